// The GEMM steps of the attention kernels on wgmma m64nNk16 for bf16 or fp16 operands, any N the kernels use (64,
// 128, 192, 256): the element glue (packing, the wgmma shapes), P as register A fragments, tiles of a fragment stored
// into a 128B-swizzled shared tile (for the other warpgroup's shared-A wgmma, or as a TMA store box), and the issue
// loops of S = Q K^T and O += P V over k16 slices (the layer: docs/architecture.md, "Device layer"). For the FP8
// prefill, the e4m3 glue of m64nNk32 (ElementE4M3, to_a_fragments_e4m3, e4m3_pv_key).
//
// Operands in shared memory follow common/mma_tile.cuh: 128-byte rows (64 16-bit columns), 128B-swizzled, K-major
// (Q, K, P) or viewed MN-major (V, from the K / V tiles). A tile may have 64 rows (the decode kernels, sparse
// prefill: 8 KB) or 128 (dense MHA prefill: 16 KB); the MN-major view steps to the next 64 columns by one tile
// (LBO = the tile's bytes).
//
// The issue loops form each wgmma's descriptor in one of three measured styles (the Desc policies below).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/mma_tile.cuh"
#include "common/ptx.cuh"
#include "common/wgmma_ops.cuh"

namespace openmla::kernels::tile {

// The element type of Q, K, V and P: bf16 (kIsFp16 = false) or fp16; accumulation is fp32 either way.
template <bool kIsFp16>
struct Element16 {
  __device__ static uint32_t pack(float lo, float hi) {
    if constexpr (kIsFp16) {
      __half2 v = __floats2half2_rn(lo, hi);
      return *reinterpret_cast<uint32_t*>(&v);
    } else {
      __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
      return *reinterpret_cast<uint32_t*>(&v);
    }
  }
  // Element `half` (0: low, 1: high) of a packed pair, as fp32 (exact).
  __device__ static float unpack(uint32_t v, int half) {
    const uint32_t bits = half ? (v >> 16) : (v & 0xffffu);
    if constexpr (kIsFp16) {
      return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
    } else {
      return __uint_as_float(bits << 16);
    }
  }
  // d (+)= A B over one k16 slice, A and B from shared memory (descriptors); scale_d = 0 overwrites d.
  template <int kN, int kTransB>
  __device__ static void mma_ss(float (&d)[kN / 2], uint64_t a, uint64_t b, int scale_d) {
    static_assert(kN == 64 || kN == 128 || kN == 192 || kN == 256,
                  "wgmma shapes of the library: m64n64, m64n128, m64n192, m64n256");
    if constexpr (kN == 192 && kIsFp16) ptx::wgmma_m64n192k16_ss_f16<kTransB>(d, a, b, scale_d);
    if constexpr (kN == 192 && !kIsFp16) ptx::wgmma_m64n192k16_ss_bf16<kTransB>(d, a, b, scale_d);
    if constexpr (kN == 64 && kIsFp16) ptx::wgmma_m64n64k16_ss_f16<kTransB>(d, a, b, scale_d);
    if constexpr (kN == 64 && !kIsFp16) ptx::wgmma_m64n64k16_ss_bf16<kTransB>(d, a, b, scale_d);
    if constexpr (kN == 128 && kIsFp16) ptx::wgmma_m64n128k16_ss_f16<kTransB>(d, a, b, scale_d);
    if constexpr (kN == 128 && !kIsFp16) ptx::wgmma_m64n128k16_ss_bf16<kTransB>(d, a, b, scale_d);
    if constexpr (kN == 256 && kIsFp16) ptx::wgmma_m64n256k16_ss_f16<kTransB>(d, a, b, scale_d);
    if constexpr (kN == 256 && !kIsFp16) ptx::wgmma_m64n256k16_ss_bf16<kTransB>(d, a, b, scale_d);
  }
  // d (+)= A B over one k16 slice, A from registers (A fragments), B from shared memory.
  template <int kN, int kTransB>
  __device__ static void mma_rs(float (&d)[kN / 2], const uint32_t (&a)[4], uint64_t b, int scale_d) {
    static_assert(kN == 64 || kN == 128 || kN == 192 || kN == 256,
                  "wgmma shapes of the library: m64n64, m64n128, m64n192, m64n256");
    if constexpr (kN == 192 && kIsFp16) ptx::wgmma_m64n192k16_rs_f16<kTransB>(d, a, b, scale_d);
    if constexpr (kN == 192 && !kIsFp16) ptx::wgmma_m64n192k16_rs_bf16<kTransB>(d, a, b, scale_d);
    if constexpr (kN == 64 && kIsFp16) ptx::wgmma_m64n64k16_rs_f16<kTransB>(d, a, b, scale_d);
    if constexpr (kN == 64 && !kIsFp16) ptx::wgmma_m64n64k16_rs_bf16<kTransB>(d, a, b, scale_d);
    if constexpr (kN == 128 && kIsFp16) ptx::wgmma_m64n128k16_rs_f16<kTransB>(d, a, b, scale_d);
    if constexpr (kN == 128 && !kIsFp16) ptx::wgmma_m64n128k16_rs_bf16<kTransB>(d, a, b, scale_d);
    if constexpr (kN == 256 && kIsFp16) ptx::wgmma_m64n256k16_rs_f16<kTransB>(d, a, b, scale_d);
    if constexpr (kN == 256 && !kIsFp16) ptx::wgmma_m64n256k16_rs_bf16<kTransB>(d, a, b, scale_d);
  }
  // d (+)= A B over one k16 slice with A read MN-major (transposed: stored K rows x M contiguous columns, as a
  // K-major tile written by stmatrix_tile holds its transpose) and B from shared memory; m64n64 only (the dense MHA
  // backward's dQ = dS K, with dS stored key-major).
  template <int kN, int kTransB>
  __device__ static void mma_ss_trans_a(float (&d)[kN / 2], uint64_t a, uint64_t b, int scale_d) {
    static_assert(kN == 64, "the transposed-A wgmma of the library: m64n64");
    if constexpr (kIsFp16) ptx::wgmma_m64n64k16_ss_ta_f16<kTransB>(d, a, b, scale_d);
    if constexpr (!kIsFp16) ptx::wgmma_m64n64k16_ss_ta_bf16<kTransB>(d, a, b, scale_d);
  }
};

// e4m3 operands (the FP8 prefill, docs/fp8-prefill-design.md): Q, K, V^T and P as float8_e4m3fn, accumulation fp32,
// wgmma m64nNk32. 8-bit wgmma takes no transpose: A and B are both K-major (V must be transposed into V^T in shared
// memory before P V). A k32 slice is 32 bytes of a K-major row, as a k16 slice of 16-bit elements is, so the Desc
// policies' byte offsets (32 per slice) and the 128B-swizzled tile convention carry over unchanged.
struct ElementE4M3 {
  static constexpr int kSliceK = 32;      // K elements per wgmma
  static constexpr int kSliceBytes = 32;  // bytes of a K-major row per wgmma
  // x0..x3 as e4m3 in bytes 0..3 (x0 lowest): round to nearest even, saturating to +-448 (satfinite; NaN stays NaN).
  // cvt.rn.satfinite.e4m3x2.f32 d, a, b puts a in the high byte of d and b in the low one.
  __device__ static uint32_t pack4(float x0, float x1, float x2, float x3) {
    uint32_t r;
    asm("{\n.reg .b16 lo, hi;\n"
        "cvt.rn.satfinite.e4m3x2.f32 lo, %2, %1;\n"
        "cvt.rn.satfinite.e4m3x2.f32 hi, %4, %3;\n"
        "mov.b32 %0, {lo, hi};\n}"
        : "=r"(r)
        : "f"(x0), "f"(x1), "f"(x2), "f"(x3));
    return r;
  }
  // Byte `b` (0..3) of a packed word, as fp32 (exact: every e4m3 value is an fp16 value).
  __device__ static float unpack(uint32_t v, int b) {
    const unsigned short pair = static_cast<unsigned short>((v >> (b & 2 ? 16 : 0)) & 0xffffu);
    uint32_t h2;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(pair));
    const unsigned short h = static_cast<unsigned short>((b & 1) ? (h2 >> 16) : (h2 & 0xffffu));
    return __half2float(__ushort_as_half(h));
  }
  // d (+)= A B over one k32 slice, A and B from shared memory (K-major descriptors); scale_d = 0 overwrites d.
  template <int kN>
  __device__ static void mma_ss(float (&d)[kN / 2], uint64_t a, uint64_t b, int scale_d) {
    static_assert(kN == 64 || kN == 128 || kN == 192 || kN == 256,
                  "e4m3 wgmma shapes of the library: m64n64k32, m64n128k32, m64n192k32, m64n256k32");
    if constexpr (kN == 64) ptx::wgmma_m64n64k32_ss_e4m3(d, a, b, scale_d);
    if constexpr (kN == 128) ptx::wgmma_m64n128k32_ss_e4m3(d, a, b, scale_d);
    if constexpr (kN == 192) ptx::wgmma_m64n192k32_ss_e4m3(d, a, b, scale_d);
    if constexpr (kN == 256) ptx::wgmma_m64n256k32_ss_e4m3(d, a, b, scale_d);
  }
  // d (+)= A B over one k32 slice, A from registers (to_a_fragments_e4m3), B from shared memory (K-major).
  template <int kN>
  __device__ static void mma_rs(float (&d)[kN / 2], const uint32_t (&a)[4], uint64_t b, int scale_d) {
    static_assert(kN == 64 || kN == 128 || kN == 192 || kN == 256,
                  "e4m3 wgmma shapes of the library: m64n64k32, m64n128k32, m64n192k32, m64n256k32");
    if constexpr (kN == 64) ptx::wgmma_m64n64k32_rs_e4m3(d, a, b, scale_d);
    if constexpr (kN == 128) ptx::wgmma_m64n128k32_rs_e4m3(d, a, b, scale_d);
    if constexpr (kN == 192) ptx::wgmma_m64n192k32_rs_e4m3(d, a, b, scale_d);
    if constexpr (kN == 256) ptx::wgmma_m64n256k32_rs_e4m3(d, a, b, scale_d);
  }
};

