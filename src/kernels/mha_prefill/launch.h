// Launcher internals of the dense MHA prefill kernel: one explicit instantiation per (d_qk, dtype) variant
// (instantiations/*.cu), dispatched by launch_mha_prefill (launch.cu).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include "kernels/mha_prefill/params.h"
#include "openmla/status.h"
#if defined(OPENMLA_HAS_TRACE)
#include <cstddef>

#include "kernels/mha_prefill/config.h"
#endif

namespace openmla::kernels {

template <int kDQK, bool kFp16>
Status launch_mha_prefill_typed(const MhaPrefillParams& p, cudaStream_t stream);

#if defined(OPENMLA_HAS_TRACE)
namespace mha_prefill {
// The trace as the reader hands it out starts with this layout (so the tool checks it parses what the kernel wrote):
// magic, kCtas, kRoles, kTiles, kMaxBlocks, kHeaderValues, kFixedEvents, kBlockEvents; then the CTAs' values.
inline constexpr size_t kTraceLayoutValues = 8;
inline constexpr unsigned long long kTraceMagic = 0x4d48415431ull;  // "MHAT1"
inline void write_trace_layout(unsigned long long* host) {
  const unsigned long long layout[kTraceLayoutValues] = {
      kTraceMagic,         Trace::kCtas,          Trace::kRoles,        Trace::kTiles,
      Trace::kMaxBlocks,   Trace::kHeaderValues,  Trace::kFixedEvents,  Trace::kBlockEvents};
  for (size_t i = 0; i < kTraceLayoutValues; ++i) host[i] = layout[i];
}
}  // namespace mha_prefill
// Values of a copied trace: the layout, then Trace::kCtas x Trace::kCtaValues.
size_t mha_prefill_trace_values();
template <int kDQK, bool kFp16>
Status mha_prefill_trace_typed(unsigned long long* host, size_t count, bool clear);
// Trace builds: copies to host[0, mha_prefill_trace_values()) (synchronising the device first) the trace of the last
// launch of the (d_qk, fp16) variant, or clears it (before a launch) when `clear` is set.
Status mha_prefill_trace(int d_qk, bool fp16, unsigned long long* host, size_t count, bool clear);
#endif

}  // namespace openmla::kernels
