// Launcher internals of the dense MHA prefill kernel: one explicit instantiation per (d_qk, dtype) variant
// (instantiations/*.cu), dispatched by launch_mha_prefill (launch.cu).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include "kernels/mha_prefill/params.h"
#include "kernels/mha_prefill/tile_math.h"
#include "openmla/status.h"
#if defined(OPENMLA_HAS_TRACE)
#include <cstddef>

#include "common/trace_symbols.cuh"
#endif

namespace openmla::kernels {

template <int kDQK, bool kFp16>
Status launch_mha_prefill_typed(const MhaPrefillParams& p, cudaStream_t stream);

#if defined(OPENMLA_HAS_TRACE)
// Trace builds only (CMake -DOPENMLA_TRACE=ON; api/trace.h): copies the trace of the last launch (config.h, struct
// Trace; format common/trace_format.h; variant code: d_qk | fp16 << 16 | staged O << 17) to host[0,
// Trace::Format::kValues), synchronising the device first, or zeroes the trace of every variant when `clear` is set.
Status mha_prefill_trace(unsigned long long* host, size_t count, bool clear);
namespace mha_prefill {
// The (d_qk, dtype) unit's trace array (kernel.cuh).
template <int kDQK, bool kFp16>
Status trace_buffer(detail::TraceBuffer* out);
}  // namespace mha_prefill
#endif

namespace mha_prefill {

// The TMA map of one packed (rows, heads, cols) operand, addressed per sequence (docs/mha-prefill.md, "Loads"):
// rows past a sequence's end are outside the map (loads read zeros, stores skip them). Box: 64 columns x 1 head x
// box_rows rows.
// `stride_t` / `stride_h`: element strides of the token and head dimensions (multiples of 8, < 2^33).
struct RaggedOperand {
  const void* base;
  int64_t cols;
  int64_t heads;
  int64_t stride_t;
  int64_t stride_h;
  bool fp16;
  int box_rows = kBlockM;  // rows per TMA box: a tile (loads) or a warpgroup's 64 (O's stores)
};
Status make_ragged_map(const RaggedOperand& op, CUtensorMap* map, const char* what);

}  // namespace mha_prefill

}  // namespace openmla::kernels
