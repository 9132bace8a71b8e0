// Dense MHA prefill forward kernel (sm_90a): varlen, GQA, bottom-right causal, d_qk 192 or 128, d_v 128.
//
// A tile is (sequence, query head, 128 query rows). Persistent CTAs (at most one per SM) take tiles from a
// longest-first order (tile_math.h) through an atomic counter (or round-robin). Each CTA has three warpgroups:
//   WG2, the producer (one warp): finds the tile's sequence in cu_seqlens (a warp scan over 32 sequences at a time,
//       moving forward only), publishes the tile in shared memory, loads Q once per tile and the tile's K and V blocks
//       (128 keys, last block first) through two-stage rings, all by TMA over the packed token dimension. The maps
//       address a sequence through a window that ends at its last row, so rows past the end read as zeros and a
//       neighbour's rows (NaN padding included) never reach shared memory.
//   WG0, WG1, the consumers: 64 query rows each. Per key block: S = Q K^T (SS wgmma, N = 128), the online softmax in
//       base 2 with the scale folded into one FFMA, then O += P V with P in registers (RS wgmma). Within a warpgroup
//       the next block's Q K^T runs while this block's softmax is computed (intra-warpgroup overlap). The two
//       warpgroups issue their GEMMs as soon as their data is ready, with no ping-pong order between them (decision
//       mha-v0.18). O stays in registers and leaves straight from them (16-byte stores of valid rows only).
// Design note, with the pipeline picture and the barrier table: docs/mha-prefill.md.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/mma_tile.cuh"
#include "common/ptx.cuh"
#include "common/trace.cuh"
#include "kernels/mha_prefill/config.h"
#include "kernels/mha_prefill/params.h"

// Hang detector of the unverified kernel: a wait that has not completed after kWatchdogNs traps (the launch fails
// with an error instead of hanging the process). The check runs only on the slow path of a wait.
#ifndef OPENMLA_MHA_WATCHDOG
#define OPENMLA_MHA_WATCHDOG 1
#endif

namespace openmla::kernels::mha_prefill {

using tile::Fragment;
using tile::make_fragment;
using tile::quad_max;
using tile::quad_sum;
using tile::quad_transpose4;

// 20 s: far beyond any wait of a working kernel, also under compute-sanitizer.
inline constexpr unsigned long long kWatchdogNs = 20ull * 1000 * 1000 * 1000;
inline constexpr float kLn2 = 0.69314718055994531f;

// Threads of the exchange barrier (config.h): the eight consumer warps and the producer warp.
inline constexpr int kExchangeThreads = kConsumerWarps * 32 + 32;

// ---------------------------------------------------------------------------------------------------
// PTX and small helpers used by this kernel only
// ---------------------------------------------------------------------------------------------------
// Blocks until the phase of `bar` with parity `parity` has completed.
__device__ __forceinline__ void wait_phase(uint64_t* bar, uint32_t parity) {
  while (!ptx::mbarrier_try_wait_parity(bar, parity)) {
  }
}

// The producer's ring waits, with the hang detector (OPENMLA_MHA_WATCHDOG): they depend on the consumers' progress, so
// a consumer that stops makes the producer trap here instead of hanging the process. Only the producer traps: a trap
// in the consumers' code makes ptxas serialise their wgmma and spill.
__device__ __forceinline__ void producer_wait(uint64_t* bar, uint32_t parity) {
  if (ptx::mbarrier_try_wait_parity(bar, parity)) return;
#if OPENMLA_MHA_WATCHDOG
  const unsigned long long t0 = ptx::globaltimer();
  for (uint32_t spins = 1;; ++spins) {
    if (ptx::mbarrier_try_wait_parity(bar, parity)) return;
    if ((spins & 1023u) == 0 && ptx::globaltimer() - t0 > kWatchdogNs) __trap();
  }
#else
  wait_phase(bar, parity);
#endif
}

template <bool kFp16>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (kFp16) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  } else {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
}

// S (+)= A B^T over one k16 slice: A = 64 query rows, B = 128 keys, both K-major in shared memory.
template <bool kFp16>
__device__ __forceinline__ void mma_qk(float (&s)[64], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  if constexpr (kFp16)
    ptx::wgmma_m64n128k16_ss_f16<0>(s, desc_a, desc_b, scale_d);
  else
    ptx::wgmma_m64n128k16_ss_bf16<0>(s, desc_a, desc_b, scale_d);
}

// O += P V over one k16 slice (16 keys): P from registers, V MN-major in shared memory (d_v contiguous).
template <bool kFp16>
__device__ __forceinline__ void mma_pv(float (&o)[64], const uint32_t (&pa)[4], uint64_t desc_b) {
  if constexpr (kFp16)
    ptx::wgmma_m64n128k16_rs_f16<1>(o, pa, desc_b, 1);
  else
    ptx::wgmma_m64n128k16_rs_bf16<1>(o, pa, desc_b, 1);
}

// ---------------------------------------------------------------------------------------------------
// Trace builds (CMake -DOPENMLA_TRACE=ON): clock64 stamps of each role's steps for the first Trace::kTiles tiles of
// the first Trace::kCtas CTAs (config.h, struct Trace), in the format of common/trace.cuh (tool:
// tools/diag/kernel_trace.py mha-prefill). Without the option every OPENMLA_MHA_* macro below is empty and the kernel
// compiles to the production SASS.
// ---------------------------------------------------------------------------------------------------
#if defined(OPENMLA_HAS_TRACE)
// Each instantiation unit has its own copy (whole-program compilation), handed out by that unit's trace_buffer.
__device__ unsigned long long g_trace[Trace::Format::kDeviceValues];

