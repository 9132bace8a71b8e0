// Dense MHA prefill forward, FP8 (e4m3) inputs (sm_90a): the bf16 kernel's tiles, walk, roles and pipeline
// (kernel.cuh, docs/mha-prefill.md) with both GEMMs as e4m3 wgmma (m64n128k32) and V transposed in shared memory.
//
// What differs from kernel.cuh (design note: docs/fp8-prefill-design.md):
//   - Operands are 1-byte: Q and K arrive as 128-column (128-byte) TMA boxes, 128B-swizzled (d_qk 192: a second box
//     of which only the first 64 columns are inside the tensor; the TMA unit fills the rest with zeros and the
//     Q K^T issue loop skips them), so every shared tile keeps the library's SW128 K-major layout.
//   - 8-bit wgmma reads both operands K-major: P V needs V^T (d_v rows, keys contiguous). V lands by TMA in a staging
//     stage (key-major) and the four warps of the producer warpgroup transpose it into the V^T stage, a quarter of
//     the d_v rows each (ldmatrix.trans of 8 x 8 b16 blocks, two byte permutes per output word, stmatrix), in the key
//     order of tile::e4m3_pv_key, so that P's A fragments are packed in each thread's own order
//     (tile::to_a_fragments_e4m3, no shuffle). The loader warp (warp 8) issues the TMA and transposes its quarter two
//     steps after each load; the helper warps 9-11 follow the tile records as the consumers do.
//   - The descales are per (sequence, kv head): the producer folds softmax_scale log2(e) q_descale k_descale into the
//     tile record's score scale and v_descale into its output scale.
//   - P is quantised to e4m3 with a fixed offset of 2^8 (p' = 2^(s c - m + 8) <= 256 < 448), so every p >= 2^-14 is
//     a normal e4m3 value; the epilogue takes the offset out of the lse and of 1 / l.
//   - The output (bf16 or fp16, a run-time choice) leaves straight from the registers (no staged-O kernel).
#pragma once

#include "kernels/mha_prefill/kernel.cuh"
#include "kernels/mha_prefill/params_fp8.h"

