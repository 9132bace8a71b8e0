// Host launcher of the dense MHA prefill kernel: the variant dispatch (the ragged TMA maps: common/tensor_map.h).
#include "kernels/mha_prefill/launch.h"

#include <string>


namespace openmla::kernels {

Status launch_mha_prefill(const MhaPrefillParams& p, cudaStream_t stream) {
  if (p.d_qk == 192)
    return p.fp16 ? launch_mha_prefill_typed<192, true>(p, stream) : launch_mha_prefill_typed<192, false>(p, stream);
  if (p.d_qk == 128)
    return p.fp16 ? launch_mha_prefill_typed<128, true>(p, stream) : launch_mha_prefill_typed<128, false>(p, stream);
  return Status::internal("dense MHA prefill: no kernel variant for d_qk " + std::to_string(p.d_qk) +
                          " (the API admits 192 and 128)");
}

#if defined(OPENMLA_HAS_TRACE)
size_t mha_prefill_trace_values() {
  return mha_prefill::kTraceLayoutValues + size_t{mha_prefill::Trace::kCtas} * mha_prefill::Trace::kCtaValues;
}

Status mha_prefill_trace(int d_qk, bool fp16, unsigned long long* host, size_t count, bool clear) {
  if (d_qk == 192)
    return fp16 ? mha_prefill_trace_typed<192, true>(host, count, clear)
                : mha_prefill_trace_typed<192, false>(host, count, clear);
  if (d_qk == 128)
    return fp16 ? mha_prefill_trace_typed<128, true>(host, count, clear)
                : mha_prefill_trace_typed<128, false>(host, count, clear);
  return Status::invalid_argument("argument 'd_qk': the dense MHA prefill trace has variants for 192 and 128, not " +
                                  std::to_string(d_qk));
}
#endif

}  // namespace openmla::kernels
