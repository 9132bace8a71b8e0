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
// A work item of a partition: its range of one request, or with a batch-invariant schedule (kChunked: the
// sparse_decode_invariant_kernel; docs/decode-schedule.md, "Batch invariance") one chunk of that range. Every role
// walks the same items. Every kChunked difference below is `if constexpr` code: the default kernels
// (kChunked = false) compile to the machine code they had without it (tools/sass_guard.sh).
struct RequestWork {
  int main_len;     // usable main slots: min(topk_length, topk), or topk
  int extra_len;    // usable extra slots (0 without an extra cache)
  int main_blocks;
  int blk_begin, blk_end;  // the item's blocks
  bool is_split;
  int split_slot;
};

__device__ __forceinline__ int clamp_len(const int32_t* lengths, int req, int topk) {
  if (lengths == nullptr) return topk;
  return min(max(lengths[req], 0), topk);
}

// The item of request `req` that starts at block `begin` (kChunked only; otherwise the record's range of the request).
template <bool kChunked>
__device__ __forceinline__ RequestWork request_work(const SparseDecodeParams& p, const DecodeScheduleRecord& rec,
                                                    int req, int begin) {
  RequestWork w;
  w.main_len = __shfl_sync(0xffffffff, clamp_len(p.main.topk_length, req, p.main.topk), 0);
  w.extra_len = p.has_extra ? __shfl_sync(0xffffffff, clamp_len(p.extra.topk_length, req, p.extra.topk), 0) : 0;
  w.main_blocks = max((w.main_len + Co::kBlockN - 1) / Co::kBlockN, 1);
  const int num_blocks = w.main_blocks + (w.extra_len + Co::kBlockN - 1) / Co::kBlockN;
  w.blk_begin = chunk_begin_block(rec, req);
  w.blk_end = chunk_end_block(rec, req, num_blocks);
  w.is_split = chunk_is_split(rec, req);
  w.split_slot = 0;
  if constexpr (kChunked) {
    w.blk_begin = begin;
    w.blk_end = invariant_chunk_end(begin, w.blk_end, p.chunk_blocks);
  }
  return w;
}

// kChunked: whether the partition's range of request `req` goes on after item `w` (recomputed from the item, not a
// RequestWork field: the default kernels' cursors keep the layout they were measured with).
__device__ __forceinline__ bool item_more(const DecodeScheduleRecord& rec, int req, const RequestWork& w) {
  return w.blk_end < chunk_end_block(rec, req, w.main_blocks + (w.extra_len + Co::kBlockN - 1) / Co::kBlockN);
}

