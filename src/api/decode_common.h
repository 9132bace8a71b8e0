// Checks and builders shared by the decode calls of every family (dense and sparse decode, and their planning):
// the problem's geometry, the schedule, the split-KV buffers, the outputs, the softmax scale and the combine
// launch. Internal to src/api; the argument checks of all families are in api/validate.h.
#pragma once

#include <cstdint>

#include "api/validate.h"
#include "heuristics/decode_schedule.h"
#include "kernels/combine/params.h"
#include "openmla/decode.h"

namespace openmla::detail {

// The geometry every decode problem shares: batch, s_q, h_q (and h_kv, 1 for sparse), d_v and num_sms.
struct DecodeGeometry {
  int64_t batch, s_q, h_q, h_kv, d_v;
  int num_sms;
};
inline DecodeGeometry geometry_of(const DenseDecodeProblem& p) {
  return DecodeGeometry{p.batch, p.s_q, p.h_q, p.h_kv, p.d_v, p.num_sms};
}
inline DecodeGeometry geometry_of(const SparseDecodeProblem& p) {
  return DecodeGeometry{p.batch, p.s_q, p.h_q, 1, p.d_v, p.num_sms};
}

// batch, s_q, h_q, h_kv (1 <= h_kv <= h_q, h_q % h_kv == 0), s_q * h_q (the combine grid), d_v = 512, num_sms >= 0.
Status check_decode_geometry(const DecodeGeometry& g);

// The SM count the schedule is built for: `num_sms` (the problem's field), or the count of device `device_id`
// when that is 0 (the only CUDA call of a check).
Status resolve_num_sms(int num_sms, int device_id, int* resolved);

// The schedule's tensors, for shapes that do not depend on num_sm_parts: metadata (parts, 8) int32 contiguous and
// 16-byte aligned, num_splits (batch + 1,) int32 contiguous.
Status check_schedule_tensors(const DecodeSchedule& schedule, int64_t batch);
// The optional merge counters: (>= needed,) int32, contiguous, on the metadata's device.
Status check_merge_counters(const DecodeSchedule& schedule, int64_t needed);
// The schedule has one record per partition of this problem.
Status check_schedule_parts(const DecodeSchedule& schedule, int num_sm_parts);
// Split-KV scratch shapes that do not depend on num_sm_parts.
Status check_split_buffers(const DecodeSplitBuffers& split, int64_t d_v);
// The schedule's partition count against num_sm_parts, and the split buffers' rows against `split_slots` * s_q * h_q
// (heuristics::decode_split_slots: batch + num_sm_parts, or the batch-invariant count).
Status check_partition_sizes(const DecodeGeometry& g, int num_sm_parts, int64_t split_slots,
                             const DecodeSchedule& schedule, const DecodeSplitBuffers& split);
// The partition count of a family's problem on the tensors' device: resolves num_sms (the only check that may
// query the device) and applies the family's formula.
template <typename Problem>
Status resolve_num_sm_parts(const Problem& problem, int device_id, int* num_sm_parts) {
  int num_sms = 0;
  OPENMLA_RETURN_IF_ERROR(resolve_num_sms(problem.num_sms, device_id, &num_sms));
  *num_sm_parts = heuristics::decode_num_sm_parts(problem, num_sms);
  return Status::ok();
}

// A dense decode's block_table (b, max_blocks_per_seq) int32 and cache_seqlens (b,) int32: the table's columns within
// what page_block_size allows and equal to problem.max_blocks_per_seq when that is given, its last dim contiguous.
Status check_dense_block_table(const TensorRef& block_table, const TensorRef& cache_seqlens, int64_t batch,
                               const DenseDecodeProblem& problem);

// out (b, s_q, h_q, d_v) of `dtype` and lse (b, h_q, s_q) float32: the caller-visible results of every decode.
Status check_decode_outputs(const DecodeGeometry& g, const TensorRef& out, const TensorRef& lse, DType dtype);

// The kernels' view of out (b, s_q, h_q, d_v) and lse (b, h_q, s_q), both checked by check_decode_outputs.
kernels::OutputView decode_output_view(const TensorRef& out, const TensorRef& lse);

// The softmax scale the kernels use: `softmax_scale`, or d_qk ** -0.5 when it is 0; and that times log2(e).
struct SoftmaxScale {
  float scale, scale_log2;
};
SoftmaxScale softmax_scale_of(float softmax_scale, int64_t d_qk);

// Split slots the (checked) split buffers hold: their rows / (s_q * h_q), at most 2^31 - 1.
int split_capacity(const DecodeGeometry& g, const DecodeSplitBuffers& split);

// The combine kernel's parameters for a decode call's outputs and split buffers. `host_num_splits`: the prefix sums
// of a schedule known on the host (batch + 1 values, batch <= kernels::kHostScheduleMaxBatch), used instead of the
// schedule's num_splits; null: read the schedule. `batch_invariant`: the capped combine (split_capacity set).
kernels::CombineParams combine_params(const DecodeGeometry& g, bool is_fp16, const DecodeSchedule& schedule,
                                      const DecodeSplitBuffers& split, const TensorRef& out, const TensorRef& lse,
                                      const float* attn_sink, int merged_in_kernel,
                                      const int32_t* host_num_splits = nullptr, bool batch_invariant = false);

// Every tensor of the schedule / the split buffers with the strides of its size-1 dimensions replaced (canonical()).
DecodeSchedule canonical(const DecodeSchedule& schedule);
DecodeSplitBuffers canonical(const DecodeSplitBuffers& split);

// Launch context of a decode entry (check_launch_context) for the tensors' device.
inline Status check_decode_launch(int device_id, cudaStream_t stream, const char* entry) {
  return check_launch_context(device_id, "q", stream, entry);
}

}  // namespace openmla::detail