// The key order of an e4m3 P V step. The A fragment of m64nNk32 wants, per thread, row r's columns 4q..4q+3 and
// 16+4q..19+4q of each 32-column slice (q = lane % 4; registers 1 and 3: row r + 8), while the m64nN accumulator S
// gives the thread row r's columns 8j + 2q + {0, 1}. to_a_fragments_e4m3 packs the thread's own values without a
// shuffle, so A column c of a slice holds S column (key) e4m3_pv_key(c): within every 16 keys the order is
// 0 1 8 9 2 3 10 11 4 5 12 13 6 7 14 15. B (V^T) must hold the same key in its column c. The in-shared-memory
// transpose of V (ldmatrix.trans of 8 x 8 b16 blocks, one byte permute per output word, stmatrix: design note,
// "V^T") yields exactly this order, so neither side needs a shuffle. Host and device (the tests use it).
__host__ __device__ constexpr int e4m3_pv_key(int c) {
  return (c & ~15) | (((c >> 2) & 3) << 1) | (c & 1) | (((c >> 1) & 1) << 3);
}

// A 64 x N fp32 fragment (P) as e4m3 A fragments of m64nNk32, one k32 slice per 32 columns, in the key order of
// e4m3_pv_key (no shuffle). Register k of slice kk: row f.row[k & 1], 4 keys of chunk pair (4 kk + 2 (k >> 1)).
template <int kElems>
__device__ __forceinline__ void to_a_fragments_e4m3(const float (&s)[kElems], uint32_t (&a)[kElems / 16][4]) {
  static_assert(kElems % 16 == 0, "whole k32 slices (32 columns = 16 accumulator values per thread)");
  using E = ElementE4M3;
#pragma unroll
  for (int kk = 0; kk < kElems / 16; ++kk) {
    const int b = 16 * kk;
    a[kk][0] = E::pack4(s[b + 0], s[b + 1], s[b + 4], s[b + 5]);
    a[kk][1] = E::pack4(s[b + 2], s[b + 3], s[b + 6], s[b + 7]);
    a[kk][2] = E::pack4(s[b + 8], s[b + 9], s[b + 12], s[b + 13]);
    a[kk][3] = E::pack4(s[b + 10], s[b + 11], s[b + 14], s[b + 15]);
  }
}

