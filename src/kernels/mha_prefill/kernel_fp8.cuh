// Dense MHA prefill forward, FP8 (e4m3) inputs (sm_90a): the bf16 kernel's tiles, walk, roles and pipeline
// (kernel.cuh, docs/mha-prefill.md) with both GEMMs as e4m3 wgmma (m64nNk32) and V transposed in shared memory.
//
// What differs from kernel.cuh (design note: docs/fp8-prefill-design.md):
//   - Operands are 1-byte: Q and K arrive as 128-column (128-byte) TMA boxes, 128B-swizzled (d_qk 192: a second box
//     of which only the first 64 columns are inside the tensor; the TMA unit fills the rest with zeros and the
//     Q K^T issue loop skips them), so every shared tile keeps the library's SW128 K-major layout.
//   - Key blocks of kBlockN = 128 or 192 keys (a kernel each; decision fp8-d5): 192 spreads the consumer step's
//     per-block fixed part (stage tests, row-max shuffles, O's rescale) over 1.5x the keys. Q K^T is m64n192k32 then,
//     P V six k32 slices instead of four.
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
template <int kDQK, int kBN>
struct Traits {
  static_assert(kDQK == 192 || kDQK == 128, "dense MHA prefill serves d_qk 192 and 128");
  static_assert(kBN == 128 || kBN == 192, "the FP8 forward's key blocks are 128 or 192 keys (decision fp8-d5)");
  static constexpr int kHeadDimQK = kDQK;
  static constexpr int kHeadDimV = 128;
  static constexpr int kBlockM = mha_prefill::kBlockM;
  static constexpr int kBlockN = kBN;
  // The tile arithmetic with this key block (key_block_end, block_needs_mask); the walk counts query blocks only.
  using Tiles = varlen::Tiling<kBlockM, kBlockN>;
  static constexpr int kRowsPerWarpgroup = 64;
  // A shared tile: rows x 128 bytes (128 e4m3 columns), 128B-swizzled: one TMA box (Q: 128 rows; K, staged V:
  // kBlockN rows).
  static constexpr int kTileCols = 128;
  static constexpr int kRowBytes = 128;
  static constexpr int kTileBytes = kBlockM * kRowBytes;                       // 16 KB: Q, a V^T head tile
  static constexpr int kKTileBytes = kBlockN * kRowBytes;                      // 16 / 24 KB: K, staged V
  static constexpr int kQKTiles = (kHeadDimQK + kTileCols - 1) / kTileCols;   // 2 (d_qk 192: the second half used)
  static constexpr int kQKSlices = kHeadDimQK / 32;                           // k32 wgmma slices of Q K^T: 6 or 4
  static constexpr int kPVSlices = kBlockN / 32;                              // of P V: 4 or 6
  static constexpr int kStages = 2;
  // V^T of a block: 128 d_v rows x kBlockN keys, K-major. Keys 0-127 fill the stage's head tile (16 KB, 128-byte
  // rows); with kBlockN 192 keys 128-191 go to a tail tile shared by both stages, stage s in its column bytes
  // 64 s .. 64 s + 63 (wgmma reads a k32 slice at any 32-byte offset of a SW128 row, as Q K^T's slices 1-3 do): one
  // 16 KB tile instead of two half-used ones, which is what lets d_qk 192 fit in 227 KB.
  static constexpr int kVtTailKeys = kBlockN - 128;  // 0 or 64
  static_assert(kStages * kVtTailKeys <= kRowBytes, "the stages' tail columns share one 128-byte row");
  static constexpr int kVtTailBytes = kVtTailKeys > 0 ? kTileBytes : 0;
  static constexpr int kKeyUnits = kBlockN / 16;  // transposition units (16 keys) per d_v quarter: 8 or 12
  static constexpr int kWarpgroupThreads = 128;
  static constexpr int kThreads = 3 * kWarpgroupThreads;
  // setmaxnreg split: the consumers hold O (64), S (kBlockN / 2: 64 or 96), P as e4m3 A fragments (kBlockN / 8: 16
  // or 24) and the state; the producer warps also transpose V (four units of 4 words in flight, addresses; the
  // loader's tile walk besides: 56 spilled).
  static constexpr int kLaunchRegs = 168;
  static constexpr int kRegsConsumer = 216;
  static constexpr int kRegsProducer = 72;
  static_assert(2 * kRegsConsumer + kRegsProducer <= 3 * kLaunchRegs, "setmaxnreg only redistributes registers");
  static constexpr uint32_t kQBytes = kQKTiles * kTileBytes;  // TMA bytes of Q (a box's bytes count in full)
  static constexpr uint32_t kKBytes = kQKTiles * kKTileBytes;
  static constexpr uint32_t kVBytes = kKTileBytes;
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

// V^T's shared tail tile (kBlockN 192), placed after the records and barriers: the 128-key kernel's member is empty
// and last, so its offsets and size are the ones it had before the 192-key kernel existed.
template <int kBytes>
struct VtTail {
  alignas(1024) uint8_t bytes[kBytes];  // V^T keys 128-191 of both stages: 128 d_v rows x (2 x 64) keys
};
template <>
struct VtTail<0> {};

template <int kDQK, int kBN>
struct alignas(1024) SharedStorage {
  using T = Traits<kDQK, kBN>;
  alignas(1024) uint8_t q[T::kQKTiles][T::kTileBytes];               // Q: 128 rows x d_qk bytes
  alignas(1024) uint8_t k[T::kStages][T::kQKTiles][T::kKTileBytes];  // K blocks: kBlockN keys x d_qk bytes
  alignas(1024) uint8_t v[T::kStages][T::kKTileBytes];               // V blocks as loaded: kBlockN keys x 128 bytes
  alignas(1024) uint8_t vt[T::kStages][T::kTileBytes];  // V^T: 128 d_v rows x keys 0-127 (e4m3_pv_key order)
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
  VtTail<T::kVtTailBytes> vt_tail;  // kBlockN 192: V^T keys 128-191, stage s at column bytes 64 s
};
static_assert(sizeof(SharedStorage<192, 128>) % 1024 == 0 && sizeof(SharedStorage<128, 128>) % 1024 == 0);
static_assert(sizeof(SharedStorage<192, 192>) % 1024 == 0 && sizeof(SharedStorage<128, 192>) % 1024 == 0);

template <int kDQK, int kBN>
inline constexpr int kSmemBytes = static_cast<int>(sizeof(SharedStorage<kDQK, kBN>)) + 1024;
static_assert(kSmemBytes<192, 128> <= 232448, "FP8 d_qk 192 plan exceeds 227 KB");
static_assert(kSmemBytes<192, 192> <= 232448, "FP8 d_qk 192, kBlockN 192 plan exceeds 227 KB");

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

// V (kBlockN keys x 128 bytes, 128B-swizzled, as TMA wrote it) -> V^T (128 d_v rows x kBlockN keys, 128B-swizzled
// K-major, the key order of tile::e4m3_pv_key within every 16 keys), by the four warps of the producer warpgroup:
// warp `du` writes V^T rows 32 du .. 32 du + 31. A unit is 16 keys x 32 d_v bytes:
//   ldmatrix.x4.trans: matrices (keys 0-7, d 0-15), (keys 8-15, d 0-15), (keys 0-7, d 16-31), (keys 8-15, d 16-31)
//     of the unit; lane (g = lane / 4, q = lane % 4) gets the words A = [V(2q, 2g), V(2q, 2g+1), V(2q+1, 2g),
//     V(2q+1, 2g+1)] (key, d byte) of the first and B (keys + 8) of the second, likewise C, D of the others;
//   prmt(A, B, 0x6420) = d 2g, keys {2q, 2q+1, 2q+8, 2q+9}; prmt(A, B, 0x7531) = d 2g+1, the same keys: exactly V^T
//     columns 4q..4q+3 of the 16-key chunk (e4m3_pv_key(4q + e) = 2q + (e & 1) + 8 (e >> 1));
//   stmatrix.x4 (not transposed): lane (g, q)'s word k lands at row g, bytes 4q..4q+3 of matrix k, whose rows are
//     V^T rows d = 2g, 2g + 1, 16 + 2g, 17 + 2g of the unit, 16 bytes at the unit's key chunk.
// Per warp and block: the kKeyUnits units of its d rows (key units 0..7 into the head tile `dst`, 8..11 (kBlockN 192)
// into the tail tile `dst_tail` at chunks tail_chunk + 0..3), in batches of four whose ldmatrix are issued back to
// back (one unit after another is latency-bound: the asm statements keep their order, and a unit's stmatrix follows
// its ldmatrix): kKeyUnits x (1 LDSM.x4.trans + 4 PRMT + 1 STSM.x4) per lane.
template <int kKeyUnits>
__device__ __forceinline__ void transpose_v(uint32_t src, uint32_t dst, uint32_t dst_tail, int tail_chunk, int lane,
                                            int du) {
  static_assert(kKeyUnits == 8 || kKeyUnits == 12, "128 or 192 keys: two or three batches of four units");
  const int mi = lane >> 3, r = lane & 7;
  // ldmatrix row of this lane: key 8 (mi & 1) + r of the unit, 16-byte chunk (mi >> 1) of the unit's 32 d bytes.
  // Unit (ku, du): key + 16 ku (row + 2048 ku bytes), chunk + 2 du (XOR 2 du into the swizzled slot: bits 5-6).
  const uint32_t src_lane = (src + static_cast<uint32_t>((8 * (mi & 1) + r) * 128 + ((((mi >> 1) ^ r) & 7) << 4))) ^
                            static_cast<uint32_t>(du << 5);
  // stmatrix row of this lane: V^T row d0 = 16 (mi >> 1) + 2 r + (mi & 1) of the unit (+ 32 du: + 4096 du bytes), key
  // chunk ku at slot ku ^ (d0 & 7) (XOR ku into bits 4-6).
  const int d0 = 16 * (mi >> 1) + 2 * r + (mi & 1);
  const uint32_t row_off = static_cast<uint32_t>(du * 4096 + d0 * 128 + ((d0 & 7) << 4));
  const uint32_t dst_lane = dst + row_off;
#pragma unroll
  for (int kb = 0; kb < kKeyUnits; kb += 4) {
    uint32_t x[4][4];
#pragma unroll
    for (int u = 0; u < 4; ++u)
      ldmatrix_x4_trans(src_lane + static_cast<uint32_t>((kb + u) * 2048), x[u][0], x[u][1], x[u][2], x[u][3]);
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const uint32_t w0 = prmt(x[u][0], x[u][1], 0x6420), w1 = prmt(x[u][0], x[u][1], 0x7531);
      const uint32_t w2 = prmt(x[u][2], x[u][3], 0x6420), w3 = prmt(x[u][2], x[u][3], 0x7531);
      // Keys 128-191 (kb 8): the tail tile, this stage's chunks tail_chunk .. tail_chunk + 3 (tail_chunk 0 or 4).
      const uint32_t addr = kb < 8 ? dst_lane ^ static_cast<uint32_t>((kb + u) << 4)
                                   : (dst_tail + row_off) ^ static_cast<uint32_t>((tail_chunk + u) << 4);
      ptx::stmatrix_x4(addr, w0, w1, w2, w3);
    }
  }
}

