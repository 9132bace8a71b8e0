// Dense MHA prefill backward kernels (sm_90a): varlen, GQA, bottom-right causal, d_qk 192 or 128, d_v 128.
//
// Three kernels per call (api/mha_prefill_bwd.cpp launches them after resetting the workspace):
//   preprocess: per query row and head, D = rowsum(dO o O) and the lse in base 2, into the workspace at the row's
//       padded position (config.h); padded rows keep a huge lse (P = 0) and D = 0.
//   main: persistent CTAs over tiles (sequence, kv head, 128 keys), taken in order through an atomic counter (the
//       varlen walk by key blocks, common/varlen_walk.cuh). Two warpgroups, no producer warpgroup:
//       WG0, WG1: 64 keys each. Per step (query head of the group, query block of 64 rows): S^T = K Q^T and
//           dP^T = V dO^T (SS wgmma, N = 64 query rows), P^T = 2^(S^T scale_log2 - lse), dS^T = P^T o (dP^T - D);
//           dV += P^T dO and dK += dS^T Q with P^T and dS^T as register A fragments (RS wgmma); dS^T into shared
//           memory, then dQ = dS K (SS wgmma with the transposed A form) split by 64-column sub-blocks between the
//           warpgroups, staged in shared memory and added to the fp32 accumulator by bulk reductions (in a fixed
//           order when deterministic). dK (scaled) and dV leave from the registers at the end of the tile, summed
//           over the group's heads.
//       One thread (kLoaderThread) issues the TMA loads: K and V of the tile once, then Q, dO, the block's lse and D
//           one step ahead through a two-stage ring; warp 0 walks the tiles.
//   dq conversion: dq = scale * the accumulator, in the operands' type.
// Design note with the pipeline, the barriers and the numerics: docs/mha-prefill-bwd.md.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "common/barrier_ring.cuh"
#include "common/cta.cuh"
#include "common/epilogue.cuh"
#include "common/mma_tile.cuh"
#include "common/ptx.cuh"
#include "common/ragged_tma.cuh"
#include "common/tile_gemm.cuh"
#include "common/varlen_walk.cuh"
#include "kernels/mha_prefill_bwd/config.h"
#include "kernels/mha_prefill_bwd/params.h"

namespace openmla::kernels::mha_prefill_bwd {

using tile::Fragment;
using tile::make_fragment;
template <int kStages>
using Ring = pipeline::BarrierRing<kStages>;
using Desc = tile::DescUniform64;
using Walk = varlen::TileWalk<Tiles, varlen::Walk::kKeyBlocks>;

// ---------------------------------------------------------------------------------------------------
// Rows of a packed query tensor -> sequences (preprocess and conversion): the sequence whose clamped rows hold
// `row`, or -1 (a row past the last sequence, or in no sequence of malformed lengths).
// ---------------------------------------------------------------------------------------------------
struct RowSeq {
  int seq;
  int begin;  // the sequence's first row
};
__device__ __forceinline__ RowSeq find_row_sequence(const varlen::VarlenBatch& b, int row) {
  // The last i with cu[i] <= row (cu is non-decreasing when valid; a malformed one gives some i, checked below).
  int lo = 0, hi = b.batch;  // answer in [lo, hi)
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (__ldg(b.cu_seqlens_q + mid) <= row)
      lo = mid;
    else
      hi = mid;
  }
  const varlen::RowRange r = varlen::clamp_rows(__ldg(b.cu_seqlens_q + lo), __ldg(b.cu_seqlens_q + lo + 1), b.total_q);
  if (row < r.begin || row >= r.begin + r.len) return RowSeq{-1, 0};
  return RowSeq{lo, r.begin};
}
// The padded row of row `row` of sequence `s` (config.h).
__device__ __forceinline__ int64_t padded_row(const RowSeq& s, int row) {
  return (static_cast<int64_t>(s.begin) + 64 * static_cast<int64_t>(s.seq)) / 64 * 64 + (row - s.begin);
}

// ---------------------------------------------------------------------------------------------------
// Preprocess: one warp per (query row, head)
// ---------------------------------------------------------------------------------------------------
template <bool kFp16>
__device__ __forceinline__ float dot4(uint2 a, uint2 b) {
  float s = 0.f;
  if constexpr (kFp16) {
    const __half2* x = reinterpret_cast<const __half2*>(&a);
    const __half2* y = reinterpret_cast<const __half2*>(&b);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const float2 u = __half22float2(x[i]), v = __half22float2(y[i]);
      s = fmaf(u.x, v.x, s);
      s = fmaf(u.y, v.y, s);
    }
  } else {
    const __nv_bfloat162* x = reinterpret_cast<const __nv_bfloat162*>(&a);
    const __nv_bfloat162* y = reinterpret_cast<const __nv_bfloat162*>(&b);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const float2 u = __bfloat1622float2(x[i]), v = __bfloat1622float2(y[i]);
      s = fmaf(u.x, v.x, s);
      s = fmaf(u.y, v.y, s);
    }
  }
  return s;
}

