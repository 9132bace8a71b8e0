// OpenMLA: MLA prefill. Sparse top-k prefill (DeepSeek-V3.2 sparse attention for prompt tokens) and dense MHA
// prefill (MLA's prompt tokens after the latent is expanded: d_qk 192 = 128 NoPE + 64 RoPE, d_v 128).
//
// Conventions (shared with decode):
//   - lse and max_logits are natural-log quantities; a query row with no valid key gets out = 0,
//     lse = +inf and max_logits = -inf.
//   - Every entry takes caller-owned outputs, never allocates and never synchronises; a bad argument returns
//     a Status whose message names it, before anything is launched.
#pragma once

#include <cuda_runtime.h>

#include "openmla/kv_cache.h"
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

// Sparse prefill straight from the paged FP8 KV cache (bf16 compute; docs/sparse-prefill.md, "Sparse prefill from
// the FP8 cache"): the result of sparse_prefill() on the dequantised cache (dequantize_kv_cache, viewed as
// (num_blocks * page_size, 1, d_qk) rows), without any bf16 copy of the cache: the kernel gathers each selected
// token's FP8 bytes and dequantises them in shared memory. Indices are cache slots, slot = page * page_size + row
// (as sparse decode takes them); a slot outside [0, num_blocks * page_size) is invalid and never read, and the other
// rules (topk_length, attn_sink, the outputs, empty rows) are sparse_prefill()'s.
struct SparsePrefillFp8Args {
  TensorRef q;            // (s_q, h_q, d_qk) bf16, d_qk = the format's (576 V3.2, 512 MODEL1); layout as SparsePrefillArgs
  TensorRef kv_cache;     // (num_blocks, page_size, 1, bytes_per_token) uint8 / int8 / float8_e4m3: the FP8 cache
                          // (656 B V3.2, 584 B MODEL1; docs/kv-cache-formats.md): stride(1) == bytes_per_token,
                          // stride(3) == 1, page stride a multiple of 16 and >= page_size * bytes_per_token, 16 B
                          // aligned; any page_size >= 1; num_blocks * page_size <= 2^31 - 1
  KVCacheFormat cache_format = KVCacheFormat::kFp8V32;  // kFp8V32 or kFp8Model1
  TensorRef indices;      // (s_q, 1, topk) int32, topk >= 1, last dim contiguous: cache slots
  TensorRef topk_length;  // optional (s_q,) int32, contiguous: per query token
  TensorRef attn_sink;    // optional (h_q,) float32, contiguous; natural-log units, +-inf allowed
  float softmax_scale = 0.f;  // > 0 (finite); 0: d_qk ** -0.5
  int64_t d_v = 512;          // must be 512
  TensorRef out;          // (s_q, h_q, d_v) bf16; last dim contiguous, strides % 8 == 0, 16 B aligned
  TensorRef max_logits;   // (s_q, h_q) float32, any strides
  TensorRef lse;          // (s_q, h_q) float32, any strides
  int num_sms = 0;        // SMs to run on (persistent CTAs); 0: the current device's count
};

// The shapes sparse_prefill() serves (any h_q >= 1, any s_q, any topk >= 1). Never synchronises, never allocates.
Status sparse_prefill_fp8(const SparsePrefillFp8Args& args, cudaStream_t stream);

// ---------------------------------------------------------------------------------------------------------------
// Dense MHA prefill, forward (flash_attn_varlen_func). Verified on an H100 (docs/mha-prefill.md, "Status").
// ---------------------------------------------------------------------------------------------------------------
// Sequences are packed along the token dimension: sequence i owns query rows [cu_seqlens_qo[i], cu_seqlens_qo[i + 1])
// (s_q,i rows) and key rows [cu_seqlens_kv[i], cu_seqlens_kv[i + 1]) (s_k,i keys); s_q,i != s_k,i is allowed (chunked
// prefill). Query row t of sequence i (0-based within it), head h, attends to key j of the sequence when !causal, or
// when j <= t + s_k,i - s_q,i (causal, bottom-right aligned); head h reads kv head h / (h_q / h_kv).
//   z_j = softmax_scale * q[row, h] . k[key j, g];  out[row, h] = sum_j exp(z_j) v[key j, g] / sum_j exp(z_j);
//   lse[row, h] = ln sum_j exp(z_j);  a row that sees no key (s_k,i = 0, or causal with t + s_k,i - s_q,i < 0):
//   out = 0, lse = +inf.
// Rows of q, k, v past the last sequence are never read into a result, and rows of out / lse past it are not written.
// cu_seqlens are device data the host never reads: the kernel clamps each sequence to the tensors (begin =
// clamp(cu[i], 0, total), end = clamp(cu[i + 1], begin, total)), so bad values can never make it touch memory outside
// the views (they remain a caller error: the result is then that of the clamped ranges).

