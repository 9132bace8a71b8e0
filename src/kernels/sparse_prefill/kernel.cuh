// Sparse top-k MLA prefill kernel (sm_90a): every query token attends to the kv rows its own index row selects.
//
// A tile is (query token, 64 heads). Persistent CTAs (one per SM) walk the tiles c, c + grid, ... Each CTA has
// three warpgroups:
//   WG2, the producer: loads each tile's Q by TMA, gathers the selected kv rows of every 64-slot block by
//       16-byte cp.async straight into 128B-swizzled K tiles (invalid slots are zero-filled, never read) and
//       publishes the block's validity mask; it runs ahead across tile boundaries, bounded by two K buffers;
//   WG0, WG1, the consumers: the seesaw over block pairs of dense decode (docs/dense-decode.md): WG0 owns
//       O[:, 0:256] and computes Q K0^T, WG1 owns O[:, 256:512] and computes Q K1^T; the two online-softmax
//       updates are chained through shared memory so one warpgroup's softmax overlaps the other's wgmma.
// The output leaves straight from the accumulators (no staging), so the producer can fill the K buffers with
// the next tile's blocks while the consumers finish the current one. The Q load, the softmax parts, the issue loops,
// the hand-offs, the mask and the row stores are the layer's (src/common/, docs/architecture.md "Device layer"); this
// file composes them into the roles. Design note: docs/sparse-prefill.md.
#pragma once

#include <cstdint>

#include "common/attention_mask.cuh"
#include "common/barrier_ring.cuh"
#include "common/cta.cuh"
#include "common/epilogue.cuh"
#include "common/mma_tile.cuh"
#include "common/online_softmax.cuh"
#include "common/ptx.cuh"
#include "common/q_tile.cuh"
#include "common/seesaw.cuh"
#include "common/tile_gemm.cuh"
#include "common/trace.cuh"
#include "kernels/sparse_prefill/config.h"
#include "kernels/sparse_prefill/params.h"

namespace openmla::kernels::sparse_prefill {

using tile::exponentiate;
using tile::Fragment;
using tile::make_fragment;
using tile::quad_sum;
using tile::row_max;
using tile::scale_rows;
using tile::scale_rows_if_changed;
// Each wgmma's descriptor is its buffer's low word plus the slice's offset (common/tile_gemm.cuh, DescLowWord;
// decision sparse-prefill-v8).
using Desc = tile::DescLowWord;
// The K buffers' and the Q tile's barriers complete once per use: parity = uses & 1 (common/barrier_ring.cuh).
using Uses = pipeline::BarrierRing<1>;

// ---------------------------------------------------------------------------------------------------
// PTX used by this kernel only
// ---------------------------------------------------------------------------------------------------
// 16-byte gather of one kv chunk into shared memory with an L2 cache policy and an L2 prefetch of
// OPENMLA_SP_L2_PREFETCH bytes (128: the 256 of FlashMLA pulls half of the neighbouring 1152-byte row into L2 with a
// row's last chunk; docs/sparse-prefill.md, decision sparse-prefill-v6); src_bytes = 0 zero-fills the destination
// without reading `src`.
__device__ __forceinline__ void cp_async_16_hint(uint32_t smem_dst, const void* src, uint32_t src_bytes,
                                                 uint64_t policy) {
#if OPENMLA_SP_L2_PREFETCH == 128
  asm volatile("cp.async.cg.shared.global.L2::cache_hint.L2::128B [%0], [%1], 16, %2, %3;" ::"r"(smem_dst), "l"(src),
               "r"(src_bytes), "l"(policy)
               : "memory");
#else
  asm volatile("cp.async.cg.shared.global.L2::cache_hint.L2::256B [%0], [%1], 16, %2, %3;" ::"r"(smem_dst), "l"(src),
               "r"(src_bytes), "l"(policy)
               : "memory");
#endif
}
// Pulls `bytes` (a multiple of 16, 16-byte aligned) of global memory into L2.
__device__ __forceinline__ void bulk_prefetch_l2(const void* src, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src), "r"(bytes) : "memory");
}