// A 64 x N fp32 fragment (P) in the register A-operand layout of m64nNk16: one k16 slice per 16 columns.
template <bool kIsFp16, int kElems>
__device__ __forceinline__ void to_a_fragments(const float (&s)[kElems], uint32_t (&a)[kElems / 8][4]) {
#pragma unroll
  for (int kk = 0; kk < kElems / 8; ++kk) {
    a[kk][0] = Element16<kIsFp16>::pack(s[8 * kk + 0], s[8 * kk + 1]);
    a[kk][1] = Element16<kIsFp16>::pack(s[8 * kk + 2], s[8 * kk + 3]);
    a[kk][2] = Element16<kIsFp16>::pack(s[8 * kk + 4], s[8 * kk + 5]);
    a[kk][3] = Element16<kIsFp16>::pack(s[8 * kk + 6], s[8 * kk + 7]);
  }
}

// Stores 64 columns of a 64 x N fragment, columns 64 kPart .. 64 kPart + 63 (fragment words 32 kPart ..), as 16-bit
// values into the 128B-swizzled 64 x 64 tile at shared address `tile` (the K-major operand layout, and the layout of
// a 64 x 64 TMA box), with four stmatrix.x4 per thread (16 scalar stores otherwise; docs/sparse-prefill.md,
// decision sparse-prefill-v4). No fence: the caller fences for the proxy that reads the tile.
//
// One stmatrix.x4 per 16 columns: matrices (rows 0-7, chunk 2c), (rows 8-15, chunk 2c), (rows 0-7, chunk 2c + 1),
// (rows 8-15, chunk 2c + 1) of the warp's 16 rows, i.e. fragment words (4j, 4j + 2) for j = 2c, 2c + 1. Lane l
// addresses row warp * 16 + 8 ((l / 8) & 1) + l % 8, chunk 2c + l / 16. Chunk 2c + h lands at 16-byte slot
// (2c + h) ^ (row & 7) = (h ^ (row & 7)) ^ 2c: the slot of chunk h, XOR 2c (bits 5-6 of the byte offset only).
template <bool kIsFp16, int kPart, int kElems>
__device__ __forceinline__ void stmatrix_tile(const float (&x)[kElems], uint32_t tile, int wg_tid) {
  static_assert((kPart + 1) * 32 <= kElems, "the fragment has no such 64 columns");
  const int lane = wg_tid % 32;
  const int row = (wg_tid / 32) * 16 + ((lane >> 3) & 1) * 8 + (lane & 7);
  const uint32_t base = tile + swizzled_chunk(row, lane >> 4);
  constexpr int h = 32 * kPart;
  using E = Element16<kIsFp16>;
#pragma unroll
  for (int c = 0; c < 4; ++c)
    ptx::stmatrix_x4(base ^ static_cast<uint32_t>(c << 5), E::pack(x[h + 8 * c + 0], x[h + 8 * c + 1]),
                     E::pack(x[h + 8 * c + 2], x[h + 8 * c + 3]), E::pack(x[h + 8 * c + 4], x[h + 8 * c + 5]),
                     E::pack(x[h + 8 * c + 6], x[h + 8 * c + 7]));
}

