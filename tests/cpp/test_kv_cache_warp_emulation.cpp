// Runs the REAL device code of src/kernels/kv_cache/kernel.cuh on the CPU: the kernels are compiled as host C++,
// each warp is 32 std::threads, and the warp intrinsics (__shfl_sync, __shfl_xor_sync, __vmaxu2, ...) are
// emulated with a barrier. The fp8/bf16 conversions are CUDA's own host implementations (cuda_fp8.hpp,
// cuda_bf16.hpp), an independent model of the hardware cvt instructions. This checks the lane mapping, the
// shuffles, the addressing of both layouts and the numerics against the CPU codec without a GPU; the GPU tests
// (tests/python/test_kv_cache.py) then check the hardware itself.
#include <gtest/gtest.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <thread>
#include <vector>

// ---- warp emulation shims (host) ------------------------------------------------------------------------------
namespace warp_emulation {

struct Warp {
  std::barrier<> barrier{32};
  uint32_t slots[32] = {};
};
thread_local Warp* t_warp = nullptr;
thread_local int t_lane = 0;
thread_local dim3 t_thread_idx;
thread_local dim3 t_block_idx;

inline uint32_t shuffle(uint32_t v, int src_lane) {
  t_warp->slots[t_lane] = v;
  t_warp->barrier.arrive_and_wait();
  const uint32_t r = t_warp->slots[src_lane & 31];
  t_warp->barrier.arrive_and_wait();
  return r;
}

}  // namespace warp_emulation