// ---------------------------------------------------------------------------------------------------
// Trace builds (CMake -DOPENMLA_TRACE=ON): the clock64 pair steps of config.h, struct Trace, in the format of
// common/trace.cuh (tools/diag/kernel_trace.py sparse-prefill reads it). Without the option the macro is empty and the
// kernel compiles to the production SASS.
// ---------------------------------------------------------------------------------------------------
#if defined(OPENMLA_HAS_TRACE)
#define OPENMLA_PREFILL_TRACE_ON 1
__device__ unsigned long long g_trace[Trace::Format::kDeviceValues];
// Event `ev` of `role`'s pair `pair` (thread 0 of each warpgroup). The producer's first pair start is the CTA header's
// start; each of WG0's tile epilogues its end so far.
__device__ __forceinline__ void trace_stamp(int role, uint32_t pair, int ev) {
  if (!trace::warpgroup_leader()) return;
  trace::stamp<Trace::Format, 0>(g_trace, role, pair, ev);
  if (role == Trace::kRoleProducer && pair == 0 && ev == Trace::kProdStart) trace::cta_start<Trace::Format>(g_trace);
  if (role == Trace::kRoleWg0 && ev == Trace::kWg0Epilogue) trace::cta_end<Trace::Format>(g_trace, pair + 1);
}
#endif
#define OPENMLA_PREFILL_STAMP(role, pair, ev) \
  OPENMLA_TRACE_ONLY(::openmla::kernels::sparse_prefill::trace_stamp(role, pair, ev))

// ---------------------------------------------------------------------------------------------------
// Work of one tile
// ---------------------------------------------------------------------------------------------------
struct TileWork {
  int token;
  int head0;
  int len;         // valid slot range [0, len) of the index row
  int num_blocks;  // ceil(len / 64)
};

__device__ __forceinline__ TileWork tile_work(const SparsePrefillParams& p, int tile) {
  TileWork w;
  w.token = tile / p.num_head_tiles;
  w.head0 = (tile - w.token * p.num_head_tiles) * 64;
  w.len = p.topk;
  if (p.topk_length != nullptr) w.len = min(max(__ldg(p.topk_length + w.token), 0), p.topk);
  w.num_blocks = (w.len + 63) / 64;
  return w;
}

// ---------------------------------------------------------------------------------------------------
// Producer
// ---------------------------------------------------------------------------------------------------
// Index of slot `16 * warp + lane % 16` of block `blk0 + lane / 16` (so a warp covers 16 rows of both blocks of a
// pair), or -1 when the slot is past the tile's length or the index is outside [0, s_kv).
__device__ __forceinline__ int load_pair_index(const SparsePrefillParams& p, const TileWork& w, int blk0, int warp,
                                               int lane) {
  const int slot = (blk0 + lane / 16) * 64 + warp * 16 + lane % 16;
  if (blk0 >= w.num_blocks || slot >= w.len) return -1;
  const int idx = __ldg(p.indices + static_cast<int64_t>(w.token) * p.indices_stride_s + slot);
  return static_cast<unsigned>(idx) < static_cast<unsigned>(p.s_kv) ? idx : -1;
}

// A block pair in the CTA's sequence of tiles (tiles without blocks are skipped); past the end: tile >= num_tiles
// and an empty TileWork (every index load then yields -1 without reading).
struct PairCursor {
  int tile;
  int blk0;
  TileWork w;
};

__device__ __forceinline__ void skip_finished_tiles(const SparsePrefillParams& p, PairCursor& c) {
  while (c.tile < p.num_tiles && c.blk0 >= c.w.num_blocks) {
    c.tile += p.grid;
    c.blk0 = 0;
    c.w = c.tile < p.num_tiles ? tile_work(p, c.tile) : TileWork{};
  }
}

__device__ __forceinline__ PairCursor next_pair(const SparsePrefillParams& p, PairCursor c) {
  c.blk0 += 2;
  skip_finished_tiles(p, c);
  return c;
}

