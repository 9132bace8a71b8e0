// Dense MHA prefill forward kernel (sm_90a): varlen, GQA, bottom-right causal, d_qk 192 or 128, d_v 128.
//
// A tile is (sequence, query head, 128 query rows). Persistent CTAs (at most one per SM) take tiles from a
// longest-first order (common/varlen.h) through an atomic counter (or round-robin). Each CTA has three warpgroups:
//   WG2, the producer (one warp): finds the tile's sequence in cu_seqlens (common/varlen_walk.cuh: a warp scan over
//       32 sequences at a time, moving forward only), publishes the tile in shared memory, loads Q once per tile and
//       the tile's K and V blocks (128 keys, last block first) through two-stage rings, all by TMA over the packed
//       token dimension. The maps (common/tensor_map.h, make_ragged_map) address a sequence through a window that
//       ends at its last row, so rows past the end read as zeros and a neighbour's rows (NaN padding included) never
//       reach shared memory.
//   WG0, WG1, the consumers: 64 query rows each. Per key block: S = Q K^T (SS wgmma, N = 128), the online softmax in
//       base 2 with the scale folded into one FFMA, then O += P V with P in registers (RS wgmma). Within a warpgroup
//       the next block's Q K^T runs while this block's softmax is computed (intra-warpgroup overlap). The two
//       warpgroups issue their GEMMs as soon as their data is ready, with no ping-pong order between them (decision
//       mha-v0.18). O stays in registers and leaves straight from them (16-byte stores of valid rows only).
// The tile math, the softmax parts, the issue loops, the mask, the walk, the loads and the stores are the layer's
// (src/common/, docs/architecture.md "Device layer"); this file composes them into the roles. Design note, with the
// pipeline picture and the barrier table: docs/mha-prefill.md.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/attention_mask.cuh"
#include "common/barrier_ring.cuh"
#include "common/cta.cuh"
#include "common/epilogue.cuh"
#include "common/mma_tile.cuh"
#include "common/online_softmax.cuh"
#include "common/ptx.cuh"
#include "common/ragged_tma.cuh"
#include "common/tile_gemm.cuh"
#include "common/trace.cuh"
#include "common/varlen_walk.cuh"
#include "kernels/mha_prefill/config.h"
#include "kernels/mha_prefill/params.h"

namespace openmla::kernels::mha_prefill {

using tile::Fragment;
using tile::make_fragment;
using tile::quad_sum;
template <int kStages>
using Ring = pipeline::BarrierRing<kStages>;

// Threads of the exchange barrier (config.h): the eight consumer warps and the producer warp.
inline constexpr int kExchangeThreads = kConsumerWarps * 32 + 32;

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
// The consumer step's pieces on a 64 x 128 accumulator fragment (m64n128: element j * 4 + 2 i + e is row f.row[i],
// column 8 j + f.col + e), composed from the layer
// ---------------------------------------------------------------------------------------------------
// The online-softmax step of one block (common/online_softmax.cuh): m_new = max(m, rowmax(S) scale_log2),
// s <- 2^(s scale_log2 - m_new), l <- l 2^(m - m_new) + rowsum (this thread's columns only; the quad's partial sums
// are added in the epilogue). Returns the factor a = 2^(m - m_new) that O (relative to m) must be scaled by. The row
// max is the tree (tile::row_max_tree): it starts the softmax's critical path (decision mha-v0.16).
__device__ __forceinline__ void softmax_step(float (&s)[64], float scale_log2, float (&m)[2], float (&l)[2],
                                             float (&a)[2]) {
  float mx[2];
  tile::row_max_tree(s, mx);
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float m_new = softmax::new_max(m[i], mx[i], scale_log2);
    a[i] = softmax::rescale_factor(m[i], m_new);
    m[i] = m_new;
  }
  float sum[2];
  tile::exponentiate(s, scale_log2, m, sum);
  softmax::update_row_sums(l, a, sum);
}

// The wgmma issues (no fence, commit or wait) of common/tile_gemm.cuh, with descriptors on the uniform datapath
// (tile::DescUniform64: decisions mha-v0.13, mha-v0.17). Q and K are K-major, V is viewed MN-major from tiles of 128
// rows (LBO one 16 KB tile).
using Desc = tile::DescUniform64;