template <bool kFp16>
__global__ void __launch_bounds__(256) mha_bwd_preprocess_kernel(const __grid_constant__ MhaPrefillBwdParams p) {
  const int64_t w = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (w >= static_cast<int64_t>(p.seqs.total_q) * p.h_q) return;
  const int row = static_cast<int>(w / p.h_q), head = static_cast<int>(w % p.h_q);
  const RowSeq s = find_row_sequence(p.seqs, row);
  if (s.seq < 0) return;
  const uint8_t* o = static_cast<const uint8_t*>(p.out) + 2 * (row * p.out_stride_t + head * p.out_stride_h);
  const uint8_t* d = static_cast<const uint8_t*>(p.dout) + 2 * (row * p.dout_stride_t + head * p.dout_stride_h);
  float sum = dot4<kFp16>(*reinterpret_cast<const uint2*>(o + 8 * lane), *reinterpret_cast<const uint2*>(d + 8 * lane));
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  if (lane == 0) {
    const int64_t at = static_cast<int64_t>(head) * p.pad_blocks * kBlockM + padded_row(s, row);
    p.dsum[at] = sum;
    p.lse2[at] = p.lse[row * p.lse_stride_t + head * p.lse_stride_h] * epilogue::kLog2e;
  }
}

// ---------------------------------------------------------------------------------------------------
// dq conversion: one thread per (query row, head, 8 columns)
// ---------------------------------------------------------------------------------------------------
template <int kDQK, bool kFp16>
__global__ void __launch_bounds__(256) mha_bwd_dq_convert_kernel(const __grid_constant__ MhaPrefillBwdParams p) {
  using T = Traits<kDQK, kFp16>;
  constexpr int kChunks = kDQK / 8;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= static_cast<int64_t>(p.seqs.total_q) * p.h_q * kChunks) return;
  const int chunk = static_cast<int>(idx % kChunks);
  const int64_t rh = idx / kChunks;
  const int row = static_cast<int>(rh / p.h_q), head = static_cast<int>(rh % p.h_q);
  const RowSeq s = find_row_sequence(p.seqs, row);
  uint8_t* dst = static_cast<uint8_t*>(p.dq) + 2 * (row * p.dq_stride_t + head * p.dq_stride_h + chunk * 8);
  if (s.seq < 0) {  // a row in no sequence does not reach the output: its gradient is 0
    *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
    return;
  }
  const int64_t prow = padded_row(s, row);
  const int g = chunk / 8, c = (chunk % 8) * 8, r = static_cast<int>(prow % 64);
  const float* base = p.dq_accum + ((static_cast<int64_t>(head) * p.pad_blocks + prow / 64) * T::kQKTiles + g) *
                                       static_cast<int64_t>(kSubBlockFloats);
  uint32_t packed[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 v = *reinterpret_cast<const float2*>(base + dq_accum_index(r, c + 2 * i));
    packed[i] = tile::Element16<kFp16>::pack(v.x * p.scale, v.y * p.scale);
  }
  *reinterpret_cast<uint4*>(dst) = make_uint4(packed[0], packed[1], packed[2], packed[3]);
}

// ---------------------------------------------------------------------------------------------------
// dk and dv of the key rows past the last sequence (rows clamp(cu_seqlens_kv[batch]) .. total_k): 0, as their keys
// reach no output. A small grid striding over the tail only, 8 columns of dk or dv per thread and step.
// ---------------------------------------------------------------------------------------------------
template <int kDQK>
__global__ void __launch_bounds__(256) mha_bwd_zero_key_tail_kernel(const __grid_constant__ MhaPrefillBwdParams p) {
  constexpr int kChunks = (kDQK + 128) / 8;  // dk's then dv's
  const int end = varlen::imin(varlen::imax(__ldg(p.seqs.cu_seqlens_k + p.seqs.batch), 0), p.seqs.total_k);
  const int64_t count = static_cast<int64_t>(p.seqs.total_k - end) * p.h_kv * kChunks;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < count;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int chunk = static_cast<int>(idx % kChunks);
    const int64_t rh = idx / kChunks;
    const int64_t row = end + rh / p.h_kv;
    const int head = static_cast<int>(rh % p.h_kv);
    uint8_t* dst = chunk < kDQK / 8
                       ? static_cast<uint8_t*>(p.dk) + 2 * (row * p.dk_stride_t + head * p.dk_stride_h + chunk * 8)
                       : static_cast<uint8_t*>(p.dv) +
                             2 * (row * p.dv_stride_t + head * p.dv_stride_h + (chunk - kDQK / 8) * 8);
    *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
  }
}

