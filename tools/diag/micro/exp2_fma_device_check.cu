// Device check of exp2_fma (src/kernels/mha_prefill/exp2_fma.h) on a Hopper GPU, to run beside the host check
// (exp2_fma_check.cpp): over every fp32 bit pattern x, the device's exp2_fma(x) against ex2.approx.ftz.f32(x), the
// MUFU path it replaces; and on a dense grid, the device's bits against the header's host form.
//
//   nvcc -std=c++20 -O3 -gencode=arch=compute_90a,code=sm_90a -I src tools/diag/micro/exp2_fma_device_check.cu \
//     -o /tmp/exp2_fma_device_check && /tmp/exp2_fma_device_check
//
// Over all 2^32 inputs below 128 (the domain; the kernel's arguments are <= 8): NaN exactly where ex2 gives NaN, +0
// exactly where ex2 gives +0 (x < -126 and -inf), elsewhere a relative difference below 1e-4 (the cubic's 7.5e-5 plus
// ex2.approx's 2 ulp). Exit status 0 when every check holds.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "kernels/mha_prefill/exp2_fma.h"

using openmla::kernels::mha_prefill::fp8::exp2_fma;

namespace {

struct Counts {
  unsigned long long checked, nan_mismatch, zero_mismatch, far, other_nonfinite;
  float worst_rel;
  uint32_t worst_bits;
};

__device__ float ex2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// One thread per bit pattern; the counters take one atomic per warp (events are rare, the checked count is a ballot).
__global__ void all_patterns(uint64_t begin, Counts* out) {
  const uint64_t i = begin + blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x;
  const uint32_t bits = static_cast<uint32_t>(i);
  const float x = __uint_as_float(bits);
  const bool in_domain = x < 128.f || isnan(x);  // not x >= 128 nor +inf
  bool nan_bad = false, zero_bad = false, far = false, other = false;
  float rel = 0.f;
  if (in_domain) {
    const float a = exp2_fma(x), b = ex2_ftz(x);
    if (isnan(a) != isnan(b)) {
      nan_bad = true;
    } else if (!isnan(a)) {
      if ((a == 0.f) != (b == 0.f) && x < -125.f) {
        zero_bad = true;  // at the flush: ex2.ftz flushes results below 2^-126, exp2_fma arguments below -126
      } else if (!isfinite(a) || !isfinite(b)) {
        other = true;
      } else if (b >= 1.17549435e-38f) {
        rel = fabsf(a / b - 1.f);
        far = rel > 1e-4f;
      }
    }
  }
  const unsigned lane = threadIdx.x % 32;
  const unsigned n_in = __popc(__ballot_sync(0xffffffffu, in_domain));
  const unsigned n_nan = __popc(__ballot_sync(0xffffffffu, nan_bad));
  const unsigned n_zero = __popc(__ballot_sync(0xffffffffu, zero_bad));
  const unsigned n_far = __popc(__ballot_sync(0xffffffffu, far));
  const unsigned n_other = __popc(__ballot_sync(0xffffffffu, other));
  const unsigned worst = __reduce_max_sync(0xffffffffu, __float_as_uint(rel));  // floats >= 0 order as their bits
  if (lane == 0) {
    if (n_in) atomicAdd(&out->checked, static_cast<unsigned long long>(n_in));
    if (n_nan) atomicAdd(&out->nan_mismatch, static_cast<unsigned long long>(n_nan));
    if (n_zero) atomicAdd(&out->zero_mismatch, static_cast<unsigned long long>(n_zero));
    if (n_far) atomicAdd(&out->far, static_cast<unsigned long long>(n_far));
    if (n_other) atomicAdd(&out->other_nonfinite, static_cast<unsigned long long>(n_other));
  }
  if (worst != 0u && __float_as_uint(rel) == worst) {
    const unsigned old = atomicMax(reinterpret_cast<unsigned*>(&out->worst_rel), worst);
    if (worst > old) out->worst_bits = bits;  // diagnostics only: a racing thread may leave another worst input
  }
}

__global__ void on_grid(const float* x, float* y, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = exp2_fma(x[i]);
}

uint32_t bits_of(float v) {
  uint32_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
}

}  // namespace

int main() {
  Counts* d = nullptr;
  cudaMalloc(&d, sizeof(Counts));
  cudaMemset(d, 0, sizeof(Counts));
  const uint64_t kChunk = uint64_t{1} << 30;
  for (uint64_t begin = 0; begin < (uint64_t{1} << 32); begin += kChunk)
    all_patterns<<<static_cast<unsigned>(kChunk / 256), 256>>>(begin, d);
  Counts c{};
  if (cudaMemcpy(&c, d, sizeof c, cudaMemcpyDeviceToHost) != cudaSuccess) {
    std::printf("CUDA error: %s\n", cudaGetErrorString(cudaGetLastError()));
    return 2;
  }
  float worst_x;
  std::memcpy(&worst_x, &c.worst_bits, sizeof worst_x);
  std::printf("all fp32 inputs below 128 and NaN: %llu checked; NaN differs from ex2.approx.ftz on %llu, zero on %llu "
              "(x < -125), other non-finite %llu; relative difference > 1e-4 on %llu; worst %.3e at x = %.9g\n",
              c.checked, c.nan_mismatch, c.zero_mismatch, c.other_nonfinite, c.far, c.worst_rel, worst_x);
  bool ok = c.nan_mismatch == 0 && c.other_nonfinite == 0 && c.far == 0;
  // The zero boundary: exp2_fma gives +0 below -126; ex2.ftz flushes results below 2^-126 (x < -126 as well, up to
  // its rounding at the boundary): a handful of inputs next to -126 may differ, none elsewhere.
  ok = ok && c.zero_mismatch <= 16;

  // The device's bits against the header's host form on every multiple of 2^-12 in [-130, 9].
  std::vector<float> xs;
  for (long k = -130L * 4096; k <= 9L * 4096; ++k)
    xs.push_back(static_cast<float>(std::ldexp(static_cast<double>(k), -12)));
  const int n = static_cast<int>(xs.size());
  float *dx = nullptr, *dy = nullptr;
  cudaMalloc(&dx, n * sizeof(float));
  cudaMalloc(&dy, n * sizeof(float));
  cudaMemcpy(dx, xs.data(), n * sizeof(float), cudaMemcpyHostToDevice);
  on_grid<<<(n + 255) / 256, 256>>>(dx, dy, n);
  std::vector<float> ys(n);
  cudaMemcpy(ys.data(), dy, n * sizeof(float), cudaMemcpyDeviceToHost);
  long differ = 0;
  for (int i = 0; i < n; ++i)
    if (bits_of(ys[i]) != bits_of(exp2_fma(xs[i]))) ++differ;
  std::printf("grid of %d values: device bits differ from the host form on %ld\n", n, differ);
  ok = ok && differ == 0;
  std::printf(ok ? "exp2_fma device check: ok\n" : "exp2_fma device check: FAILED\n");
  return ok ? 0 : 1;
}
