// The sparse-decode kernel's FP8 -> BF16 dequantisation (integer repack + bf16 multiply, kernel.cuh) against
// the CPU codec, bit for bit, over every e4m3 code and the whole range of power-of-two scales the recipe
// produces (2^-13 .. 2^126 and beyond 2^7, where the kernel switches to two multiplies), plus poisoned tiles
// (NaN scale). Needs a GPU; skipped with the reason otherwise.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/sparse_decode/dequant_probe.h"
#include "openmla_ref/fp8_codec.h"

namespace openmla {
namespace {

bool have_gpu() {
  int n = 0;
  const bool ok = cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
  cudaGetLastError();
  return ok;
}

uint16_t bf16_bits_rn(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if (std::isnan(x)) return 0x7FC0;
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

TEST(SparseDequant, MatchesCpuCodecOnEveryCodeAndScale) {
  if (!have_gpu()) GTEST_SKIP() << "GPU test: no CUDA device on this machine";
  std::vector<float> scales;
  for (int e = -13; e <= 126; ++e) scales.push_back(std::ldexp(1.0f, e));
  scales.push_back(std::nanf(""));  // a poisoned tile (its bytes are 0x7F by the codec; any byte must give NaN)
  // 256 codes = 16 groups of 16 bytes, for every scale.
  const int groups_per_scale = 16;
  const int n = static_cast<int>(scales.size()) * groups_per_scale;
  std::vector<uint8_t> bytes(static_cast<size_t>(n) * 16);
  std::vector<float> group_scale(n);
  for (int g = 0; g < n; ++g) {
    group_scale[g] = scales[g / groups_per_scale];
    for (int k = 0; k < 16; ++k) bytes[g * 16 + k] = static_cast<uint8_t>((g % groups_per_scale) * 16 + k);
  }
  uint8_t* d_bytes = nullptr;
  float* d_scales = nullptr;
  uint16_t* d_out = nullptr;
  ASSERT_EQ(cudaMalloc(&d_bytes, bytes.size()), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_scales, n * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_out, static_cast<size_t>(n) * 16 * 2), cudaSuccess);
  cudaMemcpy(d_bytes, bytes.data(), bytes.size(), cudaMemcpyHostToDevice);
  cudaMemcpy(d_scales, group_scale.data(), n * sizeof(float), cudaMemcpyHostToDevice);
  cudaMemset(d_out, 0xAB, static_cast<size_t>(n) * 16 * 2);
  const Status st = kernels::run_fp8_dequant_probe(d_bytes, d_scales, d_out, n);
  ASSERT_TRUE(st.is_ok()) << st.message();
  std::vector<uint16_t> out(static_cast<size_t>(n) * 16);
  cudaMemcpy(out.data(), d_out, out.size() * 2, cudaMemcpyDeviceToHost);
  cudaFree(d_bytes);
  cudaFree(d_scales);
  cudaFree(d_out);

  int mismatches = 0;
  for (int g = 0; g < n; ++g) {
    for (int k = 0; k < 16; ++k) {
      const uint8_t code = bytes[g * 16 + k];
      const float s = group_scale[g];
      const bool nan_code = (code & 0x7F) == 0x7F;
      if (nan_code && !std::isnan(s)) continue;  // e4m3 NaN only occurs in poisoned tiles (NaN scale)
      const uint16_t got = out[g * 16 + k];
      const bool want_nan = std::isnan(s);
      bool ok;
      uint16_t want = 0;
      if (want_nan) {
        ok = (got & 0x7F80) == 0x7F80 && (got & 0x007F) != 0;
      } else {
        want = bf16_bits_rn(ref::e4m3fn_to_float(code) * s);
        ok = got == want;
      }
      if (!ok && ++mismatches <= 10)
        ADD_FAILURE() << "code 0x" << std::hex << int(code) << std::dec << " scale " << s << ": got 0x" << std::hex
                      << got << " want 0x" << want << (want_nan ? " (NaN)" : "");
    }
  }
  EXPECT_EQ(mismatches, 0);
}

}  // namespace
}  // namespace openmla
