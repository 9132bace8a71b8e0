// Sparse top-k MLA decode over an FP8 paged cache (sm_90a): DeepSeek-V3.2 (656 B/token) and MODEL1
// (584 B/token) layouts, d_v = 512.
//
// One CTA = 64 query heads of ONE query position, walking the (request, 64-slot block) range of its
// schedule partition. Three warpgroups:
//   WG2 (producer): gathers the selected tokens by index, dequantises FP8 -> BF16 into a double-buffered
//       shared K block (64 tokens x d_qk, 128B-swizzled K-major tiles) and a per-slot validity mask.
//   WG0: S = Q K^T, masking, online softmax (base 2), P -> shared memory, O[:, 0:256] += P V_L.
//   WG1: O[:, 256:512] = a O + P V_R, with P and the rescale factor a from WG0.
// "Crossover" (an even number of head blocks, e.g. h_q = 128, unless the host picks the plain kernel for a small
// batch: heuristics::sparse_use_crossover): the two CTAs of a cluster hold different heads of the same query
// position, so they need the same K block; each producer dequantises half of the 64 tokens and writes the result
// into both CTAs' shared memory (distributed shared memory), halving the dequantisation work, which is the
// bottleneck of this kernel (docs/sparse-decode.md, "Decomposition").
// Design note: docs/sparse-decode.md.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "common/barrier_ring.cuh"
#include "common/cta.cuh"
#include "common/epilogue.cuh"
#include "common/mma_tile.cuh"
#include "common/online_softmax.cuh"
#include "common/ptx.cuh"
#include "common/trace.cuh"
#include "kernels/decode_scheduler/partition_walk.h"
#include "kernels/sparse_decode/config.h"
#include "kernels/sparse_decode/params.h"

namespace openmla::kernels::sparse_decode {

// ---------------------------------------------------------------------------------------------------
// Trace builds (CMake -DOPENMLA_TRACE=ON): the block steps, request switches and per-CTA timeline of config.h, struct
// Trace, in the format of common/trace.cuh (tools/diag/kernel_trace.py sparse-decode reads it). Without the option the
// macros are empty and the kernel compiles to the production SASS.
// ---------------------------------------------------------------------------------------------------
#if defined(OPENMLA_HAS_TRACE)
__device__ unsigned long long g_trace[Trace::Format::kDeviceValues];
// Track 0's CTAs are those of query position 0, partition 0 (blockIdx.y = blockIdx.z = 0), whose linear id is
// blockIdx.x: passed as such (trace::stamp_at), as the linear id computed in the loops spilled registers.
__device__ __forceinline__ bool block_trace_cta() { return blockIdx.y == 0 && blockIdx.z == 0; }
// Event `ev` of `role`'s block `it` (thread 0 of each warpgroup).
__device__ __forceinline__ void trace_stamp(int role, uint32_t it, int ev) {
  if (block_trace_cta() && trace::warpgroup_leader())
    trace::stamp_at<Trace::Format, 0>(g_trace, blockIdx.x, role, it, ev);
}
// Timeline event kEv (thread 0 of each warpgroup); kEntry and kExit are the CTA header's start and end too.
template <int kEv>
__device__ __forceinline__ void timeline_stamp() {
  if (!trace::warpgroup_leader()) return;
  trace::stamp<Trace::Format, 1>(g_trace, 0, 0, kEv);
  if constexpr (kEv == Trace::kEntry) trace::cta_start<Trace::Format>(g_trace);
  if constexpr (kEv == Trace::kExit) trace::cta_end<Trace::Format>(g_trace, 0);
}
// Event `ev` of WG0's switch from the partition's request k (thread 0; the first kSwitches requests).
__device__ __forceinline__ void switch_stamp(int k, int ev) {
  if (block_trace_cta() && threadIdx.x == 0 && static_cast<unsigned>(k) < Trace::kSwitches)
    trace::stamp_at<Trace::Format, 0>(g_trace, blockIdx.x, Trace::kRoleSwitch, k, ev);
}
// Timeline event `ev` once `dep` has landed (trace::stamp_after).
__device__ __forceinline__ void timeline_stamp_after(int ev, uint32_t dep) {
  if (trace::warpgroup_leader()) trace::stamp_after<Trace::Format, 1>(g_trace, 0, 0, ev, dep);
}
#endif
#define OPENMLA_TRACE(role, it, ev) OPENMLA_TRACE_ONLY(::openmla::kernels::sparse_decode::trace_stamp(role, it, ev))
#define OPENMLA_TIMELINE(ev) OPENMLA_TRACE_ONLY(::openmla::kernels::sparse_decode::timeline_stamp<Trace::ev>())
#define OPENMLA_TIMELINE_AFTER(ev, dep) \
  OPENMLA_TRACE_ONLY(::openmla::kernels::sparse_decode::timeline_stamp_after(Trace::ev, dep))
#define OPENMLA_SWITCH(k, ev) OPENMLA_TRACE_ONLY(::openmla::kernels::sparse_decode::switch_stamp(k, ev))

// ---------------------------------------------------------------------------------------------------
// FP8 e4m3 -> BF16 dequantisation
// ---------------------------------------------------------------------------------------------------
// Two e4m3 bytes of `w` (selected by `sel`) -> a bf16x2 word holding value * 2^-120 EXACTLY: the e4m3 bit
// pattern shifted into bf16 position is the same number with the exponent bias 7 read as 127 (subnormal
// e4m3 lands on subnormal bf16 with the same factor). prmt's sign-replicating selector nibbles (8 | byte)
// put each byte's sign into the byte above it, from which the shift moves it to bit 15.
__device__ __forceinline__ uint32_t e4m3x2_to_bf16x2_scaled(uint32_t w, uint32_t sel) {
  uint32_t x;
  asm("prmt.b32 %0, %1, 0, %2;" : "=r"(x) : "r"(w), "r"(sel));
  return (x << 4) & 0x87F087F0u;
}

// Multiplier(s) that turn value * 2^-120 into value * scale in bf16. scale is a power of two by format, so
// every product is exact; scale * 2^120 overflows bf16 when scale > 2^7, then two multiplies are used.
struct ScaleMul {
  __nv_bfloat162 first;
  __nv_bfloat162 second;
  bool two;
};

__device__ __forceinline__ ScaleMul make_scale_mul(float scale) {
  constexpr float k2p120 = 1.329227995784916e36f;  // 2^120
  ScaleMul m;
  m.two = !(scale <= 128.f);  // also NaN scales: then the second multiply propagates the NaN
  const float first = m.two ? k2p120 : scale * k2p120;
  m.first = __float2bfloat162_rn(first);
  m.second = __float2bfloat162_rn(scale);
  return m;
}

__device__ __forceinline__ uint32_t mul_bf16x2(uint32_t a, __nv_bfloat162 b) {
  __nv_bfloat162 r = __hmul2(*reinterpret_cast<__nv_bfloat162*>(&a), b);
  return *reinterpret_cast<uint32_t*>(&r);
}

// 16 e4m3 values -> 16 bf16 (two 16-byte chunks, dims in order).
__device__ __forceinline__ void dequant16(const uint4& raw, const ScaleMul& m, uint4& lo, uint4& hi) {
  const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
  uint32_t o[8];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    o[2 * i] = mul_bf16x2(e4m3x2_to_bf16x2_scaled(w[i], 0x9180u), m.first);      // bytes 0, 1
    o[2 * i + 1] = mul_bf16x2(e4m3x2_to_bf16x2_scaled(w[i], 0xB3A2u), m.first);  // bytes 2, 3
  }
  if (m.two) {
#pragma unroll
    for (int i = 0; i < 8; ++i) o[i] = mul_bf16x2(o[i], m.second);
  }
  lo = make_uint4(o[0], o[1], o[2], o[3]);
  hi = make_uint4(o[4], o[5], o[6], o[7]);
}