// stmatrix_tile<kIsFp16, 0> from a fragment already packed as A fragments (to_a_fragments of its first 64 columns: the
// same words), so the fp32 fragment need not stay alive until the store.
__device__ __forceinline__ void stmatrix_tile_packed(const uint32_t (&a)[4][4], uint32_t tile, int wg_tid) {
  const int lane = wg_tid % 32;
  const int row = (wg_tid / 32) * 16 + ((lane >> 3) & 1) * 8 + (lane & 7);
  const uint32_t base = tile + swizzled_chunk(row, lane >> 4);
#pragma unroll
  for (int c = 0; c < 4; ++c) ptx::stmatrix_x4(base ^ static_cast<uint32_t>(c << 5), a[c][0], a[c][1], a[c][2], a[c][3]);
}

// ---------------------------------------------------------------------------------------------------
// Issue loops (no fence, commit or wait unless named gemm_*: the kernel's pipeline places those)
// ---------------------------------------------------------------------------------------------------
// Desc policies: how a wgmma's descriptor is formed. base<kLbo>(p) is computed once per buffer from its shared address
// (kLbo: the distance to the next 64 columns, 16 for a K-major operand, one tile for an MN-major view); at(base, off)
// is the descriptor of the operand `off` bytes further. Each style is the one measured best for its kernels:
//   DescAddress: the full descriptor from the address per wgmma (make_smem_desc_sw128). No kernel uses it since dense
//       decode moved to DescUniform64 (docs/dense-decode.md, decision dense-v23); kept for A/Bs.
//   DescLowWord: the base is the descriptor's low word (mma_tile.cuh, desc_lo_*) and the offset >> 4 is added to it
//       (one 32-bit add per operand; the low word never carries, shared memory lies below 256 KB). Sparse prefill,
//       where the 64-bit form lengthened the consumer loop (docs/sparse-prefill.md, decision sparse-prefill-v8).
//   DescUniform64: the low word broadcast from lane 0 (so ptxas knows it warp-uniform and keeps it, and the add, on
//       the uniform datapath: no R2UR per wgmma), the offset added to the full 64-bit descriptor (one UIADD3.64 per
//       operand; adding to the low word made ptxas rewrite the constant high word per operand). Dense MHA prefill
//       (docs/mha-prefill.md, decisions mha-v0.13 and mha-v0.17) and dense decode (decision dense-v23).
inline constexpr uint32_t kLboKMajor = 16;
struct DescAddress {
  template <uint32_t kLbo>
  struct Base {
    const uint8_t* p;
  };
  template <uint32_t kLbo>
  __device__ __forceinline__ static Base<kLbo> base(const void* p) {
    return Base<kLbo>{static_cast<const uint8_t*>(p)};
  }
  template <uint32_t kLbo>
  __device__ __forceinline__ static uint64_t at(Base<kLbo> b, uint32_t off) {
    return ptx::make_smem_desc_sw128(ptx::smem_addr(b.p + off), kLbo, kSwizzleAtomBytes);
  }
};
struct DescLowWord {
  template <uint32_t kLbo>
  __device__ __forceinline__ static uint32_t base(const void* p) {
    return (ptx::smem_addr(p) >> 4) | ((kLbo >> 4) << 16);
  }
  __device__ __forceinline__ static uint64_t at(uint32_t lo, uint32_t off) { return desc_from_lo(lo + (off >> 4)); }
};
struct DescUniform64 {
  template <uint32_t kLbo>
  __device__ __forceinline__ static uint32_t base(const void* p) {
    return __shfl_sync(0xffffffffu, DescLowWord::base<kLbo>(p), 0);
  }
  __device__ __forceinline__ static uint64_t at(uint32_t lo, uint32_t off) { return desc_from_lo(lo) + (off >> 4); }
};

