// Host launcher of the dense MHA prefill kernel: the variant dispatch (the ragged TMA maps: common/tensor_map.h).
#include "kernels/mha_prefill/launch.h"

#include <string>

#if defined(OPENMLA_HAS_TRACE)
#include "kernels/mha_prefill/config.h"
#endif

namespace openmla::kernels {

#if defined(OPENMLA_HAS_TRACE)
namespace {
// Trace builds: which variant launched last (its unit holds the trace the reader copies).
int g_last_d_qk = 192;
bool g_last_fp16 = false, g_last_staged = false;
}  // namespace
#endif

Status launch_mha_prefill(const MhaPrefillParams& p, cudaStream_t stream) {
#if defined(OPENMLA_HAS_TRACE)
  g_last_d_qk = p.d_qk;
  g_last_fp16 = p.fp16;
  g_last_staged = p.staged_out;
#endif
  if (p.d_qk == 192)
    return p.fp16 ? launch_mha_prefill_typed<192, true>(p, stream) : launch_mha_prefill_typed<192, false>(p, stream);
  if (p.d_qk == 128)
    return p.fp16 ? launch_mha_prefill_typed<128, true>(p, stream) : launch_mha_prefill_typed<128, false>(p, stream);
  return Status::internal("dense MHA prefill: no kernel variant for d_qk " + std::to_string(p.d_qk) +
                          " (the API admits 192 and 128)");
}

Status launch_mha_prefill_fp8(const MhaPrefillFp8Params& params, cudaStream_t stream) {
  const MhaPrefillFp8Params& p = params;
  if (p.block_n != 128 && p.block_n != 192)
    return Status::internal("dense MHA prefill (FP8): no kernel variant for key blocks of " +
                            std::to_string(p.block_n) + " (built: 128 and 192)");
  const bool wide = p.block_n == 192;
  if (p.base.d_qk == 192)
    return wide ? launch_mha_prefill_fp8_typed<192, 192>(p, stream) : launch_mha_prefill_fp8_typed<192, 128>(p, stream);
  if (p.base.d_qk == 128)
    return wide ? launch_mha_prefill_fp8_typed<128, 192>(p, stream) : launch_mha_prefill_fp8_typed<128, 128>(p, stream);
  return Status::internal("dense MHA prefill (FP8): no kernel variant for d_qk " + std::to_string(p.base.d_qk) +
                          " (the API admits 192 and 128)");
}

#if defined(OPENMLA_HAS_TRACE)
Status mha_prefill_trace(unsigned long long* host, size_t count, bool clear) {
  using mha_prefill::trace_buffer;
  detail::TraceBuffer buffers[4];  // index: fp16 | (d_qk == 128) << 1
  OPENMLA_RETURN_IF_ERROR((trace_buffer<192, false>(&buffers[0])));
  OPENMLA_RETURN_IF_ERROR((trace_buffer<192, true>(&buffers[1])));
  OPENMLA_RETURN_IF_ERROR((trace_buffer<128, false>(&buffers[2])));
  OPENMLA_RETURN_IF_ERROR((trace_buffer<128, true>(&buffers[3])));
  const int last = (g_last_fp16 ? 1 : 0) | (g_last_d_qk == 128 ? 2 : 0);
  const unsigned long long variant = static_cast<unsigned long long>(g_last_d_qk) | (g_last_fp16 ? 1ull << 16 : 0) |
                                     (g_last_staged ? 1ull << 17 : 0);
  return detail::read_trace<mha_prefill::Trace::Format>(trace::Kernel::kMhaPrefill, variant, buffers, 4, last, host,
                                                        count, clear, "dense MHA prefill trace");
}
#endif

}  // namespace openmla::kernels
