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
// the next tile's blocks while the consumers finish the current one. Design note: docs/sparse-prefill.md.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "common/mma_tile.cuh"
#include "common/ptx.cuh"
#include "common/trace.cuh"
#include "kernels/sparse_prefill/config.h"
#include "kernels/sparse_prefill/params.h"

namespace openmla::kernels::sparse_prefill {

using tile::desc_from_lo;
using tile::desc_lo_k_major;
using tile::desc_lo_mn_major;
using tile::exponentiate;
using tile::Fragment;
using tile::make_fragment;
using tile::quad_sum;
using tile::row_max;
using tile::scale_rows;

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
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
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
    ptx::mbarrier_wait_parity(&smem.free_[buf][grp], (use[buf] & 1) ^ 1);
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
      ptx::mbarrier_wait_parity(&smem.q_free, (tile_iter & 1) ^ 1);
      ptx::mbarrier_arrive_expect_tx(&smem.q_full, T::kNumTiles * T::kTileBytes);
#pragma unroll
      for (int t = 0; t < T::kNumTiles; ++t)
        ptx::tma_load_4d(smem.q[t], q_map, &smem.q_full, t * T::kTileCols, w.head0, w.token, 0, q_policy);
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
    const uint32_t q_lo = desc_lo_k_major(smem.q[0]), k_lo = desc_lo_k_major(smem.k[buf][0]);
#pragma unroll
    for (int kk = 0; kk < T::kTileCols / 16; ++kk) {
      const uint32_t off = static_cast<uint32_t>(t * T::kTileBytes + kk * 32) >> 4;
      ptx::wgmma_m64n64k16_ss_bf16<0>(s, desc_from_lo(q_lo + off), desc_from_lo(k_lo + off),
                                      (init && i == 0 && kk == 0) ? 0 : 1);
    }
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

// Logits of invalid slots become -inf (overwrite: never add to a zero-filled row's logit). `valid` is the block's
// 64-bit mask; shifted right by f.col, the bit of column j * 8 + f.col + e is the constant bit j * 8 + e (no
// per-thread 64-bit masks for ptxas to hoist). A full block (the common case) skips the work.
__device__ __forceinline__ void mask_logits(float (&s)[32], uint64_t valid, int col) {
  if (valid == ~0ull) return;
  valid >>= col;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      if (((valid >> (j * 8 + e)) & 1ull) == 0) {
        s[j * 4 + e] = -INFINITY;
        s[j * 4 + 2 + e] = -INFINITY;
      }
    }
  }
}

// Rescales O's rows by a (a0 for row[0], a1 for row[1]) unless every row of the warp keeps its scale (a == 1 exactly:
// the running max did not move, the common case after the first blocks). Exact either way; a warp-level decision
// (plain FMULs, no collective instruction).
__device__ __forceinline__ void rescale_rows(float (&o)[128], float a0, float a1) {
  if (__any_sync(0xffffffffu, a0 != 1.f || a1 != 1.f)) scale_rows(o, a0, a1);
}

// Keeps ptxas from hoisting values derived from `x` out of the loops (they would hold registers for the whole
// tile; the consumers have none to spare).
__device__ __forceinline__ int launder32(int x) {
  asm volatile("mov.b32 %0, %0;" : "+r"(x));
  return x;
}

// The 64 x 64 P tile in the register A-operand layout of m64nNk16 (four k16 slices).
__device__ __forceinline__ void to_a_fragments(const float (&s)[32], uint32_t (&a)[4][4]) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    a[kk][0] = pack_bf16(s[8 * kk + 0], s[8 * kk + 1]);
    a[kk][1] = pack_bf16(s[8 * kk + 2], s[8 * kk + 3]);
    a[kk][2] = pack_bf16(s[8 * kk + 4], s[8 * kk + 5]);
    a[kk][3] = pack_bf16(s[8 * kk + 6], s[8 * kk + 7]);
  }
}