// ---------------------------------------------------------------------------------------------------
// Shared-memory addressing and wgmma (same tile conventions as dense decode)
// ---------------------------------------------------------------------------------------------------
using Co = Common;
using tile::desc_k_major;
using tile::desc_mn_major;
using tile::exponentiate;
using tile::Fragment;
using tile::make_fragment;
using tile::quad_sum;
using tile::row_max;
using tile::scale_rows;
using tile::swizzled_chunk;
static_assert(Co::kTileBytes == tile::kTileBytes && Co::kRowBytes == tile::kRowBytes &&
              Co::kSwizzleAtomBytes == tile::kSwizzleAtomBytes, "one tile convention");

// Descriptors are built once per block from a laundered base (ptx::launder) and advanced by constant offsets (the
// start address field is addr >> 4 in the low bits; shared addresses stay far below its 14-bit range). Without the
// laundering ptxas may hoist the loop-invariant descriptors out of the block loop and run out of registers; the
// same for thread-index-derived addresses (ptx::launder32), which would be kept live across the request loop.
__device__ __forceinline__ uint64_t desc_advance(uint64_t desc, uint32_t bytes) { return desc + (bytes >> 4); }

// K buffer addressing (config.h, Common::kGroupTiles): byte offset of 16-byte chunk `chunk` of row `row` of
// tile `t`, and the wgmma descriptors of the group-major tiles (K-major for Q K^T, MN-major for the V view).
__device__ __forceinline__ uint32_t k_chunk(int t, int row, int chunk) {
  if (t < Co::kGroupTiles)
    return static_cast<uint32_t>((t / Co::kHalfTiles) * Co::kHalfBytes + (row >> 3) * Co::kGroupStride +
                                 (t % Co::kHalfTiles) * Co::kSwizzleAtomBytes + (row & 7) * Co::kRowBytes +
                                 ((chunk ^ (row & 7)) << 4));
  return static_cast<uint32_t>(Co::kGroupBytes + (t - Co::kGroupTiles) * Co::kTileBytes) + swizzled_chunk(row, chunk);
}
__device__ __forceinline__ uint64_t desc_k_group(const void* p) {
  return ptx::make_smem_desc_sw128(ptx::smem_addr(p), 16, Co::kGroupStride);
}
__device__ __forceinline__ uint64_t desc_v_group(const void* p) {
  return ptx::make_smem_desc_sw128(ptx::smem_addr(p), Co::kSwizzleAtomBytes, Co::kGroupStride);
}

// Barrier phases (common/barrier_ring.cuh): the two K buffers are a ring used once per block of the partition (use
// `it`: full[buf], free_[buf][*], p_ready[buf], scale_free[buf]); the Q tile is a ring of one used once per Q
// generation (q_full, q_free).
using KRing = pipeline::BarrierRing<2>;
using QRing = pipeline::BarrierRing<1>;

// The two consumer warpgroups only (NamedBarrier::kConsumers). They reach it from different code (one instantiation
// per role), so the non-aligned barrier.sync is used (bar.sync = barrier.sync.aligned; synccheck flags it).
__device__ __forceinline__ void consumer_barrier() {
  __syncwarp();
  ptx::named_barrier_sync_unaligned(static_cast<int>(NamedBarrier::kConsumers), 2 * Common::kWarpgroupThreads);
}

using epilogue::pack_bf16;

// ---------------------------------------------------------------------------------------------------
// Per-request geometry, computed identically by every role (it must match the scheduler's block count:
// main blocks = max(ceil(main_len / 64), 1), then ceil(extra_len / 64) extra blocks).
// ---------------------------------------------------------------------------------------------------
struct RequestWork {
  int main_len;     // usable main slots: min(topk_length, topk), or topk
  int extra_len;    // usable extra slots (0 without an extra cache)
  int main_blocks;
  int blk_begin, blk_end;
  bool is_split;
  int split_slot;
};

__device__ __forceinline__ int clamp_len(const int32_t* lengths, int req, int topk) {
  if (lengths == nullptr) return topk;
  return min(max(lengths[req], 0), topk);
}

__device__ __forceinline__ RequestWork request_work(const SparseDecodeParams& p, const DecodeScheduleRecord& rec,
                                                    int req) {
  RequestWork w;
  w.main_len = __shfl_sync(0xffffffff, clamp_len(p.main.topk_length, req, p.main.topk), 0);
  w.extra_len = p.has_extra ? __shfl_sync(0xffffffff, clamp_len(p.extra.topk_length, req, p.extra.topk), 0) : 0;
  w.main_blocks = max((w.main_len + Co::kBlockN - 1) / Co::kBlockN, 1);
  const int num_blocks = w.main_blocks + (w.extra_len + Co::kBlockN - 1) / Co::kBlockN;
  w.blk_begin = chunk_begin_block(rec, req);
  w.blk_end = chunk_end_block(rec, req, num_blocks);
  w.is_split = chunk_is_split(rec, req);
  w.split_slot = 0;
  return w;
}

// ---------------------------------------------------------------------------------------------------
// Producer: gather + dequantise one token's share (4 threads per token) into a K buffer
// ---------------------------------------------------------------------------------------------------
template <Layout L, bool kCrossover>
struct TokenWriter {
  uint32_t k_base;      // shared address of k[buf]
  uint32_t peer_delta;  // peer's shared::cluster address minus our shared address (crossover)
  uint32_t peer_full;   // the peer's full[buf] (crossover): st.async completes its bytes there

