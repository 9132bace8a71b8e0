// OpenMLA: MLA decode (dense over a paged BF16/FP16 cache; sparse top-k over an FP8 cache).
//
// A decode call has three parts, all on the caller's stream, none synchronising the host:
//   1. get_decode_workspace_sizes(): how much caller-owned device memory the schedule and the split-KV
//      partials need. An engine sizes these once for its largest batch (num_sm_parts depends only on
//      the head geometry and the SM count, never on sequence lengths).
//   2. plan_decode(): a GPU kernel that computes the schedule (work partition over the SMs) from
//      cache_seqlens (dense) or topk_length (sparse). Graph-capturable; reuse the schedule across all
//      layers of one decoding step.
//   3. dense_decode() / sparse_decode(): the attention kernel plus, for requests the schedule split,
//      the combine kernel (launched with programmatic dependent launch).
//
// Conventions shared by every decode path:
//   - out: (b, s_q, h_q, d_v) in q's dtype; lse: logical (b, h_q, s_q) float32, natural log of the
//     sum of exp(scaled logits); any strides (the Python layer returns a transposed view).
//   - A query row with no visible key gets out = 0 and lse = +inf.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

#include "openmla/kv_cache.h"
#include "openmla/status.h"
#include "openmla/types.h"

namespace openmla {

// Number of int32 fields in one partition record of the schedule (see docs/decode-schedule.md).
inline constexpr int kDecodeScheduleRecordInts = 8;

// Static description of a decode problem: everything the schedule, the workspace and the kernel choice depend on.
// The per-step values (sequence lengths, top-k lengths) are tensors passed to plan_decode(). One struct per
// family; DecodeProblem (below) is the older single struct, kept as a compatibility form.

// Dense decode over a paged BF16/FP16 cache.
struct DenseDecodeProblem {
  int64_t batch = 0;             // b >= 1
  int64_t s_q = 1;               // query tokens per request (MTP / speculative: > 1)
  int64_t h_q = 0;               // query heads, a multiple of h_kv
  int64_t h_kv = 1;              // KV heads
  int64_t d_qk = 576;            // must be 576 (512 NoPE + 64 RoPE)
  int64_t d_v = 512;             // must be 512
  int64_t page_block_size = 64;  // tokens per cache page (k_cache.shape[1]): 1, 2, 4, ..., 256
  KVCacheFormat cache_format = KVCacheFormat::kBFloat16;  // kBFloat16 or kFloat16 (the dtype of q and the cache)
  bool causal = false;           // bottom-right aligned; ignored when s_q == 1
  int num_sms = 0;               // SMs to schedule over; 0: the current device's count
  // The block table's column count (its capacity is max_blocks_per_seq * page_block_size tokens), or 0: not given. Given,
  // plan_decode clamps each length to that capacity as the kernel does, so a garbage length costs no more than a
  // valid one (not given, the schedule budgets the raw length: one length of 2^31 - 1 then serialises the step),
  // and dense_decode requires block_table.shape(1) == max_blocks_per_seq. At most
  // dense_max_blocks_per_seq(page_block_size).
  int64_t max_blocks_per_seq = 0;
  // Batch-invariant schedule (docs/decode-schedule.md, "Batch invariance"): a request's output bits do not depend on
  // the other requests of the batch. Each request is split into chunks of kDecodeInvariantChunkTokens tokens fixed by
  // its own length, merged in an order fixed by its own chunks. Plan and call must agree on it (the call's split
  // buffers are sized for it, from the block table's width: get_decode_workspace_sizes needs max_blocks_per_seq).
  bool batch_invariant = false;
  // Per-request query lengths (docs/dense-decode.md, "Per-request query lengths"): s_q is then the LARGEST query
  // length, q / out stay (b, s_q, ...), and request i has seqused_q[i] rows (a (b,) int32 device tensor given to
  // plan_decode and to the call, clamped to [0, s_q] on the device). The causal mask is bottom-right per request: row
  // j of request i sees keys < cache_seqlens[i] - seqused_q[i] + 1 + j. Rows j >= seqused_q[i] get out = 0 and
  // lse = +inf (the empty-row convention). Needs DecodeSchedule::varlen_lengths; not with batch_invariant.
  bool varlen_q = false;
};

// The largest block table a dense call takes: max_blocks_per_seq * 64 tokens must fit in int32.
inline constexpr int64_t kMaxBlocksPerSeq = (int64_t{1} << 25) - 1;
// ... and at a page size: max_blocks_per_seq * page_block_size tokens must fit in int32 too (2^24 - 1 pages of 128
// tokens, 2^23 - 1 of 256; kMaxBlocksPerSeq for pages of 64 tokens or fewer).
inline constexpr int64_t dense_max_blocks_per_seq(int64_t page_block_size) {
  const int64_t by_tokens = page_block_size >= 1 ? ((int64_t{1} << 31) - 1) / page_block_size : kMaxBlocksPerSeq;
  return by_tokens < kMaxBlocksPerSeq ? by_tokens : kMaxBlocksPerSeq;
}

// Sparse top-k decode over an FP8 paged cache (one latent KV head, no causal mask: the indices select).
struct SparseDecodeProblem {
  int64_t batch = 0;             // b >= 1
  int64_t s_q = 1;               // query tokens per request, <= 65535
  int64_t h_q = 0;               // query heads, any value >= 1
  int64_t d_qk = 576;            // 576 (kFp8V32) or 512 (kFp8Model1): must match cache_format
  int64_t d_v = 512;             // must be 512
  int64_t page_block_size = 64;  // tokens per page of the main cache, any value >= 1
  KVCacheFormat cache_format = KVCacheFormat::kFp8V32;  // kFp8V32 or kFp8Model1, both caches
  int64_t topk = 0;              // top-k slots per query token, any value >= 1
  int64_t extra_topk = 0;        // slots per query token of the extra cache; 0: no extra cache
  int64_t extra_page_block_size = 0;  // tokens per page of the extra cache (>= 1 when extra_topk > 0)
  int num_sms = 0;               // SMs to schedule over; 0: the current device's count
  bool batch_invariant = false;  // as DenseDecodeProblem::batch_invariant (a request's chunks: topk slots, then extra)
  // Per-request query lengths, as DenseDecodeProblem::varlen_q (s_q = the largest length; rows past seqused_q[i] get
  // out = 0, lse = +inf; the indices of those rows are never read). The call decodes the b * s_q query tokens as
  // b * s_q requests of one token each (docs/sparse-decode.md, "Per-request query lengths"): q, indices, out and lse
  // must allow that view (stride of dimension 0 = s_q * stride of dimension 1). Not with batch_invariant.
  bool varlen_q = false;
};

// Chunk size of batch-invariant schedules, in tokens (dense) or top-k slots (sparse): a multiple of the 64-token
// block, the same for every request and every batch (docs/decode-schedule.md, "Batch invariance", for the choice).
inline constexpr int64_t kDecodeInvariantChunkTokens = 4096;

// Compatibility form (the single problem struct of earlier versions): `sparse` selects the family, and the
// fields of the other family are ignored (dense: topk, extra_topk, extra_page_block_size; sparse: causal,
// max_blocks_per_seq, and h_kv must be 1). Every function below takes it too and behaves as before; new code
// should use the family structs, to which it converts with as_dense() / as_sparse().
struct DecodeProblem {
  int64_t batch = 0;
  int64_t s_q = 1;
  int64_t h_q = 0;
  int64_t h_kv = 1;
  int64_t d_qk = 576;
  int64_t d_v = 512;
  int64_t page_block_size = 64;
  KVCacheFormat cache_format = KVCacheFormat::kBFloat16;
  bool causal = false;
  bool sparse = false;
  int64_t topk = 0;
  int64_t extra_topk = 0;
  int64_t extra_page_block_size = 0;
  int num_sms = 0;
  int64_t max_blocks_per_seq = 0;  // dense only: DenseDecodeProblem::max_blocks_per_seq
  bool batch_invariant = false;    // DenseDecodeProblem::batch_invariant / SparseDecodeProblem::batch_invariant

