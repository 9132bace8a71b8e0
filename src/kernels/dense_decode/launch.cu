// Dense decode launcher (launch.h): the one place the element type becomes a template argument. The variants
// themselves are compiled in instantiations/*.cu.
#include "kernels/dense_decode/launch.h"

namespace openmla::kernels {

#if defined(OPENMLA_HAS_TRACE)
namespace {
// Trace builds: which variant launched last (its unit holds the timeline the readers copy).
bool g_last_fp16 = false;
}  // namespace
#endif

Status launch_dense_decode(const DenseDecodeParams& params, cudaStream_t stream) {
#if defined(OPENMLA_HAS_TRACE)
  g_last_fp16 = params.is_fp16;
#endif
  return params.is_fp16 ? dense_decode::launch_variant<true>(params, stream)
                        : dense_decode::launch_variant<false>(params, stream);
}

#if defined(OPENMLA_HAS_TRACE)
Status copy_dense_decode_timeline(unsigned long long* host, size_t count) {
  detail::TraceBuffer timeline;
  OPENMLA_RETURN_IF_ERROR(g_last_fp16 ? dense_decode::timeline_buffer<true>(&timeline)
                                      : dense_decode::timeline_buffer<false>(&timeline));
  if (count < timeline.values()) return Status::invalid_argument("argument 'count': the timeline holds more values");
  OPENMLA_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize(), "dense decode timeline: synchronising");
  return detail::copy_trace_buffer(host, 0, timeline, "dense decode timeline: copying");
}

Status clear_dense_decode_timeline() {
  for (const bool fp16 : {false, true}) {
    detail::TraceBuffer timeline;
    OPENMLA_RETURN_IF_ERROR(fp16 ? dense_decode::timeline_buffer<true>(&timeline)
                                 : dense_decode::timeline_buffer<false>(&timeline));
    OPENMLA_RETURN_IF_ERROR(detail::clear_trace_buffer(timeline, "dense decode timeline: clearing"));
  }
  return Status::ok();
}
#endif

}  // namespace openmla::kernels
