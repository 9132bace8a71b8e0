// Dense MLA decode main kernel (sm_90a): paged BF16/FP16 KV cache, d_qk = 576, d_v = 512.
//
// One CTA = 2 warpgroups = one 64-row query tile (rows of one (request, kv head), packed position-major)
// walking the KV-block range its schedule partition assigns. KV blocks are consumed in pairs (K0, K1)
// with the "seesaw" schedule: WG0 owns O[:, 0:256], WG1 owns O[:, 256:512]; each computes the QK^T of one
// block of the pair, and the two online-softmax updates are chained through shared memory so one
// warpgroup's softmax overlaps the other's tensor-core work. Design note: docs/dense-decode.md.
#pragma once

#include <cstdint>

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
#include "kernels/combine/params.h"
#include "kernels/decode_scheduler/partition_walk.h"
#include "kernels/dense_decode/config.h"
#include "kernels/dense_decode/gather.cuh"
#include "kernels/dense_decode/params.h"

namespace openmla::kernels::dense_decode {

// ---------------------------------------------------------------------------------------------------
// Trace builds (CMake -DOPENMLA_TRACE=ON): the request timeline of config.h, struct Trace, in the format of
// common/trace.cuh (tools/diag/kernel_trace.py dense-decode reads it). Without the option the macros are empty and the
// kernel compiles to the production SASS.
// ---------------------------------------------------------------------------------------------------
#if defined(OPENMLA_HAS_TRACE)
__device__ unsigned long long g_trace[Trace::Format::kDeviceValues];
// Event `ev` of the CTA's request k (0 = the partition's first); a value instead of the time when value >= 0.
__device__ __forceinline__ void dense_stamp(int k, int ev, long long value = -1) {
  using F = Trace::Format;
  if (value >= 0) trace::put<F, 0>(g_trace, 0, k, ev, static_cast<unsigned long long>(value));
  else trace::stamp<F, 0>(g_trace, 0, k, ev);
  if (k == 0 && ev == Trace::kPrologueStart) trace::cta_start<F>(g_trace);
  if (ev == Trace::kDone) trace::cta_end<F>(g_trace, k + 1);
}
#endif
#define OPENMLA_DENSE_STAMP(k, ev) OPENMLA_TRACE_ONLY(::openmla::kernels::dense_decode::dense_stamp(k, Trace::ev))
#define OPENMLA_DENSE_VALUE(k, ev, v) \
  OPENMLA_TRACE_ONLY(::openmla::kernels::dense_decode::dense_stamp(k, Trace::ev, v))

using T = Traits;  // T names the traits in every kernel (elsewhere T = Traits<layout or shape>)

// Element type glue (bf16 or fp16) and the P V steps of the seesaw: common/tile_gemm.cuh.
template <bool kIsFp16>
using Element = tile::Element16<kIsFp16>;
using tile::gemm_pv_rs;
using tile::gemm_pv_ss;
using tile::to_a_fragments;

// ---------------------------------------------------------------------------------------------------
// Shared-memory addressing
// ---------------------------------------------------------------------------------------------------
using tile::Fragment;
using tile::make_fragment;
using tile::quad_sum;
using tile::row_max;
using tile::exponentiate;
using tile::scale_rows;
using tile::swizzled_offset;
static_assert(T::kTileBytes == tile::kTileBytes && T::kRowBytes == tile::kRowBytes &&
              T::kSwizzleAtomBytes == tile::kSwizzleAtomBytes, "one tile convention");

// ---------------------------------------------------------------------------------------------------
// Building blocks of the pair step
// ---------------------------------------------------------------------------------------------------
// How the pair loop forms its wgmma descriptors (common/tile_gemm.cuh, "Desc policies"; decision dense-v23): the
// low word of each buffer's descriptor broadcast from lane 0 (warp-uniform, so it stays on the uniform datapath) and
// the tile offset added to the 64-bit descriptor, instead of the full descriptor from the address per wgmma.
using Desc = tile::DescUniform64;

__device__ __forceinline__ constexpr int tile_group(int t) { return t / T::kVTilesPerHalf; }  // 0, 1 or 2

// S = Q K^T over the 9 tiles of one KV buffer, waiting tile by tile so the GEMM starts on the first
// arrival. `kFirstTile` rotates the order (WG1 starts with the tiles refilled first). kGather (page sizes 1-8): the
// tiles were written by cp.async (generic proxy) and released through the barrier; the acquire-side proxy fence orders
// them before the wgmma reads (no instruction on sm_90a).
template <bool kIsFp16, int kFirstTile, bool kGather = false>
__device__ __forceinline__ void gemm_qk(float (&s)[32], SharedStorage& smem, int buf, uint32_t phase) {
  const uint32_t q_desc = Desc::base<tile::kLboKMajor>(smem.q[0]);
  const uint32_t k_desc = Desc::base<tile::kLboKMajor>(smem.k[buf][0]);
  ptx::wgmma_fence();
#pragma unroll
  for (int i = 0; i < T::kNumTiles; ++i) {
    const int t = (i + kFirstTile) % T::kNumTiles;
    if (t % T::kVTilesPerHalf == 0) {
      ptx::mbarrier_wait_parity(&smem.k_bar[buf][tile_group(t)], phase);
      if constexpr (kGather) ptx::fence_proxy_async_acquire_shared();
    }
#pragma unroll
    for (int kk = 0; kk < T::kTileCols / 16; ++kk) {
      const uint32_t off = static_cast<uint32_t>(t * T::kTileBytes + kk * 32);
      Element<kIsFp16>::template mma_ss<64, 0>(s, Desc::at(q_desc, off), Desc::at(k_desc, off), (i | kk) != 0);
    }
  }
  ptx::wgmma_commit();
  ptx::wgmma_wait<0>();
  ptx::fence_registers(s);
}

// Logits of keys at or beyond a row's border (exclusive key index) become -inf. Overwrite, never add:
// the K rows past the sequence may hold NaN.
__device__ __forceinline__ void mask_logits(float (&s)[32], const Fragment& f, int block_token0, const int (&border)[2]) {
  if (block_token0 + T::kBlockN <= min(border[0], border[1])) return;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int tok = block_token0 + j * 8 + f.col + e;
      if (tok >= border[0]) s[j * 4 + e] = -INFINITY;
      if (tok >= border[1]) s[j * 4 + 2 + e] = -INFINITY;
    }
  }
}

// Rows past the sequence end inside a partial block may hold NaN; 0 * NaN would poison P V. Zero them in
// the 4 V tiles this warpgroup is about to read, then make the writes visible to its wgmma.
__device__ __forceinline__ void zero_tail_rows(uint8_t* v_tiles, int first_row, int wg_tid, NamedBarrier bar) {
  const int rows = T::kBlockN - first_row;
  const int chunks_per_tile = rows * (T::kRowBytes / 16);
  for (int i = wg_tid; i < chunks_per_tile * T::kVTilesPerHalf; i += T::kWarpgroupThreads) {
    const int tile = i / chunks_per_tile, rem = i % chunks_per_tile;
    *reinterpret_cast<uint4*>(v_tiles + tile * T::kTileBytes + (first_row + rem / 8) * T::kRowBytes + (rem % 8) * 16) =
        make_uint4(0, 0, 0, 0);
  }
  ptx::fence_proxy_async_shared();
  ptx::named_barrier_sync(static_cast<int>(bar), T::kWarpgroupThreads);
}

// Page id of block `block` of request `req` (only for blocks inside the sequence: entries past it are garbage).
__device__ __forceinline__ int page_of(const DenseDecodeParams& p, int req, int block) {
  return p.block_table[static_cast<int64_t>(req) * p.block_table_stride + block];
}

// TMA loads of tiles [t_begin, t_end) of the KV page `page` into buffer `buf`. The page id is read ahead of
// time by the caller: reading it here would stall the whole warpgroup (wgmma is collective) on warp 0's
// global load at every refill.
// [t_begin, t_end) must be a union of whole tile groups: one TMA per group (maps: 4-tile box, 1-tile box).
__device__ __forceinline__ void load_kv_tiles(SharedStorage& smem, const CUtensorMap* map4, const CUtensorMap* map1,
                                              int page, int kv_head, int buf, int t_begin, int t_end, uint64_t policy) {
  for (int t = t_begin; t < t_end;) {
    const int g = tile_group(t);
    const int n = g == 2 ? 1 : T::kVTilesPerHalf;
    ptx::mbarrier_arrive_expect_tx(&smem.k_bar[buf][g], n * T::kTileBytes);
    ptx::tma_load_5d(smem.k[buf][t], g == 2 ? map1 : map4, &smem.k_bar[buf][g], 0, 0, t, kv_head, page, policy);
    t += n;
  }
}

