// Parameters of the dense MLA decode main kernel. Plain data, built by api/dense_decode.cpp.
#pragma once

#include <cstdint>

#include "common/output_view.h"
#include "kernels/decode_scheduler/schedule_record.h"

namespace openmla::kernels {

struct DenseDecodeParams {
  // Geometry. Rows of one (request, kv head) are packed position-major:
  //   row = s_idx * q_per_kv + head_in_group, rows_per_kv_head = s_q * q_per_kv.
  int batch;
  int s_q;
  int h_q;
  int h_kv;
  int q_per_kv;          // h_q / h_kv
  int rows_per_kv_head;  // s_q * q_per_kv
  int num_m_blocks;      // ceil(rows_per_kv_head / 64)
  int num_sm_parts;      // records in `schedule`
  bool causal;           // bottom-right; false when s_q == 1
  bool is_fp16;          // element type of q / k_cache / out: fp16 if true, else bf16
  float softmax_scale;
  float scale_log2;      // softmax_scale * log2(e)

  // q: (b, s_q, h_q, 576), last dim contiguous; strides in elements.
  const void* q;
  int64_t q_stride_b, q_stride_s, q_stride_h;
  // k_cache: (num_blocks, 64, h_kv, 576), last dim contiguous; strides in elements.
  const void* k_cache;
  int64_t k_stride_block, k_stride_row, k_stride_head;
  int64_t num_cache_blocks;
  // block_table: (b, max_blocks_per_seq) int32; only the first ceil(L/64) entries of a row are valid.
  const int32_t* block_table;
  int64_t block_table_stride;
  int max_blocks_per_seq;
  const int32_t* cache_seqlens;  // (b,)

  // out: (b, s_q, h_q, 512) in q's dtype; lse: logical (b, h_q, s_q) float32.
  OutputView output;

  // Split-KV partials, one slot per (request chunk) = num_splits[req] + ordinal. Inside a slot the
  // s_q*h_q rows are packed kv-head-major: row = kv_head * rows_per_kv_head + packed_row.
  //   partial_o[(slot * s_q * h_q + row) * 512 + col], partial_lse[slot * s_q * h_q + row] (base 2).
  float* partial_o;
  float* partial_lse;

  const DecodeScheduleRecord* schedule;  // (num_sm_parts,)
  const int32_t* num_splits;             // (b + 1,) exclusive prefix sum of splits per request
  // One counter per (request, kv head, m-block), zero between calls (plan_decode zeroes them; every call leaves
  // them zero): requests of kMaxMergeChunks chunks are merged inside this kernel (docs/dense-decode.md). Null:
  // the combine kernel merges every split request.
  int* merge_counters;
  bool merge_publish_always;  // testing only (openmla/test_hooks.h, DenseDecodeOptions): never merge before publishing

  // The launch plan's choice (heuristics::plan_dense_decode_launch): true when Q tiles are loaded by TMA (each
  // CTA's 64 rows are 64 consecutive heads of one query position and q's address and strides suit a tensor map),
  // false for 16-byte cp.async (docs/dense-decode.md, decision dense-v17).
  bool q_tma = false;

