// Dense decode launcher (launch.h): the one place the element type becomes a template argument. The variants
// themselves are compiled in instantiations/*.cu.
#include "kernels/dense_decode/launch.h"

#include <cstdlib>

#if defined(OPENMLA_HAS_TRACE)
#include "kernels/dense_decode/config.h"
#endif

namespace openmla::kernels {

#if defined(OPENMLA_HAS_TRACE)
namespace {
// Trace builds: which variant launched last (its unit holds the trace the reader copies).
bool g_last_fp16 = false;
}  // namespace
#endif

namespace {
// Diagnostics (docs/dense-decode.md, "Small pages: the gather kernel"): OPENMLA_DENSE_GATHER_FLAGS, an integer, replaces
// the gather kernel's gather_flags (L2 look-ahead distance and policy; params.h) to compare them on one
// machine. Read once.
int gather_flags_override() {
  static const int flags = [] {
    const char* e = std::getenv("OPENMLA_DENSE_GATHER_FLAGS");
    return e != nullptr && *e != 0 ? std::atoi(e) & (kGatherPrefetchMask | kGatherEvictNormal) : -1;
  }();
  return flags;
}
// OPENMLA_DENSE_GATHER_MODE (1): the bf16 gather kernel's experiment mode (params.h; default schedule only). Read once.
int gather_mode_override() {
  static const int mode = [] {
    const char* e = std::getenv("OPENMLA_DENSE_GATHER_MODE");
    return e != nullptr && *e != 0 ? std::atoi(e) & 3 : 0;
  }();
  return mode;
}
}  // namespace

Status launch_dense_decode(const DenseDecodeParams& params, const DensePageGeometry& pages, cudaStream_t stream) {
  const int gather_flags = gather_flags_override() >= 0 ? gather_flags_override() : kGatherDefaultFlags;
#if defined(OPENMLA_HAS_TRACE)
  g_last_fp16 = params.is_fp16;
#endif
  if (params.chunk_blocks > 0) {  // batch-invariant schedule: the chunk-walking kernels
    if (pages.page_size < kDenseMinTmaPageSize)
      return params.is_fp16 ? dense_decode::launch_gather_variant<true, true>(params, pages, gather_flags, stream)
                            : dense_decode::launch_gather_variant<false, true>(params, pages, gather_flags, stream);
    if (pages.page_size != 64)
      return params.is_fp16 ? dense_decode::launch_invariant_variant<true, true>(params, pages, stream)
                            : dense_decode::launch_invariant_variant<false, true>(params, pages, stream);
    return params.is_fp16 ? dense_decode::launch_invariant_variant<true, false>(params, pages, stream)
                          : dense_decode::launch_invariant_variant<false, false>(params, pages, stream);
  }
  if (pages.page_size < kDenseMinTmaPageSize) {
    if (!params.is_fp16) switch (gather_mode_override()) {
        case 1: return dense_decode::launch_gather_variant<false, false, 1>(params, pages, gather_flags, stream);
        default: break;
      }
    return params.is_fp16 ? dense_decode::launch_gather_variant<true, false>(params, pages, gather_flags, stream)
                          : dense_decode::launch_gather_variant<false, false>(params, pages, gather_flags, stream);
  }
  if (pages.page_size != 64)
    return params.is_fp16 ? dense_decode::launch_any_page_variant<true>(params, pages, stream)
                          : dense_decode::launch_any_page_variant<false>(params, pages, stream);
  return params.is_fp16 ? dense_decode::launch_variant<true>(params, stream)
                        : dense_decode::launch_variant<false>(params, stream);
}

#if defined(OPENMLA_HAS_TRACE)
Status dense_decode_trace(unsigned long long* host, size_t count, bool clear) {
  detail::TraceBuffer buffers[2];
  OPENMLA_RETURN_IF_ERROR(dense_decode::trace_buffer<false>(&buffers[0]));
  OPENMLA_RETURN_IF_ERROR(dense_decode::trace_buffer<true>(&buffers[1]));
  return detail::read_trace<dense_decode::Trace::Format>(trace::Kernel::kDenseDecode, g_last_fp16, buffers, 2,
                                                         g_last_fp16 ? 1 : 0, host, count, clear,
                                                         "dense decode trace");
}
#endif

}  // namespace openmla::kernels
