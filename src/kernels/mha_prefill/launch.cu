// Host launcher of the dense MHA prefill kernel: the variant dispatch and the per-sequence (ragged) TMA maps.
#include "kernels/mha_prefill/launch.h"

#include <string>

#include "common/tensor_map.h"
#if defined(OPENMLA_HAS_TRACE)
#include "kernels/mha_prefill/config.h"
#endif
#include "kernels/mha_prefill/tile_math.h"

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

namespace mha_prefill {

// Sequences are packed along the token dimension, and a 128-row box starting inside one sequence would run into the
// next (or past the tensor). The map therefore addresses rows through a window that ends where the sequence ends:
//
//   dims (innermost first): column (cols), head (heads), window row r (kMaxRows), window end w, shift u
//   byte strides:                         stride_h,      stride_t,             stride_t,     2^34 - stride_t
//
// Loading rows [first, first + 128) of a sequence occupying rows [begin, begin + len) uses r = kMaxRows - len + first,
// w = begin + len, u = kMaxRows. The address is base + (r + w) stride_t + u (2^34 - stride_t) = base + (r + w -
// kMaxRows) stride_t (mod 2^64, as the TMA unit computes addresses: kMaxRows = 2^30, so u (2^34 - stride_t) =
// 2^64 - 2^30 stride_t) = base + (begin + first) stride_t: the rows wanted. A row at or past the sequence's end has
// r >= kMaxRows, outside dimension 2, and the TMA unit writes zeros for it without reading memory. Every coordinate
// is below 2^31 because sequences and tensors have at most kMaxRows rows (checked by the API).
Status make_ragged_map(const RaggedOperand& op, CUtensorMap* map, const char* what) {
  constexpr uint64_t kFar = 0x7fff0000u;  // extent of the w and u dimensions: beyond any coordinate they take
  const uint64_t row_bytes = static_cast<uint64_t>(op.stride_t) * 2;
  detail::TensorMapSpec spec{};
  spec.dtype = op.fp16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  spec.rank = 5;
  spec.dims[0] = static_cast<uint64_t>(op.cols);
  spec.dims[1] = static_cast<uint64_t>(op.heads);
  spec.dims[2] = static_cast<uint64_t>(kMaxRows);
  spec.dims[3] = kFar;
  spec.dims[4] = kFar;
  spec.byte_strides[0] = static_cast<uint64_t>(op.stride_h) * 2;
  spec.byte_strides[1] = row_bytes;
  spec.byte_strides[2] = row_bytes;
  spec.byte_strides[3] = (uint64_t{1} << 34) - row_bytes;
  spec.box[0] = 64;
  spec.box[1] = 1;
  spec.box[2] = static_cast<uint32_t>(op.box_rows);
  spec.box[3] = 1;
  spec.box[4] = 1;
  spec.swizzle = CU_TENSOR_MAP_SWIZZLE_128B;
  spec.l2_promotion = CU_TENSOR_MAP_L2_PROMOTION_L2_256B;
  return detail::encode_tensor_map(map, op.base, spec, what);
}

}  // namespace mha_prefill

}  // namespace openmla::kernels