namespace openmla::kernels::mha_prefill::fp8 {

// ---------------------------------------------------------------------------------------------------
// Traits and the shared-memory plan
// ---------------------------------------------------------------------------------------------------
template <int kDQK>
struct Traits {
  static_assert(kDQK == 192 || kDQK == 128, "dense MHA prefill serves d_qk 192 and 128");
  static constexpr int kHeadDimQK = kDQK;
  static constexpr int kHeadDimV = 128;
  static constexpr int kBlockM = mha_prefill::kBlockM;
  static constexpr int kBlockN = mha_prefill::kBlockN;
  static constexpr int kRowsPerWarpgroup = 64;
  // A shared tile: 128 rows x 128 bytes (128 e4m3 columns), 128B-swizzled: one TMA box.
  static constexpr int kTileCols = 128;
  static constexpr int kRowBytes = 128;
  static constexpr int kTileBytes = kBlockM * kRowBytes;                       // 16 KB
  static constexpr int kQKTiles = (kHeadDimQK + kTileCols - 1) / kTileCols;   // 2 (d_qk 192: the second half used)
  static constexpr int kQKSlices = kHeadDimQK / 32;                           // k32 wgmma slices of Q K^T: 6 or 4
  static constexpr int kPVSlices = kBlockN / 32;                              // of P V: 4
  static constexpr int kStages = 2;
  static constexpr int kWarpgroupThreads = 128;
  static constexpr int kThreads = 3 * kWarpgroupThreads;
  // setmaxnreg split: the consumers hold O (64), S (64), P as e4m3 A fragments (16) and the state; the producer
  // warps also transpose V (four units of 4 words in flight, addresses; the loader's tile walk besides: 56 spilled).
  static constexpr int kLaunchRegs = 168;
  static constexpr int kRegsConsumer = 216;
  static constexpr int kRegsProducer = 72;
  static_assert(2 * kRegsConsumer + kRegsProducer <= 3 * kLaunchRegs, "setmaxnreg only redistributes registers");
  static constexpr uint32_t kQBytes = kQKTiles * kTileBytes;  // TMA bytes of Q (a box's bytes count in full)
  static constexpr uint32_t kKBytes = kQKTiles * kTileBytes;
  static constexpr uint32_t kVBytes = kTileBytes;
  static constexpr float kMaxInit = -1e30f;
  // P's offset: p' = 2^(s c - m + kPOffset), p' <= 2^8 = 256 (e4m3's largest finite value is 448).
  static constexpr float kPOffset = 8.f;
};

// The tile record: the bf16 kernel's, plus the tile's scales (sequence b, kv head g).
struct TileRecord {
  TileInfo info;
  float score_scale_log2;  // softmax_scale log2(e) q_descale[b, g] k_descale[b, g]
  float out_scale;         // v_descale[b, g]
  int pad[2];
};

template <int kDQK>
struct alignas(1024) SharedStorage {
  using T = Traits<kDQK>;
  alignas(1024) uint8_t q[T::kQKTiles][T::kTileBytes];              // Q: 128 rows x d_qk bytes
  alignas(1024) uint8_t k[T::kStages][T::kQKTiles][T::kTileBytes];  // K blocks: 128 keys x d_qk bytes
  alignas(1024) uint8_t v[T::kStages][T::kTileBytes];               // V blocks as loaded: 128 keys x 128 bytes
  alignas(1024) uint8_t vt[T::kStages][T::kTileBytes];              // V^T: 128 d_v rows x 128 keys (e4m3_pv_key order)
  TileRecord tile[2];
  int zero;
  int pad_[3];
  uint64_t q_full;
  uint64_t k_full[T::kStages];
  uint64_t k_free[T::kStages];
  uint64_t v_full[T::kStages];   // the staged V landed (TMA)
  uint64_t v_read[T::kStages];   // the staged V read by the three helper transposer warps (the loader refills it)
  uint64_t vt_full[T::kStages];  // V^T written (all four transposer warps)
  uint64_t vt_free[T::kStages];  // V^T read by both consumer warpgroups' P V
};
static_assert(sizeof(SharedStorage<192>) % 1024 == 0 && sizeof(SharedStorage<128>) % 1024 == 0);

template <int kDQK>
inline constexpr int kSmemBytes = static_cast<int>(sizeof(SharedStorage<kDQK>)) + 1024;
static_assert(kSmemBytes<192> <= 232448, "FP8 d_qk 192 plan exceeds 227 KB");

// ---------------------------------------------------------------------------------------------------
// PTX pieces of the transposition
// ---------------------------------------------------------------------------------------------------
// Loads four 8 x 8 b16 matrices transposed: lane l gives the address of row l % 8 of matrix l / 8; register k gets
// this lane's pair of matrix k transposed (b16 column lane / 4 of rows 2 (lane % 4) and 2 (lane % 4) + 1).
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2,
                                                  uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr)
               : "memory");
}
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
}

