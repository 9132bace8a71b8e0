// Argument checks shared by the two sparse prefill entries (api/sparse_prefill.cpp: bf16 kv; api/sparse_prefill_fp8.cpp:
// the paged FP8 cache): the indices, the optional inputs, the scalars and the outputs are the same contract in both.
#pragma once

#include <cstdint>

#include "kernels/sparse_prefill/params.h"
#include "openmla/status.h"
#include "openmla/types.h"

namespace openmla::detail {

inline constexpr int64_t kSparsePrefillHeadDimV = 512;
inline constexpr int64_t kSparsePrefillHeadTile = 64;

// A bf16 operand moved in 16-byte units: last dim contiguous, other strides whole 16-byte units and positive (the
// stride of a size-1 dimension is never used), base 16-byte aligned.
Status check_bf16_rows(const TensorRef& t, const char* name);

// A float32 (s_q, h_q) side output: any strides, 4-byte aligned.
Status check_row_stats(const TensorRef& t, const char* name, int64_t s_q, int64_t h_q);

// What the shared checks derive for the kernel parameters.
struct SparsePrefillShape {
  int64_t topk = 0;          // indices.shape[2]
  int64_t idx_stride_s = 0;  // indices' token stride (topk when s_q == 1)
  int64_t head_tiles = 0;    // ceil(h_q / 64)
  double scale = 0.0;        // softmax_scale, 0 -> d_qk ** -0.5
};

// The arguments both entries take besides q (already checked: bf16, shape (s_q, h_q, d_qk)) and the kv operand
// (`kv` / `kv_name`, used for device and overlap messages only).
struct SparsePrefillCommonArgs {
  const TensorRef* q;
  const TensorRef* kv;
  const char* kv_name;
  const TensorRef* indices;
  const TensorRef* topk_length;
  const TensorRef* attn_sink;
  const TensorRef* out;
  const TensorRef* max_logits;
  const TensorRef* lse;
  int64_t d_v;
  float softmax_scale;
  int num_sms;
};

// indices (s_q, 1, topk) int32, topk_length (s_q,) int32 and attn_sink (h_q,) fp32 when given, d_v = 512, a positive
// finite scale, at most 2^30 (token, head tile) pairs, out (s_q, h_q, 512) bf16, max_logits / lse (s_q, h_q) fp32, the
// outputs disjoint from every input and from each other, num_sms >= 0.
Status check_sparse_prefill_common(const SparsePrefillCommonArgs& a, int64_t s_q, int64_t h_q, int64_t d_qk,
                                   SparsePrefillShape* shape);

// The kernel parameters both entries fill alike (after check_sparse_prefill_common): everything but the kv operand
// (kv = nullptr, kv_stride_s = 0; the caller sets them or its own cache fields). `s_kv` is the number of
// addressable kv rows (slots). grid = min(tiles, num_sms), 1 when num_sms == 0 (the launcher resolves it).
kernels::SparsePrefillParams sparse_prefill_params(const SparsePrefillCommonArgs& a, int64_t s_q, int64_t h_q,
                                                   int64_t d_qk, int64_t s_kv, const SparsePrefillShape& shape);

}  // namespace openmla::detail