// Event `ev` of `role`'s record of traced tile `tile`, by the role's first thread (thread 0 of the warpgroup: lane 0
// of the producer warp for the producer).
__device__ __forceinline__ void trace_stamp(int role, uint32_t tile, int ev) {
  if (trace::warpgroup_leader()) trace::stamp<Trace::Format, 0>(g_trace, role, tile, ev);
}
// Event `ev` of visited block `block` (0: the tile's first, block n_end - 1); blocks past kMaxBlocks are not kept.
__device__ __forceinline__ void trace_stamp_block(int role, uint32_t tile, int block, int ev) {
  if (block >= 0 && block < Trace::kMaxBlocks)
    trace_stamp(role, tile, Trace::kFixedEvents + block * Trace::kBlockEvents + ev);
}
// The producer's record of what tile `tile` is (its block count and coordinates).
__device__ __forceinline__ void trace_tile_meta(uint32_t tile, const TileInfo& info) {
  if (!info.valid || !trace::warpgroup_leader()) return;
  trace::put<Trace::Format, 0>(g_trace, Trace::kRoleProducer, tile, Trace::kMetaBlocks,
                               static_cast<unsigned long long>(info.n_end) | (1ull << 63));
  const unsigned long long coord = (static_cast<unsigned long long>(info.head) << 32) | uint32_t(info.m_block);
  trace::put<Trace::Format, 0>(g_trace, Trace::kRoleProducer, tile, Trace::kMetaCoord, coord);
}
// Kernel start (one thread): the CTA header's SM, block and start clocks.
__device__ __forceinline__ void trace_cta_start() { trace::cta_start<Trace::Format>(g_trace); }
// WG0's exit (its first thread): the tiles the CTA ran and the end clocks.
__device__ __forceinline__ void trace_cta_end(uint32_t tiles) {
  if (threadIdx.x == 0) trace::cta_end<Trace::Format>(g_trace, tiles);
}
#endif
#define OPENMLA_MHA_STAMP(role, tile, ev) \
  OPENMLA_TRACE_ONLY(::openmla::kernels::mha_prefill::trace_stamp(role, tile, ev))
#define OPENMLA_MHA_STAMP_BLOCK(role, tile, block, ev) \
  OPENMLA_TRACE_ONLY(::openmla::kernels::mha_prefill::trace_stamp_block(role, tile, block, ev))
#define OPENMLA_MHA_TRACE_META(tile, info) \
  OPENMLA_TRACE_ONLY(::openmla::kernels::mha_prefill::trace_tile_meta(tile, info))
#define OPENMLA_MHA_TRACE_CTA_START() OPENMLA_TRACE_ONLY(::openmla::kernels::mha_prefill::trace_cta_start())
#define OPENMLA_MHA_TRACE_CTA_END(tiles) OPENMLA_TRACE_ONLY(::openmla::kernels::mha_prefill::trace_cta_end(tiles))

// ---------------------------------------------------------------------------------------------------
// Row operations on a 64 x 128 accumulator fragment (m64n128: element j * 4 + 2 i + e is row f.row[i], column
// 8 j + f.col + e)
// ---------------------------------------------------------------------------------------------------
// This thread's two row maxima of S, reduced over the quad. A tree (5 levels of FMNMX per row) rather than
// tile::row_max's chain of 16 dependent FMNMX: the maximum starts the softmax's critical path. Exact: the same value
// as the chain (docs/mha-prefill.md, decision mha-v0.16).
__device__ __forceinline__ void row_max_tree(const float (&s)[64], float (&mx)[2]) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float t[16];
#pragma unroll
    for (int j = 0; j < 16; ++j) t[j] = fmaxf(s[j * 4 + 2 * i], s[j * 4 + 2 * i + 1]);
#pragma unroll
    for (int j = 0; j < 8; ++j) t[j] = fmaxf(t[j], t[j + 8]);
#pragma unroll
    for (int j = 0; j < 4; ++j) t[j] = fmaxf(t[j], t[j + 4]);
    mx[i] = tile::quad_max(fmaxf(fmaxf(t[0], t[2]), fmaxf(t[1], t[3])));
  }
}

// The online-softmax step of one block: m_new = max(m, rowmax(S) scale_log2), s <- 2^(s scale_log2 - m_new),
// l <- l 2^(m - m_new) + rowsum (this thread's columns only; the quad's partial sums are added in the epilogue).
// Returns the factor a = 2^(m - m_new) that O (relative to m) must be scaled by.
__device__ __forceinline__ void softmax_step(float (&s)[64], float scale_log2, float (&m)[2], float (&l)[2],
                                             float (&a)[2]) {
  float mx[2];
  row_max_tree(s, mx);
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float m_new = fmaxf(m[i], mx[i] * scale_log2);
    a[i] = ptx::exp2_approx(m[i] - m_new);
    m[i] = m_new;
  }
  float sum[2] = {0.f, 0.f};
#pragma unroll
  for (int j = 0; j < 16; ++j) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      s[j * 4 + e] = ptx::exp2_approx(fmaf(s[j * 4 + e], scale_log2, -m[0]));
      s[j * 4 + 2 + e] = ptx::exp2_approx(fmaf(s[j * 4 + 2 + e], scale_log2, -m[1]));
      sum[0] += s[j * 4 + e];
      sum[1] += s[j * 4 + 2 + e];
    }
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) l[i] = l[i] * a[i] + sum[i];
}

// Multiplies O's rows by a (unless every row of the warp keeps its scale, the common case once the running max has
// settled: exact either way; a warp-level decision, no collective instruction).
__device__ __forceinline__ void rescale_o(float (&o)[64], const float (&a)[2]) {
  if (!__any_sync(0xffffffffu, a[0] != 1.f || a[1] != 1.f)) return;
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    o[j * 4 + 0] *= a[0];
    o[j * 4 + 1] *= a[0];
    o[j * 4 + 2] *= a[1];
    o[j * 4 + 3] *= a[1];
  }
}