  // Batch-invariant schedules (docs/decode-schedule.md, "Batch invariance"): > 0, the schedule's chunk size in blocks
  // (its records were written by ChunkWalk), and the kernel walks each record's range chunk by chunk, a chunk's split
  // ordinal being its first block / chunk_blocks; 0: the default schedule. split_capacity: the split slots the
  // partial buffers hold; a request whose slots would pass it (lengths other than the plan's) writes final rows
  // instead of partials (read only with chunk_blocks > 0).
  int chunk_blocks = 0;
  int split_capacity = 0;
};

// Page sizes other than 64 (docs/dense-decode.md, "Page sizes"): how the kernel's 64-token blocks map onto pages of P
// tokens, P a power of two in [1, 256]. Passed to the any-page and gather kernels as its own argument (not a DenseDecodeParams
// field: that would move the page-64 kernel's tensor-map arguments and change its SASS).
struct DensePageGeometry {
  int page_size = 64;             // P, tokens per page (k_cache.shape[1])
  int pages_per_block = 1;        // 64 / P for P < 64, else 1 (the gather kernel, P <= 8, reads only page_size)
  int blocks_per_page_log2 = 0;   // log2(P / 64) for P > 64, else 0
};
// The gather kernel's own argument `gather_flags` (P <= 8; docs/dense-decode.md, "Small pages: the gather kernel"):
// bits 0-1 = how many block pairs ahead it pulls whole token rows into L2 (0: none, 1: the pair the current pair
// refills, 2: the one after it); kGatherEvictNormal: the gathers with L2 evict_normal instead of the TMA kernels'
// evict_last (the prefetches are evict_normal either way).
inline constexpr int kGatherPrefetchMask = 3, kGatherEvictNormal = 4;
// The gather kernel's compile-time experiment modes (session 21, decision dense-v25; bf16, default schedule only,
// chosen by OPENMLA_DENSE_GATHER_MODE, read once; 0 = the default kernel): kGatherModeNoFetchHint drops the 128-byte
// L2 fetch hint of each 16-byte gather (the look-ahead already put the rows in L2; with the hint the L2 handles a
// whole line per 16-byte request; instantiated, A/B pending), kGatherModeLinePrefetch prefetches a row as its nine
// 128-byte lines, one lane each (prefetch.global.L2) instead of one bulk prefetch per row, whose uniform operands
// make ptxas serialise the 32 lanes' prefetches in a loop (compiled, not instantiated: its loop grew 2,432 -> 2,701
// instructions with a 92-byte spill, so it was not worth a GPU run).
inline constexpr int kGatherModeNoFetchHint = 1, kGatherModeLinePrefetch = 2;
inline constexpr int kGatherDefaultFlags = 1 | kGatherEvictNormal;  // distance 1: decision dense-v24

// Per-request query lengths (docs/dense-decode.md, "Per-request query lengths"): the varlen kernels' own argument
// after the page geometry (a DenseDecodeParams field would move the default kernels' parameters).
struct DenseVarlenQ {
  const int32_t* seqused_q = nullptr;  // (b,) query rows of each request, clamped to [0, s_q] by the kernel
};

// The page sizes the kernels take (docs/dense-decode.md, "Page sizes"): 64; powers of two in [16, 256] through the
// any-page kernel (TMA boxes of P rows); 1, 2, 4 and 8 through the gather kernel (cp.async row gathers: below 16 a
// 64-token block holds more pages than a warpgroup has warps, and a box of fewer than 8 rows breaks the swizzle atom).
inline constexpr int64_t kDenseMinPageSize = 1, kDenseMaxPageSize = 256, kDenseMinTmaPageSize = 16;
inline bool dense_decode_page_size_supported(int64_t page_size) {
  return page_size >= kDenseMinPageSize && page_size <= kDenseMaxPageSize && (page_size & (page_size - 1)) == 0;
}
// The geometry of a supported page size (DensePageGeometry).
inline DensePageGeometry dense_page_geometry(int page_size) {
  DensePageGeometry g{.page_size = page_size, .pages_per_block = 1, .blocks_per_page_log2 = 0};
  if (page_size < 64) g.pages_per_block = 64 / page_size;
  for (int blocks = page_size / 64; blocks > 1; blocks /= 2) ++g.blocks_per_page_log2;
  return g;
}

// q's strides (elements) as its TMA tensor map sees them: a size-1 dimension is never stepped, so its stride
// (free in PyTorch) is replaced by the packed one. Used by the launch plan (may Q go by TMA?) and the launcher
// (the map itself), so both see the same values.
struct DenseQMapStrides {
  int64_t head, position, request;
};
inline DenseQMapStrides dense_q_map_strides(int64_t batch, int64_t s_q, int64_t h_q, int64_t stride_b, int64_t stride_s,
                                            int64_t stride_h) {
  const int64_t position = s_q > 1 ? stride_s : stride_h * h_q;
  return DenseQMapStrides{stride_h, position, batch > 1 ? stride_b : position * s_q};
}

}  // namespace openmla::kernels
