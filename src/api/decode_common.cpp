// Checks and builders shared by the decode calls (api/decode_common.h).
#include "api/decode_common.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "kernels/decode_scheduler/schedule_record.h"

namespace openmla::detail {

namespace {
constexpr int64_t kHeadDimV = 512;
constexpr int64_t kMaxCombineRows = 65535LL * kernels::kCombineWarps;  // combine grid.y limit
}  // namespace

Status check_decode_geometry(const DecodeGeometry& g) {
  if (g.batch < 1 || g.batch > kInt32Max) return invalid_field("batch", g.batch, "expected 1 <= batch < 2^31");
  if (g.s_q < 1 || g.s_q > kInt32Max) return invalid_field("s_q", g.s_q, "expected s_q >= 1");
  if (g.h_q < 1 || g.h_q > kInt32Max) return invalid_field("h_q", g.h_q, "expected h_q >= 1");
  if (g.h_kv < 1 || g.h_kv > g.h_q) return invalid_field("h_kv", g.h_kv, "expected 1 <= h_kv <= h_q");
  if (g.h_q % g.h_kv != 0) {
    MessageStream os;
    os << "argument 'problem.h_q' (" << g.h_q << ") must be a multiple of 'problem.h_kv' (" << g.h_kv << ")";
    return invalid(os.str());
  }
  if (g.s_q * g.h_q > kMaxCombineRows)
    return invalid_field("s_q", g.s_q,
                         "s_q * h_q must be <= " + std::to_string(kMaxCombineRows) + " (query rows per request)");
  if (g.d_v != kHeadDimV) return invalid_field("d_v", g.d_v, "only d_v = 512 is supported");
  if (g.num_sms < 0) return invalid_field("num_sms", g.num_sms, "expected >= 0 (0: the device's SM count)");
  return Status::ok();
}

Status resolve_num_sms(int num_sms, int device_id, int* resolved) {
  if (num_sms > 0) {
    *resolved = num_sms;
    return Status::ok();
  }
  return device_sm_count(device_id, resolved, "querying the SM count (problem.num_sms == 0)");
}

Status check_schedule_tensors(const DecodeSchedule& schedule, int64_t batch) {
  OPENMLA_RETURN_IF_ERROR(check_cuda_tensor(schedule.metadata, "schedule.metadata", {DType::kInt32}, 2));
  OPENMLA_RETURN_IF_ERROR(
      check_dim(schedule.metadata, "schedule.metadata", 1, kDecodeScheduleRecordInts, "ints per partition record"));
  OPENMLA_RETURN_IF_ERROR(check_contiguous(schedule.metadata, "schedule.metadata"));
  OPENMLA_RETURN_IF_ERROR(check_pointer_aligned(schedule.metadata, "schedule.metadata", 16));
  OPENMLA_RETURN_IF_ERROR(check_cuda_tensor(schedule.num_splits, "schedule.num_splits", {DType::kInt32}, 1));
  OPENMLA_RETURN_IF_ERROR(check_dim(schedule.num_splits, "schedule.num_splits", 0, batch + 1, "batch + 1"));
  return check_contiguous(schedule.num_splits, "schedule.num_splits");
}

Status check_merge_counters(const DecodeSchedule& schedule, int64_t needed) {
  const TensorRef& c = schedule.merge_counters;
  if (!c.defined()) return Status::ok();
  OPENMLA_RETURN_IF_ERROR(check_cuda_tensor(c, "schedule.merge_counters", {DType::kInt32}, 1));
  OPENMLA_RETURN_IF_ERROR(check_contiguous(c, "schedule.merge_counters"));
  if (c.shape[0] < needed) {
    MessageStream os;
    os << "argument 'schedule.merge_counters' has " << c.shape[0] << " elements, but this problem needs at least "
       << needed << "; size it with get_decode_workspace_sizes() (merge_counter_ints)";
    return invalid(os.str());
  }
  if (needed > kInt32Max)
    return invalid("argument 'schedule.merge_counters': this problem needs more than 2^31 - 1 counters");
  return check_same_device(schedule.metadata, "schedule.metadata", c, "schedule.merge_counters");
}

Status check_schedule_parts(const DecodeSchedule& schedule, int num_sm_parts) {
  if (schedule.metadata.shape[0] != num_sm_parts) {
    MessageStream os;
    os << "argument 'schedule.metadata' has " << schedule.metadata.shape[0] << " partition records, but this problem "
       << "uses num_sm_parts = " << num_sm_parts << "; size it with get_decode_workspace_sizes() for the same "
       << "problem (same h_q, h_kv, s_q, sparse and num_sms)";
    return invalid(os.str());
  }
  return Status::ok();
}

Status check_split_buffers(const DecodeSplitBuffers& split, int64_t d_v) {
  const TensorRef& po = split.partial_o;
  OPENMLA_RETURN_IF_ERROR(check_cuda_tensor(po, "split.partial_o", {DType::kFloat32}, 2));
  OPENMLA_RETURN_IF_ERROR(check_dim(po, "split.partial_o", 1, d_v, "d_v"));
  OPENMLA_RETURN_IF_ERROR(check_contiguous(po, "split.partial_o"));
  OPENMLA_RETURN_IF_ERROR(check_pointer_aligned(po, "split.partial_o", 16));
  const TensorRef& pl = split.partial_lse;
  OPENMLA_RETURN_IF_ERROR(check_cuda_tensor(pl, "split.partial_lse", {DType::kFloat32}, 1));
  return check_contiguous(pl, "split.partial_lse");
}

Status check_partition_sizes(const DecodeGeometry& g, int num_sm_parts, int64_t split_slots,
                             const DecodeSchedule& schedule, const DecodeSplitBuffers& split) {
  OPENMLA_RETURN_IF_ERROR(check_schedule_parts(schedule, num_sm_parts));
  const int64_t needed_rows = split_slots * g.s_q * g.h_q;
  if (needed_rows > kInt32Max)
    return invalid("the split-KV partials of this problem need " + std::to_string(needed_rows) +
                   " rows, more than the kernels' 32-bit row index allows; reduce batch, s_q or h_q");
  for (const auto& [t, name] :
       {std::pair{&split.partial_o, "split.partial_o"}, std::pair{&split.partial_lse, "split.partial_lse"}}) {
    if (t->shape[0] < needed_rows) {
      MessageStream os;
      os << "argument '" << name << "' has " << t->shape[0] << " rows, but this problem needs at least " << needed_rows;
      if (split_slots == g.batch + num_sm_parts)
        os << " ((batch + num_sm_parts) * s_q * h_q with num_sm_parts = " << num_sm_parts << ")";
      else
        os << " (batch-invariant: " << split_slots << " split slots * s_q * h_q)";
      os << "; size it with get_decode_workspace_sizes()";
      return invalid(os.str());
    }
  }
  return Status::ok();
}

DecodeSchedule canonical(const DecodeSchedule& schedule) {
  return DecodeSchedule{.metadata = canonical(schedule.metadata),
                        .num_splits = canonical(schedule.num_splits),
                        .merge_counters = canonical(schedule.merge_counters),
                        .varlen_lengths = canonical(schedule.varlen_lengths)};
}

DecodeSplitBuffers canonical(const DecodeSplitBuffers& split) {
  return DecodeSplitBuffers{.partial_o = canonical(split.partial_o), .partial_lse = canonical(split.partial_lse)};
}

Status check_dense_block_table(const TensorRef& block_table, const TensorRef& cache_seqlens, int64_t batch,
                               const DenseDecodeProblem& problem) {
  const TensorRef& bt = block_table;
  OPENMLA_RETURN_IF_ERROR(check_cuda_tensor(bt, "block_table", {DType::kInt32}, 2));
  OPENMLA_RETURN_IF_ERROR(check_dim(bt, "block_table", 0, batch, "batch"));
  if (bt.shape[1] < 1) return invalid("argument 'block_table' has no columns; shape " + shape_string(bt));
  if (bt.shape[1] > dense_max_blocks_per_seq(problem.page_block_size)) {
    MessageStream os;
    os << "argument 'block_table' has " << bt.shape[1] << " columns; at most "
       << dense_max_blocks_per_seq(problem.page_block_size) << " are supported at page size "
       << problem.page_block_size << " (max_blocks_per_seq * page size tokens must fit in int32)";
    return invalid(os.str());
  }
  if (problem.max_blocks_per_seq > 0 && bt.shape[1] != problem.max_blocks_per_seq) {
    MessageStream os;
    os << "argument 'block_table' has " << bt.shape[1] << " columns but problem.max_blocks_per_seq is "
       << problem.max_blocks_per_seq << "; the schedule clamps lengths to the capacity it was planned with";
    return invalid(os.str());
  }
  OPENMLA_RETURN_IF_ERROR(check_last_dim_contiguous(bt, "block_table"));
  OPENMLA_RETURN_IF_ERROR(check_fits_int32(bt, "block_table"));
  OPENMLA_RETURN_IF_ERROR(check_lengths(cache_seqlens, "cache_seqlens", batch));
  return Status::ok();
}

Status check_decode_outputs(const DecodeGeometry& g, const TensorRef& out, const TensorRef& lse, DType dtype) {
  OPENMLA_RETURN_IF_ERROR(check_cuda_tensor(out, "out", {dtype}, 4));
  OPENMLA_RETURN_IF_ERROR(check_dim(out, "out", 0, g.batch, "batch"));
  OPENMLA_RETURN_IF_ERROR(check_dim(out, "out", 1, g.s_q, "s_q"));
  OPENMLA_RETURN_IF_ERROR(check_dim(out, "out", 2, g.h_q, "h_q"));
  OPENMLA_RETURN_IF_ERROR(check_dim(out, "out", 3, g.d_v, "d_v"));
  OPENMLA_RETURN_IF_ERROR(check_last_dim_contiguous(out, "out"));
  OPENMLA_RETURN_IF_ERROR(check_strides_multiple(out, "out", 8, "16-byte vector stores"));
  OPENMLA_RETURN_IF_ERROR(check_pointer_aligned(out, "out", 16));
  OPENMLA_RETURN_IF_ERROR(check_fits_int32(out, "out"));
  OPENMLA_RETURN_IF_ERROR(check_cuda_tensor(lse, "lse", {DType::kFloat32}, 3));
  OPENMLA_RETURN_IF_ERROR(check_dim(lse, "lse", 0, g.batch, "batch"));
  OPENMLA_RETURN_IF_ERROR(check_dim(lse, "lse", 1, g.h_q, "h_q"));
  OPENMLA_RETURN_IF_ERROR(check_dim(lse, "lse", 2, g.s_q, "s_q"));
  OPENMLA_RETURN_IF_ERROR(check_fits_int32(lse, "lse"));
  OPENMLA_RETURN_IF_ERROR(check_no_self_overlap(out, "out"));
  return check_no_self_overlap(lse, "lse");
}

SoftmaxScale softmax_scale_of(float softmax_scale, int64_t d_qk) {
  constexpr double kLog2e = 1.4426950408889634;
  const float scale =
      softmax_scale != 0.f ? softmax_scale : static_cast<float>(1.0 / std::sqrt(static_cast<double>(d_qk)));
  return SoftmaxScale{scale, static_cast<float>(static_cast<double>(scale) * kLog2e)};
}

int split_capacity(const DecodeGeometry& g, const DecodeSplitBuffers& split) {
  const int64_t rows = std::min(split.partial_o.shape[0], split.partial_lse.shape[0]);
  return static_cast<int>(std::min<int64_t>(rows / (g.s_q * g.h_q), kInt32Max));
}

kernels::CombineParams combine_params(const DecodeGeometry& g, bool is_fp16, const DecodeSchedule& schedule,
                                      const DecodeSplitBuffers& split, const TensorRef& out, const TensorRef& lse,
                                      const float* attn_sink, int merged_in_kernel, const int32_t* host_num_splits,
                                      bool batch_invariant) {
  kernels::CombineParams p{
      .batch = static_cast<int>(g.batch),
      .s_q = static_cast<int>(g.s_q),
      .h_q = static_cast<int>(g.h_q),
      .h_kv = static_cast<int>(g.h_kv),
      .q_per_kv = static_cast<int>(g.h_q / g.h_kv),
      .is_fp16 = is_fp16,
      .partial_o = static_cast<const float*>(split.partial_o.data),
      .partial_lse = static_cast<const float*>(split.partial_lse.data),
      .num_splits = static_cast<const int32_t*>(schedule.num_splits.data),
      .use_host_num_splits = host_num_splits != nullptr,
      .host_num_splits = {},
      .attn_sink = attn_sink,
      .merged_in_kernel = merged_in_kernel,
      .split_capacity = batch_invariant ? split_capacity(g, split) : 0,
      .output = decode_output_view(out, lse),
  };
  if (host_num_splits != nullptr)
    for (int64_t i = 0; i <= g.batch && i <= kernels::kHostScheduleMaxBatch; ++i)
      p.host_num_splits[i] = host_num_splits[i];
  return p;
}

kernels::OutputView decode_output_view(const TensorRef& out, const TensorRef& lse) {
  return kernels::OutputView{
      .out = out.data,
      .out_stride_b = out.stride[0],
      .out_stride_s = out.stride[1],
      .out_stride_h = out.stride[2],
      .lse = static_cast<float*>(lse.data),
      .lse_stride_b = lse.stride[0],
      .lse_stride_h = lse.stride[1],
      .lse_stride_s = lse.stride[2],
  };
}

}  // namespace openmla::detail
