// The varlen tile walk of a persistent kernel's scheduling warp: call tile t -> (sequence, its rows in both
// dimensions, the tile's index within the sequence). The tiles of the call are the tiles of sequence 0, then of
// sequence 1, ...; a sequence has heads x blocks of the walked dimension (query rows for the forward, key rows for a
// backward dk / dv pass), and the kernel maps the index within the sequence to its (head, block) itself (varlen.h,
// tile_coord). Device only; the layer: docs/architecture.md, "Device layer"; the forward's use: docs/mha-prefill.md.
//
// One lane per sequence, 32 at a time: each lane reads its sequence's cumulative length, a max-scan over the lanes
// gives the rows under varlen.h's disjoint-rows rule, and a prefix sum the tile counts. A CTA's tile numbers only grow,
// so the window only moves forward: the whole call reads the walked cu_seqlens once per CTA.
#pragma once

#include <cstdint>

#include "common/varlen.h"

namespace openmla::kernels::varlen {

// Which rows the walk counts tiles of (and applies the disjoint-rows rule to).
enum class Walk { kQueryBlocks, kKeyBlocks };

// 32 consecutive sequences, one per lane.
struct SeqWindow {
  int base;          // first sequence of the window (lane 0's)
  int tiles_before;  // tiles of the sequences before it
  int carry_end;     // end of the walked rows of sequence base - 1 (e(base - 1))
  int begin;         // walked rows [begin, end) of sequence base + lane (empty past the batch)
  int end;
  int count;  // its tiles
  int incl;   // tiles of sequences base .. base + lane
};

// A tile found by the walk.
struct SeqTile {
  int seq;       // sequence index
  int local;     // tile index within the sequence: [0, heads x blocks)
  RowRange q;    // the sequence's query rows
  RowRange k;    // and key rows
};

template <class Tiles, Walk kWalk>
struct TileWalk {
  static constexpr bool kByQueries = kWalk == Walk::kQueryBlocks;

  __device__ __forceinline__ static int blocks(int rows) {
    if constexpr (kByQueries)
      return Tiles::num_m_blocks(rows);
    else
      return Tiles::num_n_blocks(rows);
  }

  // The window's first sequences (warp-collective).
  __device__ __forceinline__ static SeqWindow start(const VarlenBatch& b, int heads, int lane) {
    SeqWindow w{};
    w.carry_end = first_row_end(__ldg(kByQueries ? b.cu_seqlens_q : b.cu_seqlens_k), kByQueries ? b.total_q : b.total_k);
    load(b, heads, w, lane);
    return w;
  }

  // Reads the window's 32 sequences (warp-collective): this lane's walked rows, its tile count and the inclusive
  // prefix sum of the counts over the lanes.
  __device__ __forceinline__ static void load(const VarlenBatch& b, int heads, SeqWindow& w, int lane) {
    const int32_t* cu = kByQueries ? b.cu_seqlens_q : b.cu_seqlens_k;
    const int total = kByQueries ? b.total_q : b.total_k;
    const int s = w.base + lane;
    // e(s) = min(max(cu[base + 1 .. s + 1], e(base - 1)), total): a max-scan over the lanes.
    int e = s < b.batch ? __ldg(cu + s + 1) : w.carry_end;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const int x = __shfl_up_sync(0xffffffffu, e, off);
      if (lane >= off) e = imax(e, x);
    }
    e = next_row_end(w.carry_end, e, total);
    const int prev = __shfl_up_sync(0xffffffffu, e, 1);
    w.begin = lane == 0 ? w.carry_end : prev;
    w.end = e;
    const int count = heads * blocks(e - w.begin);
    int incl = count;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const int x = __shfl_up_sync(0xffffffffu, incl, off);
      if (lane >= off) incl += x;
    }
    w.count = count;
    w.incl = incl;
  }

  // Finds tile `t` (warp-collective); false when t is past the last tile.
  __device__ __forceinline__ static bool find(const VarlenBatch& b, int heads, int t, SeqWindow& w, int lane,
                                              SeqTile& tile) {
    for (;;) {
      const int window_tiles = __shfl_sync(0xffffffffu, w.incl, 31);
      if (t < w.tiles_before + window_tiles) break;
      if (w.base + 32 >= b.batch) return false;
      w.tiles_before += window_tiles;
      w.carry_end = __shfl_sync(0xffffffffu, w.end, 31);
      w.base += 32;
      load(b, heads, w, lane);
    }
    const uint32_t hit = __ballot_sync(0xffffffffu, w.tiles_before + w.incl > t);
    const int src = __ffs(hit) - 1;
    const int first = w.tiles_before + __shfl_sync(0xffffffffu, w.incl - w.count, src);
    const int seq = w.base + src;
    const int begin = __shfl_sync(0xffffffffu, w.begin, src);
    const RowRange walked{begin, __shfl_sync(0xffffffffu, w.end, src) - begin};
    tile.seq = seq;
    tile.local = t - first;
    if constexpr (kByQueries) {
      tile.q = walked;
      tile.k = clamp_rows(__ldg(b.cu_seqlens_k + seq), __ldg(b.cu_seqlens_k + seq + 1), b.total_k);
    } else {
      tile.k = walked;
      tile.q = clamp_rows(__ldg(b.cu_seqlens_q + seq), __ldg(b.cu_seqlens_q + seq + 1), b.total_q);
    }
    return true;
  }
};

}  // namespace openmla::kernels::varlen