template <int kDQK>
__device__ __forceinline__ void produce(const SparsePrefillParams& p, SharedStorage<kDQK>& smem,
                                        const CUtensorMap* q_map, int wg_tid) {
  using T = Traits<kDQK>;
  const int warp = wg_tid / 32, lane = wg_tid % 32;
  const int lane_row = lane / 8, chunk = lane % 8;  // rows 16 warp + lane_row + 4 j, 16-byte chunk `chunk`
  const auto* kv = static_cast<const uint8_t*>(p.kv);
  const int64_t kv_row_bytes = p.kv_stride_s * 2;
  // Every kv row is read by both head tiles of a token (h_q = 128) and by other tokens: keep them in L2.
  const uint64_t policy = ptx::make_l2_evict_last_policy();
  // Q is read once per tile (docs/sparse-prefill.md, decision sparse-prefill-v7).
  const uint64_t q_policy = ptx::make_l2_evict_first_policy();
  uint32_t use[2] = {0, 0};  // fills of each K buffer so far: free/full parity

  // Fills tile group `grp` of buffer `buf` with this thread's 4 rows x the group's tiles (row indices in `ridx`,
  // -1: zero-fill), once its last reader released it. `valid16`: written before the first group of a buffer.
  auto fill = [&](int buf, int grp, const int (&ridx)[T::kRowsPerThread], bool first, uint32_t valid16) {
    ptx::mbarrier_wait_parity(&smem.free_[buf][grp], Uses::free_parity(use[buf]));
    if (first && lane == 0) smem.valid[buf][warp] = static_cast<uint16_t>(valid16);
    const int t_begin = grp * T::kVTilesPerHalf;
    const int t_end = grp == 2 ? T::kNumTiles : t_begin + T::kVTilesPerHalf;
#pragma unroll
    for (int j = 0; j < T::kRowsPerThread; ++j) {
      const int row = warp * T::kRowsPerWarp + lane_row + 4 * j;
      const bool ok = ridx[j] >= 0;
      const uint8_t* src = kv + (ok ? static_cast<int64_t>(ridx[j]) * kv_row_bytes : 0) + chunk * 16;
      const uint32_t dst = ptx::smem_addr(smem.k[buf][0]) + tile::swizzled_chunk(row, chunk);
#pragma unroll
      for (int t = t_begin; t < t_end; ++t)
        cp_async_16_hint(dst + t * T::kTileBytes, src + t * T::kRowBytes, ok ? 16u : 0u, policy);
    }
    ptx::cp_async_mbarrier_arrive_noinc(&smem.full[buf][grp]);
    // The plain arrival (release) publishes the validity word written above.
    if (lane == 0) ptx::mbarrier_arrive(&smem.full[buf][grp]);
  };

  // Look-ahead over the pairs to come (across tiles): the next pair's indices are loaded one pair ahead and, once
  // landed, its kv rows are pulled into L2 (bulk prefetch) so that the fills find them there.
  PairCursor ahead = {static_cast<int>(blockIdx.x), 0, {}};
  ahead.w = ahead.tile < p.num_tiles ? tile_work(p, ahead.tile) : TileWork{};
  skip_finished_tiles(p, ahead);
  int idx_next = load_pair_index(p, ahead.w, ahead.blk0, warp, lane);  // the CTA's first pair
  ahead = next_pair(p, ahead);

  int tile = blockIdx.x;
  uint32_t tile_iter = 0;
  uint32_t pair_count = 0;  // trace only
  TileWork w = tile_work(p, tile);
  for (; tile < p.num_tiles; tile += p.grid, ++tile_iter) {
    if (tile != static_cast<int>(blockIdx.x)) w = tile_work(p, tile);
    // Q of this tile, once both consumer warpgroups are past the previous tile's last Q K^T.
    if (wg_tid == 0) {
      ptx::mbarrier_wait_parity(&smem.q_free, Uses::free_parity(tile_iter));
      load_q_tile_tma<T::kNumTiles>(smem.q, q_map, &smem.q_full, w.head0, w.token, 0, q_policy);
    }
    for (int blk0 = 0; blk0 < w.num_blocks; blk0 += 2) {
      const bool has_k1 = blk0 + 1 < w.num_blocks;
      OPENMLA_PREFILL_STAMP(2, pair_count, 0);
      const int idx = idx_next;
      // The next pair's indices are requested now; its rows go to L2 at the end of this pair, once the index load
      // has landed. (Two pairs ahead measured up to 32 % slower on the rows that miss L2: docs/sparse-prefill.md.)
      idx_next = load_pair_index(p, ahead.w, ahead.blk0, warp, lane);
      ahead = next_pair(p, ahead);
      const uint32_t valid = __ballot_sync(0xffffffffu, idx >= 0);
      int ridx0[T::kRowsPerThread], ridx1[T::kRowsPerThread];
#pragma unroll
      for (int j = 0; j < T::kRowsPerThread; ++j) {
        ridx0[j] = __shfl_sync(0xffffffffu, idx, lane_row + 4 * j);
        ridx1[j] = __shfl_sync(0xffffffffu, idx, 16 + lane_row + 4 * j);
      }
      // Issue order = release order of the consumers (K0 V_L after WG0's P0 V_L, K1 V_R after WG1's P1 V_R, the
      // rest at the end of the pair), and within a buffer the order its Q K^T reads the tiles.
      fill(0, 0, ridx0, true, valid & 0xffffu);
      OPENMLA_PREFILL_STAMP(2, pair_count, 1);
      if (has_k1) fill(1, 1, ridx1, true, valid >> 16);
      OPENMLA_PREFILL_STAMP(2, pair_count, 2);
      fill(0, 1, ridx0, false, 0);
      OPENMLA_PREFILL_STAMP(2, pair_count, 3);
      if constexpr (T::kNumGroups == 3) fill(0, 2, ridx0, false, 0);
      OPENMLA_PREFILL_STAMP(2, pair_count, 4);
      if (has_k1) {
        if constexpr (T::kNumGroups == 3) fill(1, 2, ridx1, false, 0);
        OPENMLA_PREFILL_STAMP(2, pair_count, 5);
        fill(1, 0, ridx1, false, 0);
        OPENMLA_PREFILL_STAMP(2, pair_count, 6);
      }
      ++use[0];
      if (has_k1) ++use[1];
      if (idx_next >= 0) bulk_prefetch_l2(kv + static_cast<int64_t>(idx_next) * kv_row_bytes, T::kHeadDimQK * 2);
      OPENMLA_PREFILL_STAMP(2, pair_count, 7);
      ++pair_count;
    }
  }
  // Nothing may be in flight when the warpgroup exits.
  ptx::cp_async_wait_all();
}