  DenseDecodeProblem as_dense() const {
    return DenseDecodeProblem{.batch = batch, .s_q = s_q, .h_q = h_q, .h_kv = h_kv, .d_qk = d_qk, .d_v = d_v,
                              .page_block_size = page_block_size, .cache_format = cache_format, .causal = causal,
                              .num_sms = num_sms, .max_blocks_per_seq = max_blocks_per_seq,
                              .batch_invariant = batch_invariant};
  }
  SparseDecodeProblem as_sparse() const {
    return SparseDecodeProblem{.batch = batch, .s_q = s_q, .h_q = h_q, .d_qk = d_qk, .d_v = d_v,
                               .page_block_size = page_block_size, .cache_format = cache_format, .topk = topk,
                               .extra_topk = extra_topk, .extra_page_block_size = extra_page_block_size,
                               .num_sms = num_sms, .batch_invariant = batch_invariant};
  }
};

struct DecodeWorkspaceSizes {
  int num_sm_parts = 0;          // partitions the schedule splits the work into (<= kMaxDecodeSmParts)
  int64_t metadata_ints = 0;     // schedule records: num_sm_parts * kDecodeScheduleRecordInts int32
  int64_t num_splits_ints = 0;   // split-slot prefix sums: batch + 1 int32
  int64_t partial_rows = 0;      // (batch + num_sm_parts) * s_q * h_q rows of partial results; batch-invariant:
                                 // batch * max_chunks * s_q * h_q (max_chunks: the chunks of the longest request
                                 // the problem allows, from max_blocks_per_seq or topk + extra_topk)
  size_t partial_o_bytes = 0;    // partial_rows * d_v * sizeof(float)
  size_t partial_lse_bytes = 0;  // partial_rows * sizeof(float)
  int64_t merge_counter_ints = 0;  // DecodeSchedule::merge_counters: one int32 per (request, query tile) of the
                                   // main kernel (dense: batch * h_kv * ceil(s_q * h_q / h_kv / 64); sparse:
                                   // batch * s_q * ceil(h_q / 64)); a batch-invariant dense problem adds batch,
                                   // where plan_decode writes the schedule's walk order (docs/decode-schedule.md)
  int64_t varlen_ints = 0;         // DecodeSchedule::varlen_lengths (problem.varlen_q; 0 otherwise): dense batch;
                                   // sparse batch * s_q, twice that with an extra cache. A sparse varlen problem's
                                   // other sizes are those of its b * s_q one-token requests (num_splits_ints
                                   // batch * s_q + 1, num_sm_parts of s_q = 1)
};

inline constexpr int kMaxDecodeSmParts = 160;

// Checks the problem's geometry (what the schedule and the workspace depend on; the rest is checked by the decode
// call) and fills `sizes`. Host-only: launches nothing; queries the SM count only when problem.num_sms == 0.
Status get_decode_workspace_sizes(const DenseDecodeProblem& problem, DecodeWorkspaceSizes* sizes);
Status get_decode_workspace_sizes(const SparseDecodeProblem& problem, DecodeWorkspaceSizes* sizes);
Status get_decode_workspace_sizes(const DecodeProblem& problem, DecodeWorkspaceSizes* sizes);  // compatibility form

// The schedule: caller-owned device memory, filled by plan_decode() (layout: docs/decode-schedule.md).
struct DecodeSchedule {
  TensorRef metadata;    // (num_sm_parts, 8) int32, contiguous, 16-byte aligned: one record per partition
  TensorRef num_splits;  // (batch + 1,) int32, contiguous; exclusive prefix sum of splits per request.
                         // num_splits[batch] == -1 would flag a failed scheduler pass (cannot happen; the
                         // schedule is then all-idle and out/lse are left unwritten).
  // Optional (>= merge_counter_ints,) int32, contiguous. plan_decode() zeroes it and every decode call leaves it
  // zero. With it, dense decode merges requests split into two chunks inside its main kernel (the chunk that
  // finishes last merges the other's partial), which spares the combine kernel's pass over their partials at the
  // end of the call; without it (undefined) the combine kernel merges every split request, as before. Calls that
  // share a schedule must run one after another (they already share the split buffers). A batch-invariant dense
  // schedule planned with counters keeps its walk order after them (the last batch ints of merge_counter_ints, which
  // plan_decode writes and calls leave as they are; its calls must pass these counters); planned without counters,
  // it walks request order and its calls may pass zeroed counters of their own.
  TensorRef merge_counters;
  // Required with problem.varlen_q (>= varlen_ints,) int32, contiguous, written by plan_decode: the lengths the
  // schedule was planned from (dense: each request's cache length, 0 for a request without query rows; sparse: each
  // query token's top-k lengths, which the sparse call reads).
  TensorRef varlen_lengths;
};

// Split-KV scratch: caller-owned device memory, sized by get_decode_workspace_sizes().
// Larger buffers (more rows) are accepted, so one allocation can serve every batch up to the largest.
struct DecodeSplitBuffers {
  TensorRef partial_o;    // (>= partial_rows, d_v) float32, contiguous, 16-byte aligned
  TensorRef partial_lse;  // (>= partial_rows,) float32, contiguous
};

// Fills `schedule` on the GPU, on `stream`, without host synchronisation (graph-capturable). The schedule stays
// valid for every call with the same problem and the same length VALUES (reuse it across layers of one step).
// A call with other length values than the plan's reads and writes only inside its own buffers (its results are
// then undefined); checked mode (openmla/checked.h) names the request whose length does not match.
// With problem.num_sms > 0 every check runs before any CUDA call; 0 queries the tensors' device.
//   Dense: `cache_seqlens` (b,) int32 (negative lengths count as 0; with problem.max_blocks_per_seq > 0 lengths
//   above max_blocks_per_seq * page_block_size count as that, as in the kernel).
//   Sparse: `topk_length` and `extra_topk_length` (b,) int32 may be absent (undefined TensorRef); given values
//   are clamped to [0, topk] / [0, extra_topk]; extra_topk_length only with problem.extra_topk > 0.
Status plan_decode(const DenseDecodeProblem& problem, const TensorRef& cache_seqlens, const DecodeSchedule& schedule,
                   cudaStream_t stream);
Status plan_decode(const SparseDecodeProblem& problem, const TensorRef& topk_length, const TensorRef& extra_topk_length,
                   const DecodeSchedule& schedule, cudaStream_t stream);
// Per-request query lengths (problem.varlen_q): the same, from the lengths and `seqused_q` (b,) int32 (the values
// the calls pass). Writes schedule.varlen_lengths first (one small kernel), then plans from it.
Status plan_decode(const DenseDecodeProblem& problem, const TensorRef& cache_seqlens, const TensorRef& seqused_q,
                   const DecodeSchedule& schedule, cudaStream_t stream);
Status plan_decode(const SparseDecodeProblem& problem, const TensorRef& topk_length, const TensorRef& extra_topk_length,
                   const TensorRef& seqused_q, const DecodeSchedule& schedule, cudaStream_t stream);
// Compatibility form: dense problems read cache_seqlens and ignore the top-k lengths; sparse problems the reverse.
Status plan_decode(const DecodeProblem& problem, const TensorRef& cache_seqlens, const TensorRef& topk_length,
                   const TensorRef& extra_topk_length, const DecodeSchedule& schedule, cudaStream_t stream);

struct DenseDecodeArgs {
  TensorRef q;              // (b, s_q, h_q, d_qk) bf16/fp16; last dim contiguous, byte strides % 16 == 0
  TensorRef k_cache;        // (num_blocks, page_block_size, h_kv, d_qk), q's dtype; last dim contiguous, strides % 8
                            // == 0; page_block_size 1, 2, 4, ..., 256
  TensorRef block_table;    // (b, max_blocks_per_seq) int32, entry [i, j] = the page of tokens [j P, j P + P) of
                            // request i (P = page_block_size); last dim contiguous; max_blocks_per_seq <=
                            // dense_max_blocks_per_seq(P). Entries past ceil(L/P) are never read; an entry outside
                            // [0, num_blocks) reads zeros (TMA bounds; pages 1-8: zero-filled gathers), never another address; a length above
                            // max_blocks_per_seq * P is clamped to it
  TensorRef cache_seqlens;  // (b,) int32, contiguous; 0 allowed
  float softmax_scale = 0.f;  // 0: d_qk ** -0.5
  DecodeSchedule schedule;    // from plan_decode() with the same problem and cache_seqlens
  DecodeSplitBuffers split;   // workspace
  TensorRef out;            // (b, s_q, h_q, d_v), q's dtype; last dim contiguous, strides % 8 == 0
  TensorRef lse;            // (b, h_q, s_q) float32, any strides
  TensorRef seqused_q;      // problem.varlen_q only: (b,) int32, contiguous, the values the plan was given
};

Status dense_decode(const DenseDecodeProblem& problem, const DenseDecodeArgs& args, cudaStream_t stream);
// Compatibility form: problem.sparse must be false.
Status dense_decode(const DecodeProblem& problem, const DenseDecodeArgs& args, cudaStream_t stream);

// Sparse top-k decode over an FP8 paged cache (DeepSeek-V3.2 sparse attention). Each query token attends
// to the tokens its index row selects: index = page * page_block_size + offset_in_page (the block table is
// folded into the indices). A slot is skipped (contributes nothing, is never dereferenced) when its index
// is -1, when it lies outside [0, num_blocks * page_block_size), or when its position is at or beyond the
// request's topk_length. The extra cache, if given, is a second selection attended under the same softmax.
//
// problem: cache_format = kFp8V32 (d_qk 576, 656 B/token) or kFp8Model1 (d_qk 512, 584 B/token), d_v = 512,
// any h_q >= 1 (64-head tiles; h_q = 128 pairs two tiles in a CTA cluster that share the dequantisation), any
// s_q >= 1, topk >= 1 (any value), page_block_size >= 1; extra_topk >= 1 and extra_page_block_size >= 1 when
// an extra cache is given, else 0.
struct SparseDecodeArgs {
  TensorRef q;                  // (b, s_q, h_q, d_qk) bf16; last dim contiguous, byte strides % 16 == 0
  TensorRef k_cache;            // (num_blocks, page_block_size, 1, bytes_per_token) uint8 / int8 / float8_e4m3
                                // byte buffer; stride(1) == bytes_per_token, stride(0) % 16 == 0
  TensorRef indices;            // (b, s_q, topk) int32, last dim contiguous
  TensorRef topk_length;        // optional (b,) int32: slots [0, topk_length[i]) of request i are used
  TensorRef attn_sink;          // optional (h_q,) float32, natural-log units; +-inf allowed
  TensorRef extra_k_cache;      // optional second cache (own page size = problem.extra_page_block_size)
  TensorRef extra_indices;      // (b, s_q, extra_topk) int32; required iff extra_k_cache is given
  TensorRef extra_topk_length;  // optional (b,) int32, only with extra_k_cache
  float softmax_scale = 0.f;    // 0: d_qk ** -0.5
  DecodeSchedule schedule;      // from plan_decode() with the same problem, topk_length and extra_topk_length
  DecodeSplitBuffers split;     // workspace
  TensorRef out;                // (b, s_q, h_q, d_v) bf16; last dim contiguous, strides % 8 == 0
  TensorRef lse;                // (b, h_q, s_q) float32, any strides
  TensorRef seqused_q;          // problem.varlen_q only: (b,) int32, contiguous, the values the plan was given
};

Status sparse_decode(const SparseDecodeProblem& problem, const SparseDecodeArgs& args, cudaStream_t stream);
// Compatibility form: problem.sparse must be true, h_kv 1 and causal false.
Status sparse_decode(const DecodeProblem& problem, const SparseDecodeArgs& args, cudaStream_t stream);

}  // namespace openmla