  __device__ __forceinline__ void put(uint32_t addr, uint4 v, bool remote) const {
    ptx::st_shared_v4(addr, v);
    if (kCrossover && remote) ptx::st_async_v4(addr + peer_delta, v, peer_full);
  }
  // Chunks 2*lane4 and 2*lane4 + 1 of row `tok` of tile `tile`. With crossover, the group-major tiles reach the
  // peer by one bulk copy per block (producer loop); the others (V3.2's RoPE tile) are sent chunk by chunk.
  __device__ __forceinline__ void put_pair(int tile, int tok, int lane4, uint4 lo, uint4 hi) const {
    const bool remote = tile >= Co::kGroupTiles;
    put(k_base + k_chunk(tile, tok, 2 * lane4), lo, remote);
    put(k_base + k_chunk(tile, tok, 2 * lane4 + 1), hi, remote);
  }
};

// One token's share of one thread (4 threads per token): the raw bytes, loaded before the buffer is free.
template <Layout L>
struct TokenData {
  uint4 nope[Traits<L>::kNopeTiles];
  uint4 rope[2];
  uint4 scales;  // V3.2: 4 fp32; MODEL1: 8 UE8M0 bytes in .x/.y
};

// Where token `idx` of cache `c` lives (only for valid slots; the layouts: common/fp8_cache_layout.h).
template <Layout L>
struct TokenAddress {
  const uint8_t* data;   // NoPE bytes, then RoPE at +Cache::kRopeOffset
  const uint8_t* scale;  // the scale record
};
template <Layout L>
__device__ __forceinline__ TokenAddress<L> token_address(const SparseCacheView& c, int idx) {
  using Cache = typename Traits<L>::Cache;
  const uint32_t page = static_cast<uint32_t>(idx) / static_cast<uint32_t>(c.page_size);
  const uint32_t row = static_cast<uint32_t>(idx) - page * static_cast<uint32_t>(c.page_size);
  const uint8_t* page_ptr = c.data + static_cast<int64_t>(page) * c.page_stride;
  TokenAddress<L> a;
  if constexpr (L == Layout::kV32) {
    a.data = page_ptr + static_cast<int64_t>(row) * Cache::kDataStride;
    a.scale = a.data + Cache::kScaleOffset;
  } else {
    a.data = page_ptr + static_cast<int64_t>(row) * Cache::kDataStride;
    a.scale = page_ptr + static_cast<int64_t>(c.page_size) * Cache::kDataStride +
              static_cast<int64_t>(row) * Cache::kScaleStride;
  }
  return a;
}

template <Layout L>
__device__ __forceinline__ void load_token(const SparseCacheView& c, int idx, bool valid, int lane4, TokenData<L>& d) {
  using T = Traits<L>;
  constexpr int kRopeOffset = T::Cache::kRopeOffset;  // 528 / 448
  if (valid) {
    const TokenAddress<L> a = token_address<L>(c, idx);
    // NoPE tile j: the e4m3 bytes of dims 64j.., one byte per dim; each of the 4 threads loads 16.
#pragma unroll
    for (int j = 0; j < T::kNopeTiles; ++j) d.nope[j] = ptx::ld_nc_v4(a.data + j * T::kTileCols + lane4 * 16);
    d.rope[0] = ptx::ld_nc_v4(a.data + kRopeOffset + lane4 * 32);
    d.rope[1] = ptx::ld_nc_v4(a.data + kRopeOffset + lane4 * 32 + 16);
    if constexpr (L == Layout::kV32) {
      d.scales = ptx::ld_nc_v4(a.scale);
    } else {
      const uint2 sc = ptx::ld_nc_v2(a.scale);
      d.scales = make_uint4(sc.x, sc.y, 0, 0);
    }
  } else {
    // Never dereferenced: zeros (V rows of a skipped slot must be 0, not garbage: 0 * NaN = NaN in P V).
#pragma unroll
    for (int j = 0; j < T::kNopeTiles; ++j) d.nope[j] = make_uint4(0, 0, 0, 0);
    d.rope[0] = d.rope[1] = make_uint4(0, 0, 0, 0);
    d.scales = make_uint4(0, 0, 0, 0);
  }
}

// Pulls the cache lines of token `idx` into L2 (a block ahead of its loads).
template <Layout L>
__device__ __forceinline__ void prefetch_token_l2(const SparseCacheView& c, int idx, int lane4) {
  constexpr int kDataBytes = Traits<L>::Cache::kDataStride;  // the token's contiguous bytes (656 / 576)
  const TokenAddress<L> a = token_address<L>(c, idx);
#pragma unroll
  for (int k = lane4 * 128; k < kDataBytes; k += 4 * 128)
    asm volatile("prefetch.global.L2 [%0];" ::"l"(a.data + k));
  if constexpr (L == Layout::kModel1) {
    if (lane4 == 1) asm volatile("prefetch.global.L2 [%0];" ::"l"(a.scale));
  }
}

// NoPE tiles [kFirst, kLast) of one token's share, dequantised and stored; the RoPE tile too when kLast is the
// last NoPE tile.
template <Layout L, bool kCrossover, int kFirst, int kLast>
__device__ __forceinline__ void store_tiles(const TokenData<L>& d, int tok, int lane4,
                                            const TokenWriter<L, kCrossover>& wr) {
  using T = Traits<L>;
#pragma unroll
  for (int j = kFirst; j < kLast; ++j) {
    float scale;
    if constexpr (L == Layout::kV32) {
      const uint32_t sc[4] = {d.scales.x, d.scales.y, d.scales.z, d.scales.w};
      scale = __uint_as_float(sc[j / T::kTilesPerScale]);
    } else {
      const uint32_t e = (j < 4 ? d.scales.x >> (8 * j) : d.scales.y >> (8 * (j - 4))) & 0xFFu;
      scale = __uint_as_float(e << 23);  // UE8M0: 2^(e - 127)
    }
    uint4 lo, hi;
    dequant16(d.nope[j], make_scale_mul(scale), lo, hi);
    wr.put_pair(j, tok, lane4, lo, hi);
  }
  if constexpr (kLast == T::kNopeTiles) wr.put_pair(T::kRopeTile, tok, lane4, d.rope[0], d.rope[1]);
}

// Position of the producer in its partition's (request, block) sequence: the same order the consumers walk.
struct Cursor {
  int req;
  int blk;
  RequestWork w;
};

__device__ __forceinline__ void cursor_settle(const SparseDecodeParams& p, const DecodeScheduleRecord& rec, Cursor& c) {
  // Moves past requests with an empty block range (none occur with the scheduler's work model; kept exact).
  while (c.req <= rec.end_req && c.blk >= c.w.blk_end) {
    if (++c.req > rec.end_req) break;
    c.w = request_work(p, rec, c.req);
    c.blk = c.w.blk_begin;
  }
}
__device__ __forceinline__ Cursor cursor_begin(const SparseDecodeParams& p, const DecodeScheduleRecord& rec) {
  Cursor c;
  c.req = rec.begin_req;
  c.w = request_work(p, rec, c.req);
  c.blk = c.w.blk_begin;
  cursor_settle(p, rec, c);
  return c;
}
__device__ __forceinline__ Cursor cursor_next(const SparseDecodeParams& p, const DecodeScheduleRecord& rec, Cursor c) {
  if (c.req > rec.end_req) return c;
  ++c.blk;
  cursor_settle(p, rec, c);
  return c;
}