// L2 prefetch of KV page `page` (every tile group, as load_kv_tiles would read it).
__device__ __forceinline__ void prefetch_kv_page_l2(const CUtensorMap* map4, const CUtensorMap* map1, int page,
                                                    int kv_head) {
  for (int t = 0; t < T::kNumTiles;) {
    const int g = tile_group(t);
    ptx::tma_prefetch_l2_5d(g == 2 ? map1 : map4, 0, 0, t, kv_head, page);
    t += g == 2 ? 1 : T::kVTilesPerHalf;
  }
}

// Any page size other than 64 (docs/dense-decode.md, "Page sizes"): TMA loads of tiles [t_begin, t_end) of block `blk`
// into buffer `buf`, issued by the calling thread. `page` is the page id this thread's warp loads (read ahead, as
// above), `slot` its page's place in the block (small pages: rows [slot * P, slot * P + P) of every tile), `lead` the
// one thread per warpgroup that arms the group barriers with the whole group's bytes (other warps' copies may land
// first: the transaction count may go below zero while the arrival is pending, and the phase cannot complete).
//   P < 64: the block is 64 / P pages; one copy per (page, tile) with map1 (box 64 columns x P rows), because a box
//           lands densely in shared memory and the tiles of the block are 8 KB apart (one page's rows of 4 tiles are
//           not one box). The copies of one page come from one warp; the block's pages from warps 0 .. 64/P - 1.
//   P > 64: the block is rows [(blk mod P/64) * 64, + 64) of one page: the page-64 copies with a row coordinate.
__device__ __forceinline__ void load_kv_tiles_any_page(SharedStorage& smem, const CUtensorMap* map4,
                                                       const CUtensorMap* map1, const DensePageGeometry& pg, int page,
                                                       int blk, int slot, bool lead, int kv_head, int buf, int t_begin,
                                                       int t_end, uint64_t policy) {
  for (int t = t_begin; t < t_end;) {
    const int g = tile_group(t);
    const int n = g == 2 ? 1 : T::kVTilesPerHalf;
    if (lead) ptx::mbarrier_arrive_expect_tx(&smem.k_bar[buf][g], n * T::kTileBytes);
    if (pg.pages_per_block == 1) {
      const int row = (blk & ((1 << pg.blocks_per_page_log2) - 1)) * T::kBlockN;
      ptx::tma_load_5d(smem.k[buf][t], g == 2 ? map1 : map4, &smem.k_bar[buf][g], 0, row, t, kv_head, page, policy);
    } else {
      for (int i = 0; i < n; ++i)
        ptx::tma_load_5d(smem.k[buf][t + i] + slot * pg.page_size * T::kRowBytes, map1, &smem.k_bar[buf][g], 0, 0,
                         t + i, kv_head, page, policy);
    }
    t += n;
  }
}

// Any page size: the page id warp `slot` of a warpgroup loads for block `blk` (block-table entry blk * 64/P + slot for
// P < 64, blk / (P/64) for P > 64). A slot past the sequence's last page loads the block's first page instead (its rows
// are masked and zeroed like any row past the length), so every group's byte count stays whole and no entry past
// ceil(L / P) is ever read.
__device__ __forceinline__ int page_of_any(const DenseDecodeParams& p, const DensePageGeometry& pg, int req, int blk,
                                           int slot, int seqlen) {
  const bool inside = blk * T::kBlockN + slot * pg.page_size < seqlen;
  const int entry = (blk * pg.pages_per_block + (inside ? slot : 0)) >> pg.blocks_per_page_log2;
  return p.block_table[static_cast<int64_t>(req) * p.block_table_stride + entry];
}

// Per-request query lengths: request `req`'s query rows, clamped to [0, s_q] (warp-uniform, as the lengths).
__device__ __forceinline__ int varlen_q_len(const DenseVarlenQ& vq, int req, int s_q) {
  return min(max(__shfl_sync(0xffffffff, vq.seqused_q[req], 0), 0), s_q);
}

// ---------------------------------------------------------------------------------------------------
// The kernel
// ---------------------------------------------------------------------------------------------------
// The body of the kernels below. kAnyPage = false is the page-64 kernel exactly as measured (its SASS is checked
// against the previous build's: docs/dense-decode.md, "Page sizes"); every difference of the other page sizes is an
// `if constexpr (kAnyPage)` branch, so none of it reaches the page-64 pair loop. kChunked (batch-invariant schedules,
// docs/decode-schedule.md, "Batch invariance") is the same: the chunk walk is `if constexpr (kChunked)` code, and the
// default kernels (kChunked = false) compile to the machine code they had without it (checked with
// tools/sass_guard.sh against the previous build).
// kGather (page sizes 1-8, with kAnyPage; docs/dense-decode.md, "Small pages: the gather kernel") is a third kernel on
// the body in the same way: the K tiles are gathered row by row by cp.async (gather.cuh) instead of TMA boxes.
//
// kVarlenQ (per-request query lengths, docs/dense-decode.md, "Per-request query lengths") is the same again: request
// `req` has q_len = clamp(vq.seqused_q[req], 0, s_q) query rows; the causal border of its row s_idx is
// seqlen - (q_len - 1 - s_idx), rows at or past q_len see no key (out 0, lse +inf), and a request without rows
// walks no block (the plan gave it none).
// The placement shim's length per kernel variant: the number of never-taken prefetch lines (16 bytes each) that puts
// the variant's pair loop at 0x40 modulo 128 (docs/dense-decode.md, "Code placement"). Measured fast at that offset:
// the page-64 loop (dense-v17, and again after dense-v23 changed the loop); the other variants' loops are aligned the
// same way, their speed at other offsets not measured. ptxas does not move the loop linearly with the count: retune
// with `tools/sass_loops.py --offsets` after any change above a loop.
#ifndef OPENMLA_SHIM_TUNE
template <bool kAnyPage, bool kChunked, bool kGather, bool kVarlenQ>
__host__ __device__ constexpr int placement_shim_lines() {
  if constexpr (kGather) return kChunked ? 12 : 15;
  else if constexpr (kAnyPage) return kChunked ? 9 : kVarlenQ ? 9 : 4;
  else return kChunked ? 9 : 13;  // page 64: the default and per-request query length loops 13
}
#else  // tools: -DOPENMLA_SHIM_TUNE=<lines> sets every variant's count
template <bool, bool, bool, bool>
__host__ __device__ constexpr int placement_shim_lines() { return OPENMLA_SHIM_TUNE; }
#endif