// The V^T tail tile's base address and this stage's first chunk there (kBlockN 192; 0, 0 otherwise).
template <class Smem>
__device__ __forceinline__ uint32_t vt_tail_addr(Smem& smem) {
  if constexpr (Smem::T::kVtTailBytes > 0)
    return ptx::smem_addr(smem.vt_tail.bytes);
  else
    return 0;
}
template <class T>
__device__ __forceinline__ int vt_tail_chunk(int stage) {
  return stage * (T::kVtTailKeys / 16);
}

// The producer warpgroup's four warps each transpose a quarter of every V block (transpose_v): `use` is the block's
// number in the CTA's V sequence (stage use % kStages). Waits for the staged V and for the V^T stage to be free, writes
// this warp's quarter, fences its generic writes for the consumers' wgmma and arrives on vt_full (count 4); a helper
// warp (not the loader) also tells the loader that it has read the staged V (v_read, count 3).
template <class Smem, class KvRing>
__device__ __forceinline__ void transpose_block(Smem& smem, uint32_t use, int lane, int du, bool helper) {
  using T = typename Smem::T;
  const int s = KvRing::slot(use);
  pipeline::wait_or_trap(&smem.v_full[s], KvRing::parity(use));
  pipeline::wait_or_trap(&smem.vt_free[s], KvRing::free_parity(use));
  transpose_v<T::kKeyUnits>(ptx::smem_addr(smem.v[s]), ptx::smem_addr(smem.vt[s]), vt_tail_addr(smem),
                            vt_tail_chunk<T>(s), lane, du);
  ptx::fence_proxy_async_shared();
  __syncwarp();
  if (lane == 0) {
    if (helper) ptx::mbarrier_arrive(&smem.v_read[s]);
    ptx::mbarrier_arrive(&smem.vt_full[s]);
  }
}

