// Question: do the e4m3 wgmma wrappers (common/wgmma_ops.cuh, tools/gen_wgmma.py) and the FP8 element glue
// (common/tile_gemm.cuh: ElementE4M3, to_a_fragments_e4m3, e4m3_pv_key) compute what the design note says
// (docs/fp8-prefill-design.md, "The e4m3 GEMM steps")?
//
// Not built by default. Two uses:
//   compile only (no GPU): tools/diag/micro/fp8_wgmma_probe.sh -- nvcc for sm_90a, then cuobjdump: one
//     HGMMA.64xNx32.F32.E4M3.E4M3 per wrapper (SS and RS, N = 64, 128, 192, 256) and the F2FP packs;
//   on a Hopper GPU: the same binary run, ./fp8_wgmma_probe -- each kernel against a host product in double:
//     SS: D = A B^T over 4 k32 slices (A 64 x 128, B N x 128, K-major, 128B-swizzled, e4m3 values);
//     RS: P (64 x 128 fp32, in accumulator layout) packed by to_a_fragments_e4m3, times V^T whose column c holds key
//         e4m3_pv_key(c): D must equal round_e4m3(P) V. A wrong fragment layout or key order gives errors of the
//         size of the values; a right one, the tensor pipe's own rounding: e4m3 wgmma adds its products with fewer
//         bits than fp32 (measured on an H100: 2-4e-4 of the largest value for 128-deep products, about 2^-12).
// Build: nvcc -O3 -arch=sm_90a -std=c++17 -I src -o /tmp/fp8_wgmma_probe tools/diag/micro/fp8_wgmma_probe.cu
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "common/tile_gemm.cuh"

namespace {

using openmla::kernels::tile::ElementE4M3;
using openmla::kernels::tile::e4m3_pv_key;
using openmla::kernels::tile::make_fragment;

constexpr int kM = 64;         // rows of A (one warpgroup)
constexpr int kK = 128;        // K extent: one 128-byte swizzled row, 4 k32 slices
constexpr int kRowBytes = 128;

// Byte offset of element (row, k) of a K-major 128B-swizzled operand with 128-byte rows (the library's convention).
__host__ __device__ inline int swz(int row, int k) { return row * kRowBytes + ((((k >> 4) ^ (row & 7)) << 4) | (k & 15)); }

template <int kN>
__global__ void __launch_bounds__(128, 1) probe_ss(const uint8_t* a_g, const uint8_t* b_g, float* d_g) {
  __shared__ __align__(1024) uint8_t a_s[kM * kRowBytes];
  __shared__ __align__(1024) uint8_t b_s[kN * kRowBytes];
  const int tid = threadIdx.x;
  for (int i = tid; i < kM * kK; i += 128) a_s[swz(i / kK, i % kK)] = a_g[i];
  for (int i = tid; i < kN * kK; i += 128) b_s[swz(i / kK, i % kK)] = b_g[i];
  openmla::ptx::fence_proxy_async_shared();
  __syncthreads();
  float d[kN / 2];
#pragma unroll
  for (int i = 0; i < kN / 2; ++i) d[i] = 0.f;
  openmla::ptx::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kK / ElementE4M3::kSliceK; ++kk)
    ElementE4M3::mma_ss<kN>(d, openmla::kernels::tile::desc_k_major(a_s + kk * ElementE4M3::kSliceBytes),
                            openmla::kernels::tile::desc_k_major(b_s + kk * ElementE4M3::kSliceBytes), kk > 0);
  openmla::ptx::wgmma_commit();
  openmla::ptx::wgmma_wait<0>();
  openmla::ptx::fence_registers(d);
  const auto f = make_fragment(tid);
#pragma unroll
  for (int j = 0; j < kN / 8; ++j)
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int e = 0; e < 2; ++e) d_g[f.row[i] * kN + 8 * j + f.col + e] = d[j * 4 + 2 * i + e];
}

// p_g: P (64 x 128 fp32, row-major); vt_g: V^T (kN x 128 e4m3, row n = output column, column c = key e4m3_pv_key(c)).
template <int kN>
__global__ void __launch_bounds__(128, 1) probe_rs(const float* p_g, const uint8_t* vt_g, float* d_g) {
  __shared__ __align__(1024) uint8_t b_s[kN * kRowBytes];
  const int tid = threadIdx.x;
  for (int i = tid; i < kN * kK; i += 128) b_s[swz(i / kK, i % kK)] = vt_g[i];
  openmla::ptx::fence_proxy_async_shared();
  __syncthreads();
  const auto f = make_fragment(tid);
  float s[kK / 2];  // P in the m64n128 accumulator layout
#pragma unroll
  for (int j = 0; j < kK / 8; ++j)
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int e = 0; e < 2; ++e) s[j * 4 + 2 * i + e] = p_g[f.row[i] * kK + 8 * j + f.col + e];
  uint32_t pa[kK / 32][4];
  openmla::kernels::tile::to_a_fragments_e4m3(s, pa);
  float d[kN / 2];
#pragma unroll
  for (int i = 0; i < kN / 2; ++i) d[i] = 0.f;
  openmla::ptx::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kK / ElementE4M3::kSliceK; ++kk)
    ElementE4M3::mma_rs<kN>(d, pa[kk], openmla::kernels::tile::desc_k_major(b_s + kk * ElementE4M3::kSliceBytes), 1);
  openmla::ptx::wgmma_commit();
  openmla::ptx::wgmma_wait<0>();
  openmla::ptx::fence_registers(d);
  openmla::ptx::fence_registers(pa);