template <bool kIsFp16, bool kAnyPage, bool kChunked, bool kGather = false, bool kVarlenQ = false, int kGatherMode = 0>
__device__ __forceinline__ void dense_decode_body(const DenseDecodeParams& params, const CUtensorMap& k_map,
                                                  const CUtensorMap& k_map_rope, const CUtensorMap& q_map,
                                                  const DensePageGeometry& pg,
                                                  const DenseVarlenQ& vq = DenseVarlenQ{}, int gather_flags = 0) {
  SharedStorage& smem = cta::shared_storage<SharedStorage>();

  const int tid = threadIdx.x;
  // Broadcast from lane 0 so the compiler knows the value is warp-uniform: wgmma under a branch it cannot
  // prove uniform gets serialised (ptxas C7520).
  const int wg = cta::warpgroup(tid);
  const int wg_tid = tid % T::kWarpgroupThreads;
  const int m_block = blockIdx.x;
  const int kv_head = blockIdx.y;
  const Fragment frag = make_fragment(wg_tid);
  const int lane = tid % 32;

  static_assert(!kGather || kAnyPage, "the gather kernel is an any-page kernel (its geometry argument)");
  if (tid == 0) {
    if constexpr (!kGather) {  // (the gather kernel has no cache tensor map)
      ptx::prefetch_tensormap(&k_map);
      ptx::prefetch_tensormap(&k_map_rope);
    }
    // A tile group completes on one arrival with the TMA's byte count, or (kGather) on the 128 .noinc arrivals of the
    // refilling warpgroup's gathers.
    for (int b = 0; b < 2; ++b)
      for (int g = 0; g < T::kNumTileGroups; ++g) ptx::mbarrier_init(&smem.k_bar[b][g], kGather ? T::kWarpgroupThreads : 1);
    for (int h = 0; h < kHandoffs; ++h)
      ptx::mbarrier_init(&smem.handoff[h], T::kWarpgroupThreads);
    ptx::mbarrier_init(&smem.merge_bar, 1);
    ptx::mbarrier_init(&smem.q_bar, 1);
    smem.q_waits = 0;
    if (params.q_tma) ptx::prefetch_tensormap(&q_map);
    smem.merge_info[2] = 0;
    ptx::fence_mbarrier_init();
  }
  __syncthreads();

  DecodeScheduleRecord rec = params.schedule[blockIdx.z];
  broadcast_record_range(rec);
  if (rec.begin_req >= params.batch) {
    ptx::griddep_launch_dependents();
    return;
  }

  // KV tiles are read by every m-block CTA of the request (4 at s_q = 2, h_q = 128): evict_last keeps them
  // in L2 for the later readers (better than evict_first / evict_normal: docs/dense-decode.md, decision dense-v9).
  const uint64_t policy = ptx::make_l2_evict_last_policy();
  const int R = params.rows_per_kv_head;
  const int row_base = m_block * T::kBlockM;
  // Issuing threads: one per warpgroup.
  const bool is_issuer = wg_tid == 0;
  // Any page size: the threads that issue a block's copies (lane 0 of warps 0 .. pages_per_block - 1 of the refilling
  // warpgroup; one warp for P >= 64) and the page each of them loads (`slot`: its warp in the warpgroup).
  // kGather: every thread of the refilling warpgroup gathers (gather.cuh); `page` is then the pair's ids (PairIds) and
  // the block's half of the pair is its buffer (K0 = even block).
  const int slot = wg_tid / 32;
  const bool is_page_issuer = kGather || (kAnyPage && lane == 0 && slot < pg.pages_per_block);
  auto refill_any_page = [&](int page, int blk, int buf, int t_begin, int t_end) {
    if constexpr (kGather)
      gather::gather_kv_tiles<kGatherMode>(smem, params, page, buf, pg.page_size, wg_tid, kv_head, buf, t_begin, t_end,
                              gather::policy_of(gather_flags));  // (one createpolicy: not held across the loop)
    else
      load_kv_tiles_any_page(smem, &k_map, &k_map_rope, pg, page, blk, slot, wg_tid == 0, kv_head, buf, t_begin, t_end,
                             policy);
  };
  // kGather: log2 of the page size (block-table entry of token t: t >> log2_page), the L2 look-ahead distance in pairs,
  // and the page ids (PairIds) of the pairs after the current one: ids1 = the pair this one refills, ids2 = the next.
  const int log2_page = kGather ? 31 - __clz(pg.page_size) : 0;
  const int prefetch_pairs = kGather ? gather_flags & kGatherPrefetchMask : 0;
  int ids1 = -1, ids2 = -1;
  // Parity of each K buffer's tile-group barriers: they complete once per fill of the buffer (one per pair for K0;
  // K1 is not filled in a pair without it).
  pipeline::PhaseBit k_phase[2];
  pipeline::Handoffs<Handoff> handoff{smem.handoff};  // every hand-off barrier completes once per block pair

  // Q tile of request `req_q`: rows of this (request, kv head), zero-filled past R; 16-byte chunks into the
  // swizzled layout, by every thread, committed as one cp.async group.
  auto issue_q = [&](int req_q, int first, int stride) {
    const auto* q = static_cast<const uint8_t*>(params.q);
    constexpr int kChunksPerRow = T::kHeadDimQK / 8;
    for (int i = first; i < T::kBlockM * kChunksPerRow; i += stride) {
      const int row = i / kChunksPerRow, chunk = i % kChunksPerRow;
      const int r = row_base + row;
      uint8_t* dst = smem.q[chunk / 8] + row * T::kRowBytes + (((chunk % 8) ^ (row & 7)) << 4);
      if (r < R) {
        const int s_idx = r / params.q_per_kv, head = kv_head * params.q_per_kv + r % params.q_per_kv;
        const int64_t elem = static_cast<int64_t>(req_q) * params.q_stride_b + s_idx * params.q_stride_s +
                             head * params.q_stride_h + chunk * 8;
        ptx::cp_async_16(dst, q + elem * 2, 16);
      } else {
        ptx::cp_async_16(dst, q, 0);
      }
    }
    ptx::cp_async_commit();
  };
  // TMA path (params.q_tma; docs/dense-decode.md, decision dense-v17): a partition's first Q comes by cp.async
  // like the other path; every later one is loaded during the previous request's epilogue by thread 0 with 9 box
  // loads completing on q_bar (instead of 4,608 cp.async issued by 192 threads). Each issue is waited for once, by
  // every thread: smem.q_waits (the waits so far, counted by thread 0 after the prologue's barrier) gives the
  // parity. Keeping the first Q on cp.async is what leaves ptxas's schedule of the pair loop as it was
  // (tools/sass_loops.py; every Q by TMA moved it: dense-v14, not kept).
  auto tma_q = [&](int req_q) {
    if (tid == 0) {
      const int s_idx = row_base / params.q_per_kv, head0 = kv_head * params.q_per_kv + row_base % params.q_per_kv;
      load_q_tile_tma<T::kNumTiles>(smem.q, &q_map, &smem.q_bar, head0, s_idx, req_q);
    }
  };
  // The next request's Q was issued during this request's epilogue (docs/dense-decode.md, decision dense-v12).
  bool q_issued = false;
  bool q_sent = false;    // (epilogue) this thread has issued its share of that Q

  // kChunked: the partition's work items are the chunks of its range of each request [begin_req, end_req]
  // (ChunkWalk's records). `item_begin` is the current chunk's first block; it is set at the end of the previous item,
  // so it is not live across the pair loop. `item_step` 0: the next item is a chunk of the same request.
  int item_begin = rec.begin_block;
  int item_step = 1;
  // kChunked: the requests of the range follow the walk order (docs/decode-schedule.md, decision schedule-v5): from
  // begin_req to end_req by the successor list after the merge counters (request order without counters); the loop
  // ends when the next request is -1.
  for (int req = rec.begin_req; kChunked ? req >= 0 : req <= rec.end_req; req += kChunked ? item_step : 1) {
    if (tid == 0) OPENMLA_DENSE_STAMP(req - rec.begin_req, kPrologueStart);
    // ---------------------------------------------------------------- request prologue
    // Negative lengths count as empty (as in the scheduler). A length beyond the block table's row is the
    // caller's error; clamping keeps it from ever reading another request's row.
    // (The capacity in tokens: max_blocks_per_seq counts pages; the host checks that it fits in int32.)
    const int seqlen = min(max(__shfl_sync(0xffffffff, params.cache_seqlens[req], 0), 0),
                           params.max_blocks_per_seq * (kAnyPage ? pg.page_size : T::kBlockN));
    const int num_seq_blocks = (seqlen + T::kBlockN - 1) / T::kBlockN;
    int blk_begin = req == rec.begin_req ? rec.begin_block : 0;
    int blk_end = req == rec.end_req ? rec.end_block : num_seq_blocks;
    bool is_split =
        (req == rec.begin_req && rec.is_first_req_split) || (req == rec.end_req && rec.is_last_req_split);
    int split_slot = params.num_splits[req] + (req == rec.begin_req ? rec.begin_split : 0);
    if constexpr (kChunked) {
      // The chunk [item_begin, next multiple of chunk_blocks) of the range; split when the request has more than one
      // chunk (num_splits, as the combine reads it) and its slots fit the partial buffers. (Broadcast from lane 0,
      // as the lengths: values the compiler cannot prove warp-uniform move the pair loop's counters out of the
      // uniform registers.)
      const int first_slot = __shfl_sync(0xffffffff, params.num_splits[req], 0);
      const int end_slot = __shfl_sync(0xffffffff, params.num_splits[req + 1], 0);
      blk_begin = __shfl_sync(0xffffffff, item_begin, 0);
      blk_end = invariant_chunk_end(blk_begin, blk_end, params.chunk_blocks);
      split_slot = first_slot + blk_begin / params.chunk_blocks;
      is_split = end_slot - first_slot > 1 && end_slot <= params.split_capacity;
    }

    // Right border (exclusive key index) of each of this thread's two rows; bottom-right causal mask.
    int border[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int r = row_base + frag.row[i];
      border[i] = (params.causal && r < R) ? seqlen - (params.s_q - 1 - r / params.q_per_kv) : seqlen;
      if constexpr (kVarlenQ) {  // bottom-right per request; rows past q_len see nothing
        const int q_len = varlen_q_len(vq, req, params.s_q), s_idx = r / params.q_per_kv;
        border[i] = r < R && s_idx < q_len ? (params.causal ? seqlen - (q_len - 1 - s_idx) : seqlen) : 0;
      }
    }
    // Blocks past the last valid row's border are fully masked for the whole tile: skip them.
    {
      const int last_row = min(row_base + T::kBlockM, R) - 1;
      const int max_border = params.causal ? seqlen - (params.s_q - 1 - last_row / params.q_per_kv) : seqlen;
      blk_end = min(blk_end, max(0, (max_border + T::kBlockN - 1) / T::kBlockN));
    }
    // kVarlenQ: the same from the request's own q_len instead (so not clamped by the line above: recomputed from the
    // range). A request without rows (q_len 0: planned as empty) and an m-block of rows past q_len walk no block and
    // only write their empty rows.
    if constexpr (kVarlenQ) {
      const int q_len = varlen_q_len(vq, req, params.s_q);
      const int last_row = min(min(row_base + T::kBlockM, R), q_len * params.q_per_kv) - 1;
      const int max_border =
          last_row < row_base ? 0 : (params.causal ? seqlen - (q_len - 1 - last_row / params.q_per_kv) : seqlen);
      const int range_end = req == rec.end_req ? rec.end_block : num_seq_blocks;
      blk_end = min(range_end, max(0, (max_border + T::kBlockN - 1) / T::kBlockN));
    }
    const bool has_work = blk_begin < blk_end;

    if (has_work) {
      if constexpr (kGather) {
        // The Q tile first, as one committed cp.async group: the prologue then waits for it alone (the gathers below
        // are never committed; they complete on the K barriers). Each tile group is gathered by the warpgroup that
        // refills it in the pair loop (the barrier counts its 128 threads).
        if (!q_issued) issue_q(req, tid, T::kThreads);
        const int ids0 = gather::pair_ids(params, req, blk_begin, blk_end, seqlen, log2_page, wg_tid);
        ids1 = gather::pair_ids(params, req, blk_begin + 2, blk_end, seqlen, log2_page, wg_tid);
        ids2 = gather::pair_ids(params, req, blk_begin + 4, blk_end, seqlen, log2_page, wg_tid);
        const bool two = blk_begin + 1 < blk_end;
        if (wg == 0) {
          refill_any_page(ids0, blk_begin, 0, 0, T::kVTilesPerHalf);
          if (two) refill_any_page(ids0, blk_begin + 1, 1, 0, T::kVTilesPerHalf);
          if (two) refill_any_page(ids0, blk_begin + 1, 1, T::kRopeTile, T::kNumTiles);
        } else {
          refill_any_page(ids0, blk_begin, 0, T::kVTilesPerHalf, T::kNumTiles);
          if (two) refill_any_page(ids0, blk_begin + 1, 1, T::kVTilesPerHalf, 2 * T::kVTilesPerHalf);
          // The loop prefetches `prefetch_pairs` pairs ahead from its first pair on; at distance 2 the second pair's
          // rows (refilled during the first) are prefetched here.
          if (prefetch_pairs == 2) gather::prefetch_pair_rows_l2<kGatherMode>(params, ids1, pg.page_size, wg_tid, kv_head);
        }
      } else if constexpr (kAnyPage) {
        if (tid < T::kWarpgroupThreads && is_page_issuer) {
          load_kv_tiles_any_page(smem, &k_map, &k_map_rope, pg, page_of_any(params, pg, req, blk_begin, slot, seqlen),
                                 blk_begin, slot, tid == 0, kv_head, 0, 0, T::kNumTiles, policy);
          if (blk_begin + 1 < blk_end)
            load_kv_tiles_any_page(smem, &k_map, &k_map_rope, pg,
                                   page_of_any(params, pg, req, blk_begin + 1, slot, seqlen), blk_begin + 1, slot,
                                   tid == 0, kv_head, 1, 0, T::kNumTiles, policy);
        }
      } else if (tid == 0) {
        load_kv_tiles(smem, &k_map, &k_map_rope, page_of(params, req, blk_begin), kv_head, 0, 0, T::kNumTiles, policy);
        if (blk_begin + 1 < blk_end)
          load_kv_tiles(smem, &k_map, &k_map_rope, page_of(params, req, blk_begin + 1), kv_head, 1, 0, T::kNumTiles, policy);
      }
      if (!kGather && !q_issued) issue_q(req, tid, T::kThreads);
    }
    // A Q issued during the previous request's epilogue (or above) must land before use, and before another
    // is issued into the same buffer, so it is waited for even by a request without work.
    if (has_work || q_issued) {
      if (params.q_tma && q_issued) {
        ptx::mbarrier_wait_parity(&smem.q_bar, pipeline::BarrierRing<1>::parity(static_cast<uint32_t>(smem.q_waits)));
      } else {
        if constexpr (kGather) gather::cp_async_wait_committed();
        else ptx::cp_async_wait_all();
        ptx::fence_proxy_async_shared();
      }
    }
    const bool q_waited = params.q_tma && q_issued;
    q_issued = false;
    __syncthreads();
    if (q_waited && tid == 0) ++smem.q_waits;
    if (tid == 0) {
      OPENMLA_DENSE_STAMP(req - rec.begin_req, kPrologueDone);
      OPENMLA_DENSE_VALUE(req - rec.begin_req, kBlocks, blk_end - blk_begin);
    }

    // Placement shim (docs/dense-decode.md, "Code placement", decision dense-v17): never taken, but its
    // instructions put the pair loop below at offset 0x40 modulo 128 bytes, the only placement that measured fast:
    // the same loop SASS elsewhere ran 2-5 % slower (s_q = 2, 32K). After any change above the loop, check with
    // `tools/sass_loops.py --offsets` and adjust the number of prefetch lines here (each moves the loop 16 bytes;
    // tools/placement_sweep.sh measures).
    if (params.batch < 0) {
      constexpr int kShimLines = placement_shim_lines<kAnyPage, kChunked, kGather, kVarlenQ>();
#pragma unroll
      for (int i = 0; i < kShimLines; ++i) asm volatile("prefetch.global.L2 [%0+0];" ::"l"(params.q) : "memory");
    }
    float o[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.f;
    float m_run[2] = {T::kMaxInit, T::kMaxInit};  // running max, base-2 scaled units
    float l_run[2] = {0.f, 0.f};                   // this thread's partial row sums, relative to m_run

    // ---------------------------------------------------------------- main loop over block pairs
    for (int blk0 = blk_begin; blk0 < blk_end; blk0 += 2) {
      const int blk1 = blk0 + 1;
      const bool has_k1 = blk1 < blk_end;
      const bool has_next = blk0 + 2 < blk_end;
      const bool next_has_k1 = blk0 + 3 < blk_end;
      const int tok0 = blk0 * T::kBlockN, tok1 = blk1 * T::kBlockN;
      const bool k0_partial = tok0 + T::kBlockN > seqlen;
      const bool k1_partial = tok1 + T::kBlockN > seqlen;
      // Pages of the next pair, loaded now so the refills below never wait on global memory.
      int next_page0, next_page1;
      int ids3 = -1;
      if constexpr (kGather) {  // the next pair's ids (loaded two pairs ago); the ids three pairs ahead requested now
        next_page0 = next_page1 = ids1;
        ids3 = gather::pair_ids(params, req, blk0 + 6, blk_end, seqlen, log2_page, wg_tid);
      } else if constexpr (kAnyPage) {  // this warp's page of each next block
        next_page0 = has_next ? page_of_any(params, pg, req, blk0 + 2, slot, seqlen) : 0;
        next_page1 = next_has_k1 ? page_of_any(params, pg, req, blk0 + 3, slot, seqlen) : 0;
      } else {
        next_page0 = has_next ? page_of(params, req, blk0 + 2) : 0;
        next_page1 = next_has_k1 ? page_of(params, req, blk0 + 3) : 0;
      }
      float s[32];
      uint32_t pa[4][4];

      if (wg == 0) {
        // Step 1: S0 = Q K0^T.
        gemm_qk<kIsFp16, 0, kGather>(s, smem, 0, k_phase[0].bit);
        if (tid == 0 && blk0 == blk_begin) OPENMLA_DENSE_STAMP(req - rec.begin_req, kFirstTiles);
        mask_logits(s, frag, tok0, border);
        // Step 2: m0 = max(m, rowmax S0), a0 = 2^(m - m0); publish; O_L = a0 O_L + P0 V0_L.
        float a0[2];
        seesaw::wg0_softmax(s, params.scale_log2, m_run, l_run, smem, frag, lane, a0);
        handoff.arrive(Handoff::kMax0Ready);
        scale_rows(o, a0[0], a0[1]);
        to_a_fragments<kIsFp16>(s, pa);
        // (kGather: rows past the length were zero-filled by the gathers.)
        if (!kGather && k0_partial) zero_tail_rows(smem.k[0][0], seqlen - tok0, wg_tid, NamedBarrier::kWg0Local);
        gemm_pv_rs<kIsFp16, Desc>(o, pa, smem.k[0][0]);
        if constexpr (kAnyPage) {
          if (has_next && is_page_issuer) refill_any_page(next_page0, blk0 + 2, 0, 0, T::kVTilesPerHalf);
        } else if (has_next && is_issuer) {
          load_kv_tiles(smem, &k_map, &k_map_rope, next_page0, kv_head, 0, 0, T::kVTilesPerHalf, policy);
        }

        // Step 4: wait for a1 and P1; rescale P0 to m1 and hand it to WG1.
        handoff.wait(Handoff::kScale1Ready);
        float a1[2];
        seesaw::wg0_receive(smem, frag, m_run, l_run, a1);
        scale_rows(s, a1[0], a1[1]);
        tile::stmatrix_tile<kIsFp16, 0>(s, ptx::smem_addr(smem.k[0][T::kRopeTile]), wg_tid);
        ptx::fence_proxy_async_shared();
        handoff.arrive(Handoff::kP0Ready);

        // Step 6: O_L = a1 O_L + P1 V1_L.
        scale_rows(o, a1[0], a1[1]);
        if (has_k1) {
          if (!kGather && k1_partial) zero_tail_rows(smem.k[1][0], seqlen - tok1, wg_tid, NamedBarrier::kWg0Local);
          ptx::mbarrier_wait_parity(&smem.k_bar[1][0], k_phase[1].bit);  // V1_L = group 0
          if constexpr (kGather) ptx::fence_proxy_async_acquire_shared();
          gemm_pv_ss<kIsFp16, Desc>(o, smem.k[1][T::kRopeTile], smem.k[1][0]);
          if constexpr (kAnyPage) {
            if (next_has_k1 && is_page_issuer) {
              refill_any_page(next_page1, blk0 + 3, 1, 0, T::kVTilesPerHalf);
              refill_any_page(next_page1, blk0 + 3, 1, T::kRopeTile, T::kNumTiles);
            }
          } else if (next_has_k1 && is_issuer) {
            load_kv_tiles(smem, &k_map, &k_map_rope, next_page1, kv_head, 1, 0, T::kVTilesPerHalf, policy);
            load_kv_tiles(smem, &k_map, &k_map_rope, next_page1, kv_head, 1, T::kRopeTile, T::kNumTiles, policy);
          }
        }
      } else {
        // kGather: the L2 look-ahead (gather.cuh), one bulk prefetch per row of the pair `prefetch_pairs` ahead.
        if constexpr (kGather) {
          if (prefetch_pairs != 0)
            gather::prefetch_pair_rows_l2<kGatherMode>(params, prefetch_pairs == 1 ? ids1 : ids2, pg.page_size, wg_tid,
                                                       kv_head);
        }
        // Step 1: S1 = Q K1^T, starting with the tiles WG1 itself refilled first.
        float mx[2] = {-INFINITY, -INFINITY};
        if (has_k1) {
          gemm_qk<kIsFp16, T::kVTilesPerHalf, kGather>(s, smem, 1, k_phase[1].bit);
          mask_logits(s, frag, tok1, border);
          row_max(s, mx);
        }
        // Step 3: m1 = max(m0, rowmax S1), a1 = 2^(m0 - m1); O_R = a0 a1 O_R + P1 V1_R.
        handoff.wait(Handoff::kMax0Ready);
        float m1[2], a1[2], a01[2], sum[2] = {0.f, 0.f};
        seesaw::wg1_rescale(mx, params.scale_log2, m_run, smem, frag, lane, m1, a1, a01);
        if (has_k1) {
          exponentiate(s, params.scale_log2, m1, sum);
          to_a_fragments<kIsFp16>(s, pa);
          tile::stmatrix_tile_packed(pa, ptx::smem_addr(smem.k[1][T::kRopeTile]), wg_tid);
          ptx::fence_proxy_async_shared();
        }
        handoff.arrive(Handoff::kScale1Ready);
        softmax::update_row_sums(l_run, a01, sum);
        scale_rows(o, a01[0], a01[1]);
        if (has_k1) {
          if (!kGather && k1_partial)
            zero_tail_rows(smem.k[1][T::kVTilesPerHalf], seqlen - tok1, wg_tid, NamedBarrier::kWg1Local);
          gemm_pv_rs<kIsFp16, Desc>(o, pa, smem.k[1][T::kVTilesPerHalf]);
          if constexpr (kAnyPage) {
            if (next_has_k1 && is_page_issuer)
              refill_any_page(next_page1, blk0 + 3, 1, T::kVTilesPerHalf, 2 * T::kVTilesPerHalf);
          } else if (next_has_k1 && is_issuer) {
            load_kv_tiles(smem, &k_map, &k_map_rope, next_page1, kv_head, 1, T::kVTilesPerHalf, 2 * T::kVTilesPerHalf,
                          policy);
          }
        }

        // Step 5: O_R += P0 V0_R.
        handoff.wait(Handoff::kP0Ready);
        if (!kGather && k0_partial)
          zero_tail_rows(smem.k[0][T::kVTilesPerHalf], seqlen - tok0, wg_tid, NamedBarrier::kWg1Local);
        ptx::mbarrier_wait_parity(&smem.k_bar[0][1], k_phase[0].bit);  // V0_R = group 1
        if constexpr (kGather) ptx::fence_proxy_async_acquire_shared();
        gemm_pv_ss<kIsFp16, Desc>(o, smem.k[0][T::kRopeTile], smem.k[0][T::kVTilesPerHalf]);
        if constexpr (kAnyPage) {
          if (has_next && is_page_issuer) refill_any_page(next_page0, blk0 + 2, 0, T::kVTilesPerHalf, T::kNumTiles);
        } else if (has_next && is_issuer) {
          load_kv_tiles(smem, &k_map, &k_map_rope, next_page0, kv_head, 0, T::kVTilesPerHalf, T::kNumTiles, policy);
        }
      }
      k_phase[0].flip();
      if (has_k1) k_phase[1].flip();
      handoff.next_step();
      if constexpr (kGather) {
        ids1 = ids2;
        ids2 = ids3;
      }
    }

    // ---------------------------------------------------------------- epilogue
    if (tid == 0) OPENMLA_DENSE_STAMP(req - rec.begin_req, kLoopDone);
    // The next item: the next request from its first block, or (kChunked) the next chunk of this request while the
    // record's range of it goes on (recomputed here from the split slot and the record, so nothing more stays live
    // across the pair loop).
    int next_req = req + 1, next_begin = 0;
    if constexpr (kChunked) {
      const int first_slot = __shfl_sync(0xffffffff, params.num_splits[req], 0);
      const int chunks = __shfl_sync(0xffffffff, params.num_splits[req + 1], 0) - first_slot;
      const int chunk_end = __shfl_sync(0xffffffff, (split_slot - first_slot + 1) * params.chunk_blocks, 0);
      const bool more = req == rec.end_req ? chunk_end < rec.end_block : chunk_end < chunks * params.chunk_blocks;
      if (more) {
        next_req = req;
        next_begin = chunk_end;
      } else if (req == rec.end_req) {
        next_req = -1;
      } else if (params.merge_counters != nullptr &&
                 (__shfl_sync(0xffffffff, params.schedule[blockIdx.z].pad, 0) & kRecordWalkListBit) != 0) {
        // The successor list after the counters, only where the plan wrote it (the record says so: a plan without
        // counters walks request order, and its call's counters hold no list). Read here, not kept across the loop.
        const int64_t next_at =
            static_cast<int64_t>(params.batch) * params.h_kv * params.num_m_blocks + req;
        next_req = __shfl_sync(0xffffffff, params.merge_counters[next_at], 0);
      }
    }
    const bool has_next = kChunked ? next_req >= 0 : req < rec.end_req;
    if (kChunked ? !has_next : req == rec.end_req) ptx::griddep_launch_dependents();
    // The next request's inputs while this epilogue runs (docs/dense-decode.md, decisions dense-v12, dense-v13,
    // dense-v17): its Q (the Q buffer is dead here and the epilogue stages in the K buffers; by TMA from thread 0
    // after the row-sum barrier where params.q_tma, otherwise by cp.async from the threads that do not store rows,
    // during the stores), and thread 0 reads its length and first two page ids, used after the epilogue's stores
    // to prefetch those pages into L2.
    int next_len = 0, next_page[2] = {0, 0};
    // kChunked: block-table entries of the next item's first block (its first page), prefetched from that page on.
    const int next_entry = kAnyPage ? (next_begin * pg.pages_per_block) >> pg.blocks_per_page_log2 : next_begin;
    if (has_next) {
      q_issued = true;  // by threads kBlockM.. while threads 0..kBlockM-1 store the rows (below)
      if constexpr (kGather) {
        // Threads 0-127: the page of row tid % 64 of the next item's block tid / 64 (-1: past its length).
        if (tid < 2 * T::kBlockN) {
          const int nreq = kChunked ? next_req : req + 1;
          next_len = min(max(params.cache_seqlens[nreq], 0), params.max_blocks_per_seq * pg.page_size);
          next_page[0] = gather::page_of_token(params, nreq, ((kChunked ? next_begin : 0) + tid / T::kBlockN) * T::kBlockN +
                                                             tid % T::kBlockN, next_len, log2_page);
        }
      } else if (tid == 0) {
        if constexpr (kChunked) {
          next_len = params.cache_seqlens[next_req];
          // (An entry past the table's row is never read; one past the length is never prefetched, below.)
          if (next_entry < params.max_blocks_per_seq) next_page[0] = page_of(params, next_req, next_entry);
          if (next_entry + 1 < params.max_blocks_per_seq) next_page[1] = page_of(params, next_req, next_entry + 1);
        } else {
          next_len = params.cache_seqlens[req + 1];
          next_page[0] = page_of(params, req + 1, 0);
          if (params.max_blocks_per_seq > 1) next_page[1] = page_of(params, req + 1, 1);
        }
      }
    }
    // In-kernel merge of a request split into two chunks (docs/dense-decode.md, "Split requests"): thread 0
    // reads the chunk count and how many other chunks of this (request, kv head, m-block) have published their
    // partials. If the other one has, this chunk merges now and writes the final rows (no partial of its own);
    // otherwise it publishes its partial, and merges anyway if its publication turns out to be the last.
    int* const counter = is_split && params.merge_counters != nullptr
                             ? params.merge_counters +
                                   (static_cast<int64_t>(req) * params.h_kv + kv_head) * params.num_m_blocks + m_block
                             : nullptr;
    const int valid_rows = min(T::kBlockM, R - row_base);
    const uint32_t merge_bytes = static_cast<uint32_t>(valid_rows) * T::kHeadDimV * 4;
    if (counter != nullptr && tid == 0) {
      const int first_slot = params.num_splits[req];
      const int chunks = params.num_splits[req + 1] - first_slot;
      int mode = kMergeByCombine;
      if constexpr (kChunked) {  // more chunks: every chunk publishes, the last one merges them all (below)
        if (chunks > kMaxMergeChunks) mode = kMergePublish;
      }
      if (chunks == kMaxMergeChunks) {
        mode = !params.merge_publish_always && ptx::ld_acquire_gpu(counter) == chunks - 1 ? kMergeNow : kMergePublish;
        if (mode == kMergeNow) {
          *counter = 0;  // nobody else touches it in this call: reset for the next call with this schedule
          ptx::fence_proxy_async_global();
          ptx::mbarrier_arrive_expect_tx(&smem.merge_bar, merge_bytes);
        }
      }
      smem.merge_info[0] = mode;
      smem.merge_info[1] = split_slot == first_slot ? first_slot + 1 : first_slot;  // the other chunk's slot
    }
    float total[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const float l = quad_sum(l_run[i]);
      if (lane % 4 == 0) smem.row_sum[wg][frag.row[i]] = l;
    }
    // Also certifies both warpgroups are done reading the K buffers, which become the staging area.
    ptx::named_barrier_sync(static_cast<int>(NamedBarrier::kRowSumReady), T::kThreads);
    // Both warpgroups are past their last Q K^T: the TMA path loads the next Q now (one thread, 9 boxes).
    if (params.q_tma && q_issued) tma_q(kChunked ? next_req : req + 1);
    const int merge_mode = counter != nullptr ? smem.merge_info[0] : kMergeByCombine;
#pragma unroll
    for (int i = 0; i < 2; ++i) total[i] = smem.row_sum[0][frag.row[i]] + smem.row_sum[1][frag.row[i]];
    // Per row: empty (no visible key, or a pathological NaN) and the base-2 log of the row sum (with the max).
    bool empty[2];
    float lse2[2];
    {
      float inv[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        empty[i] = epilogue::is_empty_row(total[i]);
        inv[i] = empty[i] ? 0.f : 1.f / total[i];
        lse2[i] = empty[i] ? -INFINITY : epilogue::lse_log2(m_run[i], total[i]);
      }
      scale_rows(o, inv[0], inv[1]);
    }

    uint8_t* stage = &smem.k[0][0][0];
    const int col_base = wg * (T::kHeadDimV / 2);
    // Stages the 64 x 512 result (this warpgroup's 256 columns) and sends its rows: final bf16/fp16 rows with the
    // natural-log lse, or fp32 partial rows with the base-2 lse. The rows leave by bulk copies (TMA engine, one
    // per row: 1 KB or 2 KB; docs/dense-decode.md, decision dense-v12): the generic-proxy staging writes are fenced
    // for the async proxy before the barrier, and the issuing threads wait until the engine has READ the staging
    // area (or, for a published partial, until the writes are complete). On the cp.async Q path threads kBlockM..
    // issue the next request's Q meanwhile.
    auto store_rows = [&](bool as_partial, bool publish) {
      if (!as_partial) {
#pragma unroll
        for (int j = 0; j < 32; ++j) {
          const int col = col_base + j * 8 + frag.col;
#pragma unroll
          for (int i = 0; i < 2; ++i)
            *reinterpret_cast<uint32_t*>(stage + frag.row[i] * T::kStageBf16PitchBytes + col * 2) =
                Element<kIsFp16>::pack(o[j * 4 + 2 * i], o[j * 4 + 2 * i + 1]);
        }
      } else {
        float* stage_f = reinterpret_cast<float*>(stage);
#pragma unroll
        for (int j = 0; j < 32; ++j) {
          const int col = col_base + j * 8 + frag.col;
#pragma unroll
          for (int i = 0; i < 2; ++i)
            *reinterpret_cast<float2*>(stage_f + frag.row[i] * T::kStageF32Pitch + col) =
                make_float2(o[j * 4 + 2 * i], o[j * 4 + 2 * i + 1]);
        }
      }
      // Softmax statistics: WG0 writes them (one thread per row).
      if (wg == 0 && lane % 4 == 0) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const int r = row_base + frag.row[i];
          if (r >= R) continue;
          if (!as_partial) {
            const int s_idx = r / params.q_per_kv, head = kv_head * params.q_per_kv + r % params.q_per_kv;
            params.output.lse[params.output.lse_offset(req, s_idx, head)] =
                epilogue::final_lse(empty[i], lse2[i]);
          } else {
            params.partial_lse[static_cast<int64_t>(split_slot) * params.s_q * params.h_q + kv_head * R + r] = lse2[i];
          }
        }
        if (publish) ptx::fence_acq_rel_gpu();
      }
      ptx::fence_proxy_async_shared();
      __syncthreads();
      if (tid == 0) OPENMLA_DENSE_STAMP(req - rec.begin_req, kStaged);
      if (tid < T::kBlockM) {
        const int row = tid, r = row_base + row;
        if (r < R) {
          if (!as_partial) {
            const int s_idx = r / params.q_per_kv, head = kv_head * params.q_per_kv + r % params.q_per_kv;
            const int64_t elem = params.output.out_offset(req, s_idx, head);
            ptx::bulk_store_global(static_cast<uint8_t*>(params.output.out) + elem * 2,
                                   ptx::smem_addr(stage + row * T::kStageBf16PitchBytes), T::kHeadDimV * 2);
          } else {
            const int64_t prow = static_cast<int64_t>(split_slot) * params.s_q * params.h_q + kv_head * R + r;
            ptx::bulk_store_global(params.partial_o + prow * T::kHeadDimV,
                                   ptx::smem_addr(stage + row * T::kStageF32Pitch * 4), T::kHeadDimV * 4);
          }
        }
        ptx::bulk_commit_group();
        if (publish) {  // the partial must be complete in global memory before the counter says so
          ptx::bulk_wait_group0();
          ptx::fence_proxy_async_global();
          ptx::fence_acq_rel_gpu();
        } else {
          ptx::bulk_wait_group_read0();
        }
      } else if (q_issued && !q_sent && !params.q_tma) {
        issue_q(kChunked ? next_req : req + 1, tid - T::kBlockM, T::kThreads - T::kBlockM);
        q_sent = true;
      }
    };
    q_sent = false;
    bool merge = merge_mode == kMergeNow;
    if (is_split && merge_mode != kMergeNow) store_rows(true, merge_mode == kMergePublish);
    if (is_split && merge_mode == kMergePublish) {
      __syncthreads();  // every row and lse of the partial is complete and fenced
      if (tid == 0) {
        // Publication: the other chunk merges when it finds the count at 1; if it published first, we merge.
        const bool last =
            ptx::atomic_add_acq_rel_gpu(counter, 1) ==
            (kChunked ? params.num_splits[req + 1] - params.num_splits[req] : kMaxMergeChunks) - 1;
        if (last) {
          *counter = 0;
          ptx::fence_proxy_async_global();
          ptx::mbarrier_arrive_expect_tx(&smem.merge_bar, merge_bytes);
        }
        smem.merge_info[0] = last ? kMergeNow : kMergePublish;
      }
      __syncthreads();
      merge = smem.merge_info[0] == kMergeNow;
    }
    if constexpr (kChunked) {
      // A request of more than two chunks (batch-invariant schedules): the chunk that published last merges every
      // chunk's partial, its own included, read back in slot order (docs/decode-schedule.md, "Batch invariance").
      const int first_slot = __shfl_sync(0xffffffff, params.num_splits[req], 0);
      const int chunks = __shfl_sync(0xffffffff, params.num_splits[req + 1], 0) - first_slot;
      if (merge && chunks > kMaxMergeChunks) {
        // Weights from the chunks' lse (base 2): w_c = 2^(l_c - max) / sum, the sum taken in slot order; out =
        // w_0 O_0, then out = fma(w_c, O_c, out) for c = 1, 2, ... (each chunk's rows staged in turn by bulk copies
        // completing on merge_bar: the publisher's arrival above expects the first, thread 0's below the others).
        const int64_t slot_rows = static_cast<int64_t>(params.s_q) * params.h_q;
        const int64_t row0 = static_cast<int64_t>(first_slot) * slot_rows + kv_head * R + row_base;
        ptx::fence_acq_rel_gpu();  // acquire: thread 0 saw the last publication; order this thread's reads after it
        ptx::fence_proxy_async_global();
        auto chunk_lse = [&](int c, int i) {
          return frag.row[i] < valid_rows ? params.partial_lse[row0 + c * slot_rows + frag.row[i]] : -INFINITY;
        };
        float mx[2] = {-INFINITY, -INFINITY}, sum[2] = {0.f, 0.f};
        for (int c = 0; c < chunks; ++c)
#pragma unroll
          for (int i = 0; i < 2; ++i) mx[i] = fmaxf(mx[i], chunk_lse(c, i));
#pragma unroll
        for (int i = 0; i < 2; ++i) empty[i] = mx[i] == -INFINITY;  // (empty chunks publish -inf)
        for (int c = 0; c < chunks; ++c)
#pragma unroll
          for (int i = 0; i < 2; ++i) sum[i] += empty[i] ? 0.f : exp2f(chunk_lse(c, i) - mx[i]);
#pragma unroll
        for (int i = 0; i < 2; ++i) lse2[i] = empty[i] ? -INFINITY : mx[i] + log2f(sum[i]);
        const uint32_t merges = static_cast<uint32_t>(smem.merge_info[2]);
        const float* stage_f = reinterpret_cast<const float*>(stage);
        for (int c = 0; c < chunks; ++c) {
          if (tid < valid_rows)
            ptx::bulk_load_shared(ptx::smem_addr(stage + tid * T::kStageF32Pitch * 4),
                                  params.partial_o + (row0 + c * slot_rows + tid) * T::kHeadDimV, T::kHeadDimV * 4,
                                  &smem.merge_bar);
          float w[2];
#pragma unroll
          for (int i = 0; i < 2; ++i) w[i] = empty[i] ? 0.f : exp2f(chunk_lse(c, i) - mx[i]) / sum[i];
          ptx::mbarrier_wait_parity(&smem.merge_bar, pipeline::BarrierRing<1>::parity(merges + c));
#pragma unroll
          for (int j = 0; j < 32; ++j) {
            if (j % 4 == 0) asm volatile("" ::: "memory");  // (bound the shared loads in flight, as below)
            const int col = col_base + j * 8 + frag.col;
#pragma unroll
            for (int i = 0; i < 2; ++i) {
              float2 v = make_float2(0.f, 0.f);
              if (frag.row[i] < valid_rows)
                v = *reinterpret_cast<const float2*>(stage_f + frag.row[i] * T::kStageF32Pitch + col);
              float& o0 = o[j * 4 + 2 * i];
              float& o1 = o[j * 4 + 2 * i + 1];
              o0 = c == 0 ? w[i] * v.x : fmaf(w[i], v.x, o0);
              o1 = c == 0 ? w[i] * v.y : fmaf(w[i], v.y, o1);
            }
          }
          // The next chunk's arrival (its phase cannot complete before its copies, issued after the barrier).
          if (tid == 0 && c + 1 < chunks) ptx::mbarrier_arrive_expect_tx(&smem.merge_bar, merge_bytes);
          __syncthreads();  // every thread read its part of the staging area before the next chunk's rows land
        }
        if (tid == 0) smem.merge_info[2] = static_cast<int>(merges + chunks);
        merge = false;
        is_split = false;  // the final rows are stored below
      }
    }
    if (merge) {
      // The other chunk's partial rows into the staging area (fp32, pitch kStageF32Pitch) and its lse.
      const int64_t other_row0 = static_cast<int64_t>(smem.merge_info[1]) * params.s_q * params.h_q + kv_head * R + row_base;
      ptx::fence_acq_rel_gpu();  // acquire: thread 0 saw the publication; order this thread's reads after it
      ptx::fence_proxy_async_global();
      if (tid < valid_rows)
        ptx::bulk_load_shared(ptx::smem_addr(stage + tid * T::kStageF32Pitch * 4),
                              params.partial_o + (other_row0 + tid) * T::kHeadDimV, T::kHeadDimV * 4, &smem.merge_bar);
      float lse2_other[2];
#pragma unroll
      for (int i = 0; i < 2; ++i)
        lse2_other[i] = frag.row[i] < valid_rows ? params.partial_lse[other_row0 + frag.row[i]] : -INFINITY;
      // Weights in slot order (a = the chunk of ordinal 0, b = ordinal 1), so both chunks, whichever merges,
      // compute the same numbers: out = w_b O_b + w_a O_a, lse = log2(2^l_a + 2^l_b).
      const bool own_first = smem.merge_info[1] > split_slot;  // the other chunk has the higher ordinal
      float w_own[2], w_other[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const float la = own_first ? lse2[i] : lse2_other[i], lb = own_first ? lse2_other[i] : lse2[i];
        const float mx = fmaxf(la, lb);
        float wa = 0.f, wb = 0.f;
        empty[i] = mx == -INFINITY;  // (NaN lse never occurs: empty chunks publish -inf)
        if (!empty[i]) {
          const float ea = exp2f(la - mx), eb = exp2f(lb - mx);
          const float sum = ea + eb;
          wa = ea / sum;
          wb = eb / sum;
          lse2[i] = mx + log2f(sum);
        }
        w_own[i] = own_first ? wa : wb;
        w_other[i] = own_first ? wb : wa;
      }
      ptx::mbarrier_wait_parity(&smem.merge_bar,
                                pipeline::BarrierRing<1>::parity(static_cast<uint32_t>(smem.merge_info[2])));
      const float* stage_f = reinterpret_cast<const float*>(stage);
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        // Bound the shared loads in flight (the accumulators already hold 128 registers): without this fence ptxas
        // hoists all 64 loads and runs out of registers for the whole kernel.
        if (j % 4 == 0) asm volatile("" ::: "memory");
        const int col = col_base + j * 8 + frag.col;
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          float2 v = make_float2(0.f, 0.f);
          if (frag.row[i] < valid_rows) v = *reinterpret_cast<const float2*>(stage_f + frag.row[i] * T::kStageF32Pitch + col);
          float& o0 = o[j * 4 + 2 * i];
          float& o1 = o[j * 4 + 2 * i + 1];
          if (own_first) {
            o0 = fmaf(w_other[i], v.x, w_own[i] * o0);
            o1 = fmaf(w_other[i], v.y, w_own[i] * o1);
          } else {
            o0 = fmaf(w_own[i], o0, w_other[i] * v.x);
            o1 = fmaf(w_own[i], o1, w_other[i] * v.y);
          }
        }
      }
      __syncthreads();  // every thread read its part of the staging area: it becomes the bf16 staging now
      if (tid == 0) ++smem.merge_info[2];  // merge_bar's next completion has the other parity
    }
    if (!is_split || merge) store_rows(false, false);
    if (tid == 0) OPENMLA_DENSE_STAMP(req - rec.begin_req, kStored);
    if constexpr (kGather) {  // one token row per thread 0-127: the next request's first two blocks
      if (has_next && tid < 2 * T::kBlockN && next_page[0] >= 0)
        gather::prefetch_row_l2(params, next_page[0], (tid % T::kBlockN) & (pg.page_size - 1), kv_head);
    } else if (tid == 0 && has_next) {  // only pages inside the next sequence are touched
      // (Any page size: entries 0 and 1 are the next sequence's first two pages, prefetched from their first row.)
      const int page_tokens = kAnyPage ? pg.page_size : T::kBlockN;
      const int len = min(max(next_len, 0), params.max_blocks_per_seq * page_tokens);
      for (int b = 0; b < 2; ++b)
        if (len > (kChunked ? next_entry + b : b) * page_tokens)
          prefetch_kv_page_l2(&k_map, &k_map_rope, next_page[b], kv_head);
    }
    // The staging area is the K buffers: nobody may run ahead into the next request's TMA loads.
    __syncthreads();
    if (tid == 0) OPENMLA_DENSE_STAMP(req - rec.begin_req, kDone);
    if constexpr (kChunked) {
      item_step = next_req - req;
      item_begin = next_begin;
    }
  }
}