// ---------------------------------------------------------------------------------------------------
// Main kernel: tile scheduling (warp 0) and loads (the loader, kLoaderThread)
// ---------------------------------------------------------------------------------------------------
__device__ __forceinline__ bool find_tile(const MhaPrefillBwdParams& p, int t, varlen::SeqWindow& w, int lane,
                                          TileInfo& info) {
  varlen::SeqTile st;
  if (!Walk::find(p.seqs, p.h_kv, t, w, lane, st)) return false;
  // The key blocks of a kv head in order (longest first under causal), except deterministic causal: last first,
  // the order in which that mode adds dq (below, the rank in consume), so that a CTA only ever waits for tiles taken
  // before its own (no deadlock with fewer CTAs than tiles).
  // GQA (p.key_block_major): a sequence's tiles key block by key block across the kv heads, so that the longest
  // tiles (a kv head's first key blocks, each over h_q / h_kv query heads) of every kv head come first; a kv head's
  // tiles in a row otherwise (its Q and dO are then shared in L2 by the CTAs running beside each other).
  const int blocks = Tiles::num_n_blocks(st.k.len);
  const bool reverse = p.deterministic && p.causal;
  varlen::TileCoord c;
  if (p.key_block_major) {
    const int i = st.local / p.h_kv;
    c.head = st.local - i * p.h_kv;
    c.block = reverse ? blocks - 1 - i : i;
  } else {
    c = varlen::tile_coord(st.local, blocks, reverse);
  }
  info.valid = 1;
  info.q_begin = st.q.begin;
  info.s_q = st.q.len;
  info.k_begin = st.k.begin;
  info.s_k = st.k.len;
  info.kv_head = c.head;
  info.n_block = c.block;
  info.m_begin = Tiles::query_block_begin(st.q.len, st.k.len, c.block, p.causal);
  info.m_end = Tiles::num_m_blocks(st.q.len);
  info.pad_block = static_cast<int>((static_cast<int64_t>(st.q.begin) + 64 * static_cast<int64_t>(st.seq)) / 64);
  // Deterministic non-causal: rotated walks when the sequence's key blocks fit in the grid (config.h, walk_start).
  const int num_m = info.m_end - info.m_begin;
  info.rotated = p.deterministic && !p.causal && blocks <= p.grid && num_m > 0;
  info.walk_from = info.rotated ? walk_start(c.block, blocks, num_m) : 0;
  return true;
}

// Step j of a tile: query head kv_head * heads_per_kv + j / blocks, query block m_begin + j % blocks (from walk_from
// when rotated). GQA under the key-block-major order (default mode only): the query blocks outer, from the last one
// down, the group's heads inner, rotated by the key block: the tiles of a kv head started together (the order starts
// several key blocks of every kv head at once) then stay on the same query block, step for step, and share its Q, dO
// and dq accumulator in L2 (in the head-outer walk, key block n reaches a head hh 2n steps later than key block 0),
// on different heads at any one step (no two reductions into the same block at once).
struct StepCoord {
  int head;
  int m;
};
__device__ __forceinline__ StepCoord step_coord(const MhaPrefillBwdParams& p, const TileInfo& info, int j) {
  if (p.key_block_major) {
    const int b = j / p.heads_per_kv;
    int hh = j - b * p.heads_per_kv + info.n_block % p.heads_per_kv;
    if (hh >= p.heads_per_kv) hh -= p.heads_per_kv;
    return StepCoord{info.kv_head * p.heads_per_kv + hh, info.m_end - 1 - b};
  }
  const int blocks = info.m_end - info.m_begin;
  const int hh = j / blocks;
  int i = j - hh * blocks + info.walk_from;
  if (i >= blocks) i -= blocks;
  return StepCoord{info.kv_head * p.heads_per_kv + hh, info.m_begin + i};
}

// The loader: K and V of the tile (they are free: every thread passed the tile-start barrier after the previous tile's
// last GEMM).
template <int kDQK, bool kFp16>
__device__ __forceinline__ void load_kv(SharedStorage<kDQK, kFp16>& smem, const TileInfo& info,
                                        const CUtensorMap* k_map, const CUtensorMap* v_map) {
  using T = Traits<kDQK, kFp16>;
  const uint64_t policy = ptx::make_l2_evict_first_policy();  // read by this CTA only
  ptx::mbarrier_arrive_expect_tx(&smem.kv_full, T::kKBytes + T::kVBytes);
  load_ragged_rows(smem.k, T::kQKTiles, k_map, &smem.kv_full, info.kv_head, info.k_begin, info.s_k,
                   info.n_block * T::kBlockN, policy);
  load_ragged_rows(smem.v, T::kVTiles, v_map, &smem.kv_full, info.kv_head, info.k_begin, info.s_k,
                   info.n_block * T::kBlockN, policy);
}

