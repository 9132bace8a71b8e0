// Sparse prefill from the FP8 cache, V3.2 layout, the staged producer (fp8_staged_producer.cuh).
#include "kernels/sparse_prefill/fp8_launch_impl.cuh"

namespace openmla::kernels {
template Status launch_sparse_prefill_fp8_typed<576, true>(const SparsePrefillFp8Params&, cudaStream_t);
}  // namespace openmla::kernels