#pragma unroll
  for (int j = 0; j < kN / 8; ++j)
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int e = 0; e < 2; ++e) d_g[f.row[i] * kN + 8 * j + f.col + e] = d[j * 4 + 2 * i + e];
}

float e4m3_to_float(uint8_t b) {
  __nv_fp8_e4m3 v;
  v.__x = b;
  return static_cast<float>(v);
}
uint8_t float_to_e4m3(float x) { return __nv_fp8_e4m3(x).__x; }

// Returns the largest |D - ref| / (max |ref| + 1e-30) of one kernel run.
template <int kN>
double run_ss(std::mt19937& rng) {
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<uint8_t> a(kM * kK), b(kN * kK);
  for (auto& x : a) x = float_to_e4m3(nd(rng));
  for (auto& x : b) x = float_to_e4m3(nd(rng));
  uint8_t *a_d, *b_d;
  float* d_d;
  cudaMalloc(&a_d, a.size());
  cudaMalloc(&b_d, b.size());
  cudaMalloc(&d_d, kM * kN * sizeof(float));
  cudaMemcpy(a_d, a.data(), a.size(), cudaMemcpyHostToDevice);
  cudaMemcpy(b_d, b.data(), b.size(), cudaMemcpyHostToDevice);
  probe_ss<kN><<<1, 128>>>(a_d, b_d, d_d);
  std::vector<float> d(kM * kN);
  cudaMemcpy(d.data(), d_d, d.size() * sizeof(float), cudaMemcpyDeviceToHost);
  cudaFree(a_d), cudaFree(b_d), cudaFree(d_d);
  double worst = 0, scale = 0;
  std::vector<double> ref(kM * kN);
  for (int m = 0; m < kM; ++m)
    for (int n = 0; n < kN; ++n) {
      double acc = 0;
      for (int k = 0; k < kK; ++k) acc += double(e4m3_to_float(a[m * kK + k])) * e4m3_to_float(b[n * kK + k]);
      ref[m * kN + n] = acc;
      scale = std::fmax(scale, std::fabs(acc));
    }
  for (int i = 0; i < kM * kN; ++i) worst = std::fmax(worst, std::fabs(d[i] - ref[i]));
  return worst / (scale + 1e-30);
}

template <int kN>
double run_rs(std::mt19937& rng) {
  std::uniform_real_distribution<float> ud(0.f, 256.f);  // P after the softmax's 2^8 offset (design note)
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> p(kM * kK);
  std::vector<uint8_t> v(kK * kN), vt(kN * kK);  // V: key-major (key, n); V^T in the permuted key order
  for (auto& x : p) x = ud(rng);
  for (auto& x : v) x = float_to_e4m3(nd(rng));
  for (int n = 0; n < kN; ++n)
    for (int c = 0; c < kK; ++c) vt[n * kK + c] = v[e4m3_pv_key(c) * kN + n];
  float *p_d, *d_d;
  uint8_t* vt_d;
  cudaMalloc(&p_d, p.size() * sizeof(float));
  cudaMalloc(&vt_d, vt.size());
  cudaMalloc(&d_d, kM * kN * sizeof(float));
  cudaMemcpy(p_d, p.data(), p.size() * sizeof(float), cudaMemcpyHostToDevice);
  cudaMemcpy(vt_d, vt.data(), vt.size(), cudaMemcpyHostToDevice);
  probe_rs<kN><<<1, 128>>>(p_d, vt_d, d_d);
  std::vector<float> d(kM * kN);
  cudaMemcpy(d.data(), d_d, d.size() * sizeof(float), cudaMemcpyDeviceToHost);
  cudaFree(p_d), cudaFree(vt_d), cudaFree(d_d);
  double worst = 0, scale = 0;
  std::vector<double> ref(kM * kN);
  for (int m = 0; m < kM; ++m)
    for (int n = 0; n < kN; ++n) {
      double acc = 0;
      for (int k = 0; k < kK; ++k)
        acc += double(e4m3_to_float(float_to_e4m3(p[m * kK + k]))) * e4m3_to_float(v[k * kN + n]);
      ref[m * kN + n] = acc;
      scale = std::fmax(scale, std::fabs(acc));
    }
  for (int i = 0; i < kM * kN; ++i) worst = std::fmax(worst, std::fabs(d[i] - ref[i]));
  return worst / (scale + 1e-30);
}

}  // namespace

int main() {
  int dev = 0, major = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      major != 9) {
    std::printf("fp8_wgmma_probe: no sm_90 GPU; compile-only use (tools/diag/micro/fp8_wgmma_probe.sh)\n");
    return 0;
  }
  std::mt19937 rng(1234);
  const double tol = 2e-3;  // the e4m3 tensor path's reduced-precision sums (~2^-12); a layout error is ~1
  const double e[8] = {run_ss<64>(rng), run_ss<128>(rng), run_ss<192>(rng), run_ss<256>(rng),
                       run_rs<64>(rng), run_rs<128>(rng), run_rs<192>(rng), run_rs<256>(rng)};
  const char* names[8] = {"ss n64", "ss n128", "ss n192", "ss n256", "rs n64", "rs n128", "rs n192", "rs n256"};
  int bad = 0;
  for (int i = 0; i < 8; ++i) {
    std::printf("%-8s max |err| / max |ref| = %.3g %s\n", names[i], e[i], e[i] <= tol ? "ok" : "WRONG");
    bad += e[i] > tol;
  }
  const cudaError_t err = cudaDeviceSynchronize();
  if (err != cudaSuccess) std::printf("CUDA error: %s\n", cudaGetErrorString(err));
  return (bad || err != cudaSuccess) ? 1 : 0;
}
