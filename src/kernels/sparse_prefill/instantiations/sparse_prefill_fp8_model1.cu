// Sparse prefill from the FP8 cache, MODEL1 layout (d_qk 512, 584 B/token).
#include "kernels/sparse_prefill/fp8_launch_impl.cuh"

namespace openmla::kernels {
template Status launch_sparse_prefill_fp8_typed<512, false>(const SparsePrefillFp8Params&, cudaStream_t);
}  // namespace openmla::kernels