// The loader: the loads of the CTA's step number `it` (step j of the tile) into its ring slot, once both warpgroups
// released the slot's previous step.
template <int kDQK, bool kFp16>
__device__ __forceinline__ void load_step(const MhaPrefillBwdParams& p, SharedStorage<kDQK, kFp16>& smem,
                                          const TileInfo& info, uint32_t it, int j, const CUtensorMap* q_map,
                                          const CUtensorMap* do_map) {
  using T = Traits<kDQK, kFp16>;
  using StepRing = Ring<T::kStages>;
  const StepCoord c = step_coord(p, info, j);
  const int s = StepRing::slot(it);
  ptx::mbarrier_wait_parity(&smem.step_free[s], StepRing::free_parity(it));
  const uint64_t policy = ptx::make_l2_evict_last_policy();  // Q and dO of a head: read by every key block's CTA
  ptx::mbarrier_arrive_expect_tx(&smem.step_full[s], T::kStepBytes);
  load_ragged_rows(smem.q[s], T::kQKTiles, q_map, &smem.step_full[s], c.head, info.q_begin, info.s_q,
                   c.m * T::kBlockM, policy);
  load_ragged_rows(smem.dout[s], T::kVTiles, do_map, &smem.step_full[s], c.head, info.q_begin, info.s_q,
                   c.m * T::kBlockM, policy);
  const int64_t stat = (static_cast<int64_t>(c.head) * p.pad_blocks + info.pad_block + c.m) * T::kBlockM;
  ptx::bulk_load_shared(ptx::smem_addr(smem.lse[s]), p.lse2 + stat, T::kRowStatBytes, &smem.step_full[s]);
  ptx::bulk_load_shared(ptx::smem_addr(smem.dsum[s]), p.dsum + stat, T::kRowStatBytes, &smem.step_full[s]);
}

// ---------------------------------------------------------------------------------------------------
// Main kernel: the consumers' GEMM steps
// ---------------------------------------------------------------------------------------------------
// X^T (+)= A B^T over kTiles 64-column tiles: A this warpgroup's 64 rows of a 128-row K-major buffer (tiles
// a_tile_bytes apart), B a 64-row K-major buffer (tiles 8 KB apart). S^T = K Q^T and dP^T = V dO^T.
template <bool kFp16, int kTiles, int kATileBytes, int kBTileBytes>
__device__ __forceinline__ void issue_transposed_scores(float (&acc)[32], const uint8_t* a_rows, const uint8_t* b) {
  const uint32_t a = Desc::base<tile::kLboKMajor>(a_rows), bb = Desc::base<tile::kLboKMajor>(b);
#pragma unroll
  for (int g = 0; g < kTiles; ++g)
    tile::issue_qk_tile<kFp16, Desc, 64, kATileBytes, uint32_t, kBTileBytes>(acc, a, bb, g, g == 0);
}

// dQ sub-block = dS K over the tile's 128 keys: dS^T (128 keys x 64 rows, K-major as stored) read as the transposed
// A operand, K's 64-column tile `k_tile` (128 keys x 64) read MN-major.
template <bool kFp16, int kKTileBytes>
__device__ __forceinline__ void issue_dq(float (&dq)[32], const uint8_t* ds, const uint8_t* k_tile) {
  const uint32_t a = Desc::base<kKTileBytes>(ds), b = Desc::base<kKTileBytes>(k_tile);
#pragma unroll
  for (int kk = 0; kk < 8; ++kk)
    tile::Element16<kFp16>::template mma_ss_trans_a<64, 1>(dq, Desc::at(a, kk * 16 * tile::kRowBytes),
                                                           Desc::at(b, kk * 16 * tile::kRowBytes), kk == 0 ? 0 : 1);
}

// dQ sub-blocks 0 and 2 (d_qk 192) in one m64n128 GEMM: K's tiles 0 and 2 read MN-major as one 128-column operand
// (LBO: two tiles); accumulator words 0-31 are sub-block 0's m64n64 fragment, 32-63 sub-block 2's.
template <bool kFp16, int kKTileBytes>
__device__ __forceinline__ void issue_dq_pair(float (&dq)[64], const uint8_t* ds, const uint8_t* k_tile0) {
  const uint32_t a = Desc::base<kKTileBytes>(ds), b = Desc::base<2 * kKTileBytes>(k_tile0);
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) {
    const uint64_t da = Desc::at(a, kk * 16 * tile::kRowBytes), db = Desc::at(b, kk * 16 * tile::kRowBytes);
    if constexpr (kFp16)
      ptx::wgmma_m64n128k16_ss_ta_f16<1>(dq, da, db, kk == 0 ? 0 : 1);
    else
      ptx::wgmma_m64n128k16_ss_ta_bf16<1>(dq, da, db, kk == 0 ? 0 : 1);
  }
}

// Stores a 64 x 64 fp32 fragment into a staging sub-block in the accumulator's order (config.h, dq_accum_index):
// float4 j of thread t at j * 512 + 4 t.
__device__ __forceinline__ void stage_dq(const float (&dq)[32], float* stage, int wg_tid) {
#pragma unroll
  for (int j = 0; j < 8; ++j)
    *reinterpret_cast<float4*>(stage + j * 512 + wg_tid * 4) =
        make_float4(dq[4 * j + 0], dq[4 * j + 1], dq[4 * j + 2], dq[4 * j + 3]);
}