// Index of this thread's token (round r) of the cursor's block, -1 when the slot is past the length or the
// cursor is past the partition; and its cache.
template <int kRounds>
__device__ __forceinline__ void load_indices(const SparseDecodeParams& p, const DecodeScheduleRecord& rec, const Cursor& c,
                                             int tok0, int s_idx, int (&idx)[kRounds]) {
  const bool live = c.req <= rec.end_req;
  const bool extra = c.blk >= c.w.main_blocks;
  const SparseCacheView& v = extra ? p.extra : p.main;
  const int slot0 = (extra ? c.blk - c.w.main_blocks : c.blk) * Common::kBlockN + tok0;
  const int len = extra ? c.w.extra_len : c.w.main_len;
  const int32_t* row = v.indices + static_cast<int64_t>(c.req) * v.idx_stride_b + static_cast<int64_t>(s_idx) * v.idx_stride_s;
#pragma unroll
  for (int r = 0; r < kRounds; ++r) {
    const int slot = slot0 + r * Common::kTokensPerRound;
    idx[r] = (live && slot < len) ? row[slot] : -1;
  }
}
__device__ __forceinline__ const SparseCacheView& cursor_cache(const SparseDecodeParams& p, const Cursor& c) {
  return c.blk >= c.w.main_blocks ? p.extra : p.main;
}

// Q tile of request `req` (64 heads x d_qk, zero rows past h_q) by cp.async: threads first, first + stride, ...
// (no commit: the consumers commit and wait, the producer signals q_full through its mbarrier arrive).
template <Layout L>
__device__ __forceinline__ void load_q_tile(const SparseDecodeParams& p, SharedStorage<L>& smem, int req, int first,
                                            int stride) {
  using T = Traits<L>;
  const int head0 = blockIdx.x * T::kBlockM;
  const auto* q = static_cast<const uint8_t*>(p.q);
  const uint8_t* q_req = q + 2 * (static_cast<int64_t>(req) * p.q_stride_b + static_cast<int64_t>(blockIdx.y) * p.q_stride_s);
  constexpr int kChunksPerRow = T::kHeadDimQK / 8;
#pragma unroll 1
  for (int i = ptx::launder32(first); i < T::kBlockM * kChunksPerRow; i += stride) {
    const int row = i / kChunksPerRow, chunk = i % kChunksPerRow;
    const int head = head0 + row;
    uint8_t* dst = smem.q[chunk / 8] + swizzled_chunk(row, chunk % 8);
    if (head < p.h_q)
      ptx::cp_async_16(dst, q_req + 2 * (static_cast<int64_t>(head) * p.q_stride_h + chunk * 8), 16);
    else
      ptx::cp_async_16(dst, q, 0);
  }
}