// Loads rows [first, first + box rows) of a sequence of a packed e4m3 operand (the map's box: 128 rows for Q, kBlockN
// for K and V; rows past the sequence arrive as zeros): `tiles` boxes of 128 columns (tile g: columns 128 g ..;
// columns past the operand's width arrive as zeros), all completing on `bar`.
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

// `KeyTiles`: the kernel's Tiling (its kBlockN sets n_end); the walk and the query blocks are kBlockM's either way.
template <class KeyTiles>
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
  info.n_end = KeyTiles::key_block_end(st.q.len, st.k.len, c.block, p.base.causal);
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
template <int kDQK, int kBN>
__device__ __forceinline__ void produce(const MhaPrefillFp8Params& p, SharedStorage<kDQK, kBN>& smem,
                                        const CUtensorMap* q_map, const CUtensorMap* k_map, const CUtensorMap* v_map,
                                        int lane) {
  using T = Traits<kDQK, kBN>;
  using KvRing = Ring<T::kStages>;
  // Q's L2 policy is made where Q is loaded (once a tile), not kept: two registers fewer across the tile, which the
  // 192-key kernel's loader needs to keep the tile ticket in a register (a spill would wait for the atomic at once).
  const uint64_t kv_policy = ptx::make_l2_evict_last_policy();
  varlen::SeqWindow win = Walk::start(p.base.seqs, p.base.h_q, lane);
  uint32_t k_iter = 0;   // K blocks loaded, and V blocks loaded into the staging ring (the same count, the same slot)
  uint32_t vt_iter = 0;  // V blocks transposed into the V^T ring (the same slot as their staging stage)
  int ticket = 0;
  auto publish = [&](int t, int slot, int& k_begin) {
    TileRecord rec;
    if (!find_tile_fp8<typename T::Tiles>(p, t, win, lane, rec, k_begin)) {
      rec = TileRecord{};
      rec.info.valid = 0;
    }
    if (lane == 0) smem.tile[slot] = rec;
    return rec.info;
  };
  // This warp's quarter (d rows 0-31) of the oldest loaded, not yet transposed V block.
  auto transpose_next = [&] {
    transpose_block<SharedStorage<kDQK, kBN>, KvRing>(smem, vt_iter, lane, 0, false);
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
                              info.m_block * T::kBlockM, ptx::make_l2_evict_first_policy());
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
          pipeline::wait_or_trap(&smem.v_read[ks], KvRing::free_parity(k_iter));
          ptx::mbarrier_arrive_expect_tx(&smem.v_full[ks], T::kVBytes);
          load_ragged_rows_e4m3(&smem.v[ks], 1, v_map, &smem.v_full[ks], kv_head, k_begin, info.s_k,
                                (nb - 1 - i) * T::kBlockN, kv_policy);
        }
        ++k_iter;
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
template <int kDQK, int kBN>
__device__ __forceinline__ void transpose_helper(SharedStorage<kDQK, kBN>& smem, int lane, int du) {
  using KvRing = Ring<Traits<kDQK, kBN>::kStages>;
  auto exchange = [&] {
    ptx::named_barrier_sync_unaligned(static_cast<int>(NamedBarrier::kExchange), kExchangeThreadsFp8);
  };
  uint32_t use = 0;
  exchange();
  for (uint32_t tile_iter = 0;; ++tile_iter) {
    const int n_end = smem.tile[tile_iter & 1].info.n_end;
    const int valid = smem.tile[tile_iter & 1].info.valid;
    if (!valid) break;
    for (int b = 0; b < n_end; ++b) transpose_block<SharedStorage<kDQK, kBN>, KvRing>(smem, use++, lane, du, true);
    exchange();
  }
}