// Deterministic, the stage leader: once its last reductions completed, raises the count of the block they added to
// (`pending`, -1: none), which lets the next key block in the order add to it.
__device__ __forceinline__ void raise_pending(const MhaPrefillBwdParams& p, int& pending) {
  if (p.deterministic && pending >= 0) {
    ptx::bulk_wait_group0();
    ptx::fence_proxy_async_global();
    ptx::atomic_add_acq_rel_gpu(p.dq_order + pending, 1);
    pending = -1;
  }
}

// The stage leader's wait for its previous reductions: their reads of the staging sub-blocks (before they are
// rewritten), or (`all`, at the end) their completion, with the count raised.
__device__ __forceinline__ void finish_reductions(const MhaPrefillBwdParams& p, int& pending, bool all) {
  raise_pending(p, pending);
  if (all)
    ptx::bulk_wait_group0();
  else
    ptx::bulk_wait_group_read0();
}

// Deterministic: the count query block m's accumulator must show before this tile's two reductions (one per
// warpgroup) add to it: 2 x the tile's rank in the fixed order of the key blocks' additions. Causal: from the last
// block that reaches the query block down to block 0 (the order in which the diagonal-first walks reach it anyway,
// so a CTA rarely waits); non-causal: the order in which the rotated walks reach it (config.h, rotated_rank), or
// block 0 first.
__device__ __forceinline__ int dq_order_target(const MhaPrefillBwdParams& p, const TileInfo& info, int m) {
  const int rank = p.causal       ? Tiles::key_block_end(info.s_q, info.s_k, m, true) - 1 - info.n_block
                   : info.rotated ? rotated_rank(info.n_block, m - info.m_begin, Tiles::num_n_blocks(info.s_k),
                                                 info.m_end - info.m_begin)
                                  : info.n_block;
  return 2 * rank;
}