// V (128 keys x 128 bytes, 128B-swizzled, as TMA wrote it) -> V^T (128 d_v rows x 128 keys, 128B-swizzled K-major,
// the key order of tile::e4m3_pv_key within every 16 keys), by the four warps of the producer warpgroup: warp `du`
// writes V^T rows 32 du .. 32 du + 31. A unit is 16 keys x 32 d_v bytes:
//   ldmatrix.x4.trans: matrices (keys 0-7, d 0-15), (keys 8-15, d 0-15), (keys 0-7, d 16-31), (keys 8-15, d 16-31)
//     of the unit; lane (g = lane / 4, q = lane % 4) gets the words A = [V(2q, 2g), V(2q, 2g+1), V(2q+1, 2g),
//     V(2q+1, 2g+1)] (key, d byte) of the first and B (keys + 8) of the second, likewise C, D of the others;
//   prmt(A, B, 0x6420) = d 2g, keys {2q, 2q+1, 2q+8, 2q+9}; prmt(A, B, 0x7531) = d 2g+1, the same keys: exactly V^T
//     columns 4q..4q+3 of the 16-key chunk (e4m3_pv_key(4q + e) = 2q + (e & 1) + 8 (e >> 1));
//   stmatrix.x4 (not transposed): lane (g, q)'s word k lands at row g, bytes 4q..4q+3 of matrix k, whose rows are
//     V^T rows d = 2g, 2g + 1, 16 + 2g, 17 + 2g of the unit, 16 bytes at the unit's key chunk.
// Per warp and block: the 8 units of its d rows (key units 0..7), in two batches of four whose ldmatrix are issued
// back to back (one unit after another is latency-bound: the asm statements keep their order, and a unit's stmatrix
// follows its ldmatrix): 8 x (1 LDSM.x4.trans + 4 PRMT + 1 STSM.x4) per lane.
__device__ __forceinline__ void transpose_v(uint32_t src, uint32_t dst, int lane, int du) {
  const int mi = lane >> 3, r = lane & 7;
  // ldmatrix row of this lane: key 8 (mi & 1) + r of the unit, 16-byte chunk (mi >> 1) of the unit's 32 d bytes.
  // Unit (ku, du): key + 16 ku (row + 2048 ku bytes), chunk + 2 du (XOR 2 du into the swizzled slot: bits 5-6).
  const uint32_t src_lane = (src + static_cast<uint32_t>((8 * (mi & 1) + r) * 128 + ((((mi >> 1) ^ r) & 7) << 4))) ^
                            static_cast<uint32_t>(du << 5);
  // stmatrix row of this lane: V^T row d0 = 16 (mi >> 1) + 2 r + (mi & 1) of the unit (+ 32 du: + 4096 du bytes), key
  // chunk ku at slot ku ^ (d0 & 7) (XOR ku into bits 4-6).
  const int d0 = 16 * (mi >> 1) + 2 * r + (mi & 1);
  const uint32_t dst_lane = dst + static_cast<uint32_t>(du * 4096 + d0 * 128 + ((d0 & 7) << 4));
#pragma unroll
  for (int kb = 0; kb < 8; kb += 4) {
    uint32_t x[4][4];
#pragma unroll
    for (int u = 0; u < 4; ++u)
      ldmatrix_x4_trans(src_lane + static_cast<uint32_t>((kb + u) * 2048), x[u][0], x[u][1], x[u][2], x[u][3]);
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const uint32_t w0 = prmt(x[u][0], x[u][1], 0x6420), w1 = prmt(x[u][0], x[u][1], 0x7531);
      const uint32_t w2 = prmt(x[u][2], x[u][3], 0x6420), w3 = prmt(x[u][2], x[u][3], 0x7531);
      ptx::stmatrix_x4(dst_lane ^ static_cast<uint32_t>((kb + u) << 4), w0, w1, w2, w3);
    }
  }
}

// The producer warpgroup's four warps each transpose a quarter of every V block (transpose_v): `use` is the block's
// number in the CTA's V sequence (stage use % kStages). Waits for the staged V and for the V^T stage to be free, writes
// this warp's quarter, fences its generic writes for the consumers' wgmma and arrives on vt_full (count 4); a helper
// warp (not the loader) also tells the loader that it has read the staged V (v_read, count 3).
template <class Smem, class KvRing>
__device__ __forceinline__ void transpose_block(Smem& smem, uint32_t use, int lane, int du, bool helper) {
  const int s = KvRing::slot(use);
  pipeline::wait_or_trap(&smem.v_full[s], KvRing::parity(use));
  pipeline::wait_or_trap(&smem.vt_free[s], KvRing::free_parity(use));
  transpose_v(ptx::smem_addr(smem.v[s]), ptx::smem_addr(smem.vt[s]), lane, du);
  ptx::fence_proxy_async_shared();
  __syncwarp();
  if (lane == 0) {
    if (helper) ptx::mbarrier_arrive(&smem.v_read[s]);
    ptx::mbarrier_arrive(&smem.vt_full[s]);
  }
}