// The page-64 kernel: the cache's pages are the kernel's 64-token blocks (one TMA per tile group).
template <bool kIsFp16>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    dense_decode_kernel(const __grid_constant__ DenseDecodeParams params, const __grid_constant__ CUtensorMap k_map,
                        const __grid_constant__ CUtensorMap k_map_rope, const __grid_constant__ CUtensorMap q_map) {
  dense_decode_body<kIsFp16, false, false>(params, k_map, k_map_rope, q_map, DensePageGeometry{});
}

// Every other page size (docs/dense-decode.md, "Page sizes"): the same pair loop over 64-token blocks, each block's
// rows gathered from 64 / P pages (P < 64) or cut from one page (P > 64). The geometry is an extra argument after the
// tensor maps, so the page-64 kernel's parameter layout is untouched.
template <bool kIsFp16>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    dense_decode_any_page_kernel(const __grid_constant__ DenseDecodeParams params,
                                 const __grid_constant__ CUtensorMap k_map, const __grid_constant__ CUtensorMap k_map_rope,
                                 const __grid_constant__ CUtensorMap q_map, const DensePageGeometry pages) {
  dense_decode_body<kIsFp16, true, false>(params, k_map, k_map_rope, q_map, pages);
}

// Page sizes 1, 2, 4 and 8 (docs/dense-decode.md, "Small pages: the gather kernel"): the same pair loop, each block's 64
// rows gathered by cp.async (gather.cuh) from the pages the block table names row by row. The cache tensor maps are not
// read (the launcher passes empty ones); q_map serves the TMA Q path as in the other kernels.
// kGatherMode: the experiment modes of params.h (0: the default kernel).
template <bool kIsFp16, int kGatherMode = 0>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    dense_decode_gather_kernel(const __grid_constant__ DenseDecodeParams params,
                               const __grid_constant__ CUtensorMap k_map, const __grid_constant__ CUtensorMap k_map_rope,
                               const __grid_constant__ CUtensorMap q_map, const DensePageGeometry pages,
                               const int gather_flags) {
  dense_decode_body<kIsFp16, true, false, true, false, kGatherMode>(params, k_map, k_map_rope, q_map, pages,
                                                                    DenseVarlenQ{}, gather_flags);
}

