// Argument checks shared by the two sparse prefill entries (api/sparse_prefill_checks.h).
#include "api/sparse_prefill_checks.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "api/validate.h"

namespace openmla::detail {

Status check_bf16_rows(const TensorRef& t, const char* name) {
  OPENMLA_RETURN_IF_ERROR(check_last_dim_contiguous(t, name));
  OPENMLA_RETURN_IF_ERROR(check_strides_multiple(t, name, 8, "rows are moved in 16-byte units"));
  for (int i = 0; i + 1 < t.ndim; ++i) {
    if (t.shape[i] > 1 && t.stride[i] <= 0) {
      MessageStream os;
      os << "argument '" << name << "' has stride " << t.stride[i] << " in dimension " << i
         << "; strides must be positive; strides " << stride_string(t);
      return invalid(os.str());
    }
  }
  return check_pointer_aligned(t, name, 16);
}

Status check_row_stats(const TensorRef& t, const char* name, int64_t s_q, int64_t h_q) {
  OPENMLA_RETURN_IF_ERROR(check_cuda_tensor(t, name, {DType::kFloat32}, 2));
  OPENMLA_RETURN_IF_ERROR(check_dim(t, name, 0, s_q, "s_q"));
  OPENMLA_RETURN_IF_ERROR(check_dim(t, name, 1, h_q, "h_q"));
  return check_pointer_aligned(t, name, 4);
}

Status check_sparse_prefill_common(const SparsePrefillCommonArgs& a, int64_t s_q, int64_t h_q, int64_t d_qk,
                                   SparsePrefillShape* shape) {
  const TensorRef& q = *a.q;
  // ---- indices
  const TensorRef& indices = *a.indices;
  OPENMLA_RETURN_IF_ERROR(check_cuda_tensor(indices, "indices", {DType::kInt32}, 3));
  OPENMLA_RETURN_IF_ERROR(check_same_device(q, "q", indices, "indices"));
  OPENMLA_RETURN_IF_ERROR(check_dim(indices, "indices", 0, s_q, "s_q"));
  OPENMLA_RETURN_IF_ERROR(check_dim(indices, "indices", 1, 1, "h_kv"));
  const int64_t topk = indices.shape[2];
  if (topk < 1) return invalid("argument 'indices' must have topk >= 1 slots, got shape " + shape_string(indices));
  if (topk > kInt32Max - kSparsePrefillHeadTile)
    return invalid("argument 'indices' has too many slots (topk must fit in int32)");
  OPENMLA_RETURN_IF_ERROR(check_last_dim_contiguous(indices, "indices"));
  OPENMLA_RETURN_IF_ERROR(check_pointer_aligned(indices, "indices", 4));

  // ---- optional inputs
  if (a.topk_length->defined()) {
    const TensorRef& t = *a.topk_length;
    OPENMLA_RETURN_IF_ERROR(check_cuda_tensor(t, "topk_length", {DType::kInt32}, 1));
    OPENMLA_RETURN_IF_ERROR(check_same_device(q, "q", t, "topk_length"));
    OPENMLA_RETURN_IF_ERROR(check_dim(t, "topk_length", 0, s_q, "s_q: one length per query token"));
    OPENMLA_RETURN_IF_ERROR(check_contiguous(t, "topk_length"));
    OPENMLA_RETURN_IF_ERROR(check_pointer_aligned(t, "topk_length", 4));
  }
  if (a.attn_sink->defined()) {
    const TensorRef& t = *a.attn_sink;
    OPENMLA_RETURN_IF_ERROR(check_cuda_tensor(t, "attn_sink", {DType::kFloat32}, 1));
    OPENMLA_RETURN_IF_ERROR(check_same_device(q, "q", t, "attn_sink"));
    OPENMLA_RETURN_IF_ERROR(check_dim(t, "attn_sink", 0, h_q, "h_q"));
    OPENMLA_RETURN_IF_ERROR(check_contiguous(t, "attn_sink"));
    OPENMLA_RETURN_IF_ERROR(check_pointer_aligned(t, "attn_sink", 4));
  }

  // ---- scalars
  if (a.d_v != kSparsePrefillHeadDimV) {
    MessageStream os;
    os << "argument 'd_v' is " << a.d_v << "; sparse prefill requires d_v = 512 (V = the first 512 dims of kv)";
    return invalid(os.str());
  }
  const double scale = a.softmax_scale == 0.f ? 1.0 / std::sqrt(static_cast<double>(d_qk)) : a.softmax_scale;
  if (!(scale > 0.0) || !std::isfinite(scale)) {
    MessageStream os;
    os << "argument 'softmax_scale' is " << a.softmax_scale << "; it must be a positive finite number (0: d_qk ** -0.5)";
    return invalid(os.str());
  }
  const int64_t head_tiles = (h_q + kSparsePrefillHeadTile - 1) / kSparsePrefillHeadTile;
  if (s_q * head_tiles > kInt32Max / 2) {
    MessageStream os;
    os << "argument 'q' has " << s_q << " tokens x " << head_tiles
       << " head tiles of 64; at most 2^30 tiles per call are supported (split the call)";
    return invalid(os.str());
  }

  // ---- outputs
  const TensorRef& out = *a.out;
  OPENMLA_RETURN_IF_ERROR(check_cuda_tensor(out, "out", {DType::kBFloat16}, 3));
  OPENMLA_RETURN_IF_ERROR(check_same_device(q, "q", out, "out"));
  OPENMLA_RETURN_IF_ERROR(check_dim(out, "out", 0, s_q, "s_q"));
  OPENMLA_RETURN_IF_ERROR(check_dim(out, "out", 1, h_q, "h_q"));
  OPENMLA_RETURN_IF_ERROR(check_dim(out, "out", 2, kSparsePrefillHeadDimV, "d_v"));
  OPENMLA_RETURN_IF_ERROR(check_bf16_rows(out, "out"));
  OPENMLA_RETURN_IF_ERROR(check_row_stats(*a.max_logits, "max_logits", s_q, h_q));
  OPENMLA_RETURN_IF_ERROR(check_same_device(q, "q", *a.max_logits, "max_logits"));
  OPENMLA_RETURN_IF_ERROR(check_row_stats(*a.lse, "lse", s_q, h_q));
  OPENMLA_RETURN_IF_ERROR(check_same_device(q, "q", *a.lse, "lse"));
  OPENMLA_RETURN_IF_ERROR(check_no_self_overlap(out, "out"));
  OPENMLA_RETURN_IF_ERROR(check_no_self_overlap(*a.max_logits, "max_logits"));
  OPENMLA_RETURN_IF_ERROR(check_no_self_overlap(*a.lse, "lse"));
  OPENMLA_RETURN_IF_ERROR(check_disjoint({{a.out, "out"}, {a.max_logits, "max_logits"}, {a.lse, "lse"}},
                                         {{a.q, "q"},
                                          {a.kv, a.kv_name},
                                          {a.indices, "indices"},
                                          {a.topk_length, "topk_length"},
                                          {a.attn_sink, "attn_sink"}}));
  if (a.num_sms < 0) return invalid("argument 'num_sms' must be >= 0 (0: the current device's SM count)");

  shape->topk = topk;
  shape->idx_stride_s = s_q > 1 ? indices.stride[0] : topk;
  shape->head_tiles = head_tiles;
  shape->scale = scale;
  return Status::ok();
}

kernels::SparsePrefillParams sparse_prefill_params(const SparsePrefillCommonArgs& a, int64_t s_q, int64_t h_q,
                                                   int64_t d_qk, int64_t s_kv, const SparsePrefillShape& shape) {
  kernels::SparsePrefillParams p{};
  p.s_q = static_cast<int>(s_q);
  p.s_kv = static_cast<int>(s_kv);
  p.h_q = static_cast<int>(h_q);
  p.d_qk = static_cast<int>(d_qk);
  p.topk = static_cast<int>(shape.topk);
  p.num_head_tiles = static_cast<int>(shape.head_tiles);
  p.num_tiles = s_q * shape.head_tiles;
  p.scale_log2 = static_cast<float>(shape.scale * 1.4426950408889634);
  p.q = a.q->data;
  p.q_stride_s = a.q->stride[0];
  p.q_stride_h = a.q->stride[1];
  p.kv = nullptr;
  p.kv_stride_s = 0;
  p.indices = static_cast<const int32_t*>(a.indices->data);
  p.indices_stride_s = shape.idx_stride_s;
  p.topk_length = a.topk_length->defined() ? static_cast<const int32_t*>(a.topk_length->data) : nullptr;
  p.attn_sink = a.attn_sink->defined() ? static_cast<const float*>(a.attn_sink->data) : nullptr;
  p.output = kernels::OutputView::for_tokens(a.out->data, a.out->stride[0], a.out->stride[1],
                                             static_cast<float*>(a.lse->data), a.lse->stride[0], a.lse->stride[1]);
  p.max_logits = static_cast<float*>(a.max_logits->data);
  p.max_logits_stride_s = a.max_logits->stride[0];
  p.max_logits_stride_h = a.max_logits->stride[1];
  p.grid = static_cast<int>(std::min<int64_t>(p.num_tiles, a.num_sms > 0 ? a.num_sms : 1));
  return p;
}

}  // namespace openmla::detail