// Loads rows [first, first + 128) of a sequence of a packed e4m3 operand: `tiles` boxes of 128 columns (tile g:
// columns 128 g ..; columns past the operand's width arrive as zeros), all completing on `bar`.
template <int kTileBytes>
__device__ __forceinline__ void load_ragged_rows_e4m3(uint8_t (*dst)[kTileBytes], int tiles, const CUtensorMap* map,
                                                      uint64_t* bar, int head, int begin, int len, int first,
                                                      uint64_t policy) {
  const int window_row = static_cast<int>(varlen::kMaxRows) - len + first;
  const int window_end = begin + len;
  for (int g = 0; g < tiles; ++g)
    ptx::tma_load_5d(dst[g], map, bar, g * 128, head, window_row, window_end, static_cast<int>(varlen::kMaxRows),
                     policy);
}

// The exchange barrier of the FP8 kernel: the bf16 kernel's parties (eight consumer warps, the loader warp) and the
// three helper transposer warps, which read the tile records as the consumers do.
inline constexpr int kExchangeThreadsFp8 = kConsumerWarps * 32 + 4 * 32;

// ---------------------------------------------------------------------------------------------------
// Tile lookup (producer warp): the bf16 kernel's record plus the scales of the tile's (sequence, kv head)
// ---------------------------------------------------------------------------------------------------
__device__ __forceinline__ float descale_at(const float* base, int64_t stride_b, int64_t stride_h, int seq, int kvh) {
  return base == nullptr ? 1.f : base[seq * stride_b + kvh * stride_h];
}

__device__ __forceinline__ bool find_tile_fp8(const MhaPrefillFp8Params& p, int t, varlen::SeqWindow& w, int lane,
                                              TileRecord& rec, int& k_begin) {
  varlen::SeqTile st;
  if (!Walk::find(p.base.seqs, p.base.h_q, t, w, lane, st)) return false;
  const varlen::TileCoord c = varlen::tile_coord(st.local, Tiles::num_m_blocks(st.q.len), p.base.causal);
  TileInfo& info = rec.info;
  info.valid = 1;
  info.q_begin = st.q.begin;
  info.s_q = st.q.len;
  info.s_k = st.k.len;
  info.head = c.head;
  info.m_block = c.block;
  info.n_end = Tiles::key_block_end(st.q.len, st.k.len, c.block, p.base.causal);
  info.pad = 0;
  const int kvh = c.head / p.base.heads_per_kv;
  const float qd = descale_at(p.q_descale, p.q_descale_stride_b, p.q_descale_stride_h, st.seq, kvh);
  const float kd = descale_at(p.k_descale, p.k_descale_stride_b, p.k_descale_stride_h, st.seq, kvh);
  rec.score_scale_log2 = p.base.scale_log2 * qd * kd;
  rec.out_scale = descale_at(p.v_descale, p.v_descale_stride_b, p.v_descale_stride_h, st.seq, kvh);
  rec.pad[0] = rec.pad[1] = 0;
  k_begin = st.k.begin;
  return true;
}

