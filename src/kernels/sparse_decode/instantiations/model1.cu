// Sparse decode main kernel: MODEL1 layout, plain kernel.
#include "kernels/sparse_decode/launch_variant.cuh"

namespace openmla::kernels::sparse_decode {

template Status launch_variant<Layout::kModel1, false>(const SparseDecodeParams& params, cudaStream_t stream);
#if defined(OPENMLA_HAS_TRACE)
template Status trace_buffer<Layout::kModel1, false>(detail::TraceBuffer* out);
#endif

}  // namespace openmla::kernels::sparse_decode
