// OpenMLA: MLA prefill. Sparse top-k prefill (DeepSeek-V3.2 sparse attention for prompt tokens).
//
// Conventions (shared with decode):
//   - lse and max_logits are natural-log quantities; a query row with no valid key gets out = 0,
//     lse = +inf and max_logits = -inf.
//   - Every entry takes caller-owned outputs, never allocates and never synchronises; a bad argument returns
//     a Status whose message names it, before anything is launched.
#pragma once

#include <cuda_runtime.h>

#include "openmla/status.h"
#include "openmla/types.h"

namespace openmla {

// Sparse prefill: every query token t attends to the kv rows its own index row selects.
//   logits z_j = softmax_scale * q[t, h] . kv[indices[t, 0, j]] over the valid slots j;
//   a slot is valid when j < topk_length[t] (when given; values outside [0, topk] clamp) and its index lies in
//   [0, s_kv); invalid slots are never dereferenced (any value: -1, INT_MIN, s_kv, INT_MAX...);
//   out[t, h] = sum_j exp(z_j) v_j / (sum_j exp(z_j) + exp(attn_sink[h]))  (v_j = the first d_v dims of kv row j;
//   the sink term only when attn_sink is given; +inf gives out = 0, -inf changes nothing);
//   lse[t, h] = ln sum_j exp(z_j) (+inf when no slot is valid), max_logits[t, h] = max_j z_j (-inf when none).
// The sink never changes lse or max_logits.
struct SparsePrefillArgs {
  TensorRef q;            // (s_q, h_q, d_qk) bf16, d_qk in {576, 512}; last dim contiguous, strides % 8 == 0, 16 B aligned
  TensorRef kv;           // (s_kv, 1, d_qk) bf16; last dim contiguous, stride(0) % 8 == 0, 16 B aligned
  TensorRef indices;      // (s_q, 1, topk) int32, topk >= 1; last dim contiguous
  TensorRef topk_length;  // optional (s_q,) int32, contiguous: per QUERY TOKEN
  TensorRef attn_sink;    // optional (h_q,) float32, contiguous; natural-log units, +-inf allowed
  float softmax_scale = 0.f;  // > 0 (finite); 0: d_qk ** -0.5
  int64_t d_v = 512;          // must be 512
  TensorRef out;          // (s_q, h_q, d_v) bf16; last dim contiguous, strides % 8 == 0, 16 B aligned
  TensorRef max_logits;   // (s_q, h_q) float32, any strides
  TensorRef lse;          // (s_q, h_q) float32, any strides
  int num_sms = 0;        // SMs to run on (persistent CTAs); 0: the current device's count
};

// Any h_q >= 1 (64-head tiles: 64 and 128 are the fast paths; h_q = 8, 16, 32 cost what 64 does, without the
// copy into padded heads), any s_q >= 1 (up to 2^31 / ceil(h_q / 64) tokens), any s_kv >= 1, any topk >= 1.
Status sparse_prefill(const SparsePrefillArgs& args, cudaStream_t stream);

}  // namespace openmla