// ---------------------------------------------------------------------------------------------------
// Consumers
// ---------------------------------------------------------------------------------------------------
// After a `full` wait, before the wgmma that read the gathered rows: the producer's cp.async wrote them in the generic
// proxy and released them through the mbarrier; wgmma reads in the async proxy. The acquire-side proxy fence is the
// PTX ISA's form for exactly this hand-off and costs no instruction on sm_90a; the bidirectional fence (before
// decision sparse-prefill-v8) is MEMBAR.ALL.CTA + FENCE.VIEW.ASYNC.S, which the seesaw's chain pays three times a pair
// (docs/sparse-prefill.md, "Tried and not kept": dropping it measured +0.8 to +2 %).
__device__ __forceinline__ void gathered_fence() {
  ptx::fence_proxy_async_acquire_shared();
}

// Issues (no commit, no wait) the wgmmas of S += Q K^T over kCount tiles of K buffer `buf` starting at tile kFirst
// (modulo the tile count), each tile group waited for as it is reached; `init`: the first one overwrites S.
template <int kDQK, int kFirst, int kCount>
__device__ __forceinline__ void issue_qk(float (&s)[32], SharedStorage<kDQK>& smem, int buf, uint32_t phase,
                                         bool init) {
  using T = Traits<kDQK>;
#pragma unroll
  for (int i = 0; i < kCount; ++i) {
    const int t = (i + kFirst) % T::kNumTiles;
    if (t % T::kVTilesPerHalf == 0) {
      ptx::mbarrier_wait_parity(&smem.full[buf][t / T::kVTilesPerHalf], phase);
      gathered_fence();  // cp.async (generic proxy) writes -> wgmma (async proxy) reads
    }
    const uint32_t q = Desc::base<tile::kLboKMajor>(smem.q[0]), k = Desc::base<tile::kLboKMajor>(smem.k[buf][0]);
    tile::issue_qk_tile<false, Desc, T::kBlockN, T::kTileBytes>(s, q, k, t, init && i == 0);
  }
}

