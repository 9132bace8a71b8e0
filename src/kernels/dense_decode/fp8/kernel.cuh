// Dense MLA decode over an FP8 e4m3 paged cache with per-tensor scales (sm_90a): d_qk 576 (512 NoPE + 64 RoPE, all
// e4m3), d_v 512 (V = the first 512 dims of the latent), one KV head, any page size, q bf16 or e4m3, bf16 output.
//
// One CTA = 64 packed query rows (row = s_idx * h_q + head) of a request, walking the (request, 64-token block)
// range of its schedule partition (the dense schedule, docs/decode-schedule.md). Three warpgroups:
//   WG2 (producer): loads the block's tokens from the paged cache (16-byte loads, 4 threads per token, 64 tokens in
//       two rounds, the next unit in flight while this one is converted), converts e4m3 -> bf16 WITHOUT the scale
//       (exact) into a double-buffered shared K block (64 x 576, 128B-swizzled tiles) and issues later Q tiles.
//   WG0: S = Q K^T, causal / length mask, online softmax (base 2, descale_q * descale_k folded into the exponent
//       scale), P -> shared memory, O[:, 0:256] += P V_L.
//   WG1: O[:, 256:512] = a O + P V_R, with P and the rescale factor a from WG0.
// The output is scaled by descale_k / row sum. The warp roles, barriers and K buffer layout are the sparse FP8
// decode's plain kernel (docs/sparse-decode.md); what differs is where a block's tokens come from (the block table:
// contiguous rows of a page, not an index list), the per-row causal border instead of a slot mask, and the per-tensor
// scale folded out of the dequantisation. Design note: docs/dense-decode.md, "FP8 cache".
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "common/barrier_ring.cuh"
#include "common/cta.cuh"
#include "common/epilogue.cuh"
#include "common/mma_tile.cuh"
#include "common/online_softmax.cuh"
#include "common/ptx.cuh"
#include "kernels/decode_scheduler/partition_walk.h"
#include "kernels/dense_decode/fp8/params.h"

namespace openmla::kernels::dense_decode_fp8 {

struct Cfg {
  static constexpr int kHeadDimQK = 576;
  static constexpr int kHeadDimV = 512;
  static constexpr int kBlockM = 64;    // packed query rows per CTA (one wgmma M)
  static constexpr int kBlockN = 64;    // tokens per block (the scheduler's unit)
  static constexpr int kTileCols = 64;  // 64 x bf16 = one 128-byte swizzled row
  static constexpr int kTileBytes = kBlockN * kTileCols * 2;  // 8192
  static constexpr int kRowBytes = kTileCols * 2;             // 128
  static constexpr int kSwizzleAtomBytes = 1024;
  static constexpr int kNumTiles = kHeadDimQK / kTileCols;    // 9: 8 NoPE (= V) + the RoPE tile
  static constexpr int kRopeTile = 8;

  static constexpr int kWarpgroupThreads = 128;
  static constexpr int kThreads = 3 * kWarpgroupThreads;  // WG0, WG1 consumers; WG2 producer
  // setmaxnreg split (the sparse decode kernel's, whose roles these are): the CTA owns 384 x kLaunchRegs registers.
  static constexpr int kLaunchRegs = 168;
  static constexpr int kRegsWg0 = 200;
  static constexpr int kRegsWg1 = 168;
  static constexpr int kRegsProducer = 136;
  static_assert(kRegsWg0 + kRegsWg1 + kRegsProducer <= 3 * kLaunchRegs, "setmaxnreg only redistributes registers");

  // Producer mapping: 4 threads per token (16 e4m3 bytes of each 64-dim tile each), 32 tokens per round, 2 rounds.
  static constexpr int kThreadsPerToken = 4;
  static constexpr int kTokensPerRound = kWarpgroupThreads / kThreadsPerToken;  // 32
  static constexpr int kRounds = kBlockN / kTokensPerRound;                       // 2

  static constexpr float kMaxInit = -1e30f;  // finite: exp2(m_old - m_new) never sees inf - inf