// The gather kernel's batch-invariant twin (chunk walk as below; instantiations/*_gather_invariant.cu).
template <bool kIsFp16>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    dense_decode_gather_invariant_kernel(const __grid_constant__ DenseDecodeParams params,
                                         const __grid_constant__ CUtensorMap k_map,
                                         const __grid_constant__ CUtensorMap k_map_rope,
                                         const __grid_constant__ CUtensorMap q_map, const DensePageGeometry pages,
                                         const int gather_flags) {
  dense_decode_body<kIsFp16, true, true, true>(params, k_map, k_map_rope, q_map, pages, DenseVarlenQ{},
                                               gather_flags);
}

// Batch-invariant schedules (docs/decode-schedule.md, "Batch invariance"): the page-64 and any-page kernels walking
// each record's range chunk by chunk (params.chunk_blocks > 0), in units of their own (instantiations/*_invariant.cu)
// so the default kernels keep their machine code. The page geometry is an argument as for the any-page kernel
// (DensePageGeometry{} at page 64).
template <bool kIsFp16, bool kAnyPage>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    dense_decode_invariant_kernel(const __grid_constant__ DenseDecodeParams params,
                                  const __grid_constant__ CUtensorMap k_map, const __grid_constant__ CUtensorMap k_map_rope,
                                  const __grid_constant__ CUtensorMap q_map, const DensePageGeometry pages) {
  dense_decode_body<kIsFp16, kAnyPage, true>(params, k_map, k_map_rope, q_map, pages);
}

// Per-request query lengths (docs/dense-decode.md, "Per-request query lengths"): the page-64 and any-page kernels with
// the varlen rows of dense_decode_body, in units of their own (instantiations/*_varlen_q.cu) so the default kernels
// keep their machine code. The lengths are an argument after the page geometry (DenseDecodeParams is unchanged).
template <bool kIsFp16, bool kAnyPage>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    dense_decode_varlen_q_kernel(const __grid_constant__ DenseDecodeParams params,
                                 const __grid_constant__ CUtensorMap k_map, const __grid_constant__ CUtensorMap k_map_rope,
                                 const __grid_constant__ CUtensorMap q_map, const DensePageGeometry pages,
                                 const DenseVarlenQ varlen) {
  dense_decode_body<kIsFp16, kAnyPage, false, false, true>(params, k_map, k_map_rope, q_map, pages, varlen);
}

}  // namespace openmla::kernels::dense_decode
