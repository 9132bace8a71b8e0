// Sparse decode main kernel: V3.2 layout, crossover pairs.
#include "kernels/sparse_decode/launch_variant.cuh"

namespace openmla::kernels::sparse_decode {

template Status launch_variant<Layout::kV32, true>(const SparseDecodeParams& params, cudaStream_t stream);
#if defined(OPENMLA_HAS_TRACE)
template Status trace_buffer<Layout::kV32, true>(detail::TraceBuffer* out);
#endif

}  // namespace openmla::kernels::sparse_decode
