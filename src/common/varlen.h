// The tile arithmetic of the varlen (packed, cu_seqlens-addressed) attention kernels, shared by the kernels (device)
// and the host (launch plans, C++ tests): which rows a sequence owns, what a query row sees under the bottom-right
// causal mask, and the walk in both directions — a query block's key blocks (the forward, the backward's dq pass)
// and a key block's query blocks (the backward's dk / dv pass). Plain functions of integers, no CUDA types (the layer:
// docs/architecture.md, "Device layer"; the forward's use of it: docs/mha-prefill.md).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define OPENMLA_VARLEN_FN __host__ __device__ __forceinline__
#else
#define OPENMLA_VARLEN_FN inline
#endif

namespace openmla::kernels::varlen {

// The batch as a kernel reads it (device pointers to (batch + 1,) int32 cumulative lengths; values unvalidated).
struct VarlenBatch {
  int batch;
  int total_q;  // rows of the query-side tensors
  int total_k;  // rows of the key-side tensors
  const int32_t* cu_seqlens_q;
  const int32_t* cu_seqlens_k;
};

// Longest sequence (and largest packed tensor) in rows: TMA maps address a sequence's rows through a window of this
// many rows (common/tensor_map.h, make_ragged_map), so every coordinate stays below 2^31. The API checks it.
inline constexpr int64_t kMaxRows = int64_t{1} << 30;

OPENMLA_VARLEN_FN int imin(int a, int b) { return a < b ? a : b; }
OPENMLA_VARLEN_FN int imax(int a, int b) { return a > b ? a : b; }

// A sequence's rows [begin, begin + len) in a packed tensor of `total` rows, from two cumulative-length entries. The
// values are device data nobody validated: they are clamped so that the range always lies inside the tensor (entries
// out of order give an empty sequence).
struct RowRange {
  int begin;
  int len;
};
OPENMLA_VARLEN_FN RowRange clamp_rows(int lo, int hi, int total) {
  const int b = imin(imax(lo, 0), total);
  const int e = imin(imax(hi, b), total);
  return RowRange{b, e - b};
}

// The rows of the dimension a kernel walks (and writes) are assigned to sequences in order, each ending at the largest
// cumulative length seen so far: e(-1) = clamp(cu[0], 0, total), e(i) = min(max(cu[i + 1], e(i - 1)), total),
// sequence i = rows [e(i - 1), e(i)). For valid cu_seqlens (non-decreasing, within the tensor) this is
// [cu[i], cu[i + 1]); for any values the sequences are disjoint and in order, so no row is written twice and the
// call's tiles never exceed the host's bound (e.g. heuristics::mha_prefill_max_tiles). The other dimension's rows are
// only clamped (clamp_rows): overlapping ranges there are read, never written.
OPENMLA_VARLEN_FN int next_row_end(int prev_end, int cu_next, int total) { return imin(imax(cu_next, prev_end), total); }
OPENMLA_VARLEN_FN int first_row_end(int cu0, int total) { return imin(imax(cu0, 0), total); }

// Last key (inclusive) query row `row` of a sequence sees: s_k - 1, or under the bottom-right causal mask
// min(s_k - 1, row + s_k - s_q). Negative: the row sees no key.
OPENMLA_VARLEN_FN int row_key_limit(int s_q, int s_k, int row, bool causal) {
  return causal ? imin(s_k - 1, row + s_k - s_q) : s_k - 1;
}
// First query row (of s_q) that sees key `key` (< s_k): 0, or under the bottom-right causal mask
// max(0, key - (s_k - s_q)). At or past s_q: no row sees the key.
OPENMLA_VARLEN_FN int key_first_row(int s_q, int s_k, int key, bool causal) {
  return causal ? imax(0, key - (s_k - s_q)) : 0;
}

// Tiles of kBlockM query rows by kBlockN keys.
template <int kBlockM, int kBlockN>
struct Tiling {
  static_assert(kBlockM > 0 && kBlockN > 0, "tiles have rows and keys");
  OPENMLA_VARLEN_FN static int num_m_blocks(int s_q) { return (s_q + kBlockM - 1) / kBlockM; }
  OPENMLA_VARLEN_FN static int num_n_blocks(int s_k) { return (s_k + kBlockN - 1) / kBlockN; }

  // ---- A query block's key blocks (forward; backward dq)
  // Key blocks [0, key_block_end) the tile of query block `m_block` visits: every block holding a key some valid row
  // of the tile (rows below s_q) sees. 0: no valid row sees a key (out = 0, lse = +inf).
  OPENMLA_VARLEN_FN static int key_block_end(int s_q, int s_k, int m_block, bool causal) {
    const int last_row = imin(m_block * kBlockM + kBlockM, s_q) - 1;
    const int limit = row_key_limit(s_q, s_k, last_row, causal);
    return limit < 0 ? 0 : limit / kBlockN + 1;
  }
  // Whether key block `n_block` of the tile of `m_block` needs a mask: it holds keys past the sequence (s_k), or,
  // under causal, keys past the limit of the tile's first row (the rows below it see at least as much). The same test
  // decides it for the pair seen from the key block (backward).
  OPENMLA_VARLEN_FN static bool block_needs_mask(int s_q, int s_k, int m_block, int n_block, bool causal) {
    const int last_key = n_block * kBlockN + kBlockN - 1;
    return last_key > row_key_limit(s_q, s_k, m_block * kBlockM, causal);
  }

  // ---- A key block's query blocks (backward dk / dv)
  // Query blocks [query_block_begin, num_m_blocks(s_q)) whose valid rows see some key of key block `n_block`: under
  // causal, the block of the first row that sees the block's first key; num_m_blocks(s_q) (an empty range) when no row
  // sees it (then dk = dv = 0 for the block's keys).
  OPENMLA_VARLEN_FN static int query_block_begin(int s_q, int s_k, int n_block, bool causal) {
    const int first = key_first_row(s_q, s_k, n_block * kBlockN, causal);
    return first >= s_q ? num_m_blocks(s_q) : first / kBlockM;
  }
};

// Head-major (the tiles of one head, which share its keys and values in L2, are consecutive, and heads of one kv head
// are neighbours); within a head, the blocks from the last to the first when `reverse` (the forward under causal: the
// last query block sees the most keys, longest first), in order otherwise.
struct TileCoord {
  int head;
  int block;
};
OPENMLA_VARLEN_FN TileCoord tile_coord(int local, int blocks, bool reverse) {
  const int head = local / blocks;
  const int i = local - head * blocks;
  return TileCoord{head, reverse ? blocks - 1 - i : i};
}

}  // namespace openmla::kernels::varlen

#undef OPENMLA_VARLEN_FN