// S (+)= Q K^T over the four k16 slices of one 64-column tile `t` of Q and K (K-major, tiles kTileBytes apart; K's
// kKTileBytes apart when its tiles have another row count, as in the dense MHA backward's S^T = K Q^T): q / k are the
// Desc bases (base<kLboKMajor>) of the buffers' first tiles. `overwrite`: the first slice overwrites S.
template <bool kIsFp16, class Desc, int kN, int kTileBytes, class Base, int kKTileBytes = kTileBytes>
__device__ __forceinline__ void issue_qk_tile(float (&s)[kN / 2], Base q, Base k, int t, bool overwrite) {
#pragma unroll
  for (int kk = 0; kk < kRowBytes / 32; ++kk) {
    const uint32_t off = static_cast<uint32_t>(t * kTileBytes + kk * 32);
    const uint32_t k_off = static_cast<uint32_t>(t * kKTileBytes + kk * 32);
    Element16<kIsFp16>::template mma_ss<kN, 0>(s, Desc::at(q, off), Desc::at(k, k_off), (overwrite && kk == 0) ? 0 : 1);
  }
}

// O += P V over kSlices k16 slices (16 keys each): P from registers, V viewed MN-major from tiles of kTileBytes
// starting at `v` (slice kk starts kk * 16 rows in).
template <bool kIsFp16, class Desc, int kTileBytes, int kN, int kSlices>
__device__ __forceinline__ void issue_pv_rs(float (&o)[kN / 2], const uint32_t (&pa)[kSlices][4], const uint8_t* v) {
  const auto v_base = Desc::template base<kTileBytes>(v);
#pragma unroll
  for (int kk = 0; kk < kSlices; ++kk)
    Element16<kIsFp16>::template mma_rs<kN, 1>(o, pa[kk], Desc::at(v_base, kk * 16 * kRowBytes), 1);
}

