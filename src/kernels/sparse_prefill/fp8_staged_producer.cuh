// The staged producer of the FP8-cache sparse prefill (sparse-prefill-fp8-v3; included by fp8_kernel.cuh).
//
// The register producer (produce_fp8) keeps at most one tile group's bytes in flight and waits for them before it
// converts: on the first GPU run it ran the pair in ~17k cycles against the bf16 kernel's ~6k, bound by the memory
// latency of its serial loads. This one stages the FP8 bytes in shared memory with cp.async, in the group's own
// destination tiles, and converts a group only after the NEXT group's copies are issued, so one group's latency
// overlaps the previous group's conversion:
//   issue(g):   wait free(g); each warp cp.asyncs the FP8 bytes of its 16 rows (256 per row; MODEL1's V_R: 192) into
//               its own rows of the group's two staging tiles (16 rows x 256 B = exactly those rows: 4 KB), invalid
//               slots zero-filled; the row scales by one plain load per lane (kept in a register); MODEL1's V_R also
//               cp.asyncs its RoPE tile straight to its place; commit.
//   convert(g): cp.async.wait_group 1 (everything but the newest group landed), __syncwarp; the tiles before the
//               staging tiles are written first (their sources lie in the staging tiles), then the staging tiles'
//               own sources are read into registers, __syncwarp, and written; proxy fence; one plain arrival per
//               thread on full(g).
// A warp only ever reads and writes its own rows, so __syncwarp orders everything. Deferring convert(g) past the free
// wait of the next group cannot deadlock inside a tile (docs/sparse-prefill.md, "Sparse prefill from the FP8 cache"):
// no release the producer waits for depends on the group it holds back, except across a tile boundary (the Q of the
// next tile waits for q_free, which needs every K group of the tile), so the pending group is flushed at the end of
// each tile.
#pragma once

