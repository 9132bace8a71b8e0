// Sparse top-k MLA prefill straight from the paged FP8 KV cache, bf16 compute (sm_90a).
//
// The bf16 kernel (kernel.cuh) with another producer: the consumers (WG0, WG1: the seesaw over block pairs, the
// epilogue) are its consume<> unchanged and read the same bf16 128B-swizzled K tiles; the producer warpgroup gathers
// the selected cache slots' FP8 bytes instead of bf16 rows and dequantises them into those tiles itself. No bf16 copy
// of a token exists outside shared memory.
//   - NoPE dims (e4m3 + per-tile scales): 16-byte read-only loads into registers, issued BEFORE the producer waits
//     for the tile group to be released (the registers are the staging: the 227 KB plan of the bf16 kernel leaves
//     ~7 KB, a 64-token block of FP8 bytes is 41 KB), then converted (exact: the codec's scales are powers of two,
//     common/fp8_dequant.cuh) and stored with st.shared into the swizzled tiles; writer-side proxy fence, then one
//     plain arrival per thread on the group's full barrier.
//   - RoPE dims (bf16 in the cache, bit for bit): 16-byte cp.async straight into the tile, as the bf16 kernel gathers
//     (zero-filled for invalid slots), with the cp.async arrivals on the same barrier.
// Tile groups and their full-barrier arrivals (128 producer threads): V3.2: V_L = dims 0-255 (registers), V_R =
// 256-511 (registers), RoPE tile 8 (cp.async): 128 / 128 / 128; MODEL1: V_L = dims 0-255 (registers), V_R = NoPE
// 256-447 (registers) + RoPE 448-511 (cp.async): 128 / 256. Design note: docs/sparse-prefill.md, "Sparse prefill from
// the FP8 cache".
#pragma once

#include <cstdint>
#include <type_traits>

#include "common/fp8_cache_layout.h"
#include "common/fp8_dequant.cuh"
#include "kernels/sparse_prefill/fp8_params.h"
#include "kernels/sparse_prefill/kernel.cuh"