// ---------------------------------------------------------------------------------------------------
// Consumers
// ---------------------------------------------------------------------------------------------------
using Desc = tile::DescUniform64;
using E8 = tile::ElementE4M3;

// S = Q K^T (m64nNk32, N = kBlockN) over kQKSlices k32 slices: slice j is 32 bytes at column byte 32 j, i.e. tile
// j / 4, offset 32 (j % 4); Q's tiles are 16 KB apart, K's kKTileBytes (kBlockN rows).
template <class T>
__device__ __forceinline__ void issue_qk(float (&s)[T::kBlockN / 2], const uint8_t* q_rows, const uint8_t* k_block) {
  const uint32_t q = Desc::base<tile::kLboKMajor>(q_rows), k = Desc::base<tile::kLboKMajor>(k_block);
#pragma unroll
  for (int j = 0; j < T::kQKSlices; ++j) {
    const uint32_t q_off = static_cast<uint32_t>((j / 4) * T::kTileBytes + (j % 4) * 32);
    const uint32_t k_off = static_cast<uint32_t>((j / 4) * T::kKTileBytes + (j % 4) * 32);
    E8::mma_ss<T::kBlockN>(s, Desc::at(q, q_off), Desc::at(k, k_off), j == 0 ? 0 : 1);
  }
}