// Logits of keys a row must not see become -inf (overwritten, never added to). limit[i]: the last key row i sees
// (row_key_limit); the element of column c holds key n0 + c.
__device__ __forceinline__ void mask_block(float (&s)[64], const int (&limit)[2], int n0, int col) {
  const int t0 = limit[0] - n0 - col, t1 = limit[1] - n0 - col;
#pragma unroll
  for (int j = 0; j < 16; ++j) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      if (8 * j + e > t0) s[j * 4 + e] = -INFINITY;
      if (8 * j + e > t1) s[j * 4 + 2 + e] = -INFINITY;
    }
  }
}

// P (fp32, in S's registers) as the A operand of m64nNk16 for each of the 8 k16 slices of the 128 keys.
template <bool kFp16>
__device__ __forceinline__ void to_a_fragments(const float (&s)[64], uint32_t (&pa)[8][4]) {
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) {
    pa[kk][0] = pack2<kFp16>(s[8 * kk + 0], s[8 * kk + 1]);
    pa[kk][1] = pack2<kFp16>(s[8 * kk + 2], s[8 * kk + 3]);
    pa[kk][2] = pack2<kFp16>(s[8 * kk + 4], s[8 * kk + 5]);
    pa[kk][3] = pack2<kFp16>(s[8 * kk + 6], s[8 * kk + 7]);
  }
}

// The wgmma descriptors' low words (mma_tile.cuh, desc_lo_k_major / desc_lo_mn_major / desc_from_lo: one add per
// wgmma instead of an address computation, a mask and a shift). Each issue computes its buffers' low words once,
// broadcast from lane 0 (`from_lane0`) so that ptxas knows them warp-uniform and keeps them, and the add, on the
// uniform datapath: no R2UR per wgmma (docs/mha-prefill.md, decision mha-v0.13). Broadcasting once per kernel instead
// brought the R2UR back. LBO: 16 B for the K-major Q and K, one 16 KB tile (the next 64 columns; this kernel's tiles
// are 128 rows) for V viewed MN-major; SBO one 1024-byte swizzle atom. Each wgmma's descriptor is
// the buffer's full descriptor plus the offset >> 4 as a 64-bit add (the same value: the low word never carries):
// one UIADD3.64 per operand, where adding to the low word first made ptxas rewrite the constant high word with a
// UMOV per operand (decision mha-v0.17: d128 loop 644 -> 620 instructions).
__device__ __forceinline__ uint32_t from_lane0(uint32_t v) { return __shfl_sync(0xffffffffu, v, 0); }
using tile::desc_from_lo;

// Issues (no fence, commit or wait) S = Q K^T: this warpgroup's 64 rows of the Q tile against a 128-key K block.
template <class T>
__device__ __forceinline__ void issue_qk(float (&s)[64], const uint8_t* q_rows, const uint8_t* k_block) {
  const uint32_t q_lo = from_lane0(tile::desc_lo_k_major(q_rows)), k_lo = from_lane0(tile::desc_lo_k_major(k_block));
#pragma unroll
  for (int g = 0; g < T::kQKTiles; ++g) {
#pragma unroll
    for (int kk = 0; kk < T::kTileCols / 16; ++kk) {
      const uint32_t off = (g * T::kTileBytes + kk * 32) >> 4;
      mma_qk<T::kIsFp16>(s, desc_from_lo(q_lo) + off, desc_from_lo(k_lo) + off, (g == 0 && kk == 0) ? 0 : 1);
    }
  }
}

// Issues (no fence, commit or wait) O += P V over a 128-key V block.
template <class T>
__device__ __forceinline__ void issue_pv(float (&o)[64], const uint32_t (&pa)[8][4], const uint8_t* v_block) {
  const uint32_t v_lo = from_lane0(tile::desc_lo_mn_major<T::kTileBytes>(v_block));
#pragma unroll
  for (int kk = 0; kk < T::kBlockN / 16; ++kk)
    mma_pv<T::kIsFp16>(o, pa[kk], desc_from_lo(v_lo) + ((kk * 16 * T::kRowBytes) >> 4));
}

// ---------------------------------------------------------------------------------------------------
// Tile scheduling (producer warp): tile t -> (sequence, head, query block)
// ---------------------------------------------------------------------------------------------------
// 32 consecutive sequences, one per lane: this lane's query rows (tile_math.h, next_query_end), its tile count and
// the inclusive prefix sum of the counts over the lanes. A CTA's tile numbers only grow, so the window only moves
// forward: the whole call reads cu_seqlens_qo once per CTA.
struct SeqWindow {
  int base;          // first sequence of the window (lane 0's)
  int tiles_before;  // tiles of the sequences before it
  int carry_end;     // end of the query rows of sequence base - 1 (e(base - 1))
  int q_begin;       // query rows [q_begin, q_end) of sequence base + lane (empty past the batch)
  int q_end;
  int count;  // its tiles
  int incl;   // tiles of sequences base .. base + lane
};

__device__ __forceinline__ void load_window(const MhaPrefillParams& p, SeqWindow& w, int lane) {
  const int b = w.base + lane;
  // e(b) = min(max(cu[base + 1 .. b + 1], e(base - 1)), total): a max-scan over the lanes.
  int e = b < p.batch ? __ldg(p.cu_seqlens_qo + b + 1) : w.carry_end;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const int x = __shfl_up_sync(0xffffffffu, e, off);
    if (lane >= off) e = imax(e, x);
  }
  e = next_query_end(w.carry_end, e, p.total_q);
  const int prev = __shfl_up_sync(0xffffffffu, e, 1);
  w.q_begin = lane == 0 ? w.carry_end : prev;
  w.q_end = e;
  const int count = p.h_q * num_m_blocks(e - w.q_begin);
  int incl = count;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const int x = __shfl_up_sync(0xffffffffu, incl, off);
    if (lane >= off) incl += x;
  }
  w.count = count;
  w.incl = incl;
}