// S = Q K^T: this warpgroup's 64 rows of the Q tile against a 128-key K block.
template <class T>
__device__ __forceinline__ void issue_qk(float (&s)[64], const uint8_t* q_rows, const uint8_t* k_block) {
  const uint32_t q = Desc::base<tile::kLboKMajor>(q_rows), k = Desc::base<tile::kLboKMajor>(k_block);
#pragma unroll
  for (int g = 0; g < T::kQKTiles; ++g) tile::issue_qk_tile<T::kIsFp16, Desc, T::kBlockN, T::kTileBytes>(s, q, k, g, g == 0);
}

// O += P V over a 128-key V block (8 k16 slices).
template <class T>
__device__ __forceinline__ void issue_pv(float (&o)[64], const uint32_t (&pa)[8][4], const uint8_t* v_block) {
  tile::issue_pv_rs<T::kIsFp16, Desc, T::kTileBytes, T::kHeadDimV>(o, pa, v_block);
}

// ---------------------------------------------------------------------------------------------------
// Tile scheduling (producer warp): tile t -> (sequence, head, query block)
// ---------------------------------------------------------------------------------------------------
// The call's tiles by query blocks (common/varlen_walk.cuh); a sequence's tiles in tile_coord's order (head-major,
// longest first under causal).
using Walk = varlen::TileWalk<Tiles, varlen::Walk::kQueryBlocks>;

// Finds tile `t` (warp-collective); false when t is past the last tile. On success fills `info` and the sequence's
// first key row.
__device__ __forceinline__ bool find_tile(const MhaPrefillParams& p, int t, varlen::SeqWindow& w, int lane,
                                          TileInfo& info, int& k_begin) {
  varlen::SeqTile st;
  if (!Walk::find(p.seqs, p.h_q, t, w, lane, st)) return false;
  const varlen::TileCoord c = varlen::tile_coord(st.local, Tiles::num_m_blocks(st.q.len), p.causal);
  info.valid = 1;
  info.q_begin = st.q.begin;
  info.s_q = st.q.len;
  info.s_k = st.k.len;
  info.head = c.head;
  info.m_block = c.block;
  info.n_end = Tiles::key_block_end(st.q.len, st.k.len, c.block, p.causal);
  info.pad = 0;
  k_begin = st.k.begin;
  return true;
}

// ---------------------------------------------------------------------------------------------------
// Producer (one warp; lane 0 issues the TMA)
// ---------------------------------------------------------------------------------------------------
template <int kDQK, bool kFp16>
__device__ __forceinline__ void produce(const MhaPrefillParams& p, SharedStorage<kDQK, kFp16>& smem,
                                        const CUtensorMap* q_map, const CUtensorMap* k_map, const CUtensorMap* v_map,
                                        int lane) {
  using T = Traits<kDQK, kFp16>;
  // Q is read by one CTA; K and V of a head by every CTA working on that head's query blocks: keep them in L2.
  const uint64_t q_policy = ptx::make_l2_evict_first_policy();
  const uint64_t kv_policy = ptx::make_l2_evict_last_policy();
  varlen::SeqWindow win = Walk::start(p.seqs, p.h_q, lane);
  using KvRing = Ring<T::kStages>;
  uint32_t k_iter = 0, v_iter = 0;  // blocks loaded into each ring so far (KvRing: slot and parity of each)
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
  ptx::named_barrier_sync_unaligned(static_cast<int>(NamedBarrier::kExchange), kExchangeThreads);  // record 0 published
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
        load_ragged_rows(smem.q, T::kQKTiles, q_map, &smem.q_full, info.head, info.q_begin, info.s_q,
                         info.m_block * T::kBlockM, q_policy);
      }
      OPENMLA_MHA_STAMP(Trace::kRoleProducer, tile_iter, Trace::kQIssued);
      // Blocks are consumed last first. The consumers take K of block i + 1 together with V of block i, so K runs one
      // block ahead: K(n-1), K(n-2), V(n-1), K(n-3), V(n-2), ..., V(0).
      const int kv_head = info.head / p.heads_per_kv;
      const int nb = info.n_end;
      for (int i = 0; i <= nb; ++i) {
        if (i < nb) {
          const int s = KvRing::slot(k_iter);
          pipeline::wait_or_trap(&smem.k_free[s], KvRing::free_parity(k_iter));
          ptx::mbarrier_arrive_expect_tx(&smem.k_full[s], T::kKBytes);
          load_ragged_rows(smem.k[s], T::kQKTiles, k_map, &smem.k_full[s], kv_head, k_begin, info.s_k,
                           (nb - 1 - i) * T::kBlockN, kv_policy);
          OPENMLA_MHA_STAMP_BLOCK(Trace::kRoleProducer, tile_iter, i, Trace::kKIssued);
          ++k_iter;
        }
        if (i >= 1) {
          const int s = KvRing::slot(v_iter);
          pipeline::wait_or_trap(&smem.v_free[s], KvRing::free_parity(v_iter));
          ptx::mbarrier_arrive_expect_tx(&smem.v_full[s], T::kVBytes);
          load_ragged_rows(smem.v[s], T::kVTiles, v_map, &smem.v_full[s], kv_head, k_begin, info.s_k,
                           (nb - i) * T::kBlockN, kv_policy);
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
    ptx::named_barrier_sync_unaligned(static_cast<int>(NamedBarrier::kExchange), kExchangeThreads);
    OPENMLA_MHA_STAMP(Trace::kRoleProducer, tile_iter, Trace::kProducerExchangePassed);
  }
}