// S = Q K^T over all tiles of K buffer `buf` (kFirstTile rotates the order: WG1 starts with the V_R group, which
// the producer refills first).
template <int kDQK, int kFirstTile>
__device__ __forceinline__ void gemm_qk(float (&s)[32], SharedStorage<kDQK>& smem, int buf, uint32_t phase) {
  ptx::wgmma_fence();
  issue_qk<kDQK, kFirstTile, Traits<kDQK>::kNumTiles>(s, smem, buf, phase, true);
  ptx::wgmma_commit();
  ptx::wgmma_wait<0>();
  ptx::fence_registers(s);
}

// Stores P (bf16) into a 128B-swizzled 64 x 64 tile for the other warpgroup's shared-A wgmma (tile::stmatrix_tile:
// four stmatrix.x4 per thread, decision sparse-prefill-v4) and fences the stores for the async proxy (the hand-off
// barrier that follows publishes them).
__device__ __forceinline__ void store_p(const float (&s)[32], uint8_t* tile, int wg_tid) {
  tile::stmatrix_tile<false, 0>(s, ptx::smem_addr(tile), wg_tid);
  ptx::fence_proxy_async_shared();
}

// The P V steps on tiles of 64 rows (8 KB): O_half (64 x 256) += P V_half over 64 slots, 4 k16 slices.
__device__ __forceinline__ void issue_pv_rs(float (&o)[128], const uint32_t (&pa)[4][4], const uint8_t* v_tiles) {
  tile::issue_pv_rs<false, Desc, tile::kTileBytes, 256>(o, pa, v_tiles);
}
__device__ __forceinline__ void issue_pv_ss(float (&o)[128], const uint8_t* p_tile, const uint8_t* v_tiles) {
  tile::issue_pv_ss<false, Desc, tile::kTileBytes, 256, 4>(o, p_tile, v_tiles);
}