// O += P V over kSlices k16 slices with P read from a K-major shared tile (the other warpgroup's).
template <bool kIsFp16, class Desc, int kTileBytes, int kN, int kSlices>
__device__ __forceinline__ void issue_pv_ss(float (&o)[kN / 2], const uint8_t* p_tile, const uint8_t* v) {
  const auto p_base = Desc::template base<kLboKMajor>(p_tile);
  const auto v_base = Desc::template base<kTileBytes>(v);
#pragma unroll
  for (int kk = 0; kk < kSlices; ++kk)
    Element16<kIsFp16>::template mma_ss<kN, 1>(o, Desc::at(p_base, kk * 32), Desc::at(v_base, kk * 16 * kRowBytes), 1);
}

// The seesaw's P V steps (docs/dense-decode.md, "Warp roles"; sparse prefill's too): each warpgroup owns a 64 x 256 O
// half, V_half is 4 tiles of 64 rows viewed MN-major, 64 keys (4 slices) a step. Each waits for its result.
// O_half += P V_half, P from registers.
template <bool kIsFp16, class Desc = DescAddress>
__device__ __forceinline__ void gemm_pv_rs(float (&o)[128], const uint32_t (&p)[4][4], const uint8_t* v_tiles) {
  ptx::wgmma_fence();
  issue_pv_rs<kIsFp16, Desc, kTileBytes, 256>(o, p, v_tiles);
  ptx::wgmma_commit();
  ptx::wgmma_wait<0>();
  ptx::fence_registers(o);
}

// O_half += P V_half with P read from shared memory (written by the other warpgroup).
template <bool kIsFp16, class Desc = DescAddress>
__device__ __forceinline__ void gemm_pv_ss(float (&o)[128], const uint8_t* p_tile, const uint8_t* v_tiles) {
  ptx::wgmma_fence();
  issue_pv_ss<kIsFp16, Desc, kTileBytes, 256, 4>(o, p_tile, v_tiles);
  ptx::wgmma_commit();
  ptx::wgmma_wait<0>();
  ptx::fence_registers(o);
}

}  // namespace openmla::kernels::tile
