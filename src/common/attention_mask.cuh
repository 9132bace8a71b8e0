// Masking a 64 x N logit fragment (tile::Fragment's view of a wgmma m64nN accumulator: element j * 4 + 2 i + e is row
// f.row[i], column 8 j + f.col + e): the logits of keys a row must not see become -inf, overwritten, never added to
// (a zero-filled key's logit is 0, not -inf). The softmax then gives them exactly 0. The layer: docs/architecture.md,
// "Device layer".
#pragma once

#include <cstdint>

namespace openmla::kernels::mask {

// Keys past a per-row limit (the varlen / bottom-right causal mask, varlen.h row_key_limit): limit[i] is the last key
// row i sees; the element of column c holds key n0 + c; `col` is the fragment's f.col.
template <int kElems>
__device__ __forceinline__ void by_key_limit(float (&s)[kElems], const int (&limit)[2], int n0, int col) {
  const int t0 = limit[0] - n0 - col, t1 = limit[1] - n0 - col;
#pragma unroll
  for (int j = 0; j < kElems / 4; ++j) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      if (8 * j + e > t0) s[j * 4 + e] = -INFINITY;
      if (8 * j + e > t1) s[j * 4 + 2 + e] = -INFINITY;
    }
  }
}

// Keys whose bit is clear in a 64-bit validity mask of a 64-key block (the same for every row: sparse top-k slots
// without a token). Shifted right by `col`, the bit of column j * 8 + col + e is the constant bit j * 8 + e (no
// per-thread 64-bit masks for ptxas to hoist). A full block (the common case) skips the work.
__device__ __forceinline__ void by_valid_bits(float (&s)[32], uint64_t valid, int col) {
  if (valid == ~0ull) return;
  valid >>= col;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      if (((valid >> (j * 8 + e)) & 1ull) == 0) {
        s[j * 4 + e] = -INFINITY;
        s[j * 4 + 2 + e] = -INFINITY;
      }
    }
  }
}

}  // namespace openmla::kernels::mask