namespace openmla::kernels::sparse_prefill {

__device__ __forceinline__ void cp_async_wait_group1() { asm volatile("cp.async.wait_group 1;" ::: "memory"); }
__device__ __forceinline__ uint4 ld_shared_v4(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
  return v;
}

// The layout of one register/staged group (0: V_L, 1: V_R): tiles [t0, t0 + kFp8Tiles) hold e4m3 dims; the warp's
// rows of tiles [kStage, kStage + 2) are the staging area.
template <int kDQK, int kGrp>
struct StagedGroup {
  using F = Fp8Traits<kDQK>;
  static constexpr int kT0 = kGrp * 4;
  static constexpr int kFp8Tiles = (!F::kV32 && kGrp == 1) ? 3 : 4;  // MODEL1's V_R: tiles 4-6 (7 is RoPE)
  static constexpr int kStage = kT0 + kFp8Tiles - 2;                   // the last two e4m3 tiles
  static constexpr int kEarlyPieces = (kStage - kT0) * 4;             // 16-dim pieces per row before the staging
  static constexpr int kLatePieces = 8;                               // the staging tiles' pieces per row
  static constexpr int kRowBytes = kFp8Tiles * 64;                    // staged bytes per row
};

template <int kDQK>
__device__ __forceinline__ void produce_fp8_staged(const SparsePrefillFp8Params& pf, SharedStorage<kDQK>& smem,
                                                   const CUtensorMap* q_map, int wg_tid) {
  using T = Traits<kDQK>;
  using F = Fp8Traits<kDQK>;
  using Cache = typename F::Cache;
  const SparsePrefillParams& p = pf.base;
  const int warp = wg_tid / 32, lane = wg_tid % 32;
  const uint8_t* const cache = pf.cache;
  uint32_t use[2] = {0, 0};
  int64_t off = -1;  // this lane's slot of the current pair (block lane / 16, row 16 warp + lane % 16)
  int soff = 0;
  // The group held back for conversion.
  int pend_buf = -1, pend_grp = 0;
  uint32_t pend_scale = 0;

  // Shared address of tile `t` of K buffer `buf`, from a laundered base: ptxas would otherwise compute every address of
  // the fills once and keep them (spilled) across the loops.
  constexpr uint32_t kBufBytes = static_cast<uint32_t>(T::kNumTiles * T::kTileBytes);
  auto k_tile = [&](int buf, int t) -> uint32_t {
    const uint32_t base = static_cast<uint32_t>(ptx::launder32(static_cast<int>(ptx::smem_addr(smem.k[0][0]))));
    return base + static_cast<uint32_t>(buf) * kBufBytes + static_cast<uint32_t>(t * T::kTileBytes);
  };
  // This warp's 256-byte staging row r (0..15) of a group whose staging tiles start at `stage`.
  auto stage_row = [&](int buf, int stage, int r) -> uint32_t {
    const int t = ptx::launder32(wg_tid);
    return k_tile(buf, stage + r / 8) + static_cast<uint32_t>(((t / 32) * 16) * 128 + (r % 8) * 256);
  };

  auto copy_rope = [&](int buf) {
    const int t = ptx::launder32(wg_tid), wl = t % 32;
    const int lane_row = wl / 8, chunk = wl % 8, row0 = (t / 32) * T::kRowsPerWarp;
    const uint64_t policy = ptx::make_l2_evict_last_policy();
    const uint32_t dst0 = k_tile(buf, F::kRopeTile);
#pragma unroll
    for (int j = 0; j < T::kRowsPerThread; ++j) {
      const int r = lane_row + 4 * j;
      const int64_t d = shfl64(off, buf * 16 + r);
      const bool ok = d >= 0;
      const uint8_t* src = cache + (ok ? d : 0) + Cache::kRopeOffset + chunk * 16;
      cp_async_16_hint(dst0 + tile::swizzled_chunk(row0 + r, chunk), src, ok ? 16u : 0u, policy);
    }
  };

  // issue(g) of the header; returns this lane's scale word (V3.2: scale 2 g + lane / 16 of row lane % 16, as fp32
  // bits; MODEL1: the four UE8M0 bytes of row lane % 16 from byte 4 g, lanes 0-15).
  auto issue = [&]<int kGrp>(int buf, bool first, uint32_t valid16) -> uint32_t {
    using G = StagedGroup<kDQK, kGrp>;
    const int t = ptx::launder32(wg_tid), wl = t % 32;
    // The row scales first: their latency runs with the free wait.
    uint32_t sc;
    {
      const int r = wl % 16, part = wl / 16;
      const int64_t d = shfl64(off, buf * 16 + r);
      if constexpr (F::kV32) {
        sc = 0x3F800000u;  // 1.0: a zero row stays zero
        if (d >= 0)
          sc = __ldg(reinterpret_cast<const uint32_t*>(cache + d + Cache::kScaleOffset) + 2 * kGrp + part);
      } else {
        const int s = shfl32(soff, buf * 16 + r);
        sc = 0x7F7F7F7Fu;  // 2^0 in every byte
        if (d >= 0 && part == 0) sc = __ldg(reinterpret_cast<const uint32_t*>(cache + d + s) + kGrp);
      }
    }
    ptx::mbarrier_wait_parity(&smem.free_[buf][kGrp], Uses::free_parity(use[buf]));
    if (first && lane == 0) {
      asm volatile("st.shared.u16 [%0], %1;" ::"r"(ptx::smem_addr(&smem.valid[buf][warp])),
                   "h"(static_cast<unsigned short>(valid16))
                   : "memory");
    }
    const uint64_t policy = ptx::make_l2_evict_last_policy();
    // Two chunks per step (fully unrolled, ptxas hoisted all 16 shuffles and spilled the addresses).
#pragma unroll 2
    for (int i = 0; i < 8; ++i) {
      const int k = wl + 32 * i, r = k / 16, c = k % 16;  // row r, 16-byte chunk c of its 256 bytes
      const int64_t d = shfl64(off, buf * 16 + r);  // every lane: the shuffle is outside the branch
      if (c * 16 < G::kRowBytes) {  // MODEL1's V_R stages 192 bytes per row
        const bool ok = d >= 0;
        const uint8_t* src = cache + (ok ? d : 0) + kGrp * F::kGroupDims + c * 16;
        cp_async_16_hint(stage_row(buf, G::kStage, r) + c * 16, src, ok ? 16u : 0u, policy);
      }
    }
    if (!F::kV32 && kGrp == F::kRopeGroup) copy_rope(buf);
    ptx::cp_async_commit();
    return sc;
  };

  // The scale of 16-dim piece `pc` (0..15 of the group's 256 dims) of row r, from the issuing lanes' words.
  auto piece_scale = [&]<int kGrp>(uint32_t sc, int r, int pc) -> float {
    if constexpr (F::kV32) {
      return __uint_as_float(shfl32(static_cast<int>(sc), r + 16 * (pc / 8)));
    } else {
      const uint32_t w = static_cast<uint32_t>(shfl32(static_cast<int>(sc), r));
      return fp8_dequant::ue8m0_to_float((w >> (8 * (pc / 4))) & 0xFFu);
    }
  };

  // convert(g) of the header, for the group issued with scale word `sc`; `all`: wait for every copy (flush).
  auto convert = [&]<int kGrp>(int buf, uint32_t sc, bool all) {
    using G = StagedGroup<kDQK, kGrp>;
    if (all) ptx::cp_async_wait_all(); else cp_async_wait_group1();
    __syncwarp();
    const int t = ptx::launder32(wg_tid), wl = t % 32, row0 = (t / 32) * T::kRowsPerWarp;
    // Tiles before the staging ones: 16 rows x kEarlyPieces pieces.
    constexpr int kEarlyPerLane = 16 * G::kEarlyPieces / 32;
#pragma unroll
    for (int i = 0; i < kEarlyPerLane; ++i) {
      const int k = wl + 32 * i, r = k / G::kEarlyPieces, pc = k % G::kEarlyPieces;
      const uint4 raw = ld_shared_v4(stage_row(buf, G::kStage, r) + pc * 16);
      const float s = piece_scale.template operator()<kGrp>(sc, r, pc);
      uint4 lo, hi;
      fp8_dequant::dequant16(raw, s, lo, hi);
      const uint32_t tile_base = k_tile(buf, G::kT0 + pc / 4);
      ptx::st_shared_v4(tile_base + tile::swizzled_chunk(row0 + r, (pc % 4) * 2), lo);
      ptx::st_shared_v4(tile_base + tile::swizzled_chunk(row0 + r, (pc % 4) * 2 + 1), hi);
    }
    // The staging tiles' own pieces: read all, then overwrite.
    constexpr int kLatePerLane = 16 * G::kLatePieces / 32;  // 4
    uint4 raw[kLatePerLane];
#pragma unroll
    for (int i = 0; i < kLatePerLane; ++i) {
      const int k = wl + 32 * i, r = k / G::kLatePieces, pc = k % G::kLatePieces;
      raw[i] = ld_shared_v4(stage_row(buf, G::kStage, r) + (G::kEarlyPieces + pc) * 16);
    }
    __syncwarp();
#pragma unroll
    for (int i = 0; i < kLatePerLane; ++i) {
      const int k = wl + 32 * i, r = k / G::kLatePieces, pc = k % G::kLatePieces;
      const float s = piece_scale.template operator()<kGrp>(sc, r, G::kEarlyPieces + pc);
      uint4 lo, hi;
      fp8_dequant::dequant16(raw[i], s, lo, hi);
      const uint32_t tile_base = k_tile(buf, G::kStage + pc / 4);
      ptx::st_shared_v4(tile_base + tile::swizzled_chunk(row0 + r, (pc % 4) * 2), lo);
      ptx::st_shared_v4(tile_base + tile::swizzled_chunk(row0 + r, (pc % 4) * 2 + 1), hi);
    }
    ptx::fence_proxy_async_shared();
    ptx::mbarrier_arrive(&smem.full[buf][kGrp]);
    if (!F::kV32 && kGrp == F::kRopeGroup) ptx::cp_async_mbarrier_arrive_noinc(&smem.full[buf][kGrp]);
  };

  auto convert_pending = [&](bool all) {
    if (pend_buf < 0) return;
    if (pend_grp == 0) {
      convert.template operator()<0>(pend_buf, pend_scale, all);
    } else {
      convert.template operator()<1>(pend_buf, pend_scale, all);
    }
    pend_buf = -1;
  };

  // Group g of buffer buf: issue it, then convert the one held back, and hold this one.
  auto fill = [&]<int kGrp>(int buf, bool first, uint32_t valid16) {
    const uint32_t sc = issue.template operator()<kGrp>(buf, first, valid16);
    convert_pending(false);
    pend_buf = buf;
    pend_grp = kGrp;
    pend_scale = sc;
  };

  // V3.2's RoPE group (tile 8): cp.async only, completion by the copies' own arrivals.
  auto fill_rope_group = [&](int buf) {
    ptx::mbarrier_wait_parity(&smem.free_[buf][2], Uses::free_parity(use[buf]));
    copy_rope(buf);
    ptx::cp_async_mbarrier_arrive_noinc(&smem.full[buf][2]);
  };

  PairCursor ahead = {static_cast<int>(blockIdx.x), 0, {}};
  ahead.w = ahead.tile < p.num_tiles ? tile_work(p, ahead.tile) : TileWork{};
  skip_finished_tiles(p, ahead);
  int idx_next = load_pair_index(p, ahead.w, ahead.blk0, warp, lane);
  ahead = next_pair(p, ahead);

  int tile = blockIdx.x;
  uint32_t tile_iter = 0;
  uint32_t pair_count = 0;  // trace only
  TileWork w = tile_work(p, tile);
  for (; tile < p.num_tiles; tile += p.grid, ++tile_iter) {
    if (tile != static_cast<int>(blockIdx.x)) w = tile_work(p, tile);
    if (wg_tid == 0) {
      ptx::mbarrier_wait_parity(&smem.q_free, Uses::free_parity(tile_iter));
      load_q_tile_tma<T::kNumTiles>(smem.q, q_map, &smem.q_full, w.head0, w.token, 0,
                                     ptx::make_l2_evict_first_policy());
    }
    for (int blk0 = 0; blk0 < w.num_blocks; blk0 += 2) {
      const bool has_k1 = blk0 + 1 < w.num_blocks;
      OPENMLA_PREFILL_STAMP(2, pair_count, 0);
      const int idx = idx_next;
      slot_offsets<kDQK>(pf, idx, off, soff);
      idx_next = load_pair_index(p, ahead.w, ahead.blk0, warp, lane);
      ahead = next_pair(p, ahead);
      const uint32_t valid = __ballot_sync(0xffffffffu, idx >= 0);
      fill.template operator()<0>(0, true, valid & 0xffffu);
      OPENMLA_PREFILL_STAMP(2, pair_count, 1);
      if (has_k1) fill.template operator()<1>(1, true, valid >> 16);
      OPENMLA_PREFILL_STAMP(2, pair_count, 2);
      fill.template operator()<1>(0, false, 0);
      OPENMLA_PREFILL_STAMP(2, pair_count, 3);
      if constexpr (F::kV32) fill_rope_group(0);
      OPENMLA_PREFILL_STAMP(2, pair_count, 4);
      if (has_k1) {
        if constexpr (F::kV32) fill_rope_group(1);
        OPENMLA_PREFILL_STAMP(2, pair_count, 5);
        fill.template operator()<0>(1, false, 0);
        OPENMLA_PREFILL_STAMP(2, pair_count, 6);
      }
      ++use[0];
      if (has_k1) ++use[1];
      if (idx_next >= 0) {
        int64_t d;
        int s;
        slot_offsets<kDQK>(pf, idx_next, d, s);
        bulk_prefetch_l2(cache + d, Cache::kDataStride);
        if constexpr (!F::kV32) asm volatile("prefetch.global.L2 [%0];" ::"l"(cache + d + s));
      }
      OPENMLA_PREFILL_STAMP(2, pair_count, 7);
      ++pair_count;
    }
    // The next tile's Q waits for q_free, which needs every group of this tile: nothing may stay held back.
    convert_pending(true);
  }
  ptx::cp_async_wait_all();
}

}  // namespace openmla::kernels::sparse_prefill
