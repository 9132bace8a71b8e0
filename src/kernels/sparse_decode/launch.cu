// Sparse decode launcher (launch.h): the one place the cache layout and the crossover choice become template
// arguments. The variants themselves are compiled in instantiations/*.cu.
#include "kernels/sparse_decode/launch.h"

namespace openmla::kernels {

#if defined(OPENMLA_HAS_TRACE)
namespace {
// Trace builds: which variant launched last (its unit holds the trace the readers copy).
bool g_last_model1 = false, g_last_crossover = false;

Status variant_trace_buffers(bool model1, bool crossover, sparse_decode::TraceBuffers* out) {
  using sparse_decode::Layout;
  using sparse_decode::trace_buffers;
  if (model1) return crossover ? trace_buffers<Layout::kModel1, true>(out) : trace_buffers<Layout::kModel1, false>(out);
  return crossover ? trace_buffers<Layout::kV32, true>(out) : trace_buffers<Layout::kV32, false>(out);
}
}  // namespace
#endif

Status launch_sparse_decode(const SparseDecodeParams& p, cudaStream_t stream) {
  using sparse_decode::launch_variant;
  using sparse_decode::Layout;
#if defined(OPENMLA_HAS_TRACE)
  g_last_model1 = p.is_model1;
  g_last_crossover = p.crossover;
#endif
  if (p.is_model1)
    return p.crossover ? launch_variant<Layout::kModel1, true>(p, stream)
                       : launch_variant<Layout::kModel1, false>(p, stream);
  return p.crossover ? launch_variant<Layout::kV32, true>(p, stream) : launch_variant<Layout::kV32, false>(p, stream);
}

#if defined(OPENMLA_HAS_TRACE)
Status copy_sparse_decode_trace(unsigned long long* host, size_t count) {
  sparse_decode::TraceBuffers b;
  OPENMLA_RETURN_IF_ERROR(variant_trace_buffers(g_last_model1, g_last_crossover, &b));
  const size_t steps = b.trace.values(), timeline = b.timeline.values();
  if (count < steps + timeline + b.switches.values())
    return Status::invalid_argument("argument 'count': the trace holds more values");
  OPENMLA_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize(), "sparse decode trace: synchronising");
  OPENMLA_RETURN_IF_ERROR(detail::copy_trace_buffer(host, 0, b.trace, "sparse decode trace: copying"));
  OPENMLA_RETURN_IF_ERROR(
      detail::copy_trace_buffer(host, steps, b.timeline, "sparse decode trace: copying the timeline"));
  return detail::copy_trace_buffer(host, steps + timeline, b.switches, "sparse decode trace: copying the switches");
}

Status clear_sparse_decode_timeline() {
  for (const bool model1 : {false, true}) {
    for (const bool crossover : {false, true}) {
      sparse_decode::TraceBuffers b;
      OPENMLA_RETURN_IF_ERROR(variant_trace_buffers(model1, crossover, &b));
      OPENMLA_RETURN_IF_ERROR(detail::clear_trace_buffer(b.timeline, "sparse decode trace: clearing the timeline"));
    }
  }
  return Status::ok();
}
#endif

}  // namespace openmla::kernels
