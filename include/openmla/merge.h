// OpenMLA: merging attention states (merge_attn_states), the last step of decode context parallelism (DCP).
//
// Under DCP every rank decodes over its own slice of each request's tokens and returns, per (token, head) row, an
// output o_i normalised by its own softmax sum and that sum's natural log lse_i (flash_mla_with_kvcache's out and
// lse). After an all-gather, this call combines the P partial states of every row into the state the whole set of
// tokens would have given:
//
//   empty partial:  lse_i = +inf (what a decode row without keys returns: docs/contracts.md section 1) or
//                   lse_i = -inf (log of an empty sum, as split-KV partials and other libraries write it);
//                   its o_i is never read (NaN or garbage there cannot reach the result)
//   m   = max of lse_i over the non-empty partials
//   w_i = exp(lse_i - m)                                    (0 for an empty partial)
//   out = sum_i w_i o_i / sum_i w_i                          (fp32 arithmetic, rounded once to out's dtype)
//   lse_out = m + ln(sum_i w_i)                              (natural log)
//   every partial empty: out = 0 exactly, lse_out = +inf    (the decode convention for a row without keys)
//   a NaN lse_i is not empty: the row's out and lse_out are NaN (garbage is reported, not dropped)
//
// The partials are summed in index order 0..P-1 for every row, so results are bitwise reproducible.
//
// Like every entry: caller-owned outputs, no allocation, no synchronisation, capturable in a CUDA graph; a bad
// argument returns a Status whose message names it, before anything is launched.
#pragma once

#include <cuda_runtime.h>

#include "openmla/status.h"
#include "openmla/types.h"

namespace openmla {

struct MergeStatesArgs {
  // (num_partials, tokens, heads, d_v) bf16, fp16 or fp32: partial i's output rows. num_partials >= 1, d_v a
  // multiple of 8 (>= 8). Last dim contiguous; other strides any, multiples of 16 bytes; data 16-byte aligned.
  TensorRef outs;
  // (num_partials, tokens, heads) fp32, natural log; any strides (element aligned). +-inf marks an empty partial.
  TensorRef lses;
  // (tokens, heads, d_v) bf16, fp16 or fp32 (need not be outs' dtype); written. Last dim contiguous, other strides
  // multiples of 16 bytes, data 16-byte aligned.
  TensorRef out;
  // optional (tokens, heads) fp32, any strides; written with the merged natural-log lse (+inf for an empty row).
  TensorRef lse_out;
};

// tokens * heads may be 0 (nothing is launched). One kernel on `stream`.
Status merge_attn_states(const MergeStatesArgs& args, cudaStream_t stream);

}  // namespace openmla