template <int kDQK, bool kFp16, int kWg>
__device__ __forceinline__ void consume(const MhaPrefillBwdParams& p, SharedStorage<kDQK, kFp16>& smem,
                                        SharedStorage<kDQK, kFp16>& sd, int tid,
                                        const CUtensorMap* q_map, const CUtensorMap* k_map, const CUtensorMap* v_map,
                                        const CUtensorMap* do_map) {
  using T = Traits<kDQK, kFp16>;
  const int wg_tid = tid % T::kWarpgroupThreads;
  const int lane = tid % 32;
  const Fragment frag = make_fragment(wg_tid);
  using StepRing = Ring<T::kStages>;
  uint32_t step_iter = 0;  // the CTA's steps so far (the same in every thread)
  const bool stage_leader = wg_tid == 0;  // issues this warpgroup's dq reductions
  auto release = [&](uint64_t* bar) {
    __syncwarp();
    if (lane == 0) ptx::mbarrier_arrive(bar);
  };
  const uint8_t* k_rows = smem.k[0] + kWg * T::kKeysPerWarpgroup * T::kRowBytes;
  const uint8_t* v_rows = smem.v[0] + kWg * T::kKeysPerWarpgroup * T::kRowBytes;
  const uint32_t ds_rows = ptx::smem_addr(smem.ds) + kWg * T::kKeysPerWarpgroup * T::kRowBytes;
  int tile = blockIdx.x;  // warp 0's: the CTA's current tile number
  varlen::SeqWindow window{};  // warp 0's walk state
  if (tid < 32) window = Walk::start(p.seqs, p.h_kv, lane);
  for (uint32_t tile_iter = 0;; ++tile_iter) {
    // ---- the tile: found by warp 0 (its window moving forward only), published, and once
    // every thread is past the previous tile (its last GEMMs read K and V), K, V and the first step loaded.
    if (tid < 32) {
      // The next tile number is taken when the current one starts (the atomic's latency off the lookup), except in
      // the deterministic mode: there a tile is taken only when the CTA is free to run it, so that every tile taken
      // before a CTA's own is running or done (its dq additions come first in the fixed order; a tile taken early
      // by a CTA still busy with a long one would hold up every later key block of its head).
      if (p.deterministic && tile_iter > 0) {
        int ticket = 0;
        if (lane == 0) ticket = ptx::atomic_add_relaxed_gpu(p.tile_counter, smem.zero, 1);
        tile = __shfl_sync(0xffffffffu, ticket, 0) + p.grid;
      }
      TileInfo found;
      if (!find_tile(p, tile, window, lane, found)) {
        found = TileInfo{};
        found.valid = 0;
      }
      int ticket = 0;
      if (lane == 0) {
        sd.tile[tile_iter & 1] = found;
        if (found.valid && !p.deterministic) ticket = ptx::atomic_add_relaxed_gpu(p.tile_counter, smem.zero, 1);
      }
      if (!p.deterministic) tile = __shfl_sync(0xffffffffu, ticket, 0) + p.grid;
    }
    ptx::named_barrier_sync_unaligned(static_cast<int>(NamedBarrier::kTileStart), kConsumerThreads);
    // The record is read where it is used (after the barriers and fences of each step the compiler reloads it
    // instead of keeping its fields live: registers are the kernel's limit).
    const TileInfo& info = sd.tile[tile_iter & 1];
    if (!info.valid) break;
    const int steps = p.heads_per_kv * (info.m_end - info.m_begin);
    if (tid == kLoaderThread) {
      load_kv(smem, info, k_map, v_map);
      if (steps > 0) load_step(p, smem, info, step_iter, 0, q_map, do_map);
    }
    __syncwarp();  // the loader's warp reconverges before the warp-wide wgmma instructions
    float dk[kDQK / 2], dv[64];
#pragma unroll
    for (int i = 0; i < kDQK / 2; ++i) dk[i] = 0.f;
#pragma unroll
    for (int i = 0; i < 64; ++i) dv[i] = 0.f;
    ptx::mbarrier_wait_parity(&smem.kv_full, Ring<1>::parity(tile_iter));
    for (int j = 0; j < steps; ++j, ++step_iter) {
      const StepCoord sc = step_coord(p, info, j);
      const int head = sc.head, m = sc.m;
      {
        // Thread-derived offsets recomputed per step from a laundered index (not hoisted and kept live).
        const int t = ptx::launder32(wg_tid);
        const int col = (t % 4) * 2;  // the fragment's first column (query row of S^T)
        const int key0 = info.n_block * T::kBlockN + kWg * T::kKeysPerWarpgroup + (t / 32) * 16 + (t % 32) / 4;
        const int s = StepRing::slot(step_iter);
        ptx::mbarrier_wait_parity(&smem.step_full[s], StepRing::parity(step_iter));
        // ---- S^T = K Q^T, then P^T = 2^(S^T scale_log2 - lse) (masked entries 0) packed into A fragments; then
        // dP^T = V dO^T with dV += P^T dO; then dS^T = P^T o (dP^T - D) packed, and dK += dS^T Q (register A
        // fragments; dO and Q viewed MN-major). Three phases, so that at most one fp32 score fragment is live beside
        // dK and dV (160 or 128 registers).
        float st[32], dpt[32];
        ptx::wgmma_fence();
        issue_transposed_scores<kFp16, T::kQKTiles, T::kKTileBytes, T::kQTileBytes>(st, k_rows, smem.q[s][0]);
        ptx::wgmma_commit();
        // dP^T = V dO^T needs no P: issued now, it runs while the exponentials are formed.
        issue_transposed_scores<kFp16, T::kVTiles, T::kKTileBytes, T::kQTileBytes>(dpt, v_rows, smem.dout[s][0]);
        ptx::wgmma_commit();
        // The next step's loads go out now, behind this step's first GEMMs (the loader's warp would wait for them
        // anyway; at the step's start they held up its warpgroup's GEMMs). Its slot was released by the step
        // before this one.
        if (tid == kLoaderThread && j + 1 < steps) load_step(p, smem, info, step_iter + 1, j + 1, q_map, do_map);
        // Deterministic: the previous step's reductions complete while this GEMM runs; their count is raised now
        // (the next key block of that query block may be waiting for it).
        // Deterministic, the stage leader: the first look at this step's block count, also behind the GEMMs (an
        // acquire load waits for its answer, about an L2 round trip): at the reduction below the count is then
        // usually known high enough, and the leader's warp reaches the next step's GEMMs without that wait.
        // The count still to wait for is kept in shared memory (-1: none), not in a register across the step.
        if (stage_leader) {
          raise_pending(p, sd.pending_order[kWg]);
          if (p.deterministic) {
            const int target = dq_order_target(p, info, m);
            const int* order = p.dq_order + static_cast<int64_t>(head) * p.pad_blocks + info.pad_block + m;
            sd.order_target[kWg] = ptx::ld_acquire_gpu(order) >= target ? -1 : target;
          }
        }
        __syncwarp();
        ptx::wgmma_wait<1>();
        ptx::fence_registers(st);
        // Two copies of the exponentials: the mask's per-element tests (a branch each) only on the blocks that need
        // them (the diagonal and the key tail), the other blocks run the bare loop.
        auto softmax = [&](auto kMasked) {
#pragma unroll
          for (int j = 0; j < 8; ++j) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int c = 8 * j + col + e;
              const float l2 = sd.lse[s][c];
#pragma unroll
              for (int i = 0; i < 2; ++i) {
                const int x = 4 * j + 2 * i + e;
                float pv = ptx::exp2_approx(fmaf(st[x], p.scale_log2, -l2));
                if constexpr (decltype(kMasked)::value) {
                  const int row = m * T::kBlockM + c;
                  const int key = key0 + 8 * i;
                  if (key >= info.s_k || (p.causal && key > row + info.s_k - info.s_q)) pv = 0.f;
                }
                st[x] = pv;
              }
            }
          }
        };
        if (Tiles::block_needs_mask(info.s_q, info.s_k, m, info.n_block, p.causal))
          softmax(std::true_type{});
        else
          softmax(std::false_type{});
        uint32_t pa[4][4], dsa[4][4];
        tile::to_a_fragments<kFp16>(st, pa);
        ptx::wgmma_fence();
        tile::issue_pv_rs<kFp16, Desc, T::kQTileBytes, T::kHeadDimV, 4>(dv, pa, smem.dout[s][0]);
        ptx::wgmma_commit();
        // dP^T only: dV += P^T dO runs on while dS is formed (dV and P^T's fragments, its A operand, are left alone
        // until the wait after dK's GEMM; P^T's fragments are only read).
        ptx::wgmma_wait<1>();
        ptx::fence_registers(dpt);
        // P^T again from its 16-bit fragments (the values dV used).
#pragma unroll
        for (int j = 0; j < 8; ++j) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float dd = sd.dsum[s][8 * j + col + e];
#pragma unroll
            for (int i = 0; i < 2; ++i) {
              const int x = 4 * j + 2 * i + e;
              const float pv = tile::Element16<kFp16>::unpack(pa[x / 8][(x % 8) / 2], x % 2);
              dpt[x] = pv * (dpt[x] - dd);
            }
          }
        }
        tile::to_a_fragments<kFp16>(dpt, dsa);
        ptx::wgmma_fence();
        tile::issue_pv_rs<kFp16, Desc, T::kQTileBytes, kDQK, 4>(dk, dsa, smem.q[s][0]);
        ptx::wgmma_commit();
        // ---- dS^T into shared memory once the previous step's dQ GEMMs (its readers) and this warpgroup's previous
        // reductions (readers of the staging sub-blocks) are done
        if (stage_leader) finish_reductions(p, sd.pending_order[kWg], false);
        ptx::named_barrier_sync_unaligned(static_cast<int>(NamedBarrier::kDsFree), kConsumerThreads);
        tile::stmatrix_tile_packed(dsa, ds_rows, t);
        ptx::fence_proxy_async_shared();
        ptx::named_barrier_sync_unaligned(static_cast<int>(NamedBarrier::kDsReady), kConsumerThreads);
        ptx::wgmma_wait<0>();
        ptx::fence_registers(dk);
        ptx::fence_registers(dsa);
        ptx::fence_registers(dv);
        ptx::fence_registers(pa);
        release(&smem.step_free[s]);  // Q, dO, lse and D of the step are read
        // ---- dQ = dS K: 64-column sub-blocks, g = kWg + step (mod 2): one each (d_qk 128), or two and one (192)
        const int g0 = __shfl_sync(0xffffffffu, static_cast<int>((kWg + step_iter) & 1u), 0);
        const bool two = T::kQKTiles == 3 && g0 == 0;
        // One sub-block at a time (32 accumulator registers beside dK and dV).
        auto dq_sub_block = [&](int g) {
          float dq[32];
          ptx::wgmma_fence();
          issue_dq<kFp16, T::kKTileBytes>(dq, smem.ds, smem.k[g]);
          ptx::wgmma_commit();
          ptx::wgmma_wait<0>();
          ptx::fence_registers(dq);
          stage_dq(dq, sd.dq_stage[g], t);
        };
        if constexpr (T::kQKTiles == 3) {
          // d_qk 192, the warpgroup with two sub-blocks (0 and 2): one m64n128 GEMM over both (K's tiles 0 and 2 as
          // one MN-major operand, 32 KB apart): dS^T is read once, one drain instead of two. Each branch issues and
          // waits for its own GEMMs (no accumulator in flight across the join).
          if (two) {
            float dq[64];
            ptx::wgmma_fence();
            issue_dq_pair<kFp16, T::kKTileBytes>(dq, smem.ds, smem.k[0]);
            ptx::wgmma_commit();
            ptx::wgmma_wait<0>();
            ptx::fence_registers(dq);
            stage_dq(*reinterpret_cast<const float(*)[32]>(&dq[0]), sd.dq_stage[0], t);
            stage_dq(*reinterpret_cast<const float(*)[32]>(&dq[32]), sd.dq_stage[2], t);
          } else {
            dq_sub_block(g0);
          }
        } else {
          dq_sub_block(g0);
        }
        ptx::fence_proxy_async_shared();
        ptx::named_barrier_sync_unaligned(static_cast<int>(NamedBarrier::kStage0) + kWg, T::kWarpgroupThreads);
        if (stage_leader) {
          const int64_t block = static_cast<int64_t>(head) * p.pad_blocks + info.pad_block + m;
          float* dst = p.dq_accum + block * T::kQKTiles * kSubBlockFloats;
          int* order = p.dq_order + block;
          if (p.deterministic) {
            // The fixed order of the key blocks' additions (dq_order_target); the count was first read at the
            // step's start.
            const int target = sd.order_target[kWg];
            if (target >= 0) {
              while (ptx::ld_acquire_gpu(order) < target) {
              }
            }
            ptx::fence_proxy_async_global();
          }
          constexpr uint32_t kBytes = kSubBlockFloats * 4;
          ptx::bulk_reduce_add_f32(dst + g0 * kSubBlockFloats, ptx::smem_addr(sd.dq_stage[g0]), kBytes);
          if (two) ptx::bulk_reduce_add_f32(dst + 2 * kSubBlockFloats, ptx::smem_addr(sd.dq_stage[2]), kBytes);
          ptx::bulk_commit_group();
          // The count is raised once the reductions completed: early in this warpgroup's next step, behind its first
          // GEMM (raise_pending), so the wait for their completion is off the step's path.
          if (p.deterministic) sd.pending_order[kWg] = static_cast<int>(block);
        }
        __syncwarp();
      }
    }
    // (The tile's last GEMMs are done; the next tile's barrier lets the loader reload K and V.)
    // ---- dK (times the scale) and dV of this warpgroup's keys