// Stores P (bf16) into a 128B-swizzled 64 x 64 tile for the other warpgroup's shared-A wgmma, with four stmatrix.x4
// per thread (docs/sparse-prefill.md, decision sparse-prefill-v4; 16 scalar stores before, which ptxas emitted as
// generic ST.E because it cannot prove the tile pointer shared). One stmatrix.x4 per 16 columns: matrices (rows 0-7,
// chunk 2c), (rows 8-15, chunk 2c), (rows 0-7, chunk 2c + 1), (rows 8-15, chunk 2c + 1) of the warp's 16 rows, i.e.
// fragment words (4j, 4j + 2) for j = 2c, 2c + 1. Lane l addresses row warp * 16 + 8 ((l / 8) & 1) + l % 8, chunk
// 2c + l / 16. Chunk 2c + h lands at 16-byte slot (2c + h) ^ (row & 7) = (h ^ (row & 7)) ^ 2c: the slot of chunk h,
// XOR 2c (bits 5-6 of the byte offset only).
__device__ __forceinline__ void store_p(const float (&s)[32], uint8_t* tile, int wg_tid) {
  const int lane = wg_tid % 32;
  const int row = (wg_tid / 32) * 16 + ((lane >> 3) & 1) * 8 + (lane & 7);
  const uint32_t base = ptx::smem_addr(tile) + tile::swizzled_chunk(row, lane >> 4);
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    ptx::stmatrix_x4(base ^ static_cast<uint32_t>(c << 5), pack_bf16(s[8 * c + 0], s[8 * c + 1]),
                     pack_bf16(s[8 * c + 2], s[8 * c + 3]), pack_bf16(s[8 * c + 4], s[8 * c + 5]),
                     pack_bf16(s[8 * c + 6], s[8 * c + 7]));
  }
  ptx::fence_proxy_async_shared();
}

// Issues (no fence, commit or wait) O_half += P V_half over 64 slots, P from registers, V = 4 tiles of a K buffer
// viewed MN-major. `pa` must stay untouched until the wgmmas completed.
__device__ __forceinline__ void issue_pv_rs(float (&o)[128], const uint32_t (&pa)[4][4], const uint8_t* v_tiles) {
  const uint32_t v_lo = desc_lo_mn_major(v_tiles);
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
    ptx::wgmma_m64n256k16_rs_bf16<1>(o, pa[kk], desc_from_lo(v_lo + kk * 16 * 128 / 16), 1);
}

// O_half += P V_half over 64 slots, P from registers, V = 4 tiles of a K buffer viewed MN-major.
__device__ __forceinline__ void gemm_pv_rs(float (&o)[128], const uint32_t (&pa)[4][4], const uint8_t* v_tiles) {
  ptx::wgmma_fence();
  issue_pv_rs(o, pa, v_tiles);
  ptx::wgmma_commit();
  ptx::wgmma_wait<0>();
  ptx::fence_registers(o);
}

// Issues (no fence, commit or wait) O_half += P V_half with P read from shared memory (the other warpgroup's).
__device__ __forceinline__ void issue_pv_ss(float (&o)[128], const uint8_t* p_tile, const uint8_t* v_tiles) {
  const uint32_t p_lo = desc_lo_k_major(p_tile), v_lo = desc_lo_mn_major(v_tiles);
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
    ptx::wgmma_m64n256k16_ss_bf16<1>(o, desc_from_lo(p_lo + kk * 32 / 16), desc_from_lo(v_lo + kk * 16 * 128 / 16), 1);
}

// O_half += P V_half with P read from shared memory (written by the other warpgroup).
__device__ __forceinline__ void gemm_pv_ss(float (&o)[128], const uint8_t* p_tile, const uint8_t* v_tiles) {
  ptx::wgmma_fence();
  issue_pv_ss(o, p_tile, v_tiles);
  ptx::wgmma_commit();
  ptx::wgmma_wait<0>();
  ptx::fence_registers(o);
}