  // K buffer layout (the sparse decode kernel's): tiles 0-7 in two halves of 4 tiles (V_L, V_R); inside a half the
  // 8-row swizzle atoms of its 4 tiles are interleaved: tile t, row group g at (t / 4) * kHalfBytes + g * kGroupStride
  // + (t % 4) * 1024. The RoPE tile is a plain 8 KB tile after them (P of the block once Q K^T is done).
  static constexpr int kGroupTiles = 8;
  static constexpr int kHalfTiles = 4;
  static constexpr int kGroupStride = kHalfTiles * kSwizzleAtomBytes;  // 4096
  static constexpr int kHalfBytes = 8 * kGroupStride;                  // 32768
  static constexpr int kGroupBytes = kGroupTiles * kTileBytes;         // 65536
};

enum class NamedBarrier : int {
  kConsumers = 1,  // WG0 and WG1 (256 threads)
  kInit = 3,       // the whole CTA, once, after the mbarrier setup
};

struct alignas(1024) SharedStorage {
  alignas(1024) uint8_t q[Cfg::kNumTiles][Cfg::kTileBytes];
  alignas(1024) uint8_t k[2][Cfg::kNumTiles * Cfg::kTileBytes];
  float scale[2][Cfg::kBlockM];   // per block: a = 2^(m_old - m_new), WG0 -> WG1
  float out_scale[Cfg::kBlockM];  // epilogue: descale_k / row sum, WG0 -> WG1
  alignas(8) uint64_t full[2];    // producer -> consumers: the block is in k[buf]
  uint64_t free_[2][2];           // [buf][half] consumer warps -> producer
  uint64_t p_ready[2];            // WG0 -> WG1: P and a of the block
  uint64_t q_full;                // producer -> WG0: a later request's Q tile landed
  uint64_t q_free;                // WG0 -> producer: the current Q tile is no longer read
  uint64_t scale_free[2];         // WG1 -> WG0: scale[buf] was read
  uint64_t qk_done[2];            // WG0 -> WG1: S = Q K^T of the block in k[buf] is done (WG0 starts its softmax)
};
static_assert(sizeof(SharedStorage) + 1024 <= 232448, "FP8 dense decode smem plan exceeds 227 KB");

// ---------------------------------------------------------------------------------------------------
// e4m3 -> bf16, exact, unscaled
// ---------------------------------------------------------------------------------------------------
// Two e4m3 bytes of `w` (selected by `sel`) -> bf16x2 holding value * 2^-120 exactly: the e4m3 bit pattern shifted
// into bf16 position is the same number with the exponent bias 7 read as 127 (subnormals land on bf16 subnormals with
// the same factor). prmt's sign-replicating selector nibbles put each byte's sign into the byte above it.
__device__ __forceinline__ uint32_t e4m3x2_to_bf16x2_tiny(uint32_t w, uint32_t sel) {
  uint32_t x;
  asm("prmt.b32 %0, %1, 0, %2;" : "=r"(x) : "r"(w), "r"(sel));
  return (x << 4) & 0x87F087F0u;
}
__device__ __forceinline__ uint32_t mul_bf16x2(uint32_t a, __nv_bfloat162 b) {
  __nv_bfloat162 r = __hmul2(*reinterpret_cast<__nv_bfloat162*>(&a), b);
  return *reinterpret_cast<uint32_t*>(&r);
}
// 16 e4m3 values -> 16 bf16 (two 16-byte chunks, dims in order), each value exact: one bf16x2 multiply by 2^120
// restores the exponent (a product of a representable value and a power of two inside the range: no rounding).
__device__ __forceinline__ void e4m3x16_to_bf16(const uint4& raw, uint4& lo, uint4& hi) {
  const __nv_bfloat162 k2p120 = __float2bfloat162_rn(1.329227995784916e36f);  // 2^120
  const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
  uint32_t o[8];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    o[2 * i] = mul_bf16x2(e4m3x2_to_bf16x2_tiny(w[i], 0x9180u), k2p120);      // bytes 0, 1
    o[2 * i + 1] = mul_bf16x2(e4m3x2_to_bf16x2_tiny(w[i], 0xB3A2u), k2p120);  // bytes 2, 3
  }
  lo = make_uint4(o[0], o[1], o[2], o[3]);
  hi = make_uint4(o[4], o[5], o[6], o[7]);
}

// ---------------------------------------------------------------------------------------------------
// Shared-memory addressing and wgmma descriptors
// ---------------------------------------------------------------------------------------------------
using tile::desc_k_major;
using tile::exponentiate;
using tile::Fragment;
using tile::make_fragment;
using tile::quad_sum;
using tile::row_max;
using tile::scale_rows;
using tile::swizzled_chunk;
static_assert(Cfg::kTileBytes == tile::kTileBytes && Cfg::kRowBytes == tile::kRowBytes, "one tile convention");

__device__ __forceinline__ uint64_t desc_advance(uint64_t desc, uint32_t bytes) { return desc + (bytes >> 4); }

// Byte offset of 16-byte chunk `chunk` of row `row` of tile `t` in a K buffer.
__device__ __forceinline__ uint32_t k_chunk(int t, int row, int chunk) {
  if (t < Cfg::kGroupTiles)
    return static_cast<uint32_t>((t / Cfg::kHalfTiles) * Cfg::kHalfBytes + (row >> 3) * Cfg::kGroupStride +
                                 (t % Cfg::kHalfTiles) * Cfg::kSwizzleAtomBytes + (row & 7) * Cfg::kRowBytes +
                                 ((chunk ^ (row & 7)) << 4));
  return static_cast<uint32_t>(Cfg::kGroupBytes + (t - Cfg::kGroupTiles) * Cfg::kTileBytes) + swizzled_chunk(row, chunk);
}
__device__ __forceinline__ uint64_t desc_k_group(const void* p) {
  return ptx::make_smem_desc_sw128(ptx::smem_addr(p), 16, Cfg::kGroupStride);
}
__device__ __forceinline__ uint64_t desc_v_group(const void* p) {
  return ptx::make_smem_desc_sw128(ptx::smem_addr(p), Cfg::kSwizzleAtomBytes, Cfg::kGroupStride);
}

using KRing = pipeline::BarrierRing<2>;
using QRing = pipeline::BarrierRing<1>;

__device__ __forceinline__ void consumer_barrier() {
  __syncwarp();
  ptx::named_barrier_sync_unaligned(static_cast<int>(NamedBarrier::kConsumers), 2 * Cfg::kWarpgroupThreads);
}