// ---------------------------------------------------------------------------------------------------
// Consumers: kWg = 0 (S = Q K^T, softmax, O_L) or 1 (O_R). Separate instantiations so that ptxas sees
// one register budget (setmaxnreg) per warpgroup role.
// ---------------------------------------------------------------------------------------------------
template <Layout L, bool kCrossover, int kWg, typename InitSync>
__device__ __forceinline__ void consume(const SparseDecodeParams& p, SharedStorage<L>& smem,
                                        const DecodeScheduleRecord& rec, int tid, InitSync&& init_sync) {
  using T = Traits<L>;
  constexpr int wg = kWg;
  const int lane = tid % 32;
  const int head_block = blockIdx.x;
  const int s_idx = blockIdx.y;
  const int head0 = head_block * T::kBlockM;
  uint32_t peer_delta = 0;
  if constexpr (kCrossover) {
    const uint32_t base = ptx::smem_addr(&smem);
    peer_delta = ptx::map_to_peer(base, ptx::cluster_cta_rank() ^ 1u) - base;
  }
  // WG0 is done with the whole buffer after P V_L (V_L half and, earlier, Q K^T over all of it); WG1 reads
  // only the V_R half and P, so the V_L half can be refilled while WG1 still works (docs/sparse-decode.md,
  // decision sparse-v10).
  auto release_buffer = [&](int buf) {
    __syncwarp();
    if (lane == 0) {
#pragma unroll
      for (int half = wg == 0 ? 0 : 1; half < 2; ++half) {
        ptx::mbarrier_arrive(&smem.free_[buf][half]);
        if constexpr (kCrossover) ptx::mbarrier_arrive_remote(ptx::smem_addr(&smem.free_[buf][half]) + peer_delta);
      }
    }
  };
  // Q tiles (docs/sparse-decode.md, decision sparse-v14): the consumers load the partition's first one
  // themselves; every later request with blocks gets its Q from the producer (generation g = 1, 2, ...: q_full
  // completion g - 1), which issues it once WG0 released the previous generation (q_free) after its last Q K^T,
  // so WG0's request switch no longer issues 4608 16-byte copies and the load overlaps the epilogue.
  auto load_first_q = [&] {
    load_q_tile<L>(p, smem, rec.begin_req, tid, 2 * T::kWarpgroupThreads);
    ptx::cp_async_commit();
  };
  // The first Q tile. Crossover, and the plain path with host records (small batch): after the barrier setup, so
  // that its 72 KB per CTA do not queue in front of the producers' dependent index and token loads, which are
  // issued before the setup and let the producers arrive at it without waiting for them (docs/sparse-decode.md,
  // decisions sparse-v13, sparse-v25). The plain path otherwise: before it (decision sparse-v12; after it,
  // h_q = 16 read 0.6 % slower).
  const bool q_after_setup = kCrossover || p.uniform_blocks > 0;
  if (!q_after_setup) load_first_q();
  init_sync(true);
  if (q_after_setup) load_first_q();
  uint32_t it = 0;
  uint32_t q_gen = 0;  // Q generation of the current request (0: the first, loaded above)
  for (int req = rec.begin_req; req <= rec.end_req; ++req) {
    RequestWork w = request_work(p, rec, req);
    w.split_slot = sparse_split_base(p, req) + chunk_ordinal(rec, req);
    const bool has_blocks = w.blk_end > w.blk_begin;

    // ---- Q tile: the first was requested by both consumer warpgroups above; later ones come from the producer
    // (only WG0 reads Q). The barrier also keeps WG0's next out_scale write behind WG1's read of the last one.
    if (req == rec.begin_req) {
      ptx::cp_async_wait_all();
    } else if (wg == 0 && has_blocks) {
      ++q_gen;
      ptx::mbarrier_wait_parity(&smem.q_full, QRing::parity(q_gen - 1));
    }
    OPENMLA_SWITCH(req - rec.begin_req - 1, 4);
    ptx::fence_proxy_async_shared();
    consumer_barrier();
    OPENMLA_SWITCH(req - rec.begin_req - 1, 5);
    if (wg == 0 && req == rec.begin_req) OPENMLA_TIMELINE(kQReady);

    float o[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.f;
    float m_run[2] = {T::kMaxInit, T::kMaxInit};
    float l_run[2] = {0.f, 0.f};

    for (int blk = w.blk_begin; blk < w.blk_end; ++blk, ++it) {
      const int buf = KRing::slot(it);
      const uint32_t phase = KRing::parity(it);
      const Fragment frag = make_fragment(ptx::launder32(tid) % T::kWarpgroupThreads);
      static_assert(!T::kPInRopeTile || T::kRopeTile == Co::kGroupTiles, "P reuses the plain RoPE tile");
      uint8_t* p_tile = T::kPInRopeTile ? smem.k[buf] + Co::kGroupBytes : smem.p[T::kPInRopeTile ? 0 : buf];
      if constexpr (wg == 0) {
        OPENMLA_TRACE(0, it, 0);
        ptx::mbarrier_wait_parity(&smem.full[buf], phase);
        OPENMLA_TRACE(0, it, 1);
        if (it == 0) OPENMLA_TIMELINE(kFirstFull);
        float s[32];
        const uint64_t q_desc = ptx::launder(desc_k_major(smem.q[0]));
        const uint64_t k_desc = ptx::launder(desc_k_group(smem.k[buf]));
        const uint64_t r_desc = T::kNumTiles > Co::kGroupTiles ? ptx::launder(desc_k_major(smem.k[buf] + Co::kGroupBytes)) : 0;
        ptx::wgmma_fence();
#pragma unroll
        for (int t = 0; t < T::kNumTiles; ++t) {
#pragma unroll
          for (int kk = 0; kk < T::kTileCols / 16; ++kk) {
            const uint64_t kd = t < Co::kGroupTiles ? desc_advance(k_desc, (t / Co::kHalfTiles) * Co::kHalfBytes +
                                                                         (t % Co::kHalfTiles) * Co::kSwizzleAtomBytes + kk * 32)
                                                    : desc_advance(r_desc, (t - Co::kGroupTiles) * T::kTileBytes + kk * 32);
            ptx::wgmma_m64n64k16_ss_bf16<0>(s, desc_advance(q_desc, t * T::kTileBytes + kk * 32), kd, (t | kk) != 0);
          }
        }
        ptx::wgmma_commit();
        ptx::wgmma_wait<0>();
        ptx::fence_registers(s);
        OPENMLA_TRACE(0, it, 2);
        // The request's last Q K^T: its Q tile may be overwritten (docs/sparse-decode.md, decision sparse-v16).
        if (blk == w.blk_end - 1) {
          __syncwarp();
          if (lane == 0) ptx::mbarrier_arrive(&smem.q_free);
        }
        // Skipped slots: -inf (overwrite, never add: their K rows are zeros, but keep the rule).
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const uint2 v2 = *reinterpret_cast<const uint2*>(&smem.valid[buf][j * 8 + frag.col]);
          if (v2.x == 0) s[j * 4 + 0] = s[j * 4 + 2] = -INFINITY;
          if (v2.y == 0) s[j * 4 + 1] = s[j * 4 + 3] = -INFINITY;
        }
        float mx[2];
        row_max(s, mx);
        float a[2], m_new[2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          m_new[i] = softmax::new_max(m_run[i], mx[i], p.scale_log2);
          a[i] = softmax::rescale_factor(m_run[i], m_new[i]);
          m_run[i] = m_new[i];
        }
        float sum[2];
        exponentiate(s, p.scale_log2, m_new, sum);
        softmax::update_row_sums(l_run, a, sum);
        // P (bf16) and a for WG1.
        uint32_t pa[4][4];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const uint32_t lo = pack_bf16(s[j * 4 + 0], s[j * 4 + 1]);
          const uint32_t hi = pack_bf16(s[j * 4 + 2], s[j * 4 + 3]);
          pa[j / 2][(j % 2) * 2 + 0] = lo;
          pa[j / 2][(j % 2) * 2 + 1] = hi;
          const int col = j * 8 + frag.col;
          *reinterpret_cast<uint32_t*>(p_tile + swizzled_chunk(frag.row[0], col >> 3) + (col & 7) * 2) = lo;
          *reinterpret_cast<uint32_t*>(p_tile + swizzled_chunk(frag.row[1], col >> 3) + (col & 7) * 2) = hi;
        }
        // WG1 has read scale[buf] of block it - 2 (already implied by full[buf] through the producer's free
        // wait, but that chain crosses the cluster; this local barrier states it directly, and costs nothing in
        // steady state: WG1 read it two blocks ago).
        ptx::mbarrier_wait_parity(&smem.scale_free[buf], KRing::free_parity(it));
        if (lane % 4 == 0) {
          smem.scale[buf][frag.row[0]] = a[0];
          smem.scale[buf][frag.row[1]] = a[1];
        }
        ptx::fence_proxy_async_shared();
        ptx::mbarrier_arrive(&smem.p_ready[buf]);
        OPENMLA_TRACE(0, it, 3);
        // O_L = a O_L + P V_L.
        scale_rows(o, a[0], a[1]);
        const uint64_t v_desc = ptx::launder(desc_v_group(smem.k[buf]));
        ptx::wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)  // 16 tokens = two 8-token groups per step
          ptx::wgmma_m64n256k16_rs_bf16<1>(o, pa[kk], desc_advance(v_desc, kk * 2 * Co::kGroupStride), 1);
        ptx::wgmma_commit();
        ptx::wgmma_wait<0>();
        ptx::fence_registers(o);
        release_buffer(buf);
        OPENMLA_TRACE(0, it, 4);
      } else {
        OPENMLA_TRACE(1, it, 0);
        ptx::mbarrier_wait_parity(&smem.p_ready[buf], phase);
        ptx::mbarrier_wait_parity(&smem.full[buf], phase);
        OPENMLA_TRACE(1, it, 1);
        scale_rows(o, smem.scale[buf][frag.row[0]], smem.scale[buf][frag.row[1]]);
        ptx::mbarrier_arrive(&smem.scale_free[buf]);  // every WG1 thread (each read its own rows)
        const uint64_t p_desc = ptx::launder(desc_k_major(p_tile));
        static_assert(T::kVTilesPerHalf == Co::kHalfTiles, "V_R is the second half of the group-major tiles");
        const uint64_t v_desc = ptx::launder(desc_v_group(smem.k[buf] + Co::kHalfBytes));
        ptx::wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
          ptx::wgmma_m64n256k16_ss_bf16<1>(o, desc_advance(p_desc, kk * 32),
                                           desc_advance(v_desc, kk * 2 * Co::kGroupStride), 1);
        ptx::wgmma_commit();
        ptx::wgmma_wait<0>();
        ptx::fence_registers(o);
        release_buffer(buf);
        OPENMLA_TRACE(1, it, 2);
      }
    }

    if (wg == 0 && req == rec.end_req) OPENMLA_TIMELINE(kLastBlockDone);
    // Every warpgroup takes the same decision: a request with at least one block ends with WG0's last Q K^T done.
    // WG0 released this request's Q generation after its last Q K^T; the partition's first Q is released here
    // when its request has no blocks (the scheduler never makes one; kept exact).
    OPENMLA_SWITCH(req - rec.begin_req, 0);
    if (wg == 0 && req == rec.begin_req && !has_blocks) {
      __syncwarp();
      if (lane == 0) ptx::mbarrier_arrive(&smem.q_free);
    }
    OPENMLA_SWITCH(req - rec.begin_req, 1);

    // ---- epilogue: WG0 owns the softmax statistics and hands the output scale to WG1.
    if (req == rec.end_req) ptx::griddep_launch_dependents();
    const Fragment frag = make_fragment(ptx::launder32(tid) % T::kWarpgroupThreads);
    float total[2] = {0.f, 0.f};
    if (wg == 0) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        total[i] = quad_sum(l_run[i]);
        const int head = head0 + frag.row[i];
        float inv = 0.f;
        if (total[i] > 0.f) {
          float denom = total[i];
          // The sink joins the softmax denominator only for final outputs (combine applies it otherwise).
          if (!w.is_split && p.attn_sink != nullptr && head < p.h_q)
            denom += epilogue::sink_term(p.attn_sink[head], m_run[i]);
          inv = 1.f / denom;
        }
        if (lane % 4 == 0) smem.out_scale[frag.row[i]] = inv;
      }
    }
    consumer_barrier();
    OPENMLA_SWITCH(req - rec.begin_req, 2);
    const float inv0 = smem.out_scale[frag.row[0]], inv1 = smem.out_scale[frag.row[1]];
    scale_rows(o, inv0, inv1);
    const int col_base = wg * (T::kHeadDimV / 2);
    // bf16 outputs by 16-byte stores (docs/sparse-decode.md, decision sparse-v15): the quad's fragments are
    // exchanged by shuffles first (every lane takes part; rows past h_q only skip the stores), so a warp
    // instruction writes 8 rows x 64 contiguous bytes. The fp32 partials keep 8-byte stores (8 rows x 32 bytes;
    // the same exchange for them made ptxas spill hundreds of bytes).
    const int q4 = lane % 4;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int head = head0 + frag.row[i];
      const bool live = head < p.h_q;  // the same for the whole quad
      if (!w.is_split) {
        // bf16 (out's rows are 16-byte aligned: checked on the host).
        auto* out = static_cast<uint8_t*>(p.output.out) + 2 * p.output.out_offset(req, s_idx, head);
        epilogue::store_row<false, false>(o, i, q4, out, col_base, live);
      } else {
        // fp32 partials: 8-byte stores straight from the fragment.
        const int64_t prow = (static_cast<int64_t>(w.split_slot) * p.s_q + s_idx) * p.h_q + head;
        float* po = p.partial_o + prow * T::kHeadDimV;
#pragma unroll
        for (int j = 0; j < 32; ++j) {
          const int col = col_base + j * 8 + frag.col;
          if (live) *reinterpret_cast<float2*>(po + col) = make_float2(o[j * 4 + 2 * i], o[j * 4 + 2 * i + 1]);
        }
      }
      if (!live) continue;
      if (wg == 0 && lane % 4 == 0) {
        const bool empty = epilogue::is_empty_row(total[i]);
        const float log2_sum = empty ? 0.f : epilogue::lse_log2(m_run[i], total[i]);
        if (!w.is_split) {
          p.output.lse[p.output.lse_offset(req, s_idx, head)] = epilogue::final_lse(empty, log2_sum);
        } else {
          p.partial_lse[(static_cast<int64_t>(w.split_slot) * p.s_q + s_idx) * p.h_q + head] =
              empty ? -INFINITY : log2_sum;
        }
      }
    }
    OPENMLA_SWITCH(req - rec.begin_req, 3);
  }
  if (wg == 0) OPENMLA_TIMELINE(kEpilogueDone);
}