// How O leaves the kernel. kAuto: through shared memory and TMA stores when the sequences are short (at most 2048
// query rows per sequence on average, where the epilogue is a large part of the work), else by stores from the
// registers (docs/mha-prefill.md, decision mha-v0.14). The others force one kernel (tests, tuning); the results are
// the same bits either way.
enum class MhaPrefillEpilogue { kAuto = 0, kRegisters = 1, kStaged = 2 };

// Static description of a call: what the variant, the grid and the workspace depend on.
struct MhaPrefillProblem {
  int64_t batch = 0;          // sequences, >= 1 (cu_seqlens have batch + 1 entries)
  int64_t h_q = 0;            // query heads, a multiple of h_kv
  int64_t h_kv = 0;           // key/value heads (h_q == h_kv: MHA; h_q > h_kv: GQA)
  int64_t d_qk = 192;         // 192 or 128
  int64_t d_v = 128;          // 128
  DType dtype = DType::kBFloat16;  // kBFloat16 or kFloat16: q, k, v and out; kFloat8E4M3: FP8 q, k, v (below)
  bool causal = false;        // bottom-right aligned
  int64_t max_seqlen_qo = 0;  // optional bound on every s_q,i (0: unknown); only sizes the grid, never trusted
  int num_sms = 0;            // SMs to run on (persistent CTAs); 0: the current device's count
  MhaPrefillEpilogue epilogue = MhaPrefillEpilogue::kAuto;  // how O is stored (above)
};

struct MhaPrefillWorkspaceSizes {
  size_t workspace_bytes = 0;  // MhaPrefillArgs::workspace needs at least this many bytes
};

// Checks the problem and fills `sizes`. Host-only: no CUDA call.
Status get_mha_prefill_workspace_size(const MhaPrefillProblem& problem, MhaPrefillWorkspaceSizes* sizes);

struct MhaPrefillArgs {
  TensorRef q;             // (total_q, h_q, d_qk), problem.dtype; last dim contiguous, other strides multiples of 8
                           // elements (16 bytes), 16-byte aligned (packed views of one qkv tensor are fine)
  TensorRef k;             // (total_k, h_kv, d_qk), problem.dtype; the same layout rules
  TensorRef v;             // (total_k, h_kv, d_v), problem.dtype; the same layout rules
  TensorRef cu_seqlens_qo;  // (batch + 1,) int32, contiguous: cu[0] = 0, non-decreasing, cu[batch] <= total_q
  TensorRef cu_seqlens_kv;  // (batch + 1,) int32, contiguous: likewise, cu[batch] <= total_k
  float softmax_scale = 0.f;  // > 0 and finite; 0: d_qk ** -0.5
  TensorRef workspace;     // (>= workspace_bytes,) bytes, contiguous, 16-byte aligned: scratch, rewritten by every call
                           // (calls sharing one must be ordered on one stream)
  TensorRef out;           // (total_q, h_q, d_v), problem.dtype; last dim contiguous, strides multiples of 8, 16-byte
                           // aligned
  TensorRef lse;           // (total_q, h_q) float32, any strides (flash_mla returns a transposed view)
  // FP8 only (problem.dtype = kFloat8E4M3; FlashAttention-3's FP8 API): the descales of q, k, v, whose true values are
  // q8 * q_descale[b, g] etc. for sequence b and kv head g (a query head's descale is that of its kv head). Each
  // optional (absent: 1): float32 on q's device, shape (batch, h_kv) with any strides, or one value (0-d or (1,)).
  TensorRef q_descale;
  TensorRef k_descale;
  TensorRef v_descale;
};

// FP8 inputs (problem.dtype = kFloat8E4M3, forward only): q, k, v float8_e4m3fn with the layout rules above in
// bytes (strides multiples of 16 elements, 16-byte aligned); out bfloat16 or float16 (its dtype says which); lse as
// above. Both GEMMs run on the e4m3 values in FP8 tensor-core instructions; P (the softmax's probabilities) is
// quantised to e4m3 for P V with an offset of 2^8 (docs/fp8-prefill-design.md, "Numerics": the error against an fp32
// reference on the dequantised inputs). problem.epilogue is accepted and has no effect (the FP8 kernel stores O from
// the registers). The descales are device data: zero, negative or non-finite values are the caller's error (the
// results are then those of the formula, NaN included).
//
// total_q and total_k (the tensors' rows) at most 2^30. Never synchronises, never allocates; graph-capturable (the
// workspace is reset by a memset node on `stream`).
Status mha_prefill(const MhaPrefillProblem& problem, const MhaPrefillArgs& args, cudaStream_t stream);