#pragma unroll
    for (int i = 0; i < kDQK / 2; ++i) dk[i] *= p.scale;
    const int q4 = lane % 4;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int key = info.n_block * T::kBlockN + kWg * T::kKeysPerWarpgroup + frag.row[i];
      const bool live = key < info.s_k;  // the same for the whole quad
      const int64_t token = static_cast<int64_t>(info.k_begin) + key;
      uint8_t* dk_row = static_cast<uint8_t*>(p.dk) + 2 * (token * p.dk_stride_t + info.kv_head * p.dk_stride_h);
      uint8_t* dv_row = static_cast<uint8_t*>(p.dv) + 2 * (token * p.dv_stride_t + info.kv_head * p.dv_stride_h);
      epilogue::store_row<kFp16, false>(dk, i, q4, dk_row, 0, live);
      epilogue::store_row<kFp16, false>(dv, i, q4, dv_row, 0, live);
    }
  }
  if (stage_leader) finish_reductions(p, sd.pending_order[kWg], true);  // also before the CTA's shared memory goes
}

// The kernel's shared storage at the first 1024-byte boundary of the dynamic shared memory, as cta::shared_storage
// places it, but reached by pointer arithmetic on the shared array itself (not through an integer): the compiler then
// knows every access shared (LDS / STS with 32-bit addresses). Through the integer round trip every record, lse / D
// and dq staging access was a generic LD.E / ST.E with a 64-bit address (about 60 per step, and the registers).
template <class Storage>
__device__ __forceinline__ Storage& shared_storage_in_shared() {
  extern __shared__ __align__(1024) uint8_t bwd_smem_raw[];
  const uint32_t pad = (1024u - (ptx::smem_addr(bwd_smem_raw) & 1023u)) & 1023u;
  return *reinterpret_cast<Storage*>(bwd_smem_raw + pad);
}

