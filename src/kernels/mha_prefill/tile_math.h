// Dense MHA prefill: the tile arithmetic shared by the kernel (device) and the host (launch plan, C++ tests).
// Plain functions of integers, no CUDA types: what a tile is, which key blocks it visits, which of them need a
// mask, and the order of a sequence's tiles. Design note: docs/mha-prefill.md.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define OPENMLA_MHA_HD __host__ __device__ __forceinline__
#else
#define OPENMLA_MHA_HD inline
#endif

namespace openmla::kernels::mha_prefill {

inline constexpr int kBlockM = 128;  // query rows of a tile (two consumer warpgroups of 64)
inline constexpr int kBlockN = 128;  // keys of a block
// Longest sequence (and largest packed tensor) in rows: the TMA maps address a sequence's rows through a window of
// this many rows (launch.cu, make_ragged_map), so every coordinate stays below 2^31.
inline constexpr int64_t kMaxRows = int64_t{1} << 30;

OPENMLA_MHA_HD int imin(int a, int b) { return a < b ? a : b; }
OPENMLA_MHA_HD int imax(int a, int b) { return a > b ? a : b; }

// A sequence's rows [begin, begin + len) in a packed tensor of `total` rows, from two cumulative-length entries. The
// values are device data nobody validated: they are clamped so that the range always lies inside the tensor (entries
// out of order give an empty sequence).
struct RowRange {
  int begin;
  int len;
};
OPENMLA_MHA_HD RowRange clamp_rows(int lo, int hi, int total) {
  const int b = imin(imax(lo, 0), total);
  const int e = imin(imax(hi, b), total);
  return RowRange{b, e - b};
}

// Query rows are assigned to sequences in order, each ending at the largest cumulative length seen so far:
// e(-1) = clamp(cu[0], 0, total), e(i) = min(max(cu[i + 1], e(i - 1)), total), sequence i = rows [e(i - 1), e(i)).
// For valid cu_seqlens (non-decreasing, within the tensor) this is [cu[i], cu[i + 1]); for any values the sequences
// are disjoint and in order, so the call's tiles never exceed mha_prefill_max_tiles (heuristics/mha_prefill_launch.h)
// and tile numbers cannot overflow. (Key rows are only clamped, clamp_rows: overlapping key ranges cost nothing.)
OPENMLA_MHA_HD int next_query_end(int prev_end, int cu_next, int total) { return imin(imax(cu_next, prev_end), total); }
OPENMLA_MHA_HD int first_query_end(int cu0, int total) { return imin(imax(cu0, 0), total); }

OPENMLA_MHA_HD int num_m_blocks(int s_q) { return (s_q + kBlockM - 1) / kBlockM; }
OPENMLA_MHA_HD int num_n_blocks(int s_k) { return (s_k + kBlockN - 1) / kBlockN; }

// Last key (inclusive) query row `row` of a sequence sees: s_k - 1, or under the bottom-right causal mask
// min(s_k - 1, row + s_k - s_q). Negative: the row sees no key.
OPENMLA_MHA_HD int row_key_limit(int s_q, int s_k, int row, bool causal) {
  return causal ? imin(s_k - 1, row + s_k - s_q) : s_k - 1;
}

// Key blocks [0, key_block_end) the tile of query block `m_block` visits: every block holding a key some valid row
// of the tile (rows below s_q) sees. 0: no valid row sees a key (the tile writes out = 0, lse = +inf).
OPENMLA_MHA_HD int key_block_end(int s_q, int s_k, int m_block, bool causal) {
  const int last_row = imin(m_block * kBlockM + kBlockM, s_q) - 1;
  const int limit = row_key_limit(s_q, s_k, last_row, causal);
  return limit < 0 ? 0 : limit / kBlockN + 1;
}

// Whether key block `n_block` of the tile of `m_block` needs a mask: it holds keys past the sequence (s_k), or, under
// causal, keys past the limit of the tile's first row (the rows below it see at least as much).
OPENMLA_MHA_HD bool block_needs_mask(int s_q, int s_k, int m_block, int n_block, bool causal) {
  const int last_key = n_block * kBlockN + kBlockN - 1;
  return last_key > row_key_limit(s_q, s_k, m_block * kBlockM, causal);
}

// Tiles of a sequence: one per (query head, query block).
OPENMLA_MHA_HD int64_t sequence_tiles(int s_q, int h_q) { return static_cast<int64_t>(h_q) * num_m_blocks(s_q); }

// The order of a sequence's tiles: head-major (the tiles of one head, which share its keys and values in L2, are
// consecutive, and heads of one kv head are neighbours), and within a head the query blocks from the last to the
// first under causal (the last block sees the most keys: longest first), in order otherwise.
struct TileCoord {
  int head;
  int m_block;
};
OPENMLA_MHA_HD TileCoord tile_coord(int local, int m_blocks, bool causal) {
  const int head = local / m_blocks;
  const int i = local - head * m_blocks;
  return TileCoord{head, causal ? m_blocks - 1 - i : i};
}

}  // namespace openmla::kernels::mha_prefill