inline unsigned __shfl_sync(unsigned, unsigned v, int src_lane) { return warp_emulation::shuffle(v, src_lane); }
inline unsigned __shfl_xor_sync(unsigned, unsigned v, int mask) {
  return warp_emulation::shuffle(v, warp_emulation::t_lane ^ mask);
}
inline unsigned __vmaxu2(unsigned a, unsigned b) {
  return std::max(a & 0xFFFFu, b & 0xFFFFu) | (std::max(a >> 16, b >> 16) << 16);
}
inline float __uint_as_float(unsigned u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline unsigned __float_as_uint(float f) {
  unsigned u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fmul_rn(float a, float b) { return a * b; }
using std::isnan;
using std::max;

#ifdef threadIdx
#undef threadIdx
#endif
#ifdef blockIdx
#undef blockIdx
#endif
#define threadIdx ::warp_emulation::t_thread_idx
#define blockIdx ::warp_emulation::t_block_idx
#ifdef __global__
#undef __global__
#endif
#define __global__
#ifdef __launch_bounds__
#undef __launch_bounds__
#endif
#define __launch_bounds__(...)

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunknown-pragmas"  // #pragma unroll is for nvcc
#include "kernels/kv_cache/kernel.cuh"
#pragma GCC diagnostic pop
#include "openmla_ref/fp8_codec.h"
#include "openmla_ref/numeric.h"

namespace {

namespace kvk = openmla::kernels::kv_cache;
namespace ref = openmla::ref;

// Runs `kernel` over `blocks` blocks, one emulated warp (32 threads) at a time.
void run_grid(int64_t blocks, const std::function<void()>& kernel) {
  for (int64_t b = 0; b < blocks; ++b) {
    for (int w = 0; w < kvk::kWarpsPerBlock; ++w) {
      warp_emulation::Warp warp;
      std::vector<std::thread> lanes;
      for (int lane = 0; lane < 32; ++lane) {
        lanes.emplace_back([&, lane] {
          warp_emulation::t_warp = &warp;
          warp_emulation::t_lane = lane;
          warp_emulation::t_block_idx = dim3(static_cast<unsigned>(b));
          warp_emulation::t_thread_idx = dim3(static_cast<unsigned>(w * 32 + lane));
          kernel();
        });
      }
      for (auto& t : lanes) t.join();
    }
  }
}

int64_t blocks_for(int64_t tokens) { return (tokens + kvk::kWarpsPerBlock - 1) / kvk::kWarpsPerBlock; }

// Random bf16 tokens with per-tile magnitudes from 1e-30 to 3e38, all-zero tokens, -0, and (optionally) NaN/inf.
std::vector<uint16_t> make_tokens(int64_t n, int64_t d, int64_t row_stride, bool non_finite, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> kind(0, 9);
  std::vector<uint16_t> x(n * row_stride, 0xFFFF);  // padding: NaN patterns that must never be read as data
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t c = 0; c < d; c += 32) {
      const int k = kind(rng);
      const float mag = k == 0 ? 1e-30f : k == 1 ? 1e38f : k == 2 ? 448.0f : std::exp2(static_cast<float>(k * 7 - 30));
      for (int64_t i = c; i < c + 32; ++i) {
        float v = normal(rng) * mag;
        if (k == 1) v = std::clamp(v, -3.3e38f, 3.3e38f);
        x[t * row_stride + i] = ref::float_to_bf16(v);
      }
    }
    if (t % 7 == 3)
      for (int64_t i = 0; i < d; ++i) x[t * row_stride + i] = (i & 1) ? 0x8000 : 0;  // all-zero token (with -0)
    if (non_finite && t % 5 == 1) {
      x[t * row_stride + (t * 37) % d] = 0x7FC1;                         // NaN somewhere (NoPE or RoPE)
      x[t * row_stride + (t * 91 + 5) % d] = (t & 2) ? 0xFF80 : 0x7F80;  // +-inf
    }
  }
  return x;
}

struct Case {
  kvk::Fp8Layout layout;
  int64_t num_blocks, page_size;
};

ref::Fp8Layout ref_layout(kvk::Fp8Layout l) {
  return l == kvk::Fp8Layout::kV32 ? ref::Fp8Layout::kV32 : ref::Fp8Layout::kModel1;
}

class KvCacheWarpEmulation : public ::testing::TestWithParam<Case> {};

TEST_P(KvCacheWarpEmulation, QuantizeDequantizeAppendMatchCpuCodec) {
  const Case c = GetParam();
  const ref::Fp8Layout rl = ref_layout(c.layout);
  const int64_t d = ref::fp8_head_dim(rl), bpt = ref::fp8_bytes_per_token(rl);
  const int64_t tokens = c.num_blocks * c.page_size;
  const int64_t src_row_stride = d + 16, src_page_stride = c.page_size * src_row_stride + 8;
  const int64_t page_stride = ((c.page_size * bpt + 15) / 16) * 16 + 48;  // non-contiguous pages
  // One buffer of pages; bf16 rows inside it addressed with the padded strides.
  const auto rows = make_tokens(tokens, d, src_row_stride, true, static_cast<uint32_t>(tokens * 31 + d));
  std::vector<uint16_t> src(c.num_blocks * src_page_stride, 0xFFFF);
  for (int64_t t = 0; t < tokens; ++t)
    std::memcpy(&src[(t / c.page_size) * src_page_stride + (t % c.page_size) * src_row_stride],
                &rows[t * src_row_stride], static_cast<size_t>(d) * 2);

  // ---- quantise
  std::vector<uint8_t> want(c.num_blocks * page_stride, 0xA5), got(want.size(), 0xA5);
  for (int64_t p = 0; p < c.num_blocks; ++p)
    ref::fp8_encode_page(rl, src.data() + p * src_page_stride, src_row_stride, want.data() + p * page_stride,
                         c.page_size);
  const kvk::QuantizeParams qp{.src = src.data(),
                               .src_page_stride = src_page_stride,
                               .src_row_stride = src_row_stride,
                               .dst = got.data(),
                               .dst_page_stride = page_stride,
                               .num_blocks = c.num_blocks,
                               .page_size = c.page_size};
  run_grid(blocks_for(tokens), [&] {
    if (c.layout == kvk::Fp8Layout::kV32)
      kvk::quantize_kernel<kvk::Fp8Layout::kV32>(qp);
    else
      kvk::quantize_kernel<kvk::Fp8Layout::kModel1>(qp);
  });
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_EQ(got[i], want[i]) << "quantise: byte " << i % page_stride << " of page " << i / page_stride;

  // ---- dequantise (into padded rows; padding must stay untouched)
  std::vector<uint16_t> back(src.size(), 0x1357), back_want(src.size(), 0x1357);
  for (int64_t p = 0; p < c.num_blocks; ++p)
    ref::fp8_decode_page_bf16(rl, want.data() + p * page_stride, c.page_size, back_want.data() + p * src_page_stride,
                              src_row_stride);
  const kvk::DequantizeParams dp{.src = got.data(),
                                 .src_page_stride = page_stride,
                                 .dst = back.data(),
                                 .dst_page_stride = src_page_stride,
                                 .dst_row_stride = src_row_stride,
                                 .num_blocks = c.num_blocks,
                                 .page_size = c.page_size};
  run_grid(blocks_for(tokens), [&] {
    if (c.layout == kvk::Fp8Layout::kV32)
      kvk::dequantize_kernel<kvk::Fp8Layout::kV32>(dp);
    else
      kvk::dequantize_kernel<kvk::Fp8Layout::kModel1>(dp);
  });
  for (size_t i = 0; i < back.size(); ++i) ASSERT_EQ(back[i], back_want[i]) << "dequantise: element " << i;

  // ---- append: a permutation of the slots, a third of them skipped (negative) and one past the end
  std::vector<int64_t> slots(tokens);
  for (int64_t i = 0; i < tokens; ++i) slots[i] = (i * 7 + 3) % tokens;  // a permutation when gcd(7, tokens) == 1
  std::mt19937 rng(9);
  for (int64_t i = 0; i < tokens; ++i)
    if (rng() % 3 == 0) slots[i] = -1 - static_cast<int64_t>(rng() % 5);
  if (tokens > 1) slots[tokens - 1] = tokens;  // out of range: skipped, never written
  std::vector<uint8_t> app_got(want.size(), 0x5A), app_want(want.size(), 0x5A);
  std::vector<bool> used(tokens, false);
  for (int64_t i = 0; i < tokens; ++i) {
    if (slots[i] < 0 || slots[i] >= tokens || used[slots[i]]) {
      if (slots[i] >= 0 && slots[i] < tokens) slots[i] = -1;  // keep slots unique
      continue;
    }
    used[slots[i]] = true;
    ref::fp8_encode_token(rl, rows.data() + i * src_row_stride,
                          app_want.data() + (slots[i] / c.page_size) * page_stride, c.page_size,
                          slots[i] % c.page_size);
  }
  for (bool wide : {false, true}) {
    std::fill(app_got.begin(), app_got.end(), 0x5A);
    std::vector<int32_t> slots32(slots.begin(), slots.end());
    const kvk::AppendParams ap{.new_kv = rows.data(),
                               .new_kv_row_stride = src_row_stride,
                               .slots = wide ? static_cast<const void*>(slots.data()) : slots32.data(),
                               .slots_are_int64 = wide,
                               .num_new = tokens,
                               .cache = app_got.data(),
                               .cache_page_stride = page_stride,
                               .num_blocks = c.num_blocks,
                               .page_size = c.page_size};
    run_grid(blocks_for(tokens), [&] {
      if (c.layout == kvk::Fp8Layout::kV32) {
        if (wide)
          kvk::append_kernel<kvk::Fp8Layout::kV32, int64_t>(ap);
        else
          kvk::append_kernel<kvk::Fp8Layout::kV32, int32_t>(ap);
      } else {
        if (wide)
          kvk::append_kernel<kvk::Fp8Layout::kModel1, int64_t>(ap);
        else
          kvk::append_kernel<kvk::Fp8Layout::kModel1, int32_t>(ap);
      }
    });
    for (size_t i = 0; i < app_want.size(); ++i)
      ASSERT_EQ(app_got[i], app_want[i]) << "append (" << (wide ? "int64" : "int32") << " slots): byte "
                                         << i % page_stride << " of page " << i / page_stride;
  }
}

INSTANTIATE_TEST_SUITE_P(Pages, KvCacheWarpEmulation,
                         ::testing::Values(Case{kvk::Fp8Layout::kV32, 3, 1}, Case{kvk::Fp8Layout::kV32, 2, 2},
                                           Case{kvk::Fp8Layout::kV32, 2, 13}, Case{kvk::Fp8Layout::kModel1, 3, 1},
                                           Case{kvk::Fp8Layout::kModel1, 2, 2}, Case{kvk::Fp8Layout::kModel1, 2, 13}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return std::string(info.param.layout == kvk::Fp8Layout::kV32 ? "V32" : "Model1") + "_pages" +
                                  std::to_string(info.param.num_blocks) + "x" + std::to_string(info.param.page_size);
                         });

}  // namespace