template <int kDQK, int kWg>
__device__ __forceinline__ void consume(const SparsePrefillParams& p, SharedStorage<kDQK>& smem, int tid) {
  using T = Traits<kDQK>;
  const int wg_tid = tid % T::kWarpgroupThreads;
  const int lane = tid % 32;
  uint8_t* const p_tile[2] = {T::kPInRopeTile ? smem.k[0][T::kRopeTile] : smem.p[0],
                              T::kPInRopeTile ? smem.k[1][T::kRopeTile] : smem.p[T::kPInRopeTile ? 0 : 1]};
  uint32_t use[2] = {0, 0};  // fills of each K buffer consumed so far: full parity (Uses)
  auto arrive = [&](uint64_t* bar) { ptx::mbarrier_arrive(bar); };
  // Hand-offs between the consumer warpgroups (one completion per pair): arrive / wait, the phase flipped per pair.
  pipeline::Handoffs<Handoff> handoff{smem.handoff};

  uint32_t tile_iter = 0;
  uint32_t pair_count = 0;  // trace only
  float s[32];
  // WG0: the first Q K0^T group of the next pair is already in flight (issued behind P1 V1_L inside a tile).
  bool qk_head_issued = false;
  for (int tile = blockIdx.x; tile < p.num_tiles; tile += p.grid, ++tile_iter) {
    const TileWork w = tile_work(p, tile);
    ptx::mbarrier_wait_parity(&smem.q_full, Uses::parity(tile_iter));
    if (w.num_blocks == 0) arrive(&smem.q_free);

    // The sink of this thread's two rows, loaded now so that its latency stays off the epilogue.
    float sink[2] = {-INFINITY, -INFINITY};
    if (p.attn_sink != nullptr) {
      const Fragment f = make_fragment(wg_tid);
#pragma unroll
      for (int i = 0; i < 2; ++i)
        if (w.head0 + f.row[i] < p.h_q) sink[i] = __ldg(p.attn_sink + w.head0 + f.row[i]);
    }
    float o[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.f;
    float m_run[2] = {T::kMaxInit, T::kMaxInit};  // running max, scaled base-2 units (shared by both warpgroups)
    float l_run[2] = {0.f, 0.f};                   // this warpgroup's partial row sums, relative to m_run

    // ---------------------------------------------------------------- main loop over block pairs
    // WG0 issues the next pair's Q K0^T over the V_L tiles (refilled first, after its own P0 V0_L) right behind
    // P1 V1_L, before waiting for it: the tensor pipe stays fed while the V_R and RoPE tiles, refilled only after
    // WG1's last P V of the pair, are still in flight (docs/sparse-prefill.md, decision sparse-prefill-v2).
    for (int blk0 = 0; blk0 < w.num_blocks; blk0 += 2) {
      const bool has_k1 = blk0 + 1 < w.num_blocks;
      const bool last_pair = blk0 + 2 >= w.num_blocks;
      const uint32_t ph0 = Uses::parity(use[0]), ph1 = Uses::parity(use[1]);
      const Fragment frag = make_fragment(ptx::launder32(tid) % T::kWarpgroupThreads);
      OPENMLA_PREFILL_STAMP(kWg, pair_count, 0);
      uint32_t pa[4][4];
      if constexpr (kWg == 0) {
        // S0 = Q K0^T; m0 = max(m, rowmax S0), a0 = 2^(m - m0); publish; O_L = a0 O_L + P0 V0_L.
        constexpr int kHead = T::kVTilesPerHalf;  // tiles issued early (the V_L group)
        if (!qk_head_issued) {
          ptx::wgmma_fence();
          issue_qk<kDQK, 0, kHead>(s, smem, 0, ph0, true);
        }
        issue_qk<kDQK, kHead, T::kNumTiles - kHead>(s, smem, 0, ph0, false);
        ptx::wgmma_commit();
        ptx::wgmma_wait<0>();
        ptx::fence_registers(s);
        OPENMLA_PREFILL_STAMP(0, pair_count, 1);
        if (last_pair) arrive(&smem.q_free);
        mask::by_valid_bits(s, *reinterpret_cast<const uint64_t*>(smem.valid[0]), frag.col);
        float a0[2];
        seesaw::wg0_softmax(s, p.scale_log2, m_run, l_run, smem, frag, lane, a0);
        handoff.arrive(Handoff::kMax0Ready);
        OPENMLA_PREFILL_STAMP(0, pair_count, 2);
        scale_rows_if_changed(o, a0[0], a0[1]);
        tile::to_a_fragments<false>(s, pa);
        tile::gemm_pv_rs<false, Desc>(o, pa, smem.k[0][0]);
        arrive(&smem.free_[0][0]);
        OPENMLA_PREFILL_STAMP(0, pair_count, 3);

        // a1 and P1 from WG1; P0 rescaled to m1 goes to WG1.
        handoff.wait(Handoff::kScale1Ready);
        OPENMLA_PREFILL_STAMP(0, pair_count, 4);
        float a1[2];
        seesaw::wg0_receive(smem, frag, m_run, l_run, a1);
        scale_rows_if_changed(s, a1[0], a1[1]);
        store_p(s, p_tile[0], wg_tid);
        handoff.arrive(Handoff::kP0Ready);
        OPENMLA_PREFILL_STAMP(0, pair_count, 5);
        // O_L = a1 O_L + P1 V1_L.
        scale_rows_if_changed(o, a1[0], a1[1]);
        handoff.wait(Handoff::kP1Ready);  // every pair, even without K1
        // has_k1 is false only in a tile's last pair, so the next pair (if any) follows in this tile.
        qk_head_issued = false;
        if (has_k1) {
          ptx::mbarrier_wait_parity(&smem.full[1][0], ph1);
          gathered_fence();
          ptx::wgmma_fence();
          issue_pv_ss(o, p_tile[1], smem.k[1][0]);
          ptx::wgmma_commit();
          if (!last_pair) {
            issue_qk<kDQK, 0, kHead>(s, smem, 0, ph0 ^ 1, true);
            ptx::wgmma_commit();
            qk_head_issued = true;
            ptx::wgmma_wait<1>();  // P1 V1_L done; the next Q K0^T head may still run
          } else {
            ptx::wgmma_wait<0>();
          }
          ptx::fence_registers(o);
          arrive(&smem.free_[1][0]);
          if constexpr (T::kNumGroups == 3) arrive(&smem.free_[1][2]);  // P1 lived in K1's RoPE tile
        }
        OPENMLA_PREFILL_STAMP(0, pair_count, 6);
      } else {
        // S1 = Q K1^T (V_R tiles first).
        float mx[2] = {-INFINITY, -INFINITY};
        if (has_k1) {
          gemm_qk<kDQK, T::kVTilesPerHalf>(s, smem, 1, ph1);
          mask::by_valid_bits(s, *reinterpret_cast<const uint64_t*>(smem.valid[1]), frag.col);
          row_max(s, mx);
        }
        OPENMLA_PREFILL_STAMP(1, pair_count, 1);
        if (last_pair) arrive(&smem.q_free);
        // m1 = max(m0, rowmax S1), a1 = 2^(m0 - m1); O_R = a0 a1 O_R + P1 V1_R.
        handoff.wait(Handoff::kMax0Ready);
        OPENMLA_PREFILL_STAMP(1, pair_count, 2);
        float m1[2], a1[2], a01[2], sum[2] = {0.f, 0.f};
        seesaw::wg1_rescale(mx, p.scale_log2, m_run, smem, frag, lane, m1, a1, a01);
        // m1 and a1 go out before the exponentials: WG0 rescales and stores P0 while this warpgroup computes P1.
        handoff.arrive(Handoff::kScale1Ready);
        if (has_k1) {
          exponentiate(s, p.scale_log2, m1, sum);
          store_p(s, p_tile[1], wg_tid);
        }
        handoff.arrive(Handoff::kP1Ready);
        OPENMLA_PREFILL_STAMP(1, pair_count, 3);
        softmax::update_row_sums(l_run, a01, sum);
        scale_rows_if_changed(o, a01[0], a01[1]);
        // O_R += P1 V1_R, then O_R += P0 V0_R queued right behind it (the same accumulator chains in order); K1's
        // V_R group is released once the first group of wgmmas is done.
        if (has_k1) {
          tile::to_a_fragments<false>(s, pa);
          ptx::wgmma_fence();
          issue_pv_rs(o, pa, smem.k[1][T::kVTilesPerHalf]);
          ptx::wgmma_commit();
        }
        OPENMLA_PREFILL_STAMP(1, pair_count, 4);
        handoff.wait(Handoff::kP0Ready);
        OPENMLA_PREFILL_STAMP(1, pair_count, 5);
        ptx::mbarrier_wait_parity(&smem.full[0][1], ph0);
        gathered_fence();
        ptx::wgmma_fence();  // does not wait for P1 V1_R; orders the rescale of O above when there was no K1
        issue_pv_ss(o, p_tile[0], smem.k[0][T::kVTilesPerHalf]);
        ptx::wgmma_commit();
        if (has_k1) {
          ptx::wgmma_wait<1>();
          ptx::fence_registers(pa);  // pa stays allocated until P1 V1_R, which reads it, is done
          arrive(&smem.free_[1][1]);
        }
        ptx::wgmma_wait<0>();
        ptx::fence_registers(o);
        arrive(&smem.free_[0][1]);
        if constexpr (T::kNumGroups == 3) arrive(&smem.free_[0][2]);  // P0 lived in K0's RoPE tile
        OPENMLA_PREFILL_STAMP(1, pair_count, 6);
      }
      ++use[0];
      if (has_k1) ++use[1];
      handoff.next_step();
      ++pair_count;
    }

    // ---------------------------------------------------------------- epilogue
    const Fragment frag = make_fragment(ptx::launder32(tid) % T::kWarpgroupThreads);
    float total[2];
    // Row sums of both warpgroups (relative to the same final max); double-buffered by tile parity so a
    // warpgroup that runs ahead into the next tile's epilogue cannot overwrite what the other still reads.
    const int par = tile_iter & 1;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const float l = quad_sum(l_run[i]);
      if (lane % 4 == 0) smem.row_sum[par][kWg][frag.row[i]] = l;
    }
    // Not the aligned bar.sync: the warps may arrive here diverged (after the mbarrier spin loops), which
    // compute-sanitizer synccheck reports for bar.sync.
    ptx::named_barrier_sync_unaligned(static_cast<int>(NamedBarrier::kRowSums), 2 * T::kWarpgroupThreads);
    float inv[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      total[i] = smem.row_sum[par][0][frag.row[i]] + smem.row_sum[par][1][frag.row[i]];
      const int head = w.head0 + frag.row[i];
      float denom = total[i];
      // The sink joins the denominator of out only (natural-log units): out = O / (L + 2^(sink log2 e - m)).
      if (p.attn_sink != nullptr && head < p.h_q)
        denom += epilogue::sink_term(sink[i], m_run[i]);
      inv[i] = epilogue::is_empty_row(total[i]) ? 0.f : 1.f / denom;
    }
    scale_rows(o, inv[0], inv[1]);
    const int col_base = kWg * (T::kHeadDimV / 2);
    const int q4 = ptx::launder32(lane) % 4;  // laundered: ptxas would hoist the 16 column offsets out of the tile loop
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int head = w.head0 + frag.row[i];
      const bool live = head < p.h_q;  // the same for the whole quad
      auto* out = static_cast<uint8_t*>(p.output.out) + 2 * p.output.token_out_offset(w.token, head);
      // Streaming 16-byte stores through the quad transpose (the output is not read again here).
      epilogue::store_row<false, true>(o, i, q4, out, col_base, live);
      if (live && q4 == 0) {
        const bool empty = epilogue::is_empty_row(total[i]);
        if constexpr (kWg == 0) {
          ptx::st_global_cs(p.output.lse + p.output.token_lse_offset(w.token, head),
                            empty ? INFINITY : epilogue::lse_log2(m_run[i], total[i]) * epilogue::kLn2);
        } else {
          ptx::st_global_cs(p.max_logits + static_cast<int64_t>(w.token) * p.max_logits_stride_s +
                                static_cast<int64_t>(head) * p.max_logits_stride_h,
                            empty ? -INFINITY : m_run[i] * epilogue::kLn2);
        }
      }
    }
    if (w.num_blocks > 0) OPENMLA_PREFILL_STAMP(kWg, pair_count - 1, 7);
  }
}

