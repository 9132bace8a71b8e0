// Device building blocks shared by the attention kernels (decode and prefill): the 128B-swizzled K-major tile
// convention (addressing and wgmma descriptors), the per-thread view of a wgmma m64nN accumulator of any width N, and
// the online-softmax row operations on it (every operation takes the fragment as float[N / 2]).
#pragma once

#include <cstdint>

#include "common/ptx.cuh"

namespace openmla::kernels::tile {

inline constexpr int kTileRows = 64;
inline constexpr int kRowBytes = 128;                        // 64 x 16-bit
inline constexpr int kTileBytes = kTileRows * kRowBytes;     // 8192
inline constexpr int kSwizzleAtomBytes = 1024;               // 8 rows x 128 B

// K-major operand (Q, K, P): rows of 128 B, 8-row swizzle atoms 1024 B apart (SBO); LBO unused.
__device__ __forceinline__ uint64_t desc_k_major(const void* p) {
  return ptx::make_smem_desc_sw128(ptx::smem_addr(p), 16, kSwizzleAtomBytes);
}
// MN-major operand (V viewed from the K tiles): 64 columns per tile, next 64 columns one tile (LBO) away,
// next 8 rows one swizzle atom (SBO) away.
__device__ __forceinline__ uint64_t desc_mn_major(const void* p) {
  return ptx::make_smem_desc_sw128(ptx::smem_addr(p), kTileBytes, kSwizzleAtomBytes);
}
// The descriptor whose low word is `lo`: (start address >> 4) in bits 0-13, LBO >> 4 in bits 16-29 (the high word: SBO
// one swizzle atom, 128B swizzle). The issue loops of common/tile_gemm.cuh form descriptors from low words (DescLowWord,
// DescUniform64): moving the start by a byte offset `off` inside a buffer adds off >> 4 to the low word without a carry
// (shared memory lies below 256 KB), one add per wgmma instead of an address computation, a mask and a shift.
__device__ __forceinline__ uint64_t desc_from_lo(uint32_t lo) {
  constexpr uint32_t kHi = (kSwizzleAtomBytes >> 4) | (1u << 30);  // SBO; 128B swizzle (bit 62)
  return (static_cast<uint64_t>(kHi) << 32) | lo;
}
// Byte offset of 16-byte chunk `chunk` (0..7) of row `row`, and of element (row, col), in one tile.
__device__ __forceinline__ uint32_t swizzled_chunk(int row, int chunk) {
  return static_cast<uint32_t>(row * kRowBytes + ((chunk ^ (row & 7)) << 4));
}
__device__ __forceinline__ int swizzled_offset(int row, int col) {
  return row * kRowBytes + ((((col >> 3) ^ (row & 7)) << 4) | ((col & 7) << 1));
}

// Per-thread view of a wgmma m64nN accumulator: rows row0 and row0 + 8, column pairs 8j + 2*(lane % 4).
struct Fragment {
  int row[2];
  int col;  // column of the first element of chunk j = 0
};

__device__ __forceinline__ Fragment make_fragment(int wg_tid) {
  const int warp = wg_tid / 32, lane = wg_tid % 32;
  Fragment f;
  f.row[0] = warp * 16 + lane / 4;
  f.row[1] = f.row[0] + 8;
  f.col = (lane % 4) * 2;
  return f;
}

__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffff, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffff, v, 1);
  return v + __shfl_xor_sync(0xffffffff, v, 2);
}

// 4 x 4 transpose across the quad (lanes 4g..4g+3): on entry lane q holds v[k] = M[q][k], on return
// v[k] = M[k][q]. Two butterfly rounds of two shuffles; every lane of the warp must take part.
__device__ __forceinline__ void quad_transpose4(uint32_t (&v)[4], int q) {
  const bool hi2 = (q & 2) != 0;  // round 1: swap the off-diagonal 2 x 2 blocks with lane q ^ 2
  uint32_t r0 = __shfl_xor_sync(0xffffffff, hi2 ? v[0] : v[2], 2);
  uint32_t r1 = __shfl_xor_sync(0xffffffff, hi2 ? v[1] : v[3], 2);
  if (hi2) { v[0] = r0; v[1] = r1; } else { v[2] = r0; v[3] = r1; }
  const bool hi1 = (q & 1) != 0;  // round 2: swap inside the 2 x 2 blocks with lane q ^ 1
  r0 = __shfl_xor_sync(0xffffffff, hi1 ? v[0] : v[1], 1);
  r1 = __shfl_xor_sync(0xffffffff, hi1 ? v[2] : v[3], 1);
  if (hi1) { v[0] = r0; v[2] = r1; } else { v[1] = r0; v[3] = r1; }
}