// The consumers' completion of item `w` of request `req`: its split slot (the request's first slot plus the item's
// ordinal) and, with chunks, whether it is split: the request has more than one chunk (num_splits, as the combine
// reads it) and its slots fit the partial buffers. (Not in request_work: the producer's cursors need neither.)
template <bool kChunked>
__device__ __forceinline__ void item_split(const SparseDecodeParams& p, const DecodeScheduleRecord& rec, int req,
                                           RequestWork& w) {
  if constexpr (kChunked) {
    const int first_slot = p.num_splits[req], end_slot = p.num_splits[req + 1];
    w.is_split = end_slot - first_slot > 1 && end_slot <= p.split_capacity;
    w.split_slot = first_slot + w.blk_begin / p.chunk_blocks;
  } else {
    w.split_slot = sparse_split_base(p, req) + chunk_ordinal(rec, req);
  }
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

template <bool kChunked>
__device__ __forceinline__ void cursor_settle(const SparseDecodeParams& p, const DecodeScheduleRecord& rec, Cursor& c) {
  if constexpr (kChunked) {
    // At the end of an item: the request's next chunk, else the next request.
    while (c.req <= rec.end_req && c.blk >= c.w.blk_end) {
      int begin = c.w.blk_end;
      if (!item_more(rec, c.req, c.w)) {
        if (++c.req > rec.end_req) break;
        begin = chunk_begin_block(rec, c.req);
      }
      c.w = request_work<true>(p, rec, c.req, begin);  // (one call site: a second one made the producer spill)
      c.blk = c.w.blk_begin;
    }
  } else {
    // Moves past requests with an empty block range (none occur with the scheduler's work model; kept exact).
    while (c.req <= rec.end_req && c.blk >= c.w.blk_end) {
      if (++c.req > rec.end_req) break;
      c.w = request_work<false>(p, rec, c.req, 0);
      c.blk = c.w.blk_begin;
    }
  }
}
template <bool kChunked>
__device__ __forceinline__ Cursor cursor_begin(const SparseDecodeParams& p, const DecodeScheduleRecord& rec) {
  Cursor c;
  c.req = rec.begin_req;
  c.w = request_work<kChunked>(p, rec, c.req, rec.begin_block);
  c.blk = c.w.blk_begin;
  cursor_settle<kChunked>(p, rec, c);
  return c;
}
template <bool kChunked>
__device__ __forceinline__ Cursor cursor_next(const SparseDecodeParams& p, const DecodeScheduleRecord& rec, Cursor c) {
  if (c.req > rec.end_req) return c;
  ++c.blk;
  cursor_settle<kChunked>(p, rec, c);
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
template <Layout L, bool kCrossover, bool kChunked, int kWg, typename InitSync>
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
  uint32_t q_gen = 0;  // Q generation of the current item (0: the first, loaded above)
  // kChunked: the partition's items are the chunks of its range of each request; `item` counts them, `item_begin`
  // is the next one's first block and `item_step` 0 when it is a chunk of the same request.
  int item = 0, item_begin = rec.begin_block, item_step = 1;
  for (int req = rec.begin_req; req <= rec.end_req; req += kChunked ? item_step : 1, ++item) {
    RequestWork w = request_work<kChunked>(p, rec, req, item_begin);
    item_split<kChunked>(p, rec, req, w);
    const bool has_blocks = w.blk_end > w.blk_begin;
    const bool first_item = kChunked ? item == 0 : req == rec.begin_req;
    const bool more = kChunked && item_more(rec, req, w);
    const bool last_item = kChunked ? req == rec.end_req && !more : req == rec.end_req;
    const int item_ordinal = kChunked ? item : req - rec.begin_req;  // (trace builds)

    // ---- Q tile: the first was requested by both consumer warpgroups above; later ones come from the producer
    // (only WG0 reads Q). The barrier also keeps WG0's next out_scale write behind WG1's read of the last one.
    if (first_item) {
      ptx::cp_async_wait_all();
    } else if (wg == 0 && has_blocks) {
      ++q_gen;
      ptx::mbarrier_wait_parity(&smem.q_full, QRing::parity(q_gen - 1));
    }
    OPENMLA_SWITCH(item_ordinal - 1, 4);
    ptx::fence_proxy_async_shared();
    consumer_barrier();
    OPENMLA_SWITCH(item_ordinal - 1, 5);
    if (wg == 0 && first_item) OPENMLA_TIMELINE(kQReady);

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

    if (wg == 0 && last_item) OPENMLA_TIMELINE(kLastBlockDone);
    // Every warpgroup takes the same decision: a request with at least one block ends with WG0's last Q K^T done.
    // WG0 released this request's Q generation after its last Q K^T; the partition's first Q is released here
    // when its request has no blocks (the scheduler never makes one; kept exact).
    OPENMLA_SWITCH(item_ordinal, 0);
    if (wg == 0 && first_item && !has_blocks) {
      __syncwarp();
      if (lane == 0) ptx::mbarrier_arrive(&smem.q_free);
    }
    OPENMLA_SWITCH(item_ordinal, 1);

    // ---- epilogue: WG0 owns the softmax statistics and hands the output scale to WG1.
    if (last_item) ptx::griddep_launch_dependents();
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
    OPENMLA_SWITCH(item_ordinal, 2);
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
    OPENMLA_SWITCH(item_ordinal, 3);
    if constexpr (kChunked) {  // the next item: this request's next chunk, or the next request from its first block
      item_step = more ? 0 : 1;
      item_begin = more ? w.blk_end : 0;
    }
  }
  if (wg == 0) OPENMLA_TIMELINE(kEpilogueDone);
}

// ---------------------------------------------------------------------------------------------------
// The kernel
// ---------------------------------------------------------------------------------------------------
// The kernel: one template per schedule kind, the same body (kernel_body.inc); kChunked = false is the default kernel
// exactly as measured.
template <Layout L, bool kCrossover>
__global__ void __launch_bounds__(Common::kThreads, 1) sparse_decode_kernel(const __grid_constant__ SparseDecodeParams p) {
  constexpr bool kChunked = false;
#include "kernels/sparse_decode/kernel_body.inc"
}

// Batch-invariant schedules (p.chunk_blocks > 0; docs/decode-schedule.md, "Batch invariance"): every role walks each
// record's range of a request chunk by chunk, a chunk being a work item of its own (its own Q generation, epilogue
// and split slot). Its own units (instantiations/*_invariant.cu), so the default kernels keep their machine code.
template <Layout L, bool kCrossover>
__global__ void __launch_bounds__(Common::kThreads, 1)
    sparse_decode_invariant_kernel(const __grid_constant__ SparseDecodeParams p) {
  constexpr bool kChunked = true;
#include "kernels/sparse_decode/kernel_body.inc"
}

}  // namespace openmla::kernels::sparse_decode