// ---------------------------------------------------------------------------------------------------
// Producer (one warp): lane 0 issues the TMA; the whole warp transposes V
// ---------------------------------------------------------------------------------------------------
template <int kDQK>
__device__ __forceinline__ void produce(const MhaPrefillFp8Params& p, SharedStorage<kDQK>& smem,
                                        const CUtensorMap* q_map, const CUtensorMap* k_map, const CUtensorMap* v_map,
                                        int lane) {
  using T = Traits<kDQK>;
  using KvRing = Ring<T::kStages>;
  const uint64_t q_policy = ptx::make_l2_evict_first_policy();
  const uint64_t kv_policy = ptx::make_l2_evict_last_policy();
  varlen::SeqWindow win = Walk::start(p.base.seqs, p.base.h_q, lane);
  uint32_t k_iter = 0;   // K blocks loaded
  uint32_t vl_iter = 0;  // V blocks loaded into the staging ring
  uint32_t vt_iter = 0;  // V blocks transposed into the V^T ring (the same slot as their staging stage)
  int ticket = 0;
  auto publish = [&](int t, int slot, int& k_begin) {
    TileRecord rec;
    if (!find_tile_fp8(p, t, win, lane, rec, k_begin)) {
      rec = TileRecord{};
      rec.info.valid = 0;
    }
    if (lane == 0) smem.tile[slot] = rec;
    return rec.info;
  };
  // This warp's quarter (d rows 0-31) of the oldest loaded, not yet transposed V block.
  auto transpose_next = [&] {
    transpose_block<SharedStorage<kDQK>, KvRing>(smem, vt_iter, lane, 0, false);
    ++vt_iter;
  };
  int k_begin = 0, next_k_begin = 0;
  int tile = blockIdx.x;
  TileInfo info = publish(tile, 0, k_begin);
  __syncwarp();
  ptx::named_barrier_sync_unaligned(static_cast<int>(NamedBarrier::kExchange), kExchangeThreadsFp8);
  for (uint32_t tile_iter = 0; info.valid; ++tile_iter) {
    if (p.base.dynamic_tiles && lane == 0) ticket = ptx::atomic_add_relaxed_gpu(p.base.tile_counter, smem.zero, 1);
    if (lane == 0) {
      if (info.n_end == 0) {
        ptx::mbarrier_arrive(&smem.q_full);
      } else {
        ptx::mbarrier_arrive_expect_tx(&smem.q_full, T::kQBytes);
        load_ragged_rows_e4m3(smem.q, T::kQKTiles, q_map, &smem.q_full, info.head, info.q_begin, info.s_q,
                              info.m_block * T::kBlockM, q_policy);
      }
    }
    // Blocks are consumed last first. Step i loads K(n-1-i) and V(n-1-i) (into the staging ring) and first
    // transposes this warp's quarter of the V loaded two steps before, V(n+1-i) (the helpers take theirs as soon as
    // it lands): the consumers take K of block j with V^T of block j + 1, so V^T(j + 1) is written as soon as its
    // stage is free (the P V of block j + 3 done), about a consumer step before it is needed. The last two quarters
    // (V(1), V(0)) follow the last loads. A staging stage is refilled (step i) only after this warp transposed its
    // quarter of what it held (step i, first) and the helpers read theirs (v_read).
    const int kv_head = info.head / p.base.heads_per_kv;
    const int nb = info.n_end;
    for (int i = 0; i < nb + 2; ++i) {
      if (i >= 2) transpose_next();
      if (i < nb) {
        if (lane == 0) {
          const int ks = KvRing::slot(k_iter);
          pipeline::wait_or_trap(&smem.k_free[ks], KvRing::free_parity(k_iter));
          ptx::mbarrier_arrive_expect_tx(&smem.k_full[ks], T::kKBytes);
          load_ragged_rows_e4m3(smem.k[ks], T::kQKTiles, k_map, &smem.k_full[ks], kv_head, k_begin, info.s_k,
                                (nb - 1 - i) * T::kBlockN, kv_policy);
          // The staging stage's previous V: transposed by this warp (program order) and read by the helpers.
          const int vs = KvRing::slot(vl_iter);
          pipeline::wait_or_trap(&smem.v_read[vs], KvRing::free_parity(vl_iter));
          ptx::mbarrier_arrive_expect_tx(&smem.v_full[vs], T::kVBytes);
          load_ragged_rows_e4m3(&smem.v[vs], 1, v_map, &smem.v_full[vs], kv_head, k_begin, info.s_k,
                                (nb - 1 - i) * T::kBlockN, kv_policy);
        }
        ++k_iter;
        ++vl_iter;
        __syncwarp();
      }
    }
    __syncwarp();
    tile = p.base.dynamic_tiles ? __shfl_sync(0xffffffffu, ticket, 0) + p.base.grid : tile + p.base.grid;
    info = publish(tile, (tile_iter + 1) & 1, next_k_begin);
    k_begin = next_k_begin;
    __syncwarp();
    ptx::named_barrier_sync_unaligned(static_cast<int>(NamedBarrier::kExchange), kExchangeThreadsFp8);
  }
}