template <int kDQK, int kWg>
__device__ __forceinline__ void consume(const SparsePrefillParams& p, SharedStorage<kDQK>& smem, int tid) {
  using T = Traits<kDQK>;
  const int wg_tid = tid % T::kWarpgroupThreads;
  const int lane = tid % 32;
  uint8_t* const p_tile[2] = {T::kPInRopeTile ? smem.k[0][T::kRopeTile] : smem.p[0],
                              T::kPInRopeTile ? smem.k[1][T::kRopeTile] : smem.p[T::kPInRopeTile ? 0 : 1]};
  uint32_t use[2] = {0, 0};      // fills of each K buffer consumed so far: full parity
  uint32_t handoff_phase = 0;    // every hand-off completes once per block pair
  auto arrive = [&](uint64_t* bar) { ptx::mbarrier_arrive(bar); };
  // Hand-offs between the consumer warpgroups (one completion per pair): publish / wait.
  auto handoff_signal = [&](Handoff h) { ptx::mbarrier_arrive(&smem.handoff[static_cast<int>(h)]); };
  auto handoff_wait = [&](Handoff h) {
    ptx::mbarrier_wait_parity(&smem.handoff[static_cast<int>(h)], handoff_phase);
  };

  uint32_t tile_iter = 0;
  uint32_t pair_count = 0;  // trace only
  float s[32];
  // WG0: the first Q K0^T group of the next pair is already in flight (issued behind P1 V1_L inside a tile).
  bool qk_head_issued = false;
  for (int tile = blockIdx.x; tile < p.num_tiles; tile += p.grid, ++tile_iter) {
    const TileWork w = tile_work(p, tile);
    ptx::mbarrier_wait_parity(&smem.q_full, tile_iter & 1);
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
      const uint32_t ph0 = use[0] & 1, ph1 = use[1] & 1;
      const Fragment frag = make_fragment(launder32(tid) % T::kWarpgroupThreads);
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
        mask_logits(s, *reinterpret_cast<const uint64_t*>(smem.valid[0]), frag.col);
        float mx[2], m0[2], a0[2], sum[2];
        row_max(s, mx);
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          m0[i] = fmaxf(m_run[i], mx[i] * p.scale_log2);
          a0[i] = ptx::exp2_approx(m_run[i] - m0[i]);
        }
        exponentiate(s, p.scale_log2, m0, sum);
#pragma unroll
        for (int i = 0; i < 2; ++i) l_run[i] = l_run[i] * a0[i] + sum[i];
        if (lane % 4 == 0) {
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            smem.max0[frag.row[i]] = m0[i];
            smem.scale0[frag.row[i]] = a0[i];
          }
        }
        handoff_signal(Handoff::kMax0Ready);
        OPENMLA_PREFILL_STAMP(0, pair_count, 2);
        rescale_rows(o, a0[0], a0[1]);
        to_a_fragments(s, pa);
        gemm_pv_rs(o, pa, smem.k[0][0]);
        arrive(&smem.free_[0][0]);
        OPENMLA_PREFILL_STAMP(0, pair_count, 3);

        // a1 and P1 from WG1; P0 rescaled to m1 goes to WG1.
        handoff_wait(Handoff::kScale1Ready);
        OPENMLA_PREFILL_STAMP(0, pair_count, 4);
        float a1[2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          a1[i] = smem.scale1[frag.row[i]];
          m_run[i] = smem.max1[frag.row[i]];
          l_run[i] *= a1[i];
        }
        if (__any_sync(0xffffffffu, a1[0] != 1.f || a1[1] != 1.f)) {
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            s[j * 4 + 0] *= a1[0];
            s[j * 4 + 1] *= a1[0];
            s[j * 4 + 2] *= a1[1];
            s[j * 4 + 3] *= a1[1];
          }
        }
        store_p(s, p_tile[0], wg_tid);
        handoff_signal(Handoff::kP0Ready);
        OPENMLA_PREFILL_STAMP(0, pair_count, 5);
        // O_L = a1 O_L + P1 V1_L.
        rescale_rows(o, a1[0], a1[1]);
        handoff_wait(Handoff::kP1Ready);  // every pair, even without K1
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
          mask_logits(s, *reinterpret_cast<const uint64_t*>(smem.valid[1]), frag.col);
          row_max(s, mx);
        }
        OPENMLA_PREFILL_STAMP(1, pair_count, 1);
        if (last_pair) arrive(&smem.q_free);
        // m1 = max(m0, rowmax S1), a1 = 2^(m0 - m1); O_R = a0 a1 O_R + P1 V1_R.
        handoff_wait(Handoff::kMax0Ready);
        OPENMLA_PREFILL_STAMP(1, pair_count, 2);
        float m1[2], a1[2], a01[2], sum[2] = {0.f, 0.f};
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const float m0 = smem.max0[frag.row[i]];
          const float a0 = smem.scale0[frag.row[i]];
          m1[i] = fmaxf(m0, mx[i] * p.scale_log2);
          a1[i] = ptx::exp2_approx(m0 - m1[i]);
          a01[i] = a0 * a1[i];
          m_run[i] = m1[i];
          if (lane % 4 == 0) {
            smem.scale1[frag.row[i]] = a1[i];
            smem.max1[frag.row[i]] = m1[i];
          }
        }
        // m1 and a1 go out before the exponentials: WG0 rescales and stores P0 while this warpgroup computes P1.
        handoff_signal(Handoff::kScale1Ready);
        if (has_k1) {
          exponentiate(s, p.scale_log2, m1, sum);
          store_p(s, p_tile[1], wg_tid);
        }
        handoff_signal(Handoff::kP1Ready);
        OPENMLA_PREFILL_STAMP(1, pair_count, 3);