// Finds tile `t` (warp-collective); false when t is past the last tile. On success fills `info` and the sequence's
// first key row.
__device__ __forceinline__ bool find_tile(const MhaPrefillParams& p, int t, SeqWindow& w, int lane, TileInfo& info,
                                          int& k_begin) {
  for (;;) {
    const int window_tiles = __shfl_sync(0xffffffffu, w.incl, 31);
    if (t < w.tiles_before + window_tiles) break;
    if (w.base + 32 >= p.batch) return false;
    w.tiles_before += window_tiles;
    w.carry_end = __shfl_sync(0xffffffffu, w.q_end, 31);
    w.base += 32;
    load_window(p, w, lane);
  }
  const uint32_t hit = __ballot_sync(0xffffffffu, w.tiles_before + w.incl > t);
  const int src = __ffs(hit) - 1;
  const int first = w.tiles_before + __shfl_sync(0xffffffffu, w.incl - w.count, src);
  const int seq = w.base + src;
  const int q_begin = __shfl_sync(0xffffffffu, w.q_begin, src);
  const int s_q = __shfl_sync(0xffffffffu, w.q_end, src) - q_begin;
  const RowRange rk = clamp_rows(__ldg(p.cu_seqlens_kv + seq), __ldg(p.cu_seqlens_kv + seq + 1), p.total_k);
  const TileCoord c = tile_coord(t - first, num_m_blocks(s_q), p.causal);
  info.valid = 1;
  info.q_begin = q_begin;
  info.s_q = s_q;
  info.s_k = rk.len;
  info.head = c.head;
  info.m_block = c.m_block;
  info.n_end = key_block_end(s_q, rk.len, c.m_block, p.causal);
  info.pad = 0;
  k_begin = rk.begin;
  return true;
}

// ---------------------------------------------------------------------------------------------------
// Producer (one warp; lane 0 issues the TMA)
// ---------------------------------------------------------------------------------------------------
// TMA coordinates of rows [first, first + 128) of a sequence whose rows are [begin, begin + len) of the tensor
// (launch.cu, make_ragged_map): (column, head, kMaxRows - len + first, begin + len, kMaxRows). Rows at or past len
// are out of the map's bounds and arrive as zeros.
template <class T>
__device__ __forceinline__ void load_rows(uint8_t (*dst)[T::kTileBytes], int tiles, const CUtensorMap* map,
                                          uint64_t* bar, int head, int begin, int len, int first, uint64_t policy) {
  const int window_row = static_cast<int>(kMaxRows) - len + first;
  const int window_end = begin + len;
  for (int g = 0; g < tiles; ++g)
    ptx::tma_load_5d(dst[g], map, bar, g * T::kTileCols, head, window_row, window_end, static_cast<int>(kMaxRows),
                     policy);
}