// ---------------------------------------------------------------------------------------------------
// Consumers
// ---------------------------------------------------------------------------------------------------
// The lse of query row `row` of the tile's sequence (both epilogues): the packed token is the output view's request.
__device__ __forceinline__ void store_lse(const MhaPrefillParams& p, const TileInfo& info, int row, float lse) {
  p.output.lse[p.output.token_lse_offset(static_cast<int64_t>(info.q_begin) + row, info.head)] = lse;
}

// Writes this thread's two rows of a tile (4 x 16 bytes each across the quad: epilogue::store_row) from O (already
// divided by l) and the lse, valid rows only. `o` is 64 x 128 fp32 in the m64n128 accumulator layout.
template <bool kFp16>
__device__ __forceinline__ void store_rows(const MhaPrefillParams& p, const TileInfo& info, const float (&o)[64],
                                           const int (&row)[2], const float (&lse)[2], int lane) {
  const int q4 = lane % 4;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const bool live = row[i] < info.s_q;  // the same for the whole quad
    const int64_t token = static_cast<int64_t>(info.q_begin) + row[i];
    uint8_t* dst = static_cast<uint8_t*>(p.output.out) + 2 * p.output.token_out_offset(token, info.head);
    epilogue::store_row<kFp16, false>(o, i, q4, dst, 0, live);
    if (live && q4 == 0) store_lse(p, info, row[i], lse[i]);
  }
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
  using KvRing = Ring<T::kStages>;
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
  auto exchange = [&] { ptx::named_barrier_sync_unaligned(static_cast<int>(NamedBarrier::kExchange), kExchangeThreads); };
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
        ptx::named_barrier_sync(static_cast<int>(NamedBarrier::kOStage0) + kWg, T::kWarpgroupThreads);
        if (h == 0)
          tile::stmatrix_tile<kFp16, 0>(o, stage, wg_tid);
        else
          tile::stmatrix_tile<kFp16, 1>(o, stage, wg_tid);
        ptx::fence_proxy_async_shared();
        ptx::named_barrier_sync(static_cast<int>(NamedBarrier::kOStage0) + kWg, T::kWarpgroupThreads);
        if (wg_tid == 0) {
          ptx::tma_store_5d(o_map, stage, h * T::kTileCols, info.head,
                            static_cast<int>(varlen::kMaxRows) - info.s_q + first, info.q_begin + info.s_q,
                            static_cast<int>(varlen::kMaxRows));
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
    ptx::mbarrier_wait_parity(&smem.q_full, Ring<1>::parity(tile_iter));
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
    for (int i = 0; i < 2; ++i) limit[i] = varlen::row_key_limit(info.s_q, info.s_k, row[i], p.causal);
    float m[2] = {T::kMaxInit, T::kMaxInit};  // running max (scaled, base 2)
    float l[2] = {0.f, 0.f};                  // this thread's partial row sums, relative to m
    float a[2];
    float s[64];
    uint32_t pa[8][4];

    // ---------------------------------------------------------------- first block (the last keys): S only
    int n = info.n_end - 1;
    {
      const int ks = KvRing::slot(k_iter);
      ptx::mbarrier_wait_parity(&smem.k_full[ks], KvRing::parity(k_iter));
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
      if (Tiles::block_needs_mask(info.s_q, info.s_k, info.m_block, n, p.causal))
        mask::by_key_limit(s, limit, n * T::kBlockN, frag.col);
      softmax_step(s, p.scale_log2, m, l, a);  // O is still 0: no rescale
      a[0] = a[1] = 1.f;
      OPENMLA_MHA_STAMP_BLOCK(kWg, tile_iter, 0, Trace::kBlockSoftmaxDone);
      tile::to_a_fragments<kFp16>(s, pa);
    }

    // ---------------------------------------------------------------- main loop: S of block n with P V of block n + 1
    for (--n; n >= 0; --n) {
      const int ks = KvRing::slot(k_iter), vs = KvRing::slot(v_iter);
      ptx::mbarrier_wait_parity(&smem.k_full[ks], KvRing::parity(k_iter));
      ptx::mbarrier_wait_parity(&smem.v_full[vs], KvRing::parity(v_iter));
      OPENMLA_MHA_STAMP_BLOCK(kWg, tile_iter, info.n_end - 1 - n, Trace::kBlockDataReady);
      OPENMLA_MHA_STAMP_BLOCK(kWg, tile_iter, info.n_end - 1 - n, Trace::kBlockTurn);
      ptx::wgmma_fence();
      issue_qk<T>(s, q_rows, smem.k[ks][0]);
      ptx::wgmma_commit();
      // O's rescale to the max after block n + 1 (the previous step's softmax; its P V is done) runs while this Q K^T
      // is on the tensor cores, off the step's chain (FA3's order); the fence orders it before the P V into O.
      tile::scale_rows_if_changed(o, a[0], a[1]);
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
      if (Tiles::block_needs_mask(info.s_q, info.s_k, info.m_block, n, p.causal))
        mask::by_key_limit(s, limit, n * T::kBlockN, frag.col);
      softmax_step(s, p.scale_log2, m, l, a);
      OPENMLA_MHA_STAMP_BLOCK(kWg, tile_iter, info.n_end - 1 - n, Trace::kBlockSoftmaxDone);
      ptx::wgmma_wait<0>();
      ptx::fence_registers(o);
      OPENMLA_MHA_STAMP_BLOCK(kWg, tile_iter, info.n_end - 2 - n, Trace::kBlockPvDone);
      release(&smem.v_free[vs]);
      ++v_iter;
      tile::to_a_fragments<kFp16>(s, pa);  // O's rescale by `a` waits for the next step, behind its Q K^T
    }

    // ---------------------------------------------------------------- last P V (block 0)
    {
      const int vs = KvRing::slot(v_iter);
      ptx::mbarrier_wait_parity(&smem.v_full[vs], KvRing::parity(v_iter));
      OPENMLA_MHA_STAMP(kWg, tile_iter, Trace::kLastPvReady);
      OPENMLA_MHA_STAMP(kWg, tile_iter, Trace::kLastPvTurn);
      tile::scale_rows_if_changed(o, a[0], a[1]);  // to the max after block 0
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
      // l = 0: no key, out 0 and lse +inf; NaN in the inputs propagates to out and lse (epilogue::is_keyless_row).
      const bool none = epilogue::is_keyless_row(total);
      inv[i] = none ? 0.f : 1.f / total;
      lse[i] = none ? INFINITY : epilogue::lse_log2(m[i], total) * epilogue::kLn2;
    }
    tile::scale_rows_if_changed(o, inv[0], inv[1]);
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
  Smem& smem = cta::shared_storage<Smem>();
  const int tid = threadIdx.x;
  // Warp-uniform role (wgmma under a branch ptxas cannot prove uniform is serialised).
  const int wg = cta::warpgroup(tid);

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