// O += P V: P as e4m3 A fragments (kPVSlices k32 slices of keys, e4m3_pv_key order), V^T K-major: slices 0-3 (keys
// 0-127) at byte 32 j of the stage's head tile, slices 4-5 (kBlockN 192: keys 128-191) at byte 64 stage + 32 (j - 4)
// of the shared tail tile.
template <class T>
__device__ __forceinline__ void issue_pv(float (&o)[64], const uint32_t (&pa)[T::kPVSlices][4], const uint8_t* vt,
                                         const uint8_t* vt_tail) {
  const uint32_t v = Desc::base<tile::kLboKMajor>(vt);
#pragma unroll
  for (int j = 0; j < 4; ++j) E8::mma_rs<128>(o, pa[j], Desc::at(v, static_cast<uint32_t>(j * 32)), 1);
  if constexpr (T::kPVSlices > 4) {
    const uint32_t t = Desc::base<tile::kLboKMajor>(vt_tail);
#pragma unroll
    for (int j = 4; j < T::kPVSlices; ++j)
      E8::mma_rs<128>(o, pa[j], Desc::at(t, static_cast<uint32_t>((j - 4) * 32)), 1);
  }
}

// The V^T tail of stage `vs` (its first column byte in the tail tile), or null (kBlockN 128).
template <class Smem>
__device__ __forceinline__ const uint8_t* vt_tail_of(const Smem& smem, int vs) {
  if constexpr (Smem::T::kVtTailBytes > 0)
    return smem.vt_tail.bytes + vs * Smem::T::kVtTailKeys;
  else
    return nullptr;
}

