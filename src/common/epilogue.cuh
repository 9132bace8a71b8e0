// The end of an attention row in the MLA kernels: the final normalisation, the log-sum-exp, the attention sink, and
// the bf16 row store straight from the accumulators. Shared where the kernels compute the same thing (the layer:
// docs/architecture.md, "Device layer"; the numerics: docs/dense-decode.md, "Masking and numerics", and
// docs/sparse-decode.md, "What it computes"):
//
//   total = the row sum (both warpgroups' parts, quad-reduced); a row is empty when total is not > 0 (no visible
//           key; also a NaN total): out = 0, lse = +inf for a final row, -inf (base 2) for a split chunk's partial.
//           (The dense MHA prefill follows its torch reference instead: only total == 0 is empty, a NaN propagates;
//           is_keyless_row.)
//   out   = O / (total [+ 2^(sink * log2 e - m)])        the sink only enters a final row's denominator
//   lse   = (m + log2 total) * ln 2                     natural log, never changed by the sink
//
// How each kernel gets its rows out differs and stays with it: dense decode stages them in shared memory and sends
// them by bulk copies; sparse decode, sparse prefill and the dense MHA prefill's direct-store kernel store 16-bit
// rows from the registers through a quad transpose (store_row), the MHA prefill's staged kernel through
// tile::stmatrix_tile and TMA, and the fp32 partials of sparse decode go by 8-byte stores.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "common/mma_tile.cuh"
#include "common/ptx.cuh"
#include "common/tile_gemm.cuh"

namespace openmla::kernels::epilogue {

inline constexpr float kLn2 = 0.69314718055994531f;   // natural log of a base-2 lse
inline constexpr float kLog2e = 1.4426950408889634f;  // base-2 units of a natural-log value (the sink)

// A row with no visible key (or a NaN sum) gives out = 0 and an infinite lse.
__device__ __forceinline__ bool is_empty_row(float total) { return !(total > 0.f); }
// The dense MHA prefill's test: a row with a visible key has total >= 1 (its max contributes 2^0), so only a row
// without keys has total == 0; a NaN sum (NaN in the inputs) is not empty and propagates to out and lse, as in the
// torch reference.
__device__ __forceinline__ bool is_keyless_row(float total) { return total == 0.f; }

// The row's lse in base 2 from its running max m (scaled base-2 units) and its sum relative to m (> 0).
__device__ __forceinline__ float lse_log2(float m, float total) { return m + log2f(total); }

// The lse a final row stores: natural log, +inf for an empty row.
__device__ __forceinline__ float final_lse(bool empty, float lse2) { return empty ? INFINITY : lse2 * kLn2; }

// The sink's term in a final row's denominator, relative to the row's running max m: 2^(sink * log2 e - m), with
// the sink in natural-log units (+-inf allowed: 0 or +inf).
__device__ __forceinline__ float sink_term(float sink, float m) { return ptx::exp2_approx(sink * kLog2e - m); }

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) { return tile::Element16<false>::pack(lo, hi); }

// Stores row i (0 or 1) of this thread's two rows of a 64 x N O fragment (already normalised) as 16-bit values
// (kIsFp16: fp16, else bf16) into `out_row` (the row's first column, bytes), columns col_base .. col_base + N - 1, by
// 16-byte stores: a 4 x 4 word transpose across the quad (lane q4 = lane % 4) first gives each lane 8 contiguous
// columns, so a warp instruction writes 8 rows x 64 contiguous bytes (docs/sparse-decode.md, decision sparse-v15).
// kStreaming: st.global.cs (the output is not read again by this kernel; sparse prefill, decision sparse-prefill-v7).
// Every lane of the warp must take part (shuffles); `live` = false (a row past the valid rows, the same for the whole
// quad) only skips the stores. out_row must be 16-byte aligned.
template <bool kIsFp16, bool kStreaming, int kElems>
__device__ __forceinline__ void store_row(const float (&o)[kElems], int i, int q4, uint8_t* out_row, int col_base,
                                          bool live) {
  static_assert(kElems % 16 == 0, "whole 32-column groups: each lane stores 8 columns of every 32");
#pragma unroll
  for (int m = 0; m < kElems / 16; ++m) {
    uint32_t v[4];
#pragma unroll
    for (int k = 0; k < 4; ++k)
      v[k] = tile::Element16<kIsFp16>::pack(o[(4 * m + k) * 4 + 2 * i], o[(4 * m + k) * 4 + 2 * i + 1]);
    tile::quad_transpose4(v, q4);
    if (live) {
      uint8_t* dst = out_row + (col_base + (4 * m + q4) * 8) * 2;
      if constexpr (kStreaming)
        ptx::st_global_cs(dst, make_uint4(v[0], v[1], v[2], v[3]));
      else
        *reinterpret_cast<uint4*>(dst) = make_uint4(v[0], v[1], v[2], v[3]);
    }
  }
}

}  // namespace openmla::kernels::epilogue
