// FP8 e4m3 -> bf16 dequantisation of the cache layouts' NoPE bytes (docs/kv-cache-formats.md, "Dequantisation"),
// in registers, exact for every scale the codec writes (powers of two). Device only.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace openmla::kernels::fp8_dequant {

// Two e4m3 bytes of `w` (picked by the prmt selector `sel`) -> a bf16x2 word of value * 2^-120, exactly: the e4m3
// exponent and mantissa moved into the bf16 fields are the same number read with bias 127 instead of 7 (e4m3
// subnormals land on bf16 subnormals with the same factor). The selector's sign-replicating nibbles (8 | byte) fill
// the byte above each value with its sign, which the shift brings to bit 15.
__device__ __forceinline__ uint32_t e4m3x2_to_bf16x2_times_2m120(uint32_t w, uint32_t sel) {
  uint32_t x;
  asm("prmt.b32 %0, %1, 0, %2;" : "=r"(x) : "r"(w), "r"(sel));
  return (x << 4) & 0x87F087F0u;
}

__device__ __forceinline__ uint32_t hmul_bf16x2(uint32_t a, __nv_bfloat162 b) {
  __nv_bfloat162 r = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&a), b);
  return *reinterpret_cast<const uint32_t*>(&r);
}

// The bf16 multipliers taking value * 2^-120 to value * scale: one (scale * 2^120) when it fits bf16 (scale <= 2^7),
// else 2^120 then scale. Exact when scale is a power of two; a NaN scale takes the two-step path and propagates.
struct Multiplier {
  __nv_bfloat162 first;
  __nv_bfloat162 second;
  bool two;
};

__device__ __forceinline__ Multiplier make_multiplier(float scale) {
  constexpr float k2p120 = 1.329227995784916e36f;
  Multiplier m;
  m.two = !(scale <= 128.f);
  m.first = __float2bfloat162_rn(m.two ? k2p120 : scale * k2p120);
  m.second = __float2bfloat162_rn(scale);
  return m;
}

// 16 e4m3 values (dims in order) -> 16 bf16 in two 16-byte chunks.
__device__ __forceinline__ void dequant16(const uint4& raw, float scale, uint4& lo, uint4& hi) {
  const Multiplier m = make_multiplier(scale);
  const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
  uint32_t o[8];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    o[2 * i] = hmul_bf16x2(e4m3x2_to_bf16x2_times_2m120(w[i], 0x9180u), m.first);
    o[2 * i + 1] = hmul_bf16x2(e4m3x2_to_bf16x2_times_2m120(w[i], 0xB3A2u), m.first);
  }
  if (m.two) {
#pragma unroll
    for (int i = 0; i < 8; ++i) o[i] = hmul_bf16x2(o[i], m.second);
  }
  lo = make_uint4(o[0], o[1], o[2], o[3]);
  hi = make_uint4(o[4], o[5], o[6], o[7]);
}

// A MODEL1 UE8M0 scale byte as the codec defines it: 2^(e - 127); 0x00 is the subnormal 2^-127, 0xFF is NaN.
__device__ __forceinline__ float ue8m0_to_float(uint32_t e) {
  return __uint_as_float(e == 0xFFu ? 0x7FC00000u : (e == 0u ? 0x00400000u : e << 23));
}

}  // namespace openmla::kernels::fp8_dequant