template <int kDQK, bool kFp16>
__device__ __forceinline__ void produce(const MhaPrefillParams& p, SharedStorage<kDQK, kFp16>& smem,
                                        const CUtensorMap* q_map, const CUtensorMap* k_map, const CUtensorMap* v_map,
                                        int lane) {
  using T = Traits<kDQK, kFp16>;
  // Q is read by one CTA; K and V of a head by every CTA working on that head's query blocks: keep them in L2.
  const uint64_t q_policy = ptx::make_l2_evict_first_policy();
  const uint64_t kv_policy = ptx::make_l2_evict_last_policy();
  SeqWindow win{};
  win.carry_end = first_query_end(__ldg(p.cu_seqlens_qo), p.total_q);
  load_window(p, win, lane);
  uint32_t k_iter = 0, v_iter = 0;  // blocks loaded into each ring so far (stage = iter % kStages)
  // Finds tile `t` and writes its record into `slot` (an invalid record past the last tile); returns the record and
  // the sequence's first key row.
  int ticket = 0;
  auto publish = [&](int t, int slot, int& k_begin) {
    TileInfo info;
    const bool have = find_tile(p, t, win, lane, info, k_begin);
    if (!have) {
      info = TileInfo{};
      info.valid = 0;
    }
    if (lane == 0) smem.tile[slot] = info;
    return info;
  };
  int k_begin = 0, next_k_begin = 0;
  int tile = blockIdx.x;
  TileInfo info = publish(tile, 0, k_begin);
  OPENMLA_MHA_STAMP(Trace::kRoleProducer, 0, Trace::kRecordPublished);
  OPENMLA_MHA_TRACE_META(0, info);
  __syncwarp();
  ptx::named_barrier_sync_unaligned(kExchangeBarrier, kExchangeThreads);  // record 0 published
  for (uint32_t tile_iter = 0; info.valid; ++tile_iter) {
    // The tile after this one is requested now and read at this tile's lookup, after its loads, so the atomic's
    // latency is off the lookup. Not atomicAdd: ptxas makes that a warp-aggregated atomic whose result shuffle waits
    // for the atomic on the spot; the offset read from shared memory (0) keeps the address unprovably uniform, so the
    // ATOMG stays plain. Measured equal to the aggregated form at the lookup (docs/mha-prefill.md, decision
    // mha-v0.10): the wait the trace showed before the exchange was not the atomic's.
    if (p.dynamic_tiles && lane == 0) ticket = ptx::atomic_add_relaxed_gpu(p.tile_counter, smem.zero, 1);
    // Q is free: the consumers passed the exchange of the previous tile after their last Q K^T of it.
    if (lane == 0) {
      if (info.n_end == 0) {
        ptx::mbarrier_arrive(&smem.q_full);  // no Q to load: the arrival alone completes the phase
      } else {
        ptx::mbarrier_arrive_expect_tx(&smem.q_full, T::kQBytes);
        load_rows<T>(smem.q, T::kQKTiles, q_map, &smem.q_full, info.head, info.q_begin, info.s_q,
                     info.m_block * T::kBlockM, q_policy);
      }
      OPENMLA_MHA_STAMP(Trace::kRoleProducer, tile_iter, Trace::kQIssued);
      // Blocks are consumed last first. The consumers take K of block i + 1 together with V of block i, so K runs one
      // block ahead: K(n-1), K(n-2), V(n-1), K(n-3), V(n-2), ..., V(0).
      const int kv_head = info.head / p.heads_per_kv;
      const int nb = info.n_end;
      for (int i = 0; i <= nb; ++i) {
        if (i < nb) {
          const int s = k_iter % T::kStages;
          producer_wait(&smem.k_free[s], ((k_iter / T::kStages) & 1) ^ 1);
          ptx::mbarrier_arrive_expect_tx(&smem.k_full[s], T::kKBytes);
          load_rows<T>(smem.k[s], T::kQKTiles, k_map, &smem.k_full[s], kv_head, k_begin, info.s_k,
                       (nb - 1 - i) * T::kBlockN, kv_policy);
          OPENMLA_MHA_STAMP_BLOCK(Trace::kRoleProducer, tile_iter, i, Trace::kKIssued);
          ++k_iter;
        }
        if (i >= 1) {
          const int s = v_iter % T::kStages;
          producer_wait(&smem.v_free[s], ((v_iter / T::kStages) & 1) ^ 1);
          ptx::mbarrier_arrive_expect_tx(&smem.v_full[s], T::kVBytes);
          load_rows<T>(smem.v[s], T::kVTiles, v_map, &smem.v_full[s], kv_head, k_begin, info.s_k, (nb - i) * T::kBlockN,
                       kv_policy);
          OPENMLA_MHA_STAMP_BLOCK(Trace::kRoleProducer, tile_iter, i - 1, Trace::kVIssued);
          ++v_iter;
        }
      }
    }
    __syncwarp();
    tile = p.dynamic_tiles ? __shfl_sync(0xffffffffu, ticket, 0) + p.grid : tile + p.grid;
    info = publish(tile, (tile_iter + 1) & 1, next_k_begin);
    OPENMLA_MHA_STAMP(Trace::kRoleProducer, tile_iter + 1, Trace::kRecordPublished);
    OPENMLA_MHA_TRACE_META(tile_iter + 1, info);
    k_begin = next_k_begin;
    __syncwarp();
    OPENMLA_MHA_STAMP(Trace::kRoleProducer, tile_iter, Trace::kProducerExchangeEnter);
    // The consumers are past this tile's last Q K^T: the next record is theirs and Q may be rewritten.
    ptx::named_barrier_sync_unaligned(kExchangeBarrier, kExchangeThreads);
    OPENMLA_MHA_STAMP(Trace::kRoleProducer, tile_iter, Trace::kProducerExchangePassed);
  }
}

// ---------------------------------------------------------------------------------------------------
// Consumers
// ---------------------------------------------------------------------------------------------------
// The lse of query row `row` of the tile's sequence (both epilogues).
__device__ __forceinline__ void store_lse(const MhaPrefillParams& p, const TileInfo& info, int row, float lse) {
  p.lse[(static_cast<int64_t>(info.q_begin) + row) * p.lse_stride_t + info.head * p.lse_stride_h] = lse;
}

// Writes this thread's two rows of a tile (4 x 16 bytes each across the quad) from O (already divided by l) and the
// lse, valid rows only. `o` is 64 x 128 fp32 in the m64n128 accumulator layout.
template <bool kFp16>
__device__ __forceinline__ void store_rows(const MhaPrefillParams& p, const TileInfo& info, const float (&o)[64],
                                           const int (&row)[2], const float (&lse)[2], int lane) {
  const int q4 = lane % 4;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const bool live = row[i] < info.s_q;  // the same for the whole quad
    const int64_t token = static_cast<int64_t>(info.q_begin) + row[i];
    uint8_t* dst = static_cast<uint8_t*>(p.out) + 2 * (token * p.out_stride_t + info.head * p.out_stride_h);
    // A 4 x 4 word transpose across the quad gives each lane 8 contiguous columns: 16-byte stores.
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      uint32_t v[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) v[k] = pack2<kFp16>(o[(4 * m + k) * 4 + 2 * i], o[(4 * m + k) * 4 + 2 * i + 1]);
      quad_transpose4(v, q4);
      if (live) *reinterpret_cast<uint4*>(dst + (4 * m + q4) * 16) = make_uint4(v[0], v[1], v[2], v[3]);
    }
    if (live && q4 == 0) store_lse(p, info, row[i], lse[i]);
  }
}