// ---------------------------------------------------------------------------------------------------
// Per-request work, computed identically by every role
// ---------------------------------------------------------------------------------------------------
struct RequestWork {
  int len;                 // the cache length, clamped to [0, max_blocks_per_seq * page_size]
  int blk_begin, blk_end;  // this CTA's blocks of the request (past the tile's last causal border: skipped)
};

__device__ __forceinline__ RequestWork request_work(const DenseDecodeFp8Params& p, const DecodeScheduleRecord& rec,
                                                    int req) {
  RequestWork w;
  w.len = min(max(__shfl_sync(0xffffffff, p.cache_seqlens[req], 0), 0), p.max_blocks_per_seq * p.page_size);
  const int blocks = (w.len + Cfg::kBlockN - 1) / Cfg::kBlockN;
  w.blk_begin = chunk_begin_block(rec, req);
  w.blk_end = chunk_end_block(rec, req, blocks);
  // Blocks past the border of the tile's last valid row are masked for every row of the tile.
  const int last_row = min(static_cast<int>(blockIdx.x) * Cfg::kBlockM + Cfg::kBlockM, p.rows) - 1;
  const int max_border = p.causal ? w.len - (p.s_q - 1 - last_row / p.h_q) : w.len;
  w.blk_end = min(w.blk_end, max(0, (max_border + Cfg::kBlockN - 1) / Cfg::kBlockN));
  return w;
}