// The online-softmax step with P's offset: m_new = max(m, rowmax(S) c), s <- 2^(s c - m_new + 8), l <- l a + rowsum.
// Every exponential, the rescale factor a included, is the MUFU's (ex2.approx.ftz, tile::exponentiate).
template <int kElems>
__device__ __forceinline__ void softmax_step(float (&s)[kElems], float scale_log2, float (&m)[2], float (&l)[2],
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

template <int kDQK, int kBN, int kWg>
__device__ __forceinline__ void consume(const MhaPrefillFp8Params& p, SharedStorage<kDQK, kBN>& smem, int tid) {
  using T = Traits<kDQK, kBN>;
  using KvRing = Ring<T::kStages>;
  const int lane = tid % 32;
  const Fragment frag = make_fragment(tid % T::kWarpgroupThreads);
  const uint8_t* q_rows = smem.q[0] + kWg * T::kRowsPerWarpgroup * T::kRowBytes;
  uint32_t k_iter = 0, v_iter = 0;  // K and V^T blocks taken so far
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
  // This thread's two query rows of the tile of query block m_block.
  auto rows_of = [&](int m_block, int (&row)[2]) {
    row[0] = m_block * T::kBlockM + kWg * T::kRowsPerWarpgroup + frag.row[0];
    row[1] = row[0] + 8;
  };
  exchange();
  for (uint32_t tile_iter = 0;; ++tile_iter) {
    // NOTE: only what the key loop needs is kept in registers across it (the last block, the row limits, the mask
    // threshold, the score scale); the epilogue reads the record again from its slot, which the producer does not
    // rewrite before the next tile's exchange (it publishes the next tile into the other slot). The 192-key kernel's
    // consumers (S 96 + O 64 + P 24 registers) spill the record's other fields otherwise.
    int n, limit[2], mask_limit;
    float scale_log2;
    {
      const TileRecord rec = smem.tile[tile_iter & 1];
      const TileInfo& info = rec.info;
      if (!info.valid) break;
      ptx::mbarrier_wait_parity(&smem.q_full, Ring<1>::parity(tile_iter));
      if (info.n_end == 0) {
        exchange();
        float o[64];
#pragma unroll
        for (int i = 0; i < 64; ++i) o[i] = 0.f;
        int row[2];
        rows_of(info.m_block, row);
        const float inf[2] = {INFINITY, INFINITY};
        write_out(info, o, row, inf);
        continue;
      }
      int row[2];
      rows_of(info.m_block, row);
#pragma unroll
      for (int i = 0; i < 2; ++i) limit[i] = varlen::row_key_limit(info.s_q, info.s_k, row[i], p.base.causal);
      // Tiling::block_needs_mask: block n needs the mask when its last key lies past the tile's first row's limit.
      mask_limit = varlen::row_key_limit(info.s_q, info.s_k, info.m_block * T::kBlockM, p.base.causal);
      scale_log2 = rec.score_scale_log2;
      n = info.n_end - 1;
    }
    auto needs_mask = [&](int nb) { return nb * T::kBlockN + T::kBlockN - 1 > mask_limit; };
    float o[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) o[i] = 0.f;
    float m[2] = {T::kMaxInit, T::kMaxInit};
    float l[2] = {0.f, 0.f};
    float a[2];
    float s[T::kBlockN / 2];
    uint32_t pa[T::kPVSlices][4];

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
      if (needs_mask(n))
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
      issue_pv<T>(o, pa, smem.vt[vs], vt_tail_of(smem, vs));
      ptx::wgmma_commit();
      ptx::wgmma_wait<1>();
      ptx::fence_registers(s);
      release(&smem.k_free[ks]);
      ++k_iter;
      if (n == 0) exchange();
      if (needs_mask(n))
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
      issue_pv<T>(o, pa, smem.vt[vs], vt_tail_of(smem, vs));
      ptx::wgmma_commit();
      ptx::wgmma_wait<0>();
      ptx::fence_registers(o);
      release(&smem.vt_free[vs]);
      ++v_iter;
    }

    // Epilogue: out = O v_descale / l', lse = (m - 8 + log2 l') ln 2 (l' and O both carry P's 2^8).
    const TileRecord rec = smem.tile[tile_iter & 1];
    int row[2];
    rows_of(rec.info.m_block, row);
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
    write_out(rec.info, o, row, lse);
  }
}

template <int kDQK, int kBN>
__global__ void __launch_bounds__(Traits<kDQK, kBN>::kThreads, 1)
    mha_prefill_e4m3_kernel(const __grid_constant__ MhaPrefillFp8Params p, const __grid_constant__ CUtensorMap q_map,
                            const __grid_constant__ CUtensorMap k_map, const __grid_constant__ CUtensorMap v_map) {
  using T = Traits<kDQK, kBN>;
  using Smem = SharedStorage<kDQK, kBN>;
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
      produce<kDQK, kBN>(p, smem, &q_map, &k_map, &v_map, tid % 32);
    else
      transpose_helper<kDQK, kBN>(smem, tid % 32, warp);
    return;
  } else if (wg == 0) {
    ptx::setmaxnreg_inc<T::kRegsConsumer>();
    consume<kDQK, kBN, 0>(p, smem, tid);
    return;
  } else {
    ptx::setmaxnreg_inc<T::kRegsConsumer>();
    consume<kDQK, kBN, 1>(p, smem, tid);
    return;
  }
}

}  // namespace openmla::kernels::mha_prefill::fp8