// ---------------------------------------------------------------------------------------------------------------
// Dense MHA prefill, backward (the gradients of flash_attn_varlen_func). docs/mha-prefill-bwd.md.
// ---------------------------------------------------------------------------------------------------------------
// Given the forward's inputs, its out and lse, and dout = dL/dout, computes dq, dk, dv = the gradients of
// sum(out * dout) with respect to q, k and v (lse is treated as a saved value, not an output: its gradient is not
// taken). The sequences, the mask and the head mapping are the forward's (above): with GQA, dk and dv of a kv head are
// summed over the h_q / h_kv query heads that read it. A query row that sees no key gets dq = 0; a key that no query
// row sees gets dk = dv = 0; rows of q, k, v past the last sequence reach no output either and get dq, dk, dv = 0
// (so that a framework's padded buffers carry no garbage into the weights' gradients).
//
// Three kernels on `stream`: a preprocess (D = rowsum(dout o out) per row and head, the lse in base 2, into the
// workspace), the main pass (one CTA per (sequence, kv head, 128 keys): dk and dv in registers, dq accumulated in fp32
// in the workspace) and the dq conversion. deterministic = false adds the partial dq of each key block by fp32
// reductions in whatever order the CTAs reach them; deterministic = true adds them in key-block order (a per-block
// counter), so dq, dk and dv are bitwise identical from run to run (dk and dv always are).

struct MhaPrefillBwdProblem {
  int64_t batch = 0;          // sequences, >= 1
  int64_t total_q = 0;        // rows of q, out, dout, dq (the workspace depends on it), >= 0
  int64_t h_q = 0;            // query heads, a multiple of h_kv
  int64_t h_kv = 0;           // key/value heads
  int64_t d_qk = 192;         // 192 or 128
  int64_t d_v = 128;          // 128
  DType dtype = DType::kBFloat16;  // kBFloat16 or kFloat16: q, k, v, out, dout, dq, dk, dv
  bool causal = false;        // bottom-right aligned
  bool deterministic = false;  // dq added in a fixed order (above)
  int num_sms = 0;            // SMs to run on (persistent CTAs); 0: the current device's count
};

struct MhaPrefillBwdWorkspaceSizes {
  size_t workspace_bytes = 0;  // MhaPrefillBwdArgs::workspace needs at least this many bytes: the fp32 dq
                               // accumulator (h_q x (total_q + 64 batch + 64) x d_qk x 4 bytes), D and the base-2 lse
                               // (two floats per row and head), the deterministic order's counters, the tile counter
};

// Checks the problem and fills `sizes`. Host-only: no CUDA call.
Status get_mha_prefill_bwd_workspace_size(const MhaPrefillBwdProblem& problem, MhaPrefillBwdWorkspaceSizes* sizes);

struct MhaPrefillBwdArgs {
  TensorRef q;              // (total_q, h_q, d_qk), problem.dtype; the forward's layout rules (last dim contiguous,
                            // other strides multiples of 8 elements, 16-byte aligned)
  TensorRef k;              // (total_k, h_kv, d_qk)
  TensorRef v;              // (total_k, h_kv, d_v)
  TensorRef out;            // (total_q, h_q, d_v): the forward's output
  TensorRef dout;           // (total_q, h_q, d_v): dL/dout
  TensorRef lse;            // (total_q, h_q) float32, any strides: the forward's lse (natural log; +inf: no key)
  TensorRef cu_seqlens_qo;  // (batch + 1,) int32, as the forward's
  TensorRef cu_seqlens_kv;  // (batch + 1,) int32
  float softmax_scale = 0.f;  // the forward's (> 0, finite; 0: d_qk ** -0.5)
  TensorRef workspace;      // (>= workspace_bytes,) bytes, contiguous, 16-byte aligned; rewritten by every call
  TensorRef dq;             // (total_q, h_q, d_qk), problem.dtype; last dim contiguous, strides multiples of 8, 16 B
  TensorRef dk;             // (total_k, h_kv, d_qk), likewise
  TensorRef dv;             // (total_k, h_kv, d_v), likewise
};

// Never synchronises, never allocates; graph-capturable (the workspace is reset by memset nodes on `stream`).
Status mha_prefill_bwd(const MhaPrefillBwdProblem& problem, const MhaPrefillBwdArgs& args, cudaStream_t stream);

}  // namespace openmla