#pragma unroll
        for (int i = 0; i < 2; ++i) l_run[i] = l_run[i] * a01[i] + sum[i];
        rescale_rows(o, a01[0], a01[1]);
        // O_R += P1 V1_R, then O_R += P0 V0_R queued right behind it (the same accumulator chains in order); K1's
        // V_R group is released once the first group of wgmmas is done.
        if (has_k1) {
          to_a_fragments(s, pa);
          ptx::wgmma_fence();
          issue_pv_rs(o, pa, smem.k[1][T::kVTilesPerHalf]);
          ptx::wgmma_commit();
        }
        OPENMLA_PREFILL_STAMP(1, pair_count, 4);
        handoff_wait(Handoff::kP0Ready);
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
      handoff_phase ^= 1;
      ++pair_count;
    }

    // ---------------------------------------------------------------- epilogue
    const Fragment frag = make_fragment(launder32(tid) % T::kWarpgroupThreads);
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
        denom += ptx::exp2_approx(sink[i] * 1.4426950408889634f - m_run[i]);
      inv[i] = total[i] > 0.f ? 1.f / denom : 0.f;
    }
    scale_rows(o, inv[0], inv[1]);
    const int col_base = kWg * (T::kHeadDimV / 2);
    const int q4 = launder32(lane) % 4;  // laundered: ptxas would hoist the 16 column offsets out of the tile loop
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int head = w.head0 + frag.row[i];
      const bool live = head < p.h_q;  // the same for the whole quad
      auto* out = static_cast<uint8_t*>(p.out) +
                  2 * (static_cast<int64_t>(w.token) * p.out_stride_s + static_cast<int64_t>(head) * p.out_stride_h);
      // A 4 x 4 word transpose across the quad gives each lane 8 contiguous columns: 16-byte stores.
#pragma unroll
      for (int m = 0; m < 8; ++m) {
        uint32_t v[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) v[k] = pack_bf16(o[(4 * m + k) * 4 + 2 * i], o[(4 * m + k) * 4 + 2 * i + 1]);
        tile::quad_transpose4(v, q4);
        if (live) ptx::st_global_cs(out + (col_base + (4 * m + q4) * 8) * 2, make_uint4(v[0], v[1], v[2], v[3]));
      }
      if (live && q4 == 0) {
        const bool empty = !(total[i] > 0.f);
        constexpr float kLn2 = 0.69314718055994531f;
        if constexpr (kWg == 0) {
          ptx::st_global_cs(p.lse + static_cast<int64_t>(w.token) * p.lse_stride_s +
                                static_cast<int64_t>(head) * p.lse_stride_h,
                            empty ? INFINITY : (m_run[i] + log2f(total[i])) * kLn2);
        } else {
          ptx::st_global_cs(p.max_logits + static_cast<int64_t>(w.token) * p.max_logits_stride_s +
                                static_cast<int64_t>(head) * p.max_logits_stride_h,
                            empty ? -INFINITY : m_run[i] * kLn2);
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
  extern __shared__ uint8_t smem_raw[];
  Smem& smem = *reinterpret_cast<Smem*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  const int tid = threadIdx.x;
  // Warp-uniform role (wgmma under a branch ptxas cannot prove uniform is serialised).
  const int wg = __shfl_sync(0xffffffff, tid / T::kWarpgroupThreads, 0);

  if (tid == 0) {
    ptx::prefetch_tensormap(&q_map);
    for (int b = 0; b < 2; ++b) {
      for (int g = 0; g < T::kNumGroups; ++g) {
        ptx::mbarrier_init(&smem.full[b][g], T::kWarpgroupThreads + 4);  // cp.async arrivals + 4 warps' plain ones
        ptx::mbarrier_init(&smem.free_[b][g], T::kWarpgroupThreads);     // every thread of the last reader
      }
    }
    for (int h = 0; h < static_cast<int>(Handoff::kCount); ++h)
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