// Row maxima of a 64 x N S fragment (N / 2 floats per thread: 32 for N = 64, 64 for N = 128; both rows of this
// thread), reduced over the quad.
template <int kElems>
__device__ __forceinline__ void row_max(const float (&s)[kElems], float (&mx)[2]) {
  static_assert(kElems % 4 == 0, "an m64nN accumulator fragment holds N / 2 floats per thread");
  mx[0] = mx[1] = -INFINITY;
#pragma unroll
  for (int j = 0; j < kElems / 4; ++j) {
    mx[0] = fmaxf(mx[0], fmaxf(s[j * 4 + 0], s[j * 4 + 1]));
    mx[1] = fmaxf(mx[1], fmaxf(s[j * 4 + 2], s[j * 4 + 3]));
  }
  mx[0] = quad_max(mx[0]);
  mx[1] = quad_max(mx[1]);
}

// Row maxima as a tree: per row, pairwise FMNMX levels (5 for N = 128, 4 for N = 64) instead of row_max's chain of
// N / 8 dependent ones, then the quad reduction. The same value as row_max (max is exact and associative); a kernel
// whose softmax chain starts with the row max takes this one (docs/mha-prefill.md, decision mha-v0.16), the decode
// kernels keep the chain (their SASS is the guard's: docs/architecture.md, "Device layer"). N = 192 (the FP8
// forward's 192-key blocks) first folds chunks 16-23 onto 0-7, then continues as N = 128 (6 levels).
template <int kElems>
__device__ __forceinline__ void row_max_tree(const float (&s)[kElems], float (&mx)[2]) {
  constexpr int kChunks = kElems / 4;  // 8-column chunks
  static_assert(kChunks == 8 || kChunks == 16 || kChunks == 24 || kChunks == 32,
                "the tree folds halves down to 4: N = 64, 128, 192, 256");
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float t[kChunks];
#pragma unroll
    for (int j = 0; j < kChunks; ++j) t[j] = fmaxf(s[j * 4 + 2 * i], s[j * 4 + 2 * i + 1]);
    if constexpr (kChunks == 24) {
#pragma unroll
      for (int j = 0; j < 8; ++j) t[j] = fmaxf(t[j], t[j + 16]);
    }
    if constexpr (kChunks >= 32) {
#pragma unroll
      for (int j = 0; j < 16; ++j) t[j] = fmaxf(t[j], t[j + 16]);
    }
    if constexpr (kChunks >= 16) {
#pragma unroll
      for (int j = 0; j < 8; ++j) t[j] = fmaxf(t[j], t[j + 8]);
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) t[j] = fmaxf(t[j], t[j + 4]);
    mx[i] = quad_max(fmaxf(fmaxf(t[0], t[2]), fmaxf(t[1], t[3])));
  }
}

// s <- 2^(s * scale_log2 - m) over a 64 x N fragment (N / 2 floats per thread); returns this thread's partial row
// sums (accumulated in column order).
template <int kElems>
__device__ __forceinline__ void exponentiate(float (&s)[kElems], float scale_log2, const float (&m)[2],
                                             float (&sum)[2]) {
  static_assert(kElems % 4 == 0, "an m64nN accumulator fragment holds N / 2 floats per thread");
  sum[0] = sum[1] = 0.f;
#pragma unroll
  for (int j = 0; j < kElems / 4; ++j) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      s[j * 4 + e] = ptx::exp2_approx(fmaf(s[j * 4 + e], scale_log2, -m[0]));
      s[j * 4 + 2 + e] = ptx::exp2_approx(fmaf(s[j * 4 + 2 + e], scale_log2, -m[1]));
      sum[0] += s[j * 4 + e];
      sum[1] += s[j * 4 + 2 + e];
    }
  }
}

// Multiplies the two rows of a 64 x N fragment (S, P or O) by a0 / a1.
template <int kElems>
__device__ __forceinline__ void scale_rows(float (&x)[kElems], float a0, float a1) {
  static_assert(kElems % 4 == 0, "an m64nN accumulator fragment holds N / 2 floats per thread");
#pragma unroll
  for (int j = 0; j < kElems / 4; ++j) {
    x[j * 4 + 0] *= a0;
    x[j * 4 + 1] *= a0;
    x[j * 4 + 2] *= a1;
    x[j * 4 + 3] *= a1;
  }
}

// scale_rows unless every row of the warp keeps its scale (a == 1 exactly: the running max did not move, the common
// case once it has settled). Exact either way; a warp-level decision (a vote, then plain FMULs).
template <int kElems>
__device__ __forceinline__ void scale_rows_if_changed(float (&x)[kElems], float a0, float a1) {
  if (__any_sync(0xffffffffu, a0 != 1.f || a1 != 1.f)) scale_rows(x, a0, a1);
}

}  // namespace openmla::kernels::tile
