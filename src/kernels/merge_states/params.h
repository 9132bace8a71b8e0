// Parameters of the merge_attn_states kernel. Plain data; strides count elements (of the tensor's own dtype).
#pragma once

#include <cstdint>

namespace openmla::kernels::merge_states {

struct MergeStatesParams {
  const void* outs;  // (num_partials, tokens, heads, d_v), bf16 / fp16 / fp32; last dim contiguous, 16 B aligned rows
  int64_t outs_stride_partial;
  int64_t outs_stride_token;
  int64_t outs_stride_head;

  const float* lses;  // (num_partials, tokens, heads) fp32, natural log; +-inf: empty partial
  int64_t lses_stride_partial;
  int64_t lses_stride_token;
  int64_t lses_stride_head;

  void* out;  // (tokens, heads, d_v), bf16 / fp16 / fp32; last dim contiguous, 16 B aligned rows
  int64_t out_stride_token;
  int64_t out_stride_head;

  float* lse_out;  // (tokens, heads) fp32, may be null (not written)
  int64_t lse_out_stride_token;
  int64_t lse_out_stride_head;

  int num_partials;  // >= 1
  int heads;         // >= 1
  int d_v;           // a multiple of kChunkElems
  int64_t rows;      // tokens * heads, >= 1
};

}  // namespace openmla::kernels::merge_states