// The helper transposer warps (warps 9-11 of the producer warpgroup, quarter du = 1..3): per tile, read its record
// after the exchange as the consumers do and transpose their quarter of its n_end V blocks in the loader's order, then
// join the next exchange. Their last block of a tile (V(0)) needs only the staged V (loaded before the loader joins
// the exchange) and the V^T stage of V(2), which the consumers free before they reach it: no cycle.
template <int kDQK>
__device__ __forceinline__ void transpose_helper(SharedStorage<kDQK>& smem, int lane, int du) {
  using KvRing = Ring<Traits<kDQK>::kStages>;
  auto exchange = [&] {
    ptx::named_barrier_sync_unaligned(static_cast<int>(NamedBarrier::kExchange), kExchangeThreadsFp8);
  };
  uint32_t use = 0;
  exchange();
  for (uint32_t tile_iter = 0;; ++tile_iter) {
    const int n_end = smem.tile[tile_iter & 1].info.n_end;
    const int valid = smem.tile[tile_iter & 1].info.valid;
    if (!valid) break;
    for (int b = 0; b < n_end; ++b) transpose_block<SharedStorage<kDQK>, KvRing>(smem, use++, lane, du, true);
    exchange();
  }
}

// ---------------------------------------------------------------------------------------------------
// Consumers
// ---------------------------------------------------------------------------------------------------
using Desc = tile::DescUniform64;
using E8 = tile::ElementE4M3;

// S = Q K^T over kQKSlices k32 slices: slice j is 32 bytes at column byte 32 j, i.e. tile j / 4, offset 32 (j % 4).
template <class T>
__device__ __forceinline__ void issue_qk(float (&s)[64], const uint8_t* q_rows, const uint8_t* k_block) {
  const uint32_t q = Desc::base<tile::kLboKMajor>(q_rows), k = Desc::base<tile::kLboKMajor>(k_block);
#pragma unroll
  for (int j = 0; j < T::kQKSlices; ++j) {
    const uint32_t off = static_cast<uint32_t>((j / 4) * T::kTileBytes + (j % 4) * 32);
    E8::mma_ss<128>(s, Desc::at(q, off), Desc::at(k, off), j == 0 ? 0 : 1);
  }
}

// O += P V: P as e4m3 A fragments (4 k32 slices of keys, e4m3_pv_key order), V^T K-major (slice j at byte 32 j).
template <class T>
__device__ __forceinline__ void issue_pv(float (&o)[64], const uint32_t (&pa)[4][4], const uint8_t* vt) {
  const uint32_t v = Desc::base<tile::kLboKMajor>(vt);
#pragma unroll
  for (int j = 0; j < T::kPVSlices; ++j) E8::mma_rs<128>(o, pa[j], Desc::at(v, static_cast<uint32_t>(j * 32)), 1);
}

// The online-softmax step with P's offset: m_new = max(m, rowmax(S) c), s <- 2^(s c - m_new + 8), l <- l a + rowsum.
// Every exponential, the rescale factor a included, is the MUFU's (ex2.approx.ftz, tile::exponentiate).
__device__ __forceinline__ void softmax_step(float (&s)[64], float scale_log2, float (&m)[2], float (&l)[2],
                                             float (&a)[2], float offset) {
  float mx[2];
  tile::row_max_tree(s, mx);
  float mo[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float m_new = softmax::new_max(m[i], mx[i], scale_log2);
    a[i] = softmax::rescale_factor(m[i], m_new);
    m[i] = m_new;
    mo[i] = m_new - offset;
  }
  float sum[2];
  tile::exponentiate(s, scale_log2, mo, sum);
  softmax::update_row_sums(l, a, sum);
}

