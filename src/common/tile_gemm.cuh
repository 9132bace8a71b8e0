// The P V steps of a 64-row attention tile split by columns between two warpgroups (the "seesaw" of dense decode,
// also sparse prefill's: docs/dense-decode.md, "Warp roles"), for bf16 or fp16 operands: the element glue (packing
// and the wgmma shapes the tile uses), P as register A fragments, P stored as a swizzled shared tile for the other
// warpgroup, and O_half += P V_half with P from registers or from shared memory. Each warpgroup owns a 64 x 256 O
// half; V is the MN-major view of 4 K tiles. Q K^T stays with each kernel: how it waits for its tiles is the
// kernel's pipeline (the layer: docs/architecture.md, "Device layer").
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/mma_tile.cuh"
#include "common/ptx.cuh"

namespace openmla::kernels::tile {

// The element type of Q, K, V and P: bf16 (false) or fp16 (true).
template <bool kIsFp16>
struct Element16;

template <>
struct Element16<false> {
  __device__ static uint32_t pack(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
  template <int kTransB>
  __device__ static void mma_qk(float (&d)[32], uint64_t a, uint64_t b, int scale_d) {
    ptx::wgmma_m64n64k16_ss_bf16<kTransB>(d, a, b, scale_d);
  }
  __device__ static void mma_pv_rs(float (&d)[128], const uint32_t (&a)[4], uint64_t b) {
    ptx::wgmma_m64n256k16_rs_bf16<1>(d, a, b, 1);
  }
  __device__ static void mma_pv_ss(float (&d)[128], uint64_t a, uint64_t b) {
    ptx::wgmma_m64n256k16_ss_bf16<1>(d, a, b, 1);
  }
};

template <>
struct Element16<true> {
  __device__ static uint32_t pack(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
  template <int kTransB>
  __device__ static void mma_qk(float (&d)[32], uint64_t a, uint64_t b, int scale_d) {
    ptx::wgmma_m64n64k16_ss_f16<kTransB>(d, a, b, scale_d);
  }
  __device__ static void mma_pv_rs(float (&d)[128], const uint32_t (&a)[4], uint64_t b) {
    ptx::wgmma_m64n256k16_rs_f16<1>(d, a, b, 1);
  }
  __device__ static void mma_pv_ss(float (&d)[128], uint64_t a, uint64_t b) {
    ptx::wgmma_m64n256k16_ss_f16<1>(d, a, b, 1);
  }
};

// The 64 x 64 P tile in the register A-operand layout of m64nNk16 (four k16 slices).
template <bool kIsFp16>
__device__ __forceinline__ void to_a_fragments(const float (&s)[32], uint32_t (&a)[4][4]) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    a[kk][0] = Element16<kIsFp16>::pack(s[8 * kk + 0], s[8 * kk + 1]);
    a[kk][1] = Element16<kIsFp16>::pack(s[8 * kk + 2], s[8 * kk + 3]);
    a[kk][2] = Element16<kIsFp16>::pack(s[8 * kk + 4], s[8 * kk + 5]);
    a[kk][3] = Element16<kIsFp16>::pack(s[8 * kk + 6], s[8 * kk + 7]);
  }
}

// Stores P (16-bit) into a 128B-swizzled 64 x 64 tile for the other warpgroup's shared-A wgmma, and fences the
// stores for the async proxy (the hand-off barrier that follows publishes them).
template <bool kIsFp16>
__device__ __forceinline__ void store_p(const float (&s)[32], uint8_t* tile, const Fragment& f) {
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int col = j * 8 + f.col;
    *reinterpret_cast<uint32_t*>(tile + swizzled_offset(f.row[0], col)) = Element16<kIsFp16>::pack(s[j * 4 + 0], s[j * 4 + 1]);
    *reinterpret_cast<uint32_t*>(tile + swizzled_offset(f.row[1], col)) = Element16<kIsFp16>::pack(s[j * 4 + 2], s[j * 4 + 3]);
  }
  ptx::fence_proxy_async_shared();
}

// O_half += P V_half over 64 tokens: P from registers, V = 4 tiles viewed MN-major. Waits for the result.
template <bool kIsFp16>
__device__ __forceinline__ void gemm_pv_rs(float (&o)[128], const uint32_t (&p)[4][4], const uint8_t* v_tiles) {
  ptx::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) Element16<kIsFp16>::mma_pv_rs(o, p[kk], desc_mn_major(v_tiles + kk * 16 * kRowBytes));
  ptx::wgmma_commit();
  ptx::wgmma_wait<0>();
  ptx::fence_registers(o);
}

// O_half += P V_half with P read from shared memory (written by the other warpgroup). Waits for the result.
template <bool kIsFp16>
__device__ __forceinline__ void gemm_pv_ss(float (&o)[128], const uint8_t* p_tile, const uint8_t* v_tiles) {
  ptx::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
    Element16<kIsFp16>::mma_pv_ss(o, desc_k_major(p_tile + kk * 32), desc_mn_major(v_tiles + kk * 16 * kRowBytes));
  ptx::wgmma_commit();
  ptx::wgmma_wait<0>();
  ptx::fence_registers(o);
}

}  // namespace openmla::kernels::tile