// Stages half `kHalf` of this warpgroup's O (columns 64 kHalf .. + 63, already divided by l) into its 64 x 64
// 128B-swizzled staging tile, the layout of one TMA box, with four stmatrix.x4 per thread: one per 16 columns,
// matrices (rows 0-7, chunk 2c), (rows 8-15, chunk 2c), (rows 0-7, chunk 2c + 1), (rows 8-15, chunk 2c + 1) of the
// warp's 16 rows, i.e. fragment words (4j, 4j + 2) for j = 2c, 2c + 1 of the half. Lane l addresses row
// warp * 16 + 8 ((l / 8) & 1) + l % 8, chunk 2c + l / 16, which lands at 16-byte slot (l / 16 ^ (row & 7)) ^ 2c.
template <bool kFp16, int kHalf>
__device__ __forceinline__ void stage_o_half(const float (&o)[64], uint32_t stage, int wg_tid) {
  const int lane = wg_tid % 32;
  const int row = (wg_tid / 32) * 16 + ((lane >> 3) & 1) * 8 + (lane & 7);
  const uint32_t base = stage + tile::swizzled_chunk(row, lane >> 4);
  constexpr int h = 32 * kHalf;
#pragma unroll
  for (int c = 0; c < 4; ++c)
    ptx::stmatrix_x4(base ^ static_cast<uint32_t>(c << 5), pack2<kFp16>(o[h + 8 * c + 0], o[h + 8 * c + 1]),
                     pack2<kFp16>(o[h + 8 * c + 2], o[h + 8 * c + 3]), pack2<kFp16>(o[h + 8 * c + 4], o[h + 8 * c + 5]),
                     pack2<kFp16>(o[h + 8 * c + 6], o[h + 8 * c + 7]));
}

