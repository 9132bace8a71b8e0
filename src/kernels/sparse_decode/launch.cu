// Sparse decode launcher (launch.h): the one place the cache layout and the crossover choice become template
// arguments. The variants themselves are compiled in instantiations/*.cu.
#include "kernels/sparse_decode/launch.h"

namespace openmla::kernels {

#if defined(OPENMLA_HAS_TRACE)
namespace {
// Trace builds: which variant launched last (its unit holds the trace the reader copies).
bool g_last_model1 = false, g_last_crossover = false;
}  // namespace
#endif

Status launch_sparse_decode(const SparseDecodeParams& p, cudaStream_t stream) {
  using sparse_decode::launch_variant;
  using sparse_decode::Layout;
#if defined(OPENMLA_HAS_TRACE)
  g_last_model1 = p.is_model1;
  g_last_crossover = p.crossover;
#endif
  if (p.chunk_blocks > 0) {  // batch-invariant schedule: the chunk-walking kernels
    using sparse_decode::launch_invariant_variant;
    if (p.is_model1)
      return p.crossover ? launch_invariant_variant<Layout::kModel1, true>(p, stream)
                         : launch_invariant_variant<Layout::kModel1, false>(p, stream);
    return p.crossover ? launch_invariant_variant<Layout::kV32, true>(p, stream)
                       : launch_invariant_variant<Layout::kV32, false>(p, stream);
  }
  if (p.is_model1)
    return p.crossover ? launch_variant<Layout::kModel1, true>(p, stream)
                       : launch_variant<Layout::kModel1, false>(p, stream);
  return p.crossover ? launch_variant<Layout::kV32, true>(p, stream) : launch_variant<Layout::kV32, false>(p, stream);
}

#if defined(OPENMLA_HAS_TRACE)
Status sparse_decode_trace(unsigned long long* host, size_t count, bool clear) {
  using sparse_decode::Layout;
  using sparse_decode::trace_buffer;
  detail::TraceBuffer buffers[4];  // index: MODEL1 | crossover << 1, as the variant code
  OPENMLA_RETURN_IF_ERROR((trace_buffer<Layout::kV32, false>(&buffers[0])));
  OPENMLA_RETURN_IF_ERROR((trace_buffer<Layout::kModel1, false>(&buffers[1])));
  OPENMLA_RETURN_IF_ERROR((trace_buffer<Layout::kV32, true>(&buffers[2])));
  OPENMLA_RETURN_IF_ERROR((trace_buffer<Layout::kModel1, true>(&buffers[3])));
  const int last = (g_last_model1 ? 1 : 0) | (g_last_crossover ? 2 : 0);
  return detail::read_trace<sparse_decode::Trace::Format>(trace::Kernel::kSparseDecode, last, buffers, 4, last, host,
                                                          count, clear, "sparse decode trace");
}
#endif

}  // namespace openmla::kernels
