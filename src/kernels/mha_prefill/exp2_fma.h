// 2^x on the FMA pipe, for the FP8 dense MHA prefill forward (kernel_fp8.cuh): a share of each thread's exponentials
// of P leaves the MUFU (16 results per cycle per SM, shared by both consumer warpgroups) for the FP32 pipes (128 per
// cycle per SM), FlashAttention-4's split. P is rounded to e4m3 (unit roundoff 2^-4) before the P V GEMM, so a cubic
// is accurate enough: its relative error is below 7.5e-5 (2^-13.7), 830x below e4m3's unit roundoff.
//
// 2^x = 2^j p(f) with j = floor(x) and f = x - j in [0, 1):
//   - c = max(x, -127), NaN kept (max.NaN): below -127 the result is 0, as below -126 (the scale 2^j below);
//   - t = c + (1.5 x 2^23 + 127) rounded down: in [2^23, 2^24) the add rounds to an integer, so t = floor(c) + 1.5 x
//     2^23 + 127 exactly and t's low mantissa bits hold j + 127 in [0, 135] (for c < 128);
//   - j = t - (1.5 x 2^23 + 127) and f = c - j, both exact;
//   - p(f) by Horner (three FMAs), the cubic of least maximum relative error to 2^f on [0, 1] (Remez exchange; the
//     coefficients rounded to fp32);
//   - the scale 2^j: t's bits shifted left by 23 (the 1.5 x 2^23 and the exponent leave through the top, j + 127
//     lands in the exponent field, the mantissa is 0): 2^j for j >= -126, and +0 for j = -127;
//   - the result p(f) 2^j: one multiply (an integer add into p's exponent field would turn a NaN into a finite value).
// So x < -126 gives exactly +0 (as ex2.approx.ftz, whose results below 2^-126 flush to zero), -inf gives +0, NaN gives
// NaN. The domain is x < 128 (the kernel's arguments are <= 8 plus a rounding: p' = 2^(s c - m + 8)); +inf gives NaN
// (ex2: +inf), which the kernel cannot produce. One FMNMX, three FADD, three FFMA, one shift and one FMUL per value.
//
// Host and device: the host form computes the same values (the device's round-down add is floor(c) + the integer
// constant, exactly), for the check over a dense grid, tools/diag/micro/exp2_fma_check.cpp.
#pragma once

#include <cstdint>
#include <cstring>

#if !defined(__CUDA_ARCH__)
#include <cmath>
#endif

#if defined(__CUDACC__)
#define OPENMLA_EXP2_FMA_FN __host__ __device__ __forceinline__
#else
#define OPENMLA_EXP2_FMA_FN inline
#endif

namespace openmla::kernels::mha_prefill::fp8 {

struct Exp2Fma {
  // p(f) = kC0 + kC1 f + kC2 f^2 + kC3 f^3: max |p(f) / 2^f - 1| = 7.48e-5 on [0, 1] (fp32 coefficients).
  static constexpr float kC0 = 0.99992519617080688f;
  static constexpr float kC1 = 0.69583356380462646f;
  static constexpr float kC2 = 0.22606715559959412f;
  static constexpr float kC3 = 0.078024521470069885f;
  static constexpr float kRound = 12583039.f;  // 1.5 x 2^23 + 127
  static constexpr float kLow = -127.f;
};

OPENMLA_EXP2_FMA_FN float exp2_fma(float x) {
  using E = Exp2Fma;
  float c, t, j, f, p;
#if defined(__CUDA_ARCH__)
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(c) : "f"(x), "f"(E::kLow));
  t = __fadd_rd(c, E::kRound);
  j = __fsub_rn(t, E::kRound);
  f = __fsub_rn(c, j);
  p = fmaf(E::kC3, f, E::kC2);
  p = fmaf(p, f, E::kC1);
  p = fmaf(p, f, E::kC0);
  const float scale = __int_as_float(__float_as_int(t) << 23);
  return __fmul_rn(p, scale);
#else
  c = std::isnan(x) ? x : (x < E::kLow ? E::kLow : x);
  t = E::kRound + std::floor(c);  // exact: the device's round-down add
  j = t - E::kRound;
  f = c - j;
  p = std::fma(E::kC3, f, E::kC2);
  p = std::fma(p, f, E::kC1);
  p = std::fma(p, f, E::kC0);
  uint32_t bits;
  std::memcpy(&bits, &t, sizeof bits);
  bits <<= 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
#endif
}

}  // namespace openmla::kernels::mha_prefill::fp8