namespace openmla::kernels::sparse_prefill {

template <int kDQK>
struct Fp8Traits {
  using T = Traits<kDQK>;
  using Cache = std::conditional_t<kDQK == 576, fp8_cache::V32, fp8_cache::Model1>;
  static constexpr bool kV32 = kDQK == 576;
  static_assert(Cache::kHeadDim == kDQK && Cache::kRopeDim == T::kTileCols, "one RoPE tile");
  static constexpr int kGroupDims = T::kVTilesPerHalf * T::kTileCols;  // 256 dims per register-filled group
  // Register path: a group's 64 rows x 256 dims; thread (warp w, lane l) covers dims 128 * ((l / 8) % 2) + 16 * (l % 8)
  // .. +15 of rows 16 w + 2 j + l / 16, j = 0..7: one 16-byte load (16 e4m3) and two 16-byte stores per row, each
  // warp load two contiguous 256-byte runs, each warp store conflict-free (4 wavefronts for 512 bytes).
  static constexpr int kRegRows = 8;
  // Rows per register pass: the first pass is loaded before the group's free wait, the others after the previous
  // pass is stored (all 8 at once need ~40 registers of bytes and scales: the producer spilled even at 88).
#ifndef OPENMLA_SPF8_ROWS_PER_PASS
#define OPENMLA_SPF8_ROWS_PER_PASS 4
#endif
  static constexpr int kRowsPerPass = OPENMLA_SPF8_ROWS_PER_PASS;
  static_assert(kRegRows % kRowsPerPass == 0);
  // L1 prefetch of the later passes' lines before the free wait (sparse-prefill-fp8-v2).
#ifndef OPENMLA_SPF8_L1_PREFETCH
#define OPENMLA_SPF8_L1_PREFETCH 1
#endif
  // The tile of the RoPE dims (filled by cp.async) and the group it belongs to.
  static constexpr int kRopeTile = Cache::kNopeDim / T::kTileCols;  // 8 / 7
  static constexpr int kRopeGroup = kV32 ? 2 : 1;
  // setmaxnreg split (the bf16 kernel: 216 / 216 / 72): the producer holds a group's raw bytes (32 registers), its
  // scales and the row addresses.
#ifndef OPENMLA_SPF8_REGS_CONSUMER
#define OPENMLA_SPF8_REGS_CONSUMER 208
#endif
  static constexpr int kRegsConsumer = OPENMLA_SPF8_REGS_CONSUMER;
  static constexpr int kRegsProducer = 3 * T::kLaunchRegs - 2 * kRegsConsumer;
  static_assert(kRegsProducer % 8 == 0 && kRegsProducer <= T::kLaunchRegs, "setmaxnreg only redistributes registers");
  __host__ __device__ static constexpr int full_arrivals(int grp) {
    return (grp < 2 ? T::kWarpgroupThreads : 0) + (grp == kRopeGroup ? T::kWarpgroupThreads : 0);
  }
};

__device__ __forceinline__ int shfl32(int v, int src) {
  asm volatile("shfl.sync.idx.b32 %0, %0, %1, 0x1f, 0xffffffff;" : "+r"(v) : "r"(src));
  return v;
}
// A lane's 64-bit value, read at the point of use: volatile, so that ptxas neither merges the reads of one pair's
// fills nor keeps their results live across the pair (which spilled ~480 bytes of the producer's 72 registers).
__device__ __forceinline__ int64_t shfl64(int64_t v, int src) {
  uint32_t lo = static_cast<uint32_t>(v), hi = static_cast<uint32_t>(static_cast<uint64_t>(v) >> 32);
  asm volatile("shfl.sync.idx.b32 %0, %0, %1, 0x1f, 0xffffffff;" : "+r"(lo) : "r"(src));
  asm volatile("shfl.sync.idx.b32 %0, %0, %1, 0x1f, 0xffffffff;" : "+r"(hi) : "r"(src));
  return static_cast<int64_t>((static_cast<uint64_t>(hi) << 32) | lo);
}

// Byte offsets of slot `idx` (-1: invalid) in the cache: its data (NoPE e4m3, then the RoPE bf16 at
// Cache::kRopeOffset; V3.2: the scales at Cache::kScaleOffset), and MODEL1's scale record in the page's scale section
// as a 32-bit distance from the data (page_size * 576 - row * 568; the API keeps page_size * 576 below 2^31). data < 0
// marks an invalid slot.
template <int kDQK>
__device__ __forceinline__ void slot_offsets(const SparsePrefillFp8Params& pf, int idx, int64_t& data,
                                             int& scale_delta) {
  using Cache = typename Fp8Traits<kDQK>::Cache;
  if (idx < 0) {
    data = -1;
    scale_delta = 0;
    return;
  }
  const uint32_t page = static_cast<uint32_t>(idx) / static_cast<uint32_t>(pf.page_size);
  const uint32_t row = static_cast<uint32_t>(idx) - page * static_cast<uint32_t>(pf.page_size);
  const int64_t page_base = static_cast<int64_t>(page) * pf.page_stride;
  data = page_base + static_cast<int64_t>(row) * Cache::kDataStride;
  if constexpr (Fp8Traits<kDQK>::kV32) {
    scale_delta = Cache::kScaleOffset;
  } else {
    scale_delta = pf.page_size * Cache::kDataStride - static_cast<int>(row) * (Cache::kDataStride - Cache::kScaleStride);
  }
}

template <int kDQK>
__device__ __forceinline__ void produce_fp8(const SparsePrefillFp8Params& pf, SharedStorage<kDQK>& smem,
                                            const CUtensorMap* q_map, int wg_tid) {
  using T = Traits<kDQK>;
  using F = Fp8Traits<kDQK>;
  using Cache = typename F::Cache;
  const SparsePrefillParams& p = pf.base;
  const int warp = wg_tid / 32, lane = wg_tid % 32;
  const uint8_t* const cache = pf.cache;
  uint32_t use[2] = {0, 0};  // fills of each K buffer so far: free/full parity
  // This lane's slot of the current pair (block lane / 16, row 16 warp + lane % 16): its offsets (slot_offsets).
  int64_t off = -1;
  int soff = 0;

  // The RoPE tile's rows of buffer `buf` (slots of block `buf` of the pair): cp.async, zero-filled when invalid.
  // The shared-memory addresses of the fills derive from the thread index re-read (laundered) in each fill: else
  // ptxas computes all of them once, outside the tile loop, and spills them.
  auto copy_rope = [&](int buf) {
    const int t = ptx::launder32(wg_tid), wl = t % 32;
    // rows 16 warp + lane / 8 + 4 j (j = 0..3), 16-byte chunk lane % 8, as the bf16 kernel's gather.
    const int lane_row = wl / 8, chunk = wl % 8, row0 = (t / 32) * T::kRowsPerWarp;
    const uint64_t policy = ptx::make_l2_evict_last_policy();  // created here: one register pair less in the loop
    const uint32_t dst0 = ptx::smem_addr(smem.k[buf][F::kRopeTile]);
#pragma unroll
    for (int j = 0; j < T::kRowsPerThread; ++j) {
      const int r = lane_row + 4 * j;
      const int64_t d = shfl64(off, buf * 16 + r);
      const bool ok = d >= 0;
      const uint8_t* src = cache + (ok ? d : 0) + Cache::kRopeOffset + chunk * 16;
      cp_async_16_hint(dst0 + tile::swizzled_chunk(row0 + r, chunk), src, ok ? 16u : 0u, policy);
    }
  };

  // Group `grp` (0: V_L, 1: V_R) of buffer `buf`: the NoPE dims by registers (loaded before the free wait), and for
  // MODEL1's V_R the RoPE tile by cp.async. `valid16`: published with the first group of a buffer.
  auto fill_regs = [&](int buf, int grp, bool first, uint32_t valid16) {
    // This thread's 16 dims inside the group (F::kRegRows) and its row parity.
    const int t = ptx::launder32(wg_tid), wl = t % 32;
    const int sub = wl & 7, half = (wl >> 3) & 1, row_par = wl >> 4, row0 = (t / 32) * T::kRowsPerWarp;
    const int dim0 = grp * F::kGroupDims + half * 128 + sub * 16;  // this thread's first dim
    const bool nope = dim0 < Cache::kNopeDim;                      // MODEL1's V_R: dims 448+ are the RoPE tile
    // Rows 2 j + row_par, j in [j0, j0 + kPass): raw bytes and scales into registers (invalid slots: zero rows, as
    // 0 * NaN would reach O through P V), then dequantised and stored.
    constexpr int kPass = F::kRowsPerPass;
    auto load_pass = [&](int j0, uint4 (&raw)[kPass], float (&scale)[kPass]) {
#pragma unroll
      for (int i = 0; i < kPass; ++i) {
        const int src = buf * 16 + 2 * (j0 + i) + row_par;
        const int64_t d = shfl64(off, src);
        raw[i] = make_uint4(0, 0, 0, 0);
        scale[i] = 1.f;
        if constexpr (F::kV32) {
          if (d >= 0) {
            raw[i] = ptx::ld_nc_v4(cache + d + dim0);
            scale[i] = __ldg(reinterpret_cast<const float*>(cache + d + Cache::kScaleOffset) + dim0 / Cache::kTileDim);
          }
        } else {
          const int sc = shfl32(soff, src);
          if (d >= 0 && nope) {
            raw[i] = ptx::ld_nc_v4(cache + d + dim0);
            scale[i] = fp8_dequant::ue8m0_to_float(__ldg(cache + d + sc + dim0 / Cache::kTileDim));
          }
        }
      }
    };
    auto store_pass = [&](int j0, const uint4 (&raw)[kPass], const float (&scale)[kPass]) {
      if (!nope) return;
      const uint32_t tile_base = ptx::smem_addr(smem.k[buf][dim0 / T::kTileCols]);
      const int c0 = (sub & 3) * 2;  // the two 16-byte chunks of the tile row
#pragma unroll
      for (int i = 0; i < kPass; ++i) {
        const int row = row0 + 2 * (j0 + i) + row_par;
        uint4 lo, hi;
        fp8_dequant::dequant16(raw[i], scale[i], lo, hi);
        ptx::st_shared_v4(tile_base + tile::swizzled_chunk(row, c0), lo);
        ptx::st_shared_v4(tile_base + tile::swizzled_chunk(row, c0 + 1), hi);
      }
    };
    // The later passes' lines (bytes and scales) pulled into L1 before the wait, so that their loads after the first
    // pass's stores hit L1 instead of paying the L2 latency on the refill's critical path (no registers held).
    auto prefetch_l1 = [&](int j0) {
#if OPENMLA_SPF8_L1_PREFETCH
#pragma unroll
      for (int i = 0; i < kPass; ++i) {
        const int src = buf * 16 + 2 * (j0 + i) + row_par;
        const int64_t d = shfl64(off, src);
        if constexpr (F::kV32) {
          if (d >= 0) {
            asm volatile("prefetch.global.L1 [%0];" ::"l"(cache + d + dim0));
            if (sub == 0) asm volatile("prefetch.global.L1 [%0];" ::"l"(cache + d + Cache::kScaleOffset));
          }
        } else {
          // MODEL1: the data lines only (the scale records, 8 bytes per token, stay L2 loads: one more 64-bit
          // shuffle per row here spilled in the fills).
          if (d >= 0 && nope) asm volatile("prefetch.global.L1 [%0];" ::"l"(cache + d + dim0));
        }
      }
#else
      (void)j0;
#endif
    };
    uint4 raw[kPass];
    float scale[kPass];
    load_pass(0, raw, scale);  // the first pass is in flight while the buffer is still being read
#pragma unroll
    for (int j0 = kPass; j0 < F::kRegRows; j0 += kPass) prefetch_l1(j0);
    ptx::mbarrier_wait_parity(&smem.free_[buf][grp], Uses::free_parity(use[buf]));
    if (first && lane == 0) {  // st.shared: a generic store kept a 64-bit shared pointer live (spilled)
      asm volatile("st.shared.u16 [%0], %1;" ::"r"(ptx::smem_addr(&smem.valid[buf][warp])),
                   "h"(static_cast<unsigned short>(valid16))
                   : "memory");
    }
    const bool rope = !F::kV32 && grp == F::kRopeGroup;
    store_pass(0, raw, scale);
    if (rope) copy_rope(buf);  // between the passes: no pass's bytes are live
#pragma unroll
    for (int j0 = kPass; j0 < F::kRegRows; j0 += kPass) {
      load_pass(j0, raw, scale);
      store_pass(j0, raw, scale);
    }
    // The stores (generic proxy) before the consumers' wgmma (async proxy); the plain arrival releases them and the
    // validity word.
    ptx::fence_proxy_async_shared();
    ptx::mbarrier_arrive(&smem.full[buf][grp]);
    if (rope) ptx::cp_async_mbarrier_arrive_noinc(&smem.full[buf][grp]);
  };

  // V3.2's RoPE group (tile 8): cp.async only.
  auto fill_rope_group = [&](int buf) {
    ptx::mbarrier_wait_parity(&smem.free_[buf][2], Uses::free_parity(use[buf]));
    copy_rope(buf);
    ptx::cp_async_mbarrier_arrive_noinc(&smem.full[buf][2]);
  };

  // Look-ahead over the pairs to come, as the bf16 kernel: the next pair's indices one pair ahead, its tokens pulled
  // into L2 at the end of the current pair (the data bytes by one bulk prefetch; MODEL1's scale record too).
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
      // The bf16 kernel's issue order (the consumers' release order).
      fill_regs(0, 0, true, valid & 0xffffu);
      OPENMLA_PREFILL_STAMP(2, pair_count, 1);
      if (has_k1) fill_regs(1, 1, true, valid >> 16);
      OPENMLA_PREFILL_STAMP(2, pair_count, 2);
      fill_regs(0, 1, false, 0);
      OPENMLA_PREFILL_STAMP(2, pair_count, 3);
      if constexpr (F::kV32) fill_rope_group(0);
      OPENMLA_PREFILL_STAMP(2, pair_count, 4);
      if (has_k1) {
        if constexpr (F::kV32) fill_rope_group(1);
        OPENMLA_PREFILL_STAMP(2, pair_count, 5);
        fill_regs(1, 0, false, 0);
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
  }
  ptx::cp_async_wait_all();
}

}  // namespace openmla::kernels::sparse_prefill