template <int kDQK, bool kFp16>
__global__ void __launch_bounds__(Traits<kDQK, kFp16>::kThreads, 1)
    mha_bwd_kernel(const __grid_constant__ MhaPrefillBwdParams p, const __grid_constant__ CUtensorMap q_map,
                   const __grid_constant__ CUtensorMap k_map, const __grid_constant__ CUtensorMap v_map,
                   const __grid_constant__ CUtensorMap do_map) {
  using T = Traits<kDQK, kFp16>;
  using Smem = SharedStorage<kDQK, kFp16>;
  Smem& smem = cta::shared_storage<Smem>();  // addresses for the descriptors, TMA and barriers
  Smem& sd = shared_storage_in_shared<Smem>();  // the same storage, for the data the threads read and write
  const int tid = threadIdx.x;
  const int wg = cta::warpgroup(tid);
  if (tid == 0) {
    ptx::prefetch_tensormap(&q_map);
    ptx::prefetch_tensormap(&k_map);
    ptx::prefetch_tensormap(&v_map);
    ptx::prefetch_tensormap(&do_map);
    smem.zero = 0;
    smem.pending_order[0] = smem.pending_order[1] = -1;
    ptx::mbarrier_init(&smem.kv_full, 1);
    for (int s = 0; s < T::kStages; ++s) {
      ptx::mbarrier_init(&smem.step_full[s], 1);
      ptx::mbarrier_init(&smem.step_free[s], kConsumerWarps);
    }
    ptx::fence_mbarrier_init();
  }
  __syncthreads();
  if (wg == 0)
    consume<kDQK, kFp16, 0>(p, smem, sd, tid, &q_map, &k_map, &v_map, &do_map);
  else
    consume<kDQK, kFp16, 1>(p, smem, sd, tid, &q_map, &k_map, &v_map, &do_map);
}

}  // namespace openmla::kernels::mha_prefill_bwd