// kStagedO: O leaves through the staging tiles after SharedStorage (config.h, kOStageTileBytes) and TMA stores on
// `o_map`; else by 16-byte stores from the registers (o_map unused).
template <int kDQK, bool kFp16, int kWg, bool kStagedO>
__device__ __forceinline__ void consume(const MhaPrefillParams& p, SharedStorage<kDQK, kFp16>& smem, int tid,
                                        const CUtensorMap* o_map) {
  using T = Traits<kDQK, kFp16>;
  const int lane = tid % 32;
  const Fragment frag = make_fragment(tid % T::kWarpgroupThreads);
  const uint8_t* q_rows = smem.q[0] + kWg * T::kRowsPerWarpgroup * T::kRowBytes;
  uint32_t k_iter = 0, v_iter = 0;  // blocks consumed from each ring
  // One arrival per warp, by lane 0 after a __syncwarp, so that every lane's accesses before the point are ordered
  // before the arrival (the rings' stages are read by wgmma, which the warp-wide wait already completed; the
  // __syncwarp keeps the rule independent of that and costs nothing measurable).
  auto release = [&](uint64_t* bar) {
    __syncwarp();
    if (lane == 0) ptx::mbarrier_arrive(bar);
  };
  // No ping-pong turns: each warpgroup issues its GEMMs as soon as its K / V stages are full. The softmax chain, not
  // the tensor cores, sets the pace (docs/mha-prefill.md, "Where the time goes"), and the turn wait was a link of that
  // chain; without it every row measured 0.5-1.3 % faster (decision mha-v0.18).
  // The exchange with the producer (config.h, kExchangeBarrier): record 0 is published before the first one; each
  // later one follows this warpgroup's last Q K^T of a tile (Q may then be rewritten; the next record is published).
  auto exchange = [&] { ptx::named_barrier_sync_unaligned(kExchangeBarrier, kExchangeThreads); };
  // Writes this warpgroup's 64 rows of a tile: O (divided by l) and the lse, valid rows only.
  auto write_out = [&](const TileInfo& info, const float (&o)[64], const int (&row)[2], const float (&lse)[2]) {
    if constexpr (kStagedO) {
      // Through the warpgroup's staging tile, 64 columns at a time, by TMA stores that run on while the warpgroup
      // goes on (docs/mha-prefill.md, decision mha-v0.14). Before the tile is rewritten, its previous store has read
      // it: thread 0, which issued it, waits, and the warpgroup's barrier passes that on; a second barrier orders
      // every thread's stmatrix (and the proxy fence) before thread 0 issues the store. Rows past the sequence's end
      // fall outside the map (launch.cu, make_ragged_map) and are not written.
      const int wg_tid = tid % T::kWarpgroupThreads;
      const uint32_t stage = ptx::smem_addr(&smem) + static_cast<uint32_t>(sizeof(smem)) +
                             static_cast<uint32_t>(kWg * kOStageTileBytes<kDQK, kFp16>);
      const int first = info.m_block * T::kBlockM + kWg * T::kRowsPerWarpgroup;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if (wg_tid == 0) ptx::bulk_wait_group_read0();
        ptx::named_barrier_sync(kOStageBarrier + kWg, T::kWarpgroupThreads);
        if (h == 0)
          stage_o_half<kFp16, 0>(o, stage, wg_tid);
        else
          stage_o_half<kFp16, 1>(o, stage, wg_tid);
        ptx::fence_proxy_async_shared();
        ptx::named_barrier_sync(kOStageBarrier + kWg, T::kWarpgroupThreads);
        if (wg_tid == 0) {
          ptx::tma_store_5d(o_map, stage, h * T::kTileCols, info.head, static_cast<int>(kMaxRows) - info.s_q + first,
                            info.q_begin + info.s_q, static_cast<int>(kMaxRows));
          ptx::bulk_commit_group();
        }
      }
#pragma unroll
      for (int i = 0; i < 2; ++i)
        if (row[i] < info.s_q && lane % 4 == 0) store_lse(p, info, row[i], lse[i]);
    } else {
      (void)o_map;
      store_rows<kFp16>(p, info, o, row, lse, lane);
    }
  };
  exchange();
  for (uint32_t tile_iter = 0;; ++tile_iter) {
    const TileInfo info = smem.tile[tile_iter & 1];
    if (!info.valid) {
      if constexpr (kStagedO)  // the last store has read the staging tile before the CTA's shared memory goes
        if (tid % T::kWarpgroupThreads == 0) ptx::bulk_wait_group_read0();
      OPENMLA_MHA_TRACE_CTA_END(tile_iter);
      break;
    }
    OPENMLA_MHA_STAMP(kWg, tile_iter, Trace::kTileStart);
    wait_phase(&smem.q_full, tile_iter & 1);
    OPENMLA_MHA_STAMP(kWg, tile_iter, Trace::kQReady);
    int row[2];  // this thread's rows within the sequence
    row[0] = info.m_block * T::kBlockM + kWg * T::kRowsPerWarpgroup + frag.row[0];
    row[1] = row[0] + 8;
    float o[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) o[i] = 0.f;

    if (info.n_end == 0) {  // no valid row of the tile sees a key: out = 0, lse = +inf
      OPENMLA_MHA_STAMP(kWg, tile_iter, Trace::kExchangeEnter);
      exchange();
      OPENMLA_MHA_STAMP(kWg, tile_iter, Trace::kExchangePassed);
      const float inf[2] = {INFINITY, INFINITY};
      write_out(info, o, row, inf);
      OPENMLA_MHA_STAMP(kWg, tile_iter, Trace::kStoresDone);
      continue;
    }
    int limit[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) limit[i] = row_key_limit(info.s_q, info.s_k, row[i], p.causal);
    float m[2] = {T::kMaxInit, T::kMaxInit};  // running max (scaled, base 2)
    float l[2] = {0.f, 0.f};                  // this thread's partial row sums, relative to m
    float a[2];
    float s[64];
    uint32_t pa[8][4];

    // ---------------------------------------------------------------- first block (the last keys): S only
    int n = info.n_end - 1;
    {
      const int ks = k_iter % T::kStages;
      wait_phase(&smem.k_full[ks], (k_iter / T::kStages) & 1);
      OPENMLA_MHA_STAMP_BLOCK(kWg, tile_iter, 0, Trace::kBlockDataReady);
      OPENMLA_MHA_STAMP_BLOCK(kWg, tile_iter, 0, Trace::kBlockTurn);
      ptx::wgmma_fence();
      issue_qk<T>(s, q_rows, smem.k[ks][0]);
      ptx::wgmma_commit();
      OPENMLA_MHA_STAMP_BLOCK(kWg, tile_iter, 0, Trace::kBlockIssued);
      ptx::wgmma_wait<0>();
      ptx::fence_registers(s);
      OPENMLA_MHA_STAMP_BLOCK(kWg, tile_iter, 0, Trace::kBlockQkDone);
      release(&smem.k_free[ks]);
      ++k_iter;
      if (n == 0) {
        OPENMLA_MHA_STAMP(kWg, tile_iter, Trace::kExchangeEnter);
        exchange();
        OPENMLA_MHA_STAMP(kWg, tile_iter, Trace::kExchangePassed);
      }
      if (block_needs_mask(info.s_q, info.s_k, info.m_block, n, p.causal))
        mask_block(s, limit, n * T::kBlockN, frag.col);
      softmax_step(s, p.scale_log2, m, l, a);  // O is still 0: no rescale
      a[0] = a[1] = 1.f;
      OPENMLA_MHA_STAMP_BLOCK(kWg, tile_iter, 0, Trace::kBlockSoftmaxDone);
      to_a_fragments<kFp16>(s, pa);
    }

    // ---------------------------------------------------------------- main loop: S of block n with P V of block n + 1
    for (--n; n >= 0; --n) {
      const int ks = k_iter % T::kStages, vs = v_iter % T::kStages;
      wait_phase(&smem.k_full[ks], (k_iter / T::kStages) & 1);
      wait_phase(&smem.v_full[vs], (v_iter / T::kStages) & 1);
      OPENMLA_MHA_STAMP_BLOCK(kWg, tile_iter, info.n_end - 1 - n, Trace::kBlockDataReady);
      OPENMLA_MHA_STAMP_BLOCK(kWg, tile_iter, info.n_end - 1 - n, Trace::kBlockTurn);
      ptx::wgmma_fence();
      issue_qk<T>(s, q_rows, smem.k[ks][0]);
      ptx::wgmma_commit();
      // O's rescale to the max after block n + 1 (the previous step's softmax; its P V is done) runs while this Q K^T
      // is on the tensor cores, off the step's chain (FA3's order); the fence orders it before the P V into O.
      rescale_o(o, a);
      ptx::wgmma_fence();
      issue_pv<T>(o, pa, smem.v[vs][0]);
      ptx::wgmma_commit();
      OPENMLA_MHA_STAMP_BLOCK(kWg, tile_iter, info.n_end - 1 - n, Trace::kBlockIssued);
      ptx::wgmma_wait<1>();  // S done; P V may still run (it reads pa, which stays untouched until it is done)
      ptx::fence_registers(s);
      OPENMLA_MHA_STAMP_BLOCK(kWg, tile_iter, info.n_end - 1 - n, Trace::kBlockQkDone);
      release(&smem.k_free[ks]);
      ++k_iter;
      if (n == 0) {
        OPENMLA_MHA_STAMP(kWg, tile_iter, Trace::kExchangeEnter);
        exchange();
        OPENMLA_MHA_STAMP(kWg, tile_iter, Trace::kExchangePassed);
      }
      if (block_needs_mask(info.s_q, info.s_k, info.m_block, n, p.causal))
        mask_block(s, limit, n * T::kBlockN, frag.col);
      softmax_step(s, p.scale_log2, m, l, a);
      OPENMLA_MHA_STAMP_BLOCK(kWg, tile_iter, info.n_end - 1 - n, Trace::kBlockSoftmaxDone);
      ptx::wgmma_wait<0>();
      ptx::fence_registers(o);
      OPENMLA_MHA_STAMP_BLOCK(kWg, tile_iter, info.n_end - 2 - n, Trace::kBlockPvDone);
      release(&smem.v_free[vs]);
      ++v_iter;
      to_a_fragments<kFp16>(s, pa);  // O's rescale by `a` waits for the next step, behind its Q K^T
    }

    // ---------------------------------------------------------------- last P V (block 0)
    {
      const int vs = v_iter % T::kStages;
      wait_phase(&smem.v_full[vs], (v_iter / T::kStages) & 1);
      OPENMLA_MHA_STAMP(kWg, tile_iter, Trace::kLastPvReady);
      OPENMLA_MHA_STAMP(kWg, tile_iter, Trace::kLastPvTurn);
      rescale_o(o, a);  // to the max after block 0
      ptx::wgmma_fence();
      issue_pv<T>(o, pa, smem.v[vs][0]);
      ptx::wgmma_commit();
      OPENMLA_MHA_STAMP(kWg, tile_iter, Trace::kLastPvIssued);
      ptx::wgmma_wait<0>();
      ptx::fence_registers(o);
      OPENMLA_MHA_STAMP(kWg, tile_iter, Trace::kLastPvDone);
      OPENMLA_MHA_STAMP_BLOCK(kWg, tile_iter, info.n_end - 1, Trace::kBlockPvDone);
      release(&smem.v_free[vs]);
      ++v_iter;
    }

    // ---------------------------------------------------------------- epilogue
    float lse[2];
    float inv[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const float total = quad_sum(l[i]);
      // A row with a visible key has l >= 1 (its max contributes 2^0); l = 0: no key, out 0 and lse +inf. (NaN in
      // the inputs propagates to out and lse, as in the reference.)
      const bool none = total == 0.f;
      inv[i] = none ? 0.f : 1.f / total;
      lse[i] = none ? INFINITY : (m[i] + log2f(total)) * kLn2;
    }
    rescale_o(o, inv);
    write_out(info, o, row, lse);
    OPENMLA_MHA_STAMP(kWg, tile_iter, Trace::kStoresDone);
  }
}