// ---------------------------------------------------------------------------------------------------
// Q tile: 64 packed rows x 576 (rows past `rows` zero) into the swizzled bf16 tiles
// ---------------------------------------------------------------------------------------------------
// kQFp8 = false: bf16 rows by 16-byte cp.async (no commit: the caller commits and waits, or arrives on an mbarrier).
// kQFp8 = true: e4m3 rows by 16-byte loads converted exactly to bf16 and stored (the caller fences for the async
// proxy before it publishes).
template <bool kQFp8>
__device__ __forceinline__ void load_q_tile(const DenseDecodeFp8Params& p, SharedStorage& smem, int req, int first,
                                            int stride) {
  const int row_base = blockIdx.x * Cfg::kBlockM;
  const auto* q = static_cast<const uint8_t*>(p.q);
  if constexpr (!kQFp8) {
    constexpr int kChunksPerRow = Cfg::kHeadDimQK / 8;  // 72
#pragma unroll 1
    for (int i = ptx::launder32(first); i < Cfg::kBlockM * kChunksPerRow; i += stride) {
      const int row = i / kChunksPerRow, chunk = i % kChunksPerRow;
      const int r = row_base + row;
      uint8_t* dst = smem.q[chunk / 8] + swizzled_chunk(row, chunk % 8);
      if (r < p.rows) {
        const int s_idx = r / p.h_q, head = r - s_idx * p.h_q;
        const int64_t elem = static_cast<int64_t>(req) * p.q_stride_b + static_cast<int64_t>(s_idx) * p.q_stride_s +
                             static_cast<int64_t>(head) * p.q_stride_h + chunk * 8;
        ptx::cp_async_16(dst, q + 2 * elem, 16);
      } else {
        ptx::cp_async_16(dst, q, 0);
      }
    }
  } else {
    constexpr int kChunksPerRow = Cfg::kHeadDimQK / 16;  // 36 chunks of 16 e4m3 -> 2 bf16 chunks each
    constexpr int kTotal = Cfg::kBlockM * kChunksPerRow;
    constexpr int kBatch = 4;  // loads in flight per thread before the first conversion (6 spilled the early-Q K^T producer)
#pragma unroll 1
    for (int base = ptx::launder32(first); base < kTotal; base += kBatch * stride) {
      uint4 raw[kBatch];
#pragma unroll
      for (int k = 0; k < kBatch; ++k) {
        const int i = base + k * stride;
        const int row = i / kChunksPerRow, c = i % kChunksPerRow;
        const int r = row_base + row;
        raw[k] = make_uint4(0, 0, 0, 0);
        if (i < kTotal && r < p.rows) {
          const int s_idx = r / p.h_q, head = r - s_idx * p.h_q;
          const int64_t elem = static_cast<int64_t>(req) * p.q_stride_b + static_cast<int64_t>(s_idx) * p.q_stride_s +
                               static_cast<int64_t>(head) * p.q_stride_h + c * 16;
          raw[k] = ptx::ld_nc_v4(q + elem);
        }
      }
#pragma unroll
      for (int k = 0; k < kBatch; ++k) {
        const int i = base + k * stride;
        if (i < kTotal) {
          const int row = i / kChunksPerRow, c = i % kChunksPerRow;
          uint4 lo, hi;
          e4m3x16_to_bf16(raw[k], lo, hi);
          const uint32_t tile_base = ptx::smem_addr(smem.q[c / 4]);
          ptx::st_shared_v4(tile_base + swizzled_chunk(row, (2 * c) % 8), lo);
          ptx::st_shared_v4(tile_base + swizzled_chunk(row, (2 * c + 1) % 8), hi);
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// Producer: the tokens of a block, 4 threads per token
// ---------------------------------------------------------------------------------------------------
struct TokenData {
  uint4 raw[Cfg::kNumTiles];  // 16 e4m3 bytes of each 64-dim tile
};

// Position of the producer in its partition's (request, block) sequence: the order the consumers walk.
struct Cursor {
  int req;
  int blk;
  RequestWork w;
};

__device__ __forceinline__ void cursor_settle(const DenseDecodeFp8Params& p, const DecodeScheduleRecord& rec,
                                              Cursor& c) {
  while (c.req <= rec.end_req && c.blk >= c.w.blk_end) {
    if (++c.req > rec.end_req) break;
    c.w = request_work(p, rec, c.req);
    c.blk = c.w.blk_begin;
  }
}
__device__ __forceinline__ Cursor cursor_begin(const DenseDecodeFp8Params& p, const DecodeScheduleRecord& rec) {
  Cursor c;
  c.req = rec.begin_req;
  c.w = request_work(p, rec, c.req);
  c.blk = c.w.blk_begin;
  cursor_settle(p, rec, c);
  return c;
}
__device__ __forceinline__ Cursor cursor_next(const DenseDecodeFp8Params& p, const DecodeScheduleRecord& rec, Cursor c) {
  if (c.req > rec.end_req) return c;
  ++c.blk;
  cursor_settle(p, rec, c);
  return c;
}

// The page of this thread's token of each round of the cursor's block: -1 for a token at or past the length (never
// read: zeros) or a cursor past the partition; a page outside the cache also reads zeros (load_token).
__device__ __forceinline__ void load_pages(const DenseDecodeFp8Params& p, const DecodeScheduleRecord& rec,
                                           const Cursor& c, int tok_in_round, int (&page)[Cfg::kRounds]) {
  const bool live = c.req <= rec.end_req;
  const int32_t* row = p.block_table + static_cast<int64_t>(live ? c.req : 0) * p.block_table_stride;
#pragma unroll
  for (int r = 0; r < Cfg::kRounds; ++r) {
    const int tok = c.blk * Cfg::kBlockN + r * Cfg::kTokensPerRound + tok_in_round;
    page[r] = (live && tok < c.w.len) ? row[tok / p.page_size] : -1;
  }
}

__device__ __forceinline__ bool page_usable(const DenseDecodeFp8Params& p, int page) {
  return page >= 0 && page < p.num_pages;
}

__device__ __forceinline__ const uint8_t* token_ptr(const DenseDecodeFp8Params& p, int page, int tok) {
  return p.k_cache + static_cast<int64_t>(page) * p.page_stride +
         static_cast<int64_t>(tok % p.page_size) * p.row_stride;
}

__device__ __forceinline__ uint4 ld_nc_no_allocate_v4(const void* ptr) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(ptr));
  return v;
}

__device__ __forceinline__ void load_token(const DenseDecodeFp8Params& p, int page, int tok, int lane4, TokenData& d) {
  if (page_usable(p, page)) {
    const uint8_t* a = token_ptr(p, page, tok) + lane4 * 16;
    if (p.k_l1_no_allocate) {
#pragma unroll
      for (int j = 0; j < Cfg::kNumTiles; ++j) d.raw[j] = ld_nc_no_allocate_v4(a + j * Cfg::kTileCols);
    } else {
#pragma unroll
      for (int j = 0; j < Cfg::kNumTiles; ++j) d.raw[j] = ptx::ld_nc_v4(a + j * Cfg::kTileCols);
    }
  } else {
    // Never dereferenced: zeros (V rows past the length must be 0, not garbage: 0 * NaN = NaN in P V).
#pragma unroll
    for (int j = 0; j < Cfg::kNumTiles; ++j) d.raw[j] = make_uint4(0, 0, 0, 0);
  }
}

__device__ __forceinline__ void prefetch_token_l2(const DenseDecodeFp8Params& p, int page, int tok, int lane4) {
  const uint8_t* a = token_ptr(p, page, tok);
  asm volatile("prefetch.global.L2 [%0];" ::"l"(a + lane4 * 128));
  if (lane4 == 0) asm volatile("prefetch.global.L2 [%0];" ::"l"(a + 512));
  if (lane4 == 1) asm volatile("prefetch.global.L2 [%0];" ::"l"(a + Cfg::kHeadDimQK - 1));
}

// Tiles [kFirst, kLast) of one token's share, converted and stored into k[buf] (tile 8: the RoPE tile).
template <int kFirst = 0, int kLast = Cfg::kNumTiles>
__device__ __forceinline__ void store_token(const TokenData& d, uint32_t k_base, int tok, int lane4) {
#pragma unroll
  for (int j = kFirst; j < kLast; ++j) {
    uint4 lo, hi;
    e4m3x16_to_bf16(d.raw[j], lo, hi);
    ptx::st_shared_v4(k_base + k_chunk(j, tok, 2 * lane4), lo);
    ptx::st_shared_v4(k_base + k_chunk(j, tok, 2 * lane4 + 1), hi);
  }
}

// ---------------------------------------------------------------------------------------------------
// Consumers: kWg = 0 (S = Q K^T, softmax, O_L) or 1 (O_R)
// ---------------------------------------------------------------------------------------------------
template <bool kQFp8, bool kEarlyQK, int kWg, typename InitSync>
__device__ __forceinline__ void consume(const DenseDecodeFp8Params& p, SharedStorage& smem,
                                        const DecodeScheduleRecord& rec, int tid, InitSync&& init_sync) {
  constexpr int wg = kWg;
  const int lane = tid % 32;
  const int row_base = blockIdx.x * Cfg::kBlockM;
  // The per-tensor scales, folded: logits s = q_e4m3 . k_e4m3 (exact inputs) scaled by softmax_scale * dq * dk in the
  // exponent; the output by dk (V is the same latent).
  const float dq = p.descale_q != nullptr ? *p.descale_q : p.descale_q_value;
  const float dk = p.descale_k != nullptr ? *p.descale_k : p.descale_k_value;
  const float scale_log2 = p.scale_log2 * (dq * dk);
  auto release_buffer = [&](int buf) {
    __syncwarp();
    if (lane == 0) {
#pragma unroll
      for (int half = wg == 0 ? 0 : 1; half < 2; ++half) ptx::mbarrier_arrive(&smem.free_[buf][half]);
    }
  };
  load_q_tile<kQFp8>(p, smem, rec.begin_req, tid, 2 * Cfg::kWarpgroupThreads);
  if constexpr (!kQFp8) ptx::cp_async_commit();
  init_sync();
  uint32_t it = 0;
  uint32_t q_gen = 0;
  for (int req = rec.begin_req; req <= rec.end_req; ++req) {
    const RequestWork w = request_work(p, rec, req);
    const bool is_split = chunk_is_split(rec, req);
    const int split_slot = __shfl_sync(0xffffffff, p.num_splits[req], 0) + chunk_ordinal(rec, req);
    const bool has_blocks = w.blk_end > w.blk_begin;
    const bool first_item = req == rec.begin_req;
    const bool last_item = req == rec.end_req;

    if (first_item) {
      if constexpr (!kQFp8) ptx::cp_async_wait_all();
    } else if (wg == 0 && has_blocks) {
      ++q_gen;
      ptx::mbarrier_wait_parity(&smem.q_full, QRing::parity(q_gen - 1));
    }
    ptx::fence_proxy_async_shared();
    consumer_barrier();

    const Fragment frag0 = make_fragment(ptx::launder32(tid) % Cfg::kWarpgroupThreads);
    // Right border (exclusive key index) of this thread's two rows: bottom-right causal mask.
    int border[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int r = row_base + frag0.row[i];
      border[i] = (p.causal && r < p.rows) ? w.len - (p.s_q - 1 - r / p.h_q) : w.len;
    }

    float o[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.f;
    float m_run[2] = {Cfg::kMaxInit, Cfg::kMaxInit};
    float l_run[2] = {0.f, 0.f};

    // WG0: S = Q K^T of the block in k[qbuf] into s (issued and committed, not waited for), and what follows its
    // completion: qk_done for WG1, and q_free after the request's last Q K^T (its Q tile may be overwritten).
    float s[32];
    auto issue_qk = [&](int qbuf) {
      const uint64_t q_desc = ptx::launder(desc_k_major(smem.q[0]));
      const uint64_t k_desc = ptx::launder(desc_k_group(smem.k[qbuf]));
      const uint64_t r_desc = ptx::launder(desc_k_major(smem.k[qbuf] + Cfg::kGroupBytes));
      ptx::wgmma_fence();
#pragma unroll
      for (int t = 0; t < Cfg::kNumTiles; ++t) {
#pragma unroll
        for (int kk = 0; kk < Cfg::kTileCols / 16; ++kk) {
          const uint64_t kd = t < Cfg::kGroupTiles
                                  ? desc_advance(k_desc, (t / Cfg::kHalfTiles) * Cfg::kHalfBytes +
                                                             (t % Cfg::kHalfTiles) * Cfg::kSwizzleAtomBytes + kk * 32)
                                  : desc_advance(r_desc, (t - Cfg::kGroupTiles) * Cfg::kTileBytes + kk * 32);
          ptx::wgmma_m64n64k16_ss_bf16<0>(s, desc_advance(q_desc, t * Cfg::kTileBytes + kk * 32), kd, (t | kk) != 0);
        }
      }
      ptx::wgmma_commit();
    };
    auto qk_finished = [&](int qblk, int qbuf) {
      ptx::fence_registers(s);
      // WG1 may now run the previous block's P V_R: it fills the tensor cores while this warpgroup exponentiates.
      ptx::mbarrier_arrive(&smem.qk_done[qbuf]);
      if (qblk == w.blk_end - 1) {
        __syncwarp();
        if (lane == 0) ptx::mbarrier_arrive(&smem.q_free);
      }
    };
    // kEarlyQK (decision dense-fp8-v4): WG0 issues the next block's Q K^T right behind its P V_L, so the tensor cores
    // never wait for WG0's release / full wait / issue between the two; the request's first Q K^T comes here.
    if constexpr (kEarlyQK && wg == 0) {
      if (has_blocks) {
        ptx::mbarrier_wait_parity(&smem.full[KRing::slot(it)], KRing::parity(it));
        issue_qk(KRing::slot(it));
        ptx::wgmma_wait<0>();
        qk_finished(w.blk_begin, KRing::slot(it));
      }
    }

    for (int blk = w.blk_begin; blk < w.blk_end; ++blk, ++it) {
      const int buf = KRing::slot(it);
      const uint32_t phase = KRing::parity(it);
      const Fragment frag = make_fragment(ptx::launder32(tid) % Cfg::kWarpgroupThreads);
      uint8_t* p_tile = smem.k[buf] + Cfg::kGroupBytes;  // the RoPE tile, dead after Q K^T
      if constexpr (wg == 0) {
        if constexpr (!kEarlyQK) {
          ptx::mbarrier_wait_parity(&smem.full[buf], phase);
          issue_qk(buf);
          ptx::wgmma_wait<0>();
          qk_finished(blk, buf);
        }
        // Keys at or past a row's border: -inf (overwrite, never add).
        const int tok0 = blk * Cfg::kBlockN;
        if (tok0 + Cfg::kBlockN > min(border[0], border[1])) {
#pragma unroll
          for (int j = 0; j < 8; ++j) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int tok = tok0 + j * 8 + frag.col + e;
              if (tok >= border[0]) s[j * 4 + e] = -INFINITY;
              if (tok >= border[1]) s[j * 4 + 2 + e] = -INFINITY;
            }
          }
        }
        float mx[2];
        row_max(s, mx);
        float a[2], m_new[2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          m_new[i] = softmax::new_max(m_run[i], mx[i], scale_log2);
          a[i] = softmax::rescale_factor(m_run[i], m_new[i]);
          m_run[i] = m_new[i];
        }
        float sum[2];
        exponentiate(s, scale_log2, m_new, sum);
        softmax::update_row_sums(l_run, a, sum);
        uint32_t pa[4][4];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const uint32_t lo = epilogue::pack_bf16(s[j * 4 + 0], s[j * 4 + 1]);
          const uint32_t hi = epilogue::pack_bf16(s[j * 4 + 2], s[j * 4 + 3]);
          pa[j / 2][(j % 2) * 2 + 0] = lo;
          pa[j / 2][(j % 2) * 2 + 1] = hi;
          const int col = j * 8 + frag.col;
          *reinterpret_cast<uint32_t*>(p_tile + swizzled_chunk(frag.row[0], col >> 3) + (col & 7) * 2) = lo;
          *reinterpret_cast<uint32_t*>(p_tile + swizzled_chunk(frag.row[1], col >> 3) + (col & 7) * 2) = hi;
        }
        ptx::mbarrier_wait_parity(&smem.scale_free[buf], KRing::free_parity(it));
        if (lane % 4 == 0) {
          smem.scale[buf][frag.row[0]] = a[0];
          smem.scale[buf][frag.row[1]] = a[1];
        }
        ptx::fence_proxy_async_shared();
        ptx::mbarrier_arrive(&smem.p_ready[buf]);
        // O_L = a O_L + P V_L.
        scale_rows(o, a[0], a[1]);
        const uint64_t v_desc = ptx::launder(desc_v_group(smem.k[buf]));
        ptx::wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
          ptx::wgmma_m64n256k16_rs_bf16<1>(o, pa[kk], desc_advance(v_desc, kk * 2 * Cfg::kGroupStride), 1);
        ptx::wgmma_commit();
        if constexpr (kEarlyQK) {
          if (blk + 1 < w.blk_end) {
            const int nbuf = KRing::slot(it + 1);
            ptx::mbarrier_wait_parity(&smem.full[nbuf], KRing::parity(it + 1));
            issue_qk(nbuf);
            ptx::wgmma_wait<1>();  // P V_L done (groups complete in order); the next Q K^T may still run
            ptx::fence_registers(o);
            release_buffer(buf);
            ptx::wgmma_wait<0>();
            qk_finished(blk + 1, nbuf);
            continue;
          }
        }
        ptx::wgmma_wait<0>();
        ptx::fence_registers(o);
        release_buffer(buf);
      } else {
        ptx::mbarrier_wait_parity(&smem.p_ready[buf], phase);
        ptx::mbarrier_wait_parity(&smem.full[buf], phase);
        // qk_done completes once per block (WG0's Q K^T) and WG1 waits for every completion once, in order (an
        // arrival on a phase nobody waited for is a synccheck error): this block's here unless it was waited for at
        // the previous block (already complete: WG0 handed P over after it). With the hold (decision dense-fp8-v2),
        // this block's P V_R waits for WG0's next Q K^T, so that it runs during WG0's softmax instead of beside WG0's
        // P V_L; the request's last block has no next Q K^T in this loop.
        const bool hold = p.hold_pv_r && blk + 1 < w.blk_end;
        if (!p.hold_pv_r || blk == w.blk_begin) ptx::mbarrier_wait_parity(&smem.qk_done[buf], phase);
        if (hold) ptx::mbarrier_wait_parity(&smem.qk_done[buf ^ 1], KRing::parity(it + 1));
        scale_rows(o, smem.scale[buf][frag.row[0]], smem.scale[buf][frag.row[1]]);
        ptx::mbarrier_arrive(&smem.scale_free[buf]);
        const uint64_t p_desc = ptx::launder(desc_k_major(p_tile));
        const uint64_t v_desc = ptx::launder(desc_v_group(smem.k[buf] + Cfg::kHalfBytes));
        ptx::wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
          ptx::wgmma_m64n256k16_ss_bf16<1>(o, desc_advance(p_desc, kk * 32),
                                           desc_advance(v_desc, kk * 2 * Cfg::kGroupStride), 1);
        ptx::wgmma_commit();
        ptx::wgmma_wait<0>();
        ptx::fence_registers(o);
        release_buffer(buf);
      }
    }

    // The partition's first Q is released here when its request has no blocks (WG0 releases every other generation
    // after its last Q K^T).
    if (wg == 0 && first_item && !has_blocks) {
      __syncwarp();
      if (lane == 0) ptx::mbarrier_arrive(&smem.q_free);
    }

    // ---- epilogue: WG0 owns the softmax statistics and hands the output scale to WG1.
    if (last_item) ptx::griddep_launch_dependents();
    const Fragment frag = make_fragment(ptx::launder32(tid) % Cfg::kWarpgroupThreads);
    float total[2] = {0.f, 0.f};
    if (wg == 0) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        total[i] = quad_sum(l_run[i]);
        const float inv = total[i] > 0.f ? dk / total[i] : 0.f;
        if (lane % 4 == 0) smem.out_scale[frag.row[i]] = inv;
      }
    }
    consumer_barrier();
    const float inv0 = smem.out_scale[frag.row[0]], inv1 = smem.out_scale[frag.row[1]];
    scale_rows(o, inv0, inv1);
    const int col_base = wg * (Cfg::kHeadDimV / 2);
    const int q4 = lane % 4;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int r = row_base + frag.row[i];
      const bool live = r < p.rows;  // the same for the whole quad
      const int s_idx = live ? r / p.h_q : 0;
      const int head = live ? r - s_idx * p.h_q : 0;
      if (!is_split) {
        auto* out = static_cast<uint8_t*>(p.output.out) + 2 * p.output.out_offset(req, s_idx, head);
        epilogue::store_row<false, false>(o, i, q4, out, col_base, live);
      } else {
        const int64_t prow = static_cast<int64_t>(split_slot) * p.rows + r;
        float* po = p.partial_o + prow * Cfg::kHeadDimV;
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
        if (!is_split)
          p.output.lse[p.output.lse_offset(req, s_idx, head)] = epilogue::final_lse(empty, log2_sum);
        else
          p.partial_lse[static_cast<int64_t>(split_slot) * p.rows + r] = empty ? -INFINITY : log2_sum;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// The kernel
// ---------------------------------------------------------------------------------------------------
template <bool kQFp8, bool kEarlyQK>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    dense_decode_fp8_kernel(const __grid_constant__ DenseDecodeFp8Params p) {
  SharedStorage& smem = cta::shared_storage<SharedStorage>();
  const int tid = threadIdx.x;
  const int wg = cta::warpgroup(tid);
  const int wg_tid = tid % Cfg::kWarpgroupThreads;

  DecodeScheduleRecord rec = p.schedule[blockIdx.z];
  broadcast_record_range(rec);
  if (rec.begin_req >= p.batch) {  // an idle partition
    ptx::griddep_launch_dependents();
    return;
  }
  auto init_sync = [&]() {
    if (tid == 0) {
      for (int b = 0; b < 2; ++b) {
        ptx::mbarrier_init(&smem.full[b], Cfg::kWarpgroupThreads);   // every producer thread
        ptx::mbarrier_init(&smem.free_[b][0], 4);                    // every WG0 warp
        ptx::mbarrier_init(&smem.free_[b][1], 8);                    // every consumer warp
        ptx::mbarrier_init(&smem.p_ready[b], Cfg::kWarpgroupThreads);  // every WG0 thread
        ptx::mbarrier_init(&smem.scale_free[b], Cfg::kWarpgroupThreads);  // every WG1 thread
        ptx::mbarrier_init(&smem.qk_done[b], Cfg::kWarpgroupThreads);     // every WG0 thread
      }
      ptx::mbarrier_init(&smem.q_full, Cfg::kWarpgroupThreads);  // every producer thread's Q share
      ptx::mbarrier_init(&smem.q_free, 4);                        // every WG0 warp
      ptx::fence_mbarrier_init();
    }
    ptx::named_barrier_sync_unaligned(static_cast<int>(NamedBarrier::kInit), Cfg::kThreads);
  };

  // kEarlyQK: WG0 holds the next S beside O_L and the P fragments of the running P V_L; with 200 registers ptxas
  // serialised every wgmma (C7512), so that variant moves registers from WG1 (O_R only) and the producer.
  constexpr int kRegsWg0 = kEarlyQK ? 216 : Cfg::kRegsWg0;
  constexpr int kRegsWg1 = kEarlyQK ? 160 : Cfg::kRegsWg1;
  constexpr int kRegsProducer = kEarlyQK ? 128 : Cfg::kRegsProducer;
  static_assert(kRegsWg0 + kRegsWg1 + kRegsProducer <= 3 * Cfg::kLaunchRegs, "setmaxnreg only redistributes");
  if (wg == 2) {
    // =================================================================== producer
    ptx::setmaxnreg_dec<kRegsProducer>();
    const int lane4 = wg_tid % Cfg::kThreadsPerToken;
    const int tok_in_round = wg_tid / Cfg::kThreadsPerToken;
    uint32_t q_gen = 0;
    Cursor cur = cursor_begin(p, rec);
    Cursor n1 = cursor_next(p, rec, cur);
    Cursor n2 = cursor_next(p, rec, n1);
    int pg_cur[Cfg::kRounds], pg_n1[Cfg::kRounds], pg_n2[Cfg::kRounds];
    load_pages(p, rec, cur, tok_in_round, pg_cur);
    load_pages(p, rec, n1, tok_in_round, pg_n1);
    load_pages(p, rec, n2, tok_in_round, pg_n2);
    auto token_of = [&](const Cursor& c, int r) {
      return c.blk * Cfg::kBlockN + r * Cfg::kTokensPerRound + tok_in_round;
    };
    TokenData d0, d1;  // d0: round 0 of the current block; d1: round 1
    // Where round 1's load is issued (decision dense-fp8-v6): with a bf16 q, both rounds of a block are requested
    // right after the previous block's hand-off; with an e4m3 q, whose producer also converts Q, round 1 is requested
    // at the top of its own iteration (holding both rounds across the loop made that kernel spill 44 bytes and run
    // 15 % slower on the H200, against +2 % for the bf16-q kernel).
    constexpr bool kEarlyRound1 = !kQFp8;
    load_token(p, pg_cur[0], token_of(cur, 0), lane4, d0);
    if constexpr (kEarlyRound1) load_token(p, pg_cur[1], token_of(cur, 1), lane4, d1);
    init_sync();
    for (uint32_t it = 0; cur.req <= rec.end_req; ++it) {
      const int buf = it & 1;
      const uint32_t phase = (it >> 1) & 1;
      if constexpr (!kEarlyRound1) load_token(p, pg_cur[1], token_of(cur, 1), lane4, d1);
      // Two blocks ahead: the tokens into L2. Three ahead: the pages.
#pragma unroll
      for (int r = 0; r < Cfg::kRounds; ++r)
        if (page_usable(p, pg_n2[r])) prefetch_token_l2(p, pg_n2[r], token_of(n2, r), lane4);
      const Cursor n3 = cursor_next(p, rec, n2);
      int pg_n3[Cfg::kRounds];
      load_pages(p, rec, n3, tok_in_round, pg_n3);
      // A later request's first block: first its Q tile, once WG0 is done with the previous one.
      if (cur.req != rec.begin_req && cur.blk == cur.w.blk_begin) {
        ++q_gen;
        pipeline::wait_or_trap(&smem.q_free, (q_gen - 1) & 1);
        load_q_tile<kQFp8>(p, smem, cur.req, wg_tid, Cfg::kWarpgroupThreads);
        if constexpr (kQFp8) {
          ptx::fence_proxy_async_shared();
          ptx::mbarrier_arrive(&smem.q_full);
        } else {
          ptx::cp_async_mbarrier_arrive_noinc(&smem.q_full);
        }
      }
      // The V_L tiles (0-3) as soon as WG0 is done with the buffer (after its P V_L), the rest once WG1 is done too
      // (its P V_R reads V_R and P in the RoPE tile). (The producer's waits trap after the watchdog's 20 s: a stuck
      // consumer fails the launch instead of hanging.)
      const uint32_t k_base = ptx::smem_addr(smem.k[buf]);
      pipeline::wait_or_trap(&smem.free_[buf][0], phase ^ 1);
      store_token<0, Cfg::kHalfTiles>(d0, k_base, tok_in_round, lane4);
      pipeline::wait_or_trap(&smem.free_[buf][1], phase ^ 1);
      store_token<Cfg::kHalfTiles, Cfg::kNumTiles>(d0, k_base, tok_in_round, lane4);
      if constexpr (!kEarlyRound1) load_token(p, pg_n1[0], token_of(n1, 0), lane4, d0);  // the next block's round 0
      store_token(d1, k_base, tok_in_round + Cfg::kTokensPerRound, lane4);
      ptx::fence_proxy_async_shared();
      ptx::mbarrier_arrive(&smem.full[buf]);
      if constexpr (kEarlyRound1) {
        // Both rounds of the next block, in flight while the producer waits for the next buffer's release.
        load_token(p, pg_n1[0], token_of(n1, 0), lane4, d0);
        load_token(p, pg_n1[1], token_of(n1, 1), lane4, d1);
      }
      cur = n1;
      n1 = n2;
      n2 = n3;
#pragma unroll
      for (int r = 0; r < Cfg::kRounds; ++r) {
        pg_cur[r] = pg_n1[r];
        pg_n1[r] = pg_n2[r];
        pg_n2[r] = pg_n3[r];
      }
    }
    return;
  } else if (wg == 0) {
    ptx::setmaxnreg_inc<kRegsWg0>();
    consume<kQFp8, kEarlyQK, 0>(p, smem, rec, tid, init_sync);
    return;
  } else {
    if constexpr (kRegsWg1 < Cfg::kLaunchRegs) ptx::setmaxnreg_dec<kRegsWg1>();
    consume<kQFp8, kEarlyQK, 1>(p, smem, rec, tid, init_sync);
    return;
  }
}

}  // namespace openmla::kernels::dense_decode_fp8
