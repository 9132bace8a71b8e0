// Sparse prefill from the FP8 cache, V3.2 layout (d_qk 576, 656 B/token).
#include "kernels/sparse_prefill/fp8_launch_impl.cuh"

namespace openmla::kernels {
template Status launch_sparse_prefill_fp8_typed<576, false>(const SparsePrefillFp8Params&, cudaStream_t);
}  // namespace openmla::kernels