// ---------------------------------------------------------------------------------------------------
// The kernel
// ---------------------------------------------------------------------------------------------------
// The body of both kernels; `o_map` is null in the direct-store one.
template <int kDQK, bool kFp16, bool kStagedO>
__device__ __forceinline__ void kernel_body(const MhaPrefillParams& p, const CUtensorMap* q_map,
                                            const CUtensorMap* k_map, const CUtensorMap* v_map,
                                            const CUtensorMap* o_map) {
  using T = Traits<kDQK, kFp16>;
  using Smem = SharedStorage<kDQK, kFp16>;
  extern __shared__ uint8_t smem_raw[];
  Smem& smem = *reinterpret_cast<Smem*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  const int tid = threadIdx.x;
  // Warp-uniform role (wgmma under a branch ptxas cannot prove uniform is serialised).
  const int wg = __shfl_sync(0xffffffffu, tid / T::kWarpgroupThreads, 0);

  if (tid == 0) {
    ptx::prefetch_tensormap(q_map);
    ptx::prefetch_tensormap(k_map);
    ptx::prefetch_tensormap(v_map);
    if constexpr (kStagedO) ptx::prefetch_tensormap(o_map);
    smem.zero = 0;
    ptx::mbarrier_init(&smem.q_full, 1);
    for (int s = 0; s < T::kStages; ++s) {
      ptx::mbarrier_init(&smem.k_full[s], 1);
      ptx::mbarrier_init(&smem.k_free[s], kConsumerWarps);
      ptx::mbarrier_init(&smem.v_full[s], 1);
      ptx::mbarrier_init(&smem.v_free[s], kConsumerWarps);
    }
    ptx::fence_mbarrier_init();
    OPENMLA_MHA_TRACE_CTA_START();
  }
  __syncthreads();

  // Each role ends in its own exit so that ptxas keeps the register budgets apart.
  if (wg == 2) {
    ptx::setmaxnreg_dec<T::kRegsProducer>();
    if (tid / 32 == 2 * T::kWarpgroupThreads / 32) produce<kDQK, kFp16>(p, smem, q_map, k_map, v_map, tid % 32);
    return;
  } else if (wg == 0) {
    ptx::setmaxnreg_inc<T::kRegsConsumer>();
    consume<kDQK, kFp16, 0, kStagedO>(p, smem, tid, o_map);
    return;
  } else {
    ptx::setmaxnreg_inc<T::kRegsConsumer>();
    consume<kDQK, kFp16, 1, kStagedO>(p, smem, tid, o_map);
    return;
  }
}

// O by 16-byte stores from the registers: long sequences (heuristics/mha_prefill_launch.h, staged_out).
template <int kDQK, bool kFp16>
__global__ void __launch_bounds__(Traits<kDQK, kFp16>::kThreads, 1)
    mha_prefill_kernel(const __grid_constant__ MhaPrefillParams p, const __grid_constant__ CUtensorMap q_map,
                       const __grid_constant__ CUtensorMap k_map, const __grid_constant__ CUtensorMap v_map) {
  kernel_body<kDQK, kFp16, false>(p, &q_map, &k_map, &v_map, nullptr);
}

// O through shared memory and TMA stores: short sequences, where the epilogue is a large part of a tile.
template <int kDQK, bool kFp16>
__global__ void __launch_bounds__(Traits<kDQK, kFp16>::kThreads, 1)
    mha_prefill_staged_kernel(const __grid_constant__ MhaPrefillParams p, const __grid_constant__ CUtensorMap q_map,
                              const __grid_constant__ CUtensorMap k_map, const __grid_constant__ CUtensorMap v_map,
                              const __grid_constant__ CUtensorMap o_map) {
  kernel_body<kDQK, kFp16, true>(p, &q_map, &k_map, &v_map, &o_map);
}

}  // namespace openmla::kernels::mha_prefill