// ---------------------------------------------------------------------------------------------------
// The kernel
// ---------------------------------------------------------------------------------------------------
template <Layout L, bool kCrossover>
__global__ void __launch_bounds__(Common::kThreads, 1) sparse_decode_kernel(const __grid_constant__ SparseDecodeParams p) {
  using T = Traits<L>;
  using Smem = SharedStorage<L>;
  Smem& smem = cta::shared_storage<Smem>();

  const int tid = threadIdx.x;
  const int wg = cta::warpgroup(tid);
  const int wg_tid = tid % T::kWarpgroupThreads;
  const int s_idx = blockIdx.y;
  constexpr int kCtas = kCrossover ? 2 : 1;
  if (tid == 0) OPENMLA_TIMELINE(kEntry);

  // The kernel head is a chain of dependent loads (schedule record, indices, tokens; docs/sparse-decode.md, "Where
  // the time goes"), so the record is read first and each role issues its first loads (producer: indices and
  // first tokens; consumers: the first Q tile) before it calls init_sync(), which sets the barriers up (decision
  // sparse-v12). With host records (small batch) the record comes from the kernel parameters (decision sparse-v20).
  DecodeScheduleRecord rec = p.uniform_blocks > 0 ? unpack_partition_record(p.uniform_records[blockIdx.z])
                                                  : p.schedule[blockIdx.z];
  // broadcast_record_range(rec) spelled out: through the function the trace build's crossover variants compiled
  // differently (docs/architecture.md, "Device layer").
  rec.begin_req = __shfl_sync(0xffffffff, rec.begin_req, 0);
  rec.end_req = __shfl_sync(0xffffffff, rec.end_req, 0);
  rec.begin_block = __shfl_sync(0xffffffff, rec.begin_block, 0);
  rec.end_block = __shfl_sync(0xffffffff, rec.end_block, 0);
  // An idle partition (past the last request) of the plain kernel does a dry run instead of leaving: its producer
  // walks two blocks of request 0 with no selected slot (no global load, zeros into its own shared memory) and
  // nobody consumes them. The producer's code is then fetched into L2 by the idle SMs while the working ones wait
  // for their first record, index and token, so after a flush their first block fetches it from L2, not DRAM
  // (docs/sparse-decode.md, decision sparse-v30: b = 2 -0.6 us; each SM's own instruction cache stays cold).
  // Crossover CTAs just leave (both CTAs of a cluster share the record, so both leave here, before any remote
  // access).
  const bool dry = !kCrossover && rec.begin_req >= p.batch;
  if (rec.begin_req >= p.batch) {
    ptx::griddep_launch_dependents();
    if (!dry) return;
    rec.begin_req = rec.end_req = 0;
    rec.begin_block = 0;
    rec.end_block = 2;  // both K buffers, so no wait on a consumer release
    rec.begin_split = 0;
    rec.is_first_req_split = rec.is_last_req_split = 1;
  }
  // Called once by every thread, from its role's code (the barrier instructions are per-warp aligned only).
  // publish = false: the thread has written nothing the others read (the crossover producers), so its cluster
  // arrival is relaxed and does not wait for its gathers in flight.
  auto init_sync = [&](bool publish) {
    if (tid == 0) {
      for (int b = 0; b < 2; ++b) {
        ptx::mbarrier_init(&smem.full[b], T::kWarpgroupThreads);  // every local producer thread (+ peer bytes)
        ptx::mbarrier_init(&smem.free_[b][0], 4 * kCtas);           // every WG0 warp of each CTA
        ptx::mbarrier_init(&smem.free_[b][1], 8 * kCtas);           // every consumer warp of each CTA
        ptx::mbarrier_init(&smem.p_ready[b], T::kWarpgroupThreads); // every WG0 thread
      }
      ptx::mbarrier_init(&smem.q_full, T::kWarpgroupThreads);  // every producer thread's Q copies
      ptx::mbarrier_init(&smem.q_free, 4);                      // every WG0 warp
      for (int b = 0; b < 2; ++b) ptx::mbarrier_init(&smem.scale_free[b], T::kWarpgroupThreads);  // every WG1 thread
      ptx::fence_mbarrier_init();
    }
    // The peer arrives on our barriers and writes our buffers: both CTAs must be initialised first.
    if constexpr (kCrossover) {
      if (publish) ptx::cluster_sync(); else ptx::cluster_sync_relaxed_arrive();
    } else {
      ptx::named_barrier_sync_unaligned(static_cast<int>(NamedBarrier::kInit), T::kThreads);
    }
    if (tid == 0) OPENMLA_TIMELINE(kInitDone);
  };

  if (dry && wg != 2) {  // the dry run's consumers only take part in the barrier setup
    init_sync(true);
    return;
  }
  if (wg == 2) {
    // =================================================================== producer
    ptx::setmaxnreg_dec<T::kRegsProducer>();
    const int lane4 = wg_tid % T::kThreadsPerToken;
    const int tok_in_round = wg_tid / T::kThreadsPerToken;
    uint32_t peer_delta = 0, peer_rank = 0;
    if constexpr (kCrossover) {
      peer_rank = ptx::cluster_cta_rank() ^ 1u;
      const uint32_t base = ptx::smem_addr(&smem);
      peer_delta = ptx::map_to_peer(base, peer_rank) - base;
    }
    const int tok_base = kCrossover ? static_cast<int>(peer_rank ^ 1u) * T::kTokensPerRound : 0;
    constexpr int kRounds = kCrossover ? 1 : 2;
    // Bytes the peer's st.async writes into our buffer per block: its 32 tokens x all tiles, 32 validity words.
    constexpr uint32_t kPeerBytesPerBlock =
        T::kTokensPerRound * (T::kNumTiles * T::kRowBytes + static_cast<int>(sizeof(uint32_t)));
    // Of which two bulk copies (one per half): its 32 tokens x 4 tiles each (the rest comes by st.async).
    constexpr uint32_t kBulkBytes = T::kTokensPerRound / Co::kTokensPerGroup * Co::kGroupStride;
    static_assert(kBulkBytes == T::kTokensPerRound * Co::kHalfTiles * T::kRowBytes, "32 tokens x 4 tiles");
    // Software pipeline over the partition's blocks (docs/sparse-decode.md, decisions sparse-v2, sparse-v4): indices
    // are loaded three blocks ahead, the tokens of the block two ahead are prefetched into L2, and the gathers of
    // the next unit (the next block, or this block's second round) are in flight in registers while this unit is
    // dequantised.
    const int tok0 = tok_base + tok_in_round;  // this thread's token of round 0
    auto usable = [](const SparseCacheView& c, int idx) { return idx >= 0 && idx < c.capacity; };
    uint32_t q_gen = 0;  // Q tiles loaded for the consumers so far (the first request's is theirs)
    Cursor cur = cursor_begin(p, rec);
    if (dry) cur.w.main_len = cur.w.extra_len = 0;  // every slot skipped: no index or token load
    Cursor n1 = cursor_next(p, rec, cur);
    Cursor n2 = cursor_next(p, rec, n1);
    int idx_cur[kRounds], idx_n1[kRounds], idx_n2[kRounds];
    OPENMLA_TIMELINE_AFTER(kProdCursor, static_cast<uint32_t>(cur.w.main_len));
    load_indices<kRounds>(p, rec, cur, tok0, s_idx, idx_cur);
    load_indices<kRounds>(p, rec, n1, tok0, s_idx, idx_n1);
    load_indices<kRounds>(p, rec, n2, tok0, s_idx, idx_n2);
    OPENMLA_TIMELINE_AFTER(kProdIndex, static_cast<uint32_t>(idx_cur[0]));
    TokenData<L> d0, d1;  // d0: round 0 of the current block; d1: the unit after it
    // The plain path also issues the first block's second round before the setup, except with host records (small
    // batch), where the head's extra DRAM traffic made b = 2 slower (docs/sparse-decode.md, decision sparse-v25:
    // h_q = 64 -1.6 %, b = 2 +1.3 us).
    const bool early_round1 = kRounds == 2 && p.uniform_blocks == 0;
    {
      const SparseCacheView& c = cursor_cache(p, cur);
      load_token<L>(c, idx_cur[0], usable(c, idx_cur[0]), lane4, d0);
      if (early_round1) load_token<L>(c, idx_cur[1], usable(c, idx_cur[1]), lane4, d1);
    }
    init_sync(false);
    OPENMLA_TIMELINE_AFTER(kProdToken, d0.nope[0].x);
    // One block. da holds this block's round 0; db receives the next unit (kRounds == 1: the next block, so
    // the two register sets swap roles every block; kRounds == 2: this block's round 1). No register copies:
    // a copy would wait for the in-flight gathers right away (docs/sparse-decode.md, decision sparse-v6).
    auto step = [&](uint32_t it, TokenData<L>& da, TokenData<L>& db) {
      OPENMLA_TRACE(2, it, 0);
      // KRing::slot(it) and KRing::parity(it) spelled out (the free waits below pass parity ^ 1 =
      // KRing::free_parity(it)): through the functions, ptxas scheduled the crossover producer differently
      // (docs/architecture.md, "Device layer").
      const int buf = it & 1;
      const uint32_t phase = (it >> 1) & 1;
      const SparseCacheView& c = cursor_cache(p, cur);
      const SparseCacheView& c1 = cursor_cache(p, n1);
      bool valid[kRounds];
#pragma unroll
      for (int r = 0; r < kRounds; ++r) valid[r] = usable(c, idx_cur[r]);
      // The next unit's gathers (a slot past the end of the partition has index -1: zeros, no load); with
      // early_round1 the first block's second round is already in flight.
      if constexpr (kRounds == 1)
        load_token<L>(c1, idx_n1[0], usable(c1, idx_n1[0]), lane4, db);
      else if (it != 0 || !early_round1)
        load_token<L>(c, idx_cur[1], valid[1], lane4, db);
      // Two blocks ahead: the tokens into L2. Three ahead: the indices.
      {
        const SparseCacheView& c2 = cursor_cache(p, n2);
#pragma unroll
        for (int r = 0; r < kRounds; ++r)
          if (usable(c2, idx_n2[r])) prefetch_token_l2<L>(c2, idx_n2[r], lane4);
      }
      const Cursor n3 = cursor_next(p, rec, n2);
      int idx_n3[kRounds];
      load_indices<kRounds>(p, rec, n3, tok0, s_idx, idx_n3);

      // A later request's first block: first its Q tile, once WG0 is done with the previous one (its last Q K^T
      // comes about when this buffer frees up, and the copies' latency then overlaps this block's fill).
      if (cur.req != rec.begin_req && cur.blk == cur.w.blk_begin) {
        ++q_gen;
        ptx::mbarrier_wait_parity(&smem.q_free, (q_gen - 1) & 1);  // QRing::parity(q_gen - 1), spelled out (above)
        load_q_tile<L>(p, smem, cur.req, wg_tid, T::kWarpgroupThreads);
        ptx::cp_async_mbarrier_arrive_noinc(&smem.q_full);
      }
      // Both CTAs' consumers must be done with (this half of) the buffer: we write the peer's copy too.
      ptx::mbarrier_wait_parity(&smem.free_[buf][0], phase ^ 1);
      if constexpr (!kCrossover) ptx::mbarrier_wait_parity(&smem.free_[buf][1], phase ^ 1);
      OPENMLA_TRACE(2, it, 1);
      const uint32_t full_addr = ptx::smem_addr(&smem.full[buf]);
      const uint32_t k_base = ptx::smem_addr(smem.k[buf]);
      const TokenWriter<L, kCrossover> wr{k_base, peer_delta, full_addr + peer_delta};
      auto put_valid = [&](int tok, bool v) {
        if (lane4 == 0) {
          const uint32_t vaddr = ptx::smem_addr(&smem.valid[buf][tok]);
          ptx::st_shared_u32(vaddr, v ? 1u : 0u);
          if constexpr (kCrossover) ptx::st_async_b32(vaddr + peer_delta, v ? 1u : 0u, wr.peer_full);
        }
      };
      // Crossover: sends one half (16 KB: our 32 tokens x 4 tiles) to the peer once every producer thread's
      // stores to it are fenced (one bulk copy, completing on the peer's full barrier).
      auto send_half = [&](int half) {
        ptx::fence_proxy_async_shared();
        ptx::named_barrier_sync(static_cast<int>(NamedBarrier::kProducer), T::kWarpgroupThreads);
        if (wg_tid == 0) {
          const uint32_t off = static_cast<uint32_t>(half * Co::kHalfBytes + tok_base / Co::kTokensPerGroup * Co::kGroupStride);
          ptx::bulk_copy_to_peer(k_base + off + peer_delta, k_base + off, kBulkBytes, wr.peer_full);
        }
      };
      if constexpr (kCrossover) {
        // V_L half as soon as both CTAs' WG0 are done; the V_R half (+ RoPE / P tile, validity) after both WG1.
        store_tiles<L, kCrossover, 0, Co::kHalfTiles>(da, tok0, lane4, wr);
        send_half(0);
        if (it == 0) OPENMLA_TIMELINE(kProdFirstSent);
        ptx::mbarrier_wait_parity(&smem.free_[buf][1], phase ^ 1);
        store_tiles<L, kCrossover, Co::kHalfTiles, T::kNopeTiles>(da, tok0, lane4, wr);
      } else {
        store_tiles<L, kCrossover, 0, T::kNopeTiles>(da, tok0, lane4, wr);
      }
      put_valid(tok0, valid[0]);
      if constexpr (kRounds == 2) {
        OPENMLA_TRACE(2, it, 4);  // plain path: round 0 stored (the trace's raw print shows it)
        load_token<L>(c1, idx_n1[0], usable(c1, idx_n1[0]), lane4, da);  // next block's round 0
        store_tiles<L, kCrossover, 0, T::kNopeTiles>(db, tok0 + T::kTokensPerRound, lane4, wr);
        put_valid(tok0 + T::kTokensPerRound, valid[1]);
        OPENMLA_TRACE(2, it, 5);  // plain path: round 1 stored
      }
      // Our own copy: generic stores, made visible to wgmma by the proxy fence and released by the arrival.
      // The peer's copy completes on the peer's barrier by itself (st.async complete_tx); thread 0 announces
      // the bytes the peer sends us this block.
      OPENMLA_TRACE(2, it, 2);
      if constexpr (kCrossover) {
        send_half(1);
        if (wg_tid == 0) ptx::mbarrier_arrive_expect_tx(&smem.full[buf], kPeerBytesPerBlock);
        else ptx::mbarrier_arrive(&smem.full[buf]);
      } else {
        ptx::fence_proxy_async_shared();
        ptx::mbarrier_arrive(&smem.full[buf]);
      }
      OPENMLA_TRACE(2, it, 3);

      cur = n1;
      n1 = n2;
      n2 = n3;
#pragma unroll
      for (int r = 0; r < kRounds; ++r) {
        idx_cur[r] = idx_n1[r];
        idx_n1[r] = idx_n2[r];
        idx_n2[r] = idx_n3[r];
      }
    };
    for (uint32_t it = 0; cur.req <= rec.end_req; ++it) {
      if (kRounds == 1 && (it & 1)) step(it, d1, d0);
      else step(it, d0, d1);
    }
    // Nobody leaves while the peer may still write our shared memory or arrive on our barriers. Each role
    // ends in its own exit so ptxas keeps the three register budgets apart (no merge after setmaxnreg).
    OPENMLA_TIMELINE(kProducerDone);
    if constexpr (kCrossover) ptx::cluster_sync();
    return;
  } else if (wg == 0) {
    ptx::setmaxnreg_inc<T::kRegsWg0>();
    consume<L, kCrossover, 0>(p, smem, rec, tid, init_sync);
    if constexpr (kCrossover) ptx::cluster_sync();
    OPENMLA_TIMELINE(kExit);
    return;
  } else {
    if constexpr (T::kRegsWg1 > T::kLaunchRegs) ptx::setmaxnreg_inc<T::kRegsWg1>();
    consume<L, kCrossover, 1>(p, smem, rec, tid, init_sync);
    if constexpr (kCrossover) ptx::cluster_sync();
    return;
  }
}

}  // namespace openmla::kernels::sparse_decode