template <int kDQK, int kWg>
__device__ __forceinline__ void consume(const MhaPrefillFp8Params& p, SharedStorage<kDQK>& smem, int tid) {
  using T = Traits<kDQK>;
  using KvRing = Ring<T::kStages>;
  const int lane = tid % 32;
  const Fragment frag = make_fragment(tid % T::kWarpgroupThreads);
  const uint8_t* q_rows = smem.q[0] + kWg * T::kRowsPerWarpgroup * T::kRowBytes;
  uint32_t k_iter = 0, v_iter = 0;
  auto release = [&](uint64_t* bar) {
    __syncwarp();
    if (lane == 0) ptx::mbarrier_arrive(bar);
  };
  auto exchange = [&] { ptx::named_barrier_sync_unaligned(static_cast<int>(NamedBarrier::kExchange), kExchangeThreadsFp8); };
  auto write_out = [&](const TileInfo& info, const float (&o)[64], const int (&row)[2], const float (&lse)[2]) {
    if (p.out_fp16)
      store_rows<true>(p.base, info, o, row, lse, lane);
    else
      store_rows<false>(p.base, info, o, row, lse, lane);
  };
  exchange();
  for (uint32_t tile_iter = 0;; ++tile_iter) {
    const TileRecord rec = smem.tile[tile_iter & 1];
    const TileInfo& info = rec.info;
    if (!info.valid) break;
    ptx::mbarrier_wait_parity(&smem.q_full, Ring<1>::parity(tile_iter));
    int row[2];
    row[0] = info.m_block * T::kBlockM + kWg * T::kRowsPerWarpgroup + frag.row[0];
    row[1] = row[0] + 8;
    float o[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) o[i] = 0.f;

    if (info.n_end == 0) {
      exchange();
      const float inf[2] = {INFINITY, INFINITY};
      write_out(info, o, row, inf);
      continue;
    }
    int limit[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) limit[i] = varlen::row_key_limit(info.s_q, info.s_k, row[i], p.base.causal);
    const float scale_log2 = rec.score_scale_log2;
    float m[2] = {T::kMaxInit, T::kMaxInit};
    float l[2] = {0.f, 0.f};
    float a[2];
    float s[64];
    uint32_t pa[4][4];

    int n = info.n_end - 1;
    {
      const int ks = KvRing::slot(k_iter);
      ptx::mbarrier_wait_parity(&smem.k_full[ks], KvRing::parity(k_iter));
      ptx::wgmma_fence();
      issue_qk<T>(s, q_rows, smem.k[ks][0]);
      ptx::wgmma_commit();
      ptx::wgmma_wait<0>();
      ptx::fence_registers(s);
      release(&smem.k_free[ks]);
      ++k_iter;
      if (n == 0) exchange();
      if (Tiles::block_needs_mask(info.s_q, info.s_k, info.m_block, n, p.base.causal))
        mask::by_key_limit(s, limit, n * T::kBlockN, frag.col);
      softmax_step(s, scale_log2, m, l, a, T::kPOffset);
      a[0] = a[1] = 1.f;
      tile::to_a_fragments_e4m3(s, pa);
    }

    for (--n; n >= 0; --n) {
      const int ks = KvRing::slot(k_iter), vs = KvRing::slot(v_iter);
      ptx::mbarrier_wait_parity(&smem.k_full[ks], KvRing::parity(k_iter));
      ptx::mbarrier_wait_parity(&smem.vt_full[vs], KvRing::parity(v_iter));
      ptx::wgmma_fence();
      issue_qk<T>(s, q_rows, smem.k[ks][0]);
      ptx::wgmma_commit();
      tile::scale_rows_if_changed(o, a[0], a[1]);
      ptx::wgmma_fence();
      issue_pv<T>(o, pa, smem.vt[vs]);
      ptx::wgmma_commit();
      ptx::wgmma_wait<1>();
      ptx::fence_registers(s);
      release(&smem.k_free[ks]);
      ++k_iter;
      if (n == 0) exchange();
      if (Tiles::block_needs_mask(info.s_q, info.s_k, info.m_block, n, p.base.causal))
        mask::by_key_limit(s, limit, n * T::kBlockN, frag.col);
      softmax_step(s, scale_log2, m, l, a, T::kPOffset);
      ptx::wgmma_wait<0>();
      ptx::fence_registers(o);
      release(&smem.vt_free[vs]);
      ++v_iter;
      tile::to_a_fragments_e4m3(s, pa);
    }

    {
      const int vs = KvRing::slot(v_iter);
      ptx::mbarrier_wait_parity(&smem.vt_full[vs], KvRing::parity(v_iter));
      tile::scale_rows_if_changed(o, a[0], a[1]);
      ptx::wgmma_fence();
      issue_pv<T>(o, pa, smem.vt[vs]);
      ptx::wgmma_commit();
      ptx::wgmma_wait<0>();
      ptx::fence_registers(o);
      release(&smem.vt_free[vs]);
      ++v_iter;
    }

    // Epilogue: out = O v_descale / l', lse = (m - 8 + log2 l') ln 2 (l' and O both carry P's 2^8).
    float lse[2];
    float inv[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const float total = quad_sum(l[i]);
      const bool none = epilogue::is_keyless_row(total);
      inv[i] = none ? 0.f : rec.out_scale / total;
      lse[i] = none ? INFINITY : epilogue::lse_log2(m[i] - T::kPOffset, total) * epilogue::kLn2;
    }
    tile::scale_rows_if_changed(o, inv[0], inv[1]);
    write_out(info, o, row, lse);
  }
}