#include "kernels/sparse_prefill/fp8_staged_producer.cuh"

namespace openmla::kernels::sparse_prefill {

// kStaged: the staged producer (fp8_staged_producer.cuh), else the register producer above.
template <int kDQK, bool kStaged>
__global__ void __launch_bounds__(Traits<kDQK>::kThreads, 1)
    sparse_prefill_fp8_kernel(const __grid_constant__ SparsePrefillFp8Params p,
                              const __grid_constant__ CUtensorMap q_map) {
  using T = Traits<kDQK>;
  using F = Fp8Traits<kDQK>;
  using Smem = SharedStorage<kDQK>;
  Smem& smem = cta::shared_storage<Smem>();
  const int tid = threadIdx.x;
  const int wg = cta::warpgroup(tid);

  if (tid == 0) {
    ptx::prefetch_tensormap(&q_map);
    for (int b = 0; b < 2; ++b) {
      for (int g = 0; g < T::kNumGroups; ++g) {
        ptx::mbarrier_init(&smem.full[b][g], F::full_arrivals(g));
        ptx::mbarrier_init(&smem.free_[b][g], T::kWarpgroupThreads);
      }
    }
    for (int h = 0; h < kHandoffs; ++h)
      ptx::mbarrier_init(&smem.handoff[h], T::kWarpgroupThreads);
    ptx::mbarrier_init(&smem.q_full, 1);
    ptx::mbarrier_init(&smem.q_free, 2 * T::kWarpgroupThreads);
    ptx::fence_mbarrier_init();
  }
  __syncthreads();

  if (wg == 2) {
    ptx::setmaxnreg_dec<F::kRegsProducer>();
    if constexpr (kStaged) {
      produce_fp8_staged<kDQK>(p, smem, &q_map, tid % T::kWarpgroupThreads);
    } else {
      produce_fp8<kDQK>(p, smem, &q_map, tid % T::kWarpgroupThreads);
    }
    return;
  } else if (wg == 0) {
    ptx::setmaxnreg_inc<F::kRegsConsumer>();
    consume<kDQK, 0>(p.base, smem, tid);
    return;
  } else {
    ptx::setmaxnreg_inc<F::kRegsConsumer>();
    consume<kDQK, 1>(p.base, smem, tid);
    return;
  }
}

}  // namespace openmla::kernels::sparse_prefill