// ---------------------------------------------------------------------------------------------------
// The kernel
// ---------------------------------------------------------------------------------------------------
template <int kDQK>
__global__ void __launch_bounds__(Traits<kDQK>::kThreads, 1)
    sparse_prefill_kernel(const __grid_constant__ SparsePrefillParams p, const __grid_constant__ CUtensorMap q_map) {
  using T = Traits<kDQK>;
  using Smem = SharedStorage<kDQK>;
  Smem& smem = cta::shared_storage<Smem>();
  const int tid = threadIdx.x;
  // Warp-uniform role (wgmma under a branch ptxas cannot prove uniform is serialised).
  const int wg = cta::warpgroup(tid);

  if (tid == 0) {
    ptx::prefetch_tensormap(&q_map);
    for (int b = 0; b < 2; ++b) {
      for (int g = 0; g < T::kNumGroups; ++g) {
        ptx::mbarrier_init(&smem.full[b][g], T::kWarpgroupThreads + 4);  // cp.async arrivals + 4 warps' plain ones
        ptx::mbarrier_init(&smem.free_[b][g], T::kWarpgroupThreads);     // every thread of the last reader
      }
    }
    for (int h = 0; h < kHandoffs; ++h)
      ptx::mbarrier_init(&smem.handoff[h], T::kWarpgroupThreads);
    ptx::mbarrier_init(&smem.q_full, 1);
    ptx::mbarrier_init(&smem.q_free, 2 * T::kWarpgroupThreads);
    ptx::fence_mbarrier_init();
  }
  __syncthreads();

  // Each role ends in its own exit so that ptxas keeps the register budgets apart.
  if (wg == 2) {
    ptx::setmaxnreg_dec<T::kRegsProducer>();
    produce<kDQK>(p, smem, &q_map, tid % T::kWarpgroupThreads);
    return;
  } else if (wg == 0) {
    ptx::setmaxnreg_inc<T::kRegsConsumer>();
    consume<kDQK, 0>(p, smem, tid);
    return;
  } else {
    ptx::setmaxnreg_inc<T::kRegsConsumer>();
    consume<kDQK, 1>(p, smem, tid);
    return;
  }
}

}  // namespace openmla::kernels::sparse_prefill