template <int kDQK>
__global__ void __launch_bounds__(Traits<kDQK>::kThreads, 1)
    mha_prefill_e4m3_kernel(const __grid_constant__ MhaPrefillFp8Params p, const __grid_constant__ CUtensorMap q_map,
                            const __grid_constant__ CUtensorMap k_map, const __grid_constant__ CUtensorMap v_map) {
  using T = Traits<kDQK>;
  using Smem = SharedStorage<kDQK>;
  Smem& smem = cta::shared_storage<Smem>();
  const int tid = threadIdx.x;
  const int wg = cta::warpgroup(tid);
  if (tid == 0) {
    ptx::prefetch_tensormap(&q_map);
    ptx::prefetch_tensormap(&k_map);
    ptx::prefetch_tensormap(&v_map);
    smem.zero = 0;
    ptx::mbarrier_init(&smem.q_full, 1);
    for (int s = 0; s < T::kStages; ++s) {
      ptx::mbarrier_init(&smem.k_full[s], 1);
      ptx::mbarrier_init(&smem.k_free[s], kConsumerWarps);
      ptx::mbarrier_init(&smem.v_full[s], 1);
      ptx::mbarrier_init(&smem.v_read[s], 3);
      ptx::mbarrier_init(&smem.vt_full[s], 4);
      ptx::mbarrier_init(&smem.vt_free[s], kConsumerWarps);
    }
    ptx::fence_mbarrier_init();
  }
  __syncthreads();
  if (wg == 2) {
    ptx::setmaxnreg_dec<T::kRegsProducer>();
    const int warp = tid / 32 - 2 * T::kWarpgroupThreads / 32;  // 0: the loader; 1-3: helper transposers
    if (warp == 0)
      produce<kDQK>(p, smem, &q_map, &k_map, &v_map, tid % 32);
    else
      transpose_helper<kDQK>(smem, tid % 32, warp);
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

}  // namespace openmla::kernels::mha_prefill::fp8
