// CPU FP8 KV-cache codec (reference/src/fp8_codec.cpp): hand-checked values, exhaustive e4m3 checks, round trips,
// non-finite tiles and the MODEL1 scale-section addressing.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "common/fp8_cache_layout.h"
#include "openmla_ref/fp8_codec.h"
#include "openmla_ref/numeric.h"

namespace {

using openmla::ref::Fp8Layout;
namespace ref = openmla::ref;

uint32_t bits_of(float f) { return ref::float_to_bits(f); }
float scale_v32(const std::vector<uint8_t>& page, int64_t row, int tile) {
  float s;
  std::memcpy(&s, page.data() + row * 656 + 512 + 4 * tile, 4);
  return s;
}

std::vector<uint16_t> bf16_row(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = ref::float_to_bf16(v[i]);
  return out;
}

// Independent e4m3fn quantiser: the nearest of all 254 finite codes by exhaustive search, ties to the even code.
uint8_t nearest_e4m3_by_search(float x) {
  if (std::isnan(x)) return 0x7F;
  const double a = std::fabs(static_cast<double>(x));
  int best = 0;
  double best_err = std::numeric_limits<double>::infinity();
  for (int c = 0; c <= 0x7E; ++c) {
    const double err = std::fabs(static_cast<double>(ref::e4m3fn_to_float(static_cast<uint8_t>(c))) - a);
    if (err < best_err || (err == best_err && (c & 1) == 0)) {
      best = c;
      best_err = err;
    }
  }
  return static_cast<uint8_t>(best | (std::signbit(x) ? 0x80 : 0));
}

// ---------------------------------------------------------------------------------------------------------------
// Scalars
// ---------------------------------------------------------------------------------------------------------------
TEST(KvCacheCodec, E4m3DecodeKnownCodes) {
  EXPECT_EQ(ref::e4m3fn_to_float(0x00), 0.0f);
  EXPECT_EQ(ref::e4m3fn_to_float(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(ref::e4m3fn_to_float(0x08), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_EQ(ref::e4m3fn_to_float(0x38), 1.0f);
  EXPECT_EQ(ref::e4m3fn_to_float(0x7E), 448.0f);
  EXPECT_EQ(ref::e4m3fn_to_float(0xFE), -448.0f);
  EXPECT_TRUE(std::isnan(ref::e4m3fn_to_float(0x7F)));
  EXPECT_TRUE(std::isnan(ref::e4m3fn_to_float(0xFF)));
  EXPECT_TRUE(std::signbit(ref::e4m3fn_to_float(0x80)));
}

TEST(KvCacheCodec, E4m3EncodeRoundTripsEveryCode) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7F) == 0x7F) continue;
    EXPECT_EQ(ref::float_to_e4m3fn(ref::e4m3fn_to_float(static_cast<uint8_t>(c))), c) << "code " << c;
  }
}

TEST(KvCacheCodec, E4m3TiesRoundToEven) {
  EXPECT_EQ(ref::float_to_e4m3fn(1.0625f), 0x38);  // between 1.0 (0x38) and 1.125 (0x39): even
  EXPECT_EQ(ref::float_to_e4m3fn(1.1875f), 0x3A);  // between 1.125 (0x39) and 1.25 (0x3A): even
  EXPECT_EQ(ref::float_to_e4m3fn(-1.1875f), 0xBA);
  EXPECT_EQ(ref::float_to_e4m3fn(std::ldexp(1.0f, -10)), 0x00);   // half the smallest subnormal -> 0
  EXPECT_EQ(ref::float_to_e4m3fn(std::ldexp(3.0f, -10)), 0x02);   // 1.5 subnormal quanta -> 2 (even)
  EXPECT_EQ(ref::float_to_e4m3fn(std::ldexp(15.0f, -10)), 0x08);  // 7.5 quanta -> 8 = smallest normal
  EXPECT_EQ(ref::float_to_e4m3fn(240.0f + 8.0f), 0x78 | 0x0);     // 248: between 240 (0x77) and 256 (0x78)
  EXPECT_EQ(ref::float_to_e4m3fn(432.0f), 0x7E);                  // between 416 (0x7D) and 448 (0x7E): even
  EXPECT_EQ(ref::float_to_e4m3fn(448.0f), 0x7E);
  EXPECT_EQ(ref::float_to_e4m3fn(464.0f), 0x7E);  // saturates (satfinite)
  EXPECT_EQ(ref::float_to_e4m3fn(-0.0f), 0x80);
  EXPECT_EQ(ref::float_to_e4m3fn(-1e-30f), 0x80);  // sign kept when rounding to zero
  EXPECT_EQ(ref::float_to_e4m3fn(std::numeric_limits<float>::quiet_NaN()), 0x7F);
}

TEST(KvCacheCodec, E4m3EncodeMatchesExhaustiveSearch) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> exponent(-14.0f, 9.0f);
  for (int i = 0; i < 20000; ++i) {
    float x = std::exp2(exponent(rng));
    if (x > 448.0f) x = 448.0f;
    if (i & 1) x = -x;
    ASSERT_EQ(ref::float_to_e4m3fn(x), nearest_e4m3_by_search(x)) << "x = " << x;
  }
  // Every midpoint between consecutive codes (the tie cases), and a hair on either side.
  for (int c = 0; c < 0x7E; ++c) {
    const float lo = ref::e4m3fn_to_float(static_cast<uint8_t>(c)),
                hi = ref::e4m3fn_to_float(static_cast<uint8_t>(c + 1));
    const float mid = 0.5f * (lo + hi);
    EXPECT_EQ(ref::float_to_e4m3fn(mid), (c & 1) ? c + 1 : c) << "midpoint above code " << c;
    EXPECT_EQ(ref::float_to_e4m3fn(std::nextafter(mid, 0.0f)), c);
    EXPECT_EQ(ref::float_to_e4m3fn(std::nextafter(mid, 1000.0f)), c + 1);
  }
}

TEST(KvCacheCodec, TileScaleHandValues) {
  EXPECT_EQ(ref::fp8_tile_scale(448.0f), 1.0f);  // amax 448 -> scale exactly 1
  EXPECT_EQ(ref::fp8_tile_scale(447.0f), 1.0f);
  EXPECT_EQ(ref::fp8_tile_scale(449.0f), 2.0f);
  EXPECT_EQ(ref::fp8_tile_scale(896.0f), 2.0f);
  EXPECT_EQ(ref::fp8_tile_scale(0.0f), std::ldexp(1.0f, -13));  // 2^ceil(log2(1e-4)) = 2^-13
  EXPECT_EQ(ref::fp8_tile_scale(1e-30f), std::ldexp(1.0f, -13));
  EXPECT_EQ(ref::fp8_tile_scale(448e-4f * 0.5f), std::ldexp(1.0f, -13));
  EXPECT_EQ(ref::fp8_tile_scale(3e38f), std::ldexp(1.0f, 120));  // 3e38/448 = 6.7e35 in (2^119, 2^120]
  EXPECT_EQ(ref::fp8_tile_scale(std::numeric_limits<float>::max()), std::ldexp(1.0f, 120));
  EXPECT_TRUE(std::isnan(ref::fp8_tile_scale(std::numeric_limits<float>::infinity())));
  EXPECT_TRUE(std::isnan(ref::fp8_tile_scale(std::numeric_limits<float>::quiet_NaN())));
}

TEST(KvCacheCodec, TileScaleMatchesLog2OverAllBf16) {
  // Every positive finite bf16 amax: the bit-rounded scale equals 2^ceil(log2(max(amax/448, 1e-4))) computed in
  // long double, and |x / s| <= 448 always holds.
  for (uint32_t h = 0; h < 0x7F80u; ++h) {
    const float amax = ref::bf16_to_float(static_cast<uint16_t>(h));
    const float s = ref::fp8_tile_scale(amax);
    long double arg = static_cast<long double>(amax) / 448.0L;
    if (arg < static_cast<long double>(1e-4f)) arg = static_cast<long double>(1e-4f);
    const long double expected = std::exp2(std::ceil(std::log2(arg)));
    ASSERT_EQ(static_cast<long double>(s), expected) << "amax bits " << h;
    ASSERT_LE(amax / s, 448.0f);
  }
}

TEST(KvCacheCodec, Ue8m0Conversions) {
  EXPECT_EQ(ref::fp8_scale_to_ue8m0(1.0f), 127);
  EXPECT_EQ(ref::fp8_scale_to_ue8m0(std::ldexp(1.0f, -13)), 114);
  EXPECT_EQ(ref::fp8_scale_to_ue8m0(std::ldexp(1.0f, 120)), 247);
  EXPECT_EQ(ref::fp8_scale_to_ue8m0(std::numeric_limits<float>::quiet_NaN()), 0xFF);
  EXPECT_EQ(ref::fp8_ue8m0_to_float(127), 1.0f);
  EXPECT_EQ(ref::fp8_ue8m0_to_float(0), std::ldexp(1.0f, -127));
  EXPECT_TRUE(std::isnan(ref::fp8_ue8m0_to_float(0xFF)));
  EXPECT_EQ(ref::fp8_decoded_float_to_bf16(std::numeric_limits<float>::quiet_NaN()), 0x7FC0);
  EXPECT_EQ(ref::fp8_decoded_float_to_bf16(-std::numeric_limits<float>::quiet_NaN()), 0x7FC0);
  EXPECT_EQ(ref::fp8_decoded_float_to_bf16(1.0f), 0x3F80);
}

// ---------------------------------------------------------------------------------------------------------------
// Tokens
// ---------------------------------------------------------------------------------------------------------------
class KvCacheCodecLayout : public ::testing::TestWithParam<Fp8Layout> {};

std::vector<float> decode_row(Fp8Layout layout, const std::vector<uint8_t>& page, int64_t page_size, int64_t row) {
  std::vector<float> out(ref::fp8_head_dim(layout));
  ref::fp8_decode_token(layout, page.data(), page_size, row, out.data());
  return out;
}

float stored_scale(Fp8Layout layout, const std::vector<uint8_t>& page, int64_t page_size, int64_t row, int tile) {
  if (layout == Fp8Layout::kV32) return scale_v32(page, row, tile);
  return ref::fp8_ue8m0_to_float(page[ref::fp8_scale_offset(layout, page_size, row) + tile]);
}

TEST_P(KvCacheCodecLayout, AmaxOf448GivesScaleOneAndExactValues) {
  const Fp8Layout layout = GetParam();
  const int64_t d = ref::fp8_head_dim(layout), nope = ref::fp8_nope_dim(layout), tile = ref::fp8_tile_dim(layout);
  std::vector<float> x(d);
  for (int64_t i = 0; i < d; ++i)
    x[i] = ref::e4m3fn_to_float(static_cast<uint8_t>((i * 37) % 0x7E)) * ((i & 1) ? -1 : 1);
  for (int64_t t = 0; t < nope / tile; ++t) x[t * tile + 5] = 448.0f;  // every tile's amax is exactly 448
  for (int64_t i = nope; i < d; ++i) x[i] = 0.001f * static_cast<float>(i);
  const auto bits = bf16_row(x);
  std::vector<uint8_t> page(ref::fp8_bytes_per_token(layout), 0xAB);
  ref::fp8_encode_token(layout, bits.data(), page.data(), 1, 0);
  for (int64_t t = 0; t < nope / tile; ++t) EXPECT_EQ(stored_scale(layout, page, 1, 0, static_cast<int>(t)), 1.0f);
  if (layout == Fp8Layout::kModel1) {
    EXPECT_EQ(page[576 + 0], 127);
  }
  const auto y = decode_row(layout, page, 1, 0);
  for (int64_t i = 0; i < d; ++i) EXPECT_EQ(bits_of(y[i]), bits_of(ref::bf16_to_float(bits[i]))) << "dim " << i;
}

TEST_P(KvCacheCodecLayout, AllZeroToken) {
  const Fp8Layout layout = GetParam();
  const int64_t d = ref::fp8_head_dim(layout), nope = ref::fp8_nope_dim(layout);
  std::vector<uint16_t> bits(d, 0);
  std::vector<uint8_t> page(ref::fp8_bytes_per_token(layout), 0xAB);
  ref::fp8_encode_token(layout, bits.data(), page.data(), 1, 0);
  for (int64_t i = 0; i < nope; ++i) EXPECT_EQ(page[i], 0);
  for (int t = 0; t < nope / ref::fp8_tile_dim(layout); ++t)
    EXPECT_EQ(stored_scale(layout, page, 1, 0, t), std::ldexp(1.0f, -13));
  if (layout == Fp8Layout::kV32) {
    EXPECT_EQ(bits_of(scale_v32(page, 0, 0)), 0x39000000u);
  } else {
    EXPECT_EQ(page[576 + 0], 114);
    EXPECT_EQ(page[576 + 7], 0) << "pad byte";
  }
  for (float v : decode_row(layout, page, 1, 0)) EXPECT_EQ(bits_of(v), 0u);
}

TEST_P(KvCacheCodecLayout, TinyMagnitudesFlushToSignedZero) {
  const Fp8Layout layout = GetParam();
  const int64_t d = ref::fp8_head_dim(layout), nope = ref::fp8_nope_dim(layout);
  std::vector<float> x(d);
  for (int64_t i = 0; i < d; ++i) x[i] = (i & 1) ? -1e-30f : 1e-30f;
  const auto bits = bf16_row(x);
  std::vector<uint8_t> page(ref::fp8_bytes_per_token(layout));
  ref::fp8_encode_token(layout, bits.data(), page.data(), 1, 0);
  EXPECT_EQ(stored_scale(layout, page, 1, 0, 0), std::ldexp(1.0f, -13));
  for (int64_t i = 0; i < nope; ++i) EXPECT_EQ(page[i], (i & 1) ? 0x80 : 0x00) << "dim " << i;
  const auto y = decode_row(layout, page, 1, 0);
  for (int64_t i = 0; i < nope; ++i) EXPECT_EQ(bits_of(y[i]), (i & 1) ? 0x80000000u : 0u);
  for (int64_t i = nope; i < d; ++i) EXPECT_EQ(y[i], ref::bf16_to_float(bits[i])) << "RoPE is copied";
}

TEST_P(KvCacheCodecLayout, HugeMagnitudes) {
  const Fp8Layout layout = GetParam();
  const int64_t d = ref::fp8_head_dim(layout), nope = ref::fp8_nope_dim(layout);
  std::vector<float> x(d);
  for (int64_t i = 0; i < d; ++i) x[i] = ((i & 1) ? -3e38f : 3e38f) * (1.0f - 0.001f * static_cast<float>(i % 100));
  const auto bits = bf16_row(x);
  std::vector<uint8_t> page(ref::fp8_bytes_per_token(layout));
  ref::fp8_encode_token(layout, bits.data(), page.data(), 1, 0);
  EXPECT_EQ(stored_scale(layout, page, 1, 0, 0), std::ldexp(1.0f, 120));
  const auto y = decode_row(layout, page, 1, 0);
  for (int64_t i = 0; i < nope; ++i) {
    const float xi = ref::bf16_to_float(bits[i]);
    EXPECT_TRUE(std::isfinite(y[i]));
    EXPECT_LE(std::fabs(y[i] - xi), std::fabs(xi) / 16.0f) << "dim " << i;  // e4m3: 3 mantissa bits
  }
}

TEST_P(KvCacheCodecLayout, RandomRoundTripErrorBound) {
  const Fp8Layout layout = GetParam();
  const int64_t d = ref::fp8_head_dim(layout), nope = ref::fp8_nope_dim(layout), tile = ref::fp8_tile_dim(layout);
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> mag(-20.0f, 20.0f);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<float> x(d);
    for (int64_t t = 0; t < d / tile + 1; ++t) {
      const float m = std::exp2(mag(rng));
      for (int64_t i = t * tile; i < std::min(d, (t + 1) * tile); ++i) x[i] = normal(rng) * m;
    }
    const auto bits = bf16_row(x);
    std::vector<uint8_t> page(ref::fp8_bytes_per_token(layout));
    ref::fp8_encode_token(layout, bits.data(), page.data(), 1, 0);
    const auto y = decode_row(layout, page, 1, 0);
    for (int64_t i = 0; i < nope; ++i) {
      const float xi = ref::bf16_to_float(bits[i]);
      const float s = stored_scale(layout, page, 1, 0, static_cast<int>(i / tile));
      // Normal e4m3: half an ulp = 2^-4 relative; subnormal: half the quantum 2^-9 * s.
      ASSERT_LE(std::fabs(y[i] - xi), std::max(std::fabs(xi) / 16.0f, std::ldexp(s, -10))) << "dim " << i;
      ASSERT_EQ(ref::float_to_bf16(y[i]), ref::fp8_decoded_float_to_bf16(y[i])) << "decoded values are bf16";
    }
    for (int64_t i = nope; i < d; ++i) ASSERT_EQ(ref::float_to_bf16(y[i]), bits[i]);
  }
}

TEST_P(KvCacheCodecLayout, NonFiniteTileIsPoisonedOthersUntouched) {
  const Fp8Layout layout = GetParam();
  const int64_t d = ref::fp8_head_dim(layout), nope = ref::fp8_nope_dim(layout), tile = ref::fp8_tile_dim(layout);
  std::vector<float> x(d, 1.0f);
  x[1 * tile + 3] = std::numeric_limits<float>::quiet_NaN();  // tile 1: NaN
  x[2 * tile + 0] = -std::numeric_limits<float>::infinity();  // tile 2: -inf
  x[nope + 1] = std::numeric_limits<float>::quiet_NaN();      // RoPE NaN is copied, poisons nothing
  const auto bits = bf16_row(x);
  std::vector<uint8_t> page(ref::fp8_bytes_per_token(layout));
  ref::fp8_encode_token(layout, bits.data(), page.data(), 1, 0);
  for (int t : {1, 2}) {
    for (int64_t i = t * tile; i < (t + 1) * tile; ++i) EXPECT_EQ(page[i], 0x7F);
    if (layout == Fp8Layout::kV32) {
      EXPECT_EQ(bits_of(scale_v32(page, 0, t)), 0x7FC00000u);
    } else {
      EXPECT_EQ(page[576 + t], 0xFF);
    }
  }
  EXPECT_EQ(stored_scale(layout, page, 1, 0, 0), std::ldexp(1.0f, -8));  // 1/448 -> 2^-8
  std::vector<uint16_t> y(d);
  ref::fp8_decode_token_bf16(layout, page.data(), 1, 0, y.data());
  for (int64_t i = 0; i < nope; ++i) {
    const int64_t t = i / tile;
    EXPECT_EQ(y[i], (t == 1 || t == 2) ? 0x7FC0 : 0x3F80) << "dim " << i;
  }
  for (int64_t i = nope; i < d; ++i) EXPECT_EQ(y[i], bits[i]);
}

TEST_P(KvCacheCodecLayout, PageRoundTripWithRowStride) {
  const Fp8Layout layout = GetParam();
  const int64_t d = ref::fp8_head_dim(layout), page_size = 5, row_stride = d + 8;
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint16_t> src(page_size * row_stride, 0xFFFF), back(page_size * row_stride, 0x1234);
  for (int64_t r = 0; r < page_size; ++r)
    for (int64_t i = 0; i < d; ++i)
      src[r * row_stride + i] = ref::float_to_bf16(normal(rng) * static_cast<float>(r + 1));
  std::vector<uint8_t> page(page_size * ref::fp8_bytes_per_token(layout));
  ref::fp8_encode_page(layout, src.data(), row_stride, page.data(), page_size);
  ref::fp8_decode_page_bf16(layout, page.data(), page_size, back.data(), row_stride);
  for (int64_t r = 0; r < page_size; ++r) {
    std::vector<uint16_t> token(d);
    ref::fp8_decode_token_bf16(layout, page.data(), page_size, r, token.data());
    for (int64_t i = 0; i < d; ++i) ASSERT_EQ(back[r * row_stride + i], token[i]);
    for (int64_t i = d; i < row_stride; ++i) ASSERT_EQ(back[r * row_stride + i], 0x1234) << "padding untouched";
  }
  // Decoded values are fixed points: encoding them again decodes to the same values (the bytes may differ: a
  // tile whose amax rounded down can get a smaller power-of-two scale).
  std::vector<uint8_t> page2(page.size());
  std::vector<uint16_t> back2(back.size(), 0x1234);
  ref::fp8_encode_page(layout, back.data(), row_stride, page2.data(), page_size);
  ref::fp8_decode_page_bf16(layout, page2.data(), page_size, back2.data(), row_stride);
  EXPECT_EQ(back, back2);
}

INSTANTIATE_TEST_SUITE_P(Layouts, KvCacheCodecLayout, ::testing::Values(Fp8Layout::kV32, Fp8Layout::kModel1),
                         [](const ::testing::TestParamInfo<Fp8Layout>& info) {
                           return info.param == Fp8Layout::kV32 ? std::string("V32") : std::string("Model1");
                         });

// ---------------------------------------------------------------------------------------------------------------
// Layout addressing
// ---------------------------------------------------------------------------------------------------------------
TEST(KvCacheCodec, LayoutConstants) {
  EXPECT_EQ(ref::fp8_bytes_per_token(Fp8Layout::kV32), 656);
  EXPECT_EQ(ref::fp8_bytes_per_token(Fp8Layout::kModel1), 584);
  EXPECT_EQ(ref::fp8_head_dim(Fp8Layout::kV32), 576);
  EXPECT_EQ(ref::fp8_head_dim(Fp8Layout::kModel1), 512);
  EXPECT_EQ(ref::fp8_nope_dim(Fp8Layout::kV32), 512);
  EXPECT_EQ(ref::fp8_nope_dim(Fp8Layout::kModel1), 448);
  EXPECT_EQ(ref::fp8_tile_dim(Fp8Layout::kV32), 128);
  EXPECT_EQ(ref::fp8_tile_dim(Fp8Layout::kModel1), 64);
  EXPECT_EQ(ref::fp8_scale_offset(Fp8Layout::kV32, 64, 3), 3 * 656 + 512);
  EXPECT_EQ(ref::fp8_scale_offset(Fp8Layout::kModel1, 64, 3), 64 * 576 + 3 * 8);
  EXPECT_EQ(ref::fp8_data_offset(Fp8Layout::kModel1, 3), 3 * 576);
}

// The library's one definition of the layouts (src/common/fp8_cache_layout.h: the kernels, the API and Python use
// it) against the reference's own, written separately on purpose.
template <class Cache>
void expect_same_layout(Fp8Layout layout) {
  EXPECT_EQ(Cache::kBytesPerToken, ref::fp8_bytes_per_token(layout));
  EXPECT_EQ(Cache::kHeadDim, ref::fp8_head_dim(layout));
  EXPECT_EQ(Cache::kNopeDim, ref::fp8_nope_dim(layout));
  EXPECT_EQ(Cache::kTileDim, ref::fp8_tile_dim(layout));
  for (const int64_t row : {0, 1, 5}) EXPECT_EQ(row * Cache::kDataStride, ref::fp8_data_offset(layout, row));
}
TEST(KvCacheCodec, LibraryLayoutsMatchTheReference) {
  namespace fc = openmla::fp8_cache;
  expect_same_layout<fc::V32>(Fp8Layout::kV32);
  expect_same_layout<fc::Model1>(Fp8Layout::kModel1);
  for (const int64_t page_size : {1, 3, 64}) {
    for (const int64_t row : {int64_t{0}, page_size - 1}) {
      EXPECT_EQ(row * fc::V32::kDataStride + fc::V32::kScaleOffset,
                ref::fp8_scale_offset(Fp8Layout::kV32, page_size, row));
      EXPECT_EQ(page_size * fc::Model1::kDataStride + row * fc::Model1::kScaleStride,
                ref::fp8_scale_offset(Fp8Layout::kModel1, page_size, row));
    }
  }
}

TEST(KvCacheCodec, Model1ScaleSectionAddressing) {
  // A page of 3 tokens: token r's tile k has amax 448 * 2^(r + k), so its UE8M0 byte is 127 + r + k; the bytes
  // must sit at 3*576 + r*8 + k, with the pad byte 0, and the data section must hold only e4m3/RoPE bytes.
  const int64_t page_size = 3, d = 512;
  std::vector<uint16_t> src(page_size * d);
  for (int64_t r = 0; r < page_size; ++r) {
    for (int64_t i = 0; i < d; ++i) src[r * d + i] = ref::float_to_bf16(0.5f);
    for (int k = 0; k < 7; ++k)
      src[r * d + k * 64 + 1] = ref::float_to_bf16(std::ldexp(448.0f, static_cast<int>(r) + k));
    for (int64_t i = 448; i < d; ++i) src[r * d + i] = static_cast<uint16_t>(0x4000 + r * 64 + (i - 448));
  }
  std::vector<uint8_t> page(page_size * 584, 0xCD);
  ref::fp8_encode_page(Fp8Layout::kModel1, src.data(), d, page.data(), page_size);
  for (int64_t r = 0; r < page_size; ++r) {
    for (int k = 0; k < 7; ++k)
      EXPECT_EQ(page[page_size * 576 + r * 8 + k], 127 + r + k) << "token " << r << " tile " << k;
    EXPECT_EQ(page[page_size * 576 + r * 8 + 7], 0) << "pad byte of token " << r;
    for (int k = 0; k < 7; ++k) EXPECT_EQ(page[r * 576 + k * 64 + 1], 0x7E) << "448 * s / s = 448";
    for (int64_t i = 448; i < d; ++i) {
      uint16_t rope;
      std::memcpy(&rope, page.data() + r * 576 + 448 + 2 * (i - 448), 2);
      EXPECT_EQ(rope, src[r * d + i]);
    }
  }
  // Decoding row 1 alone reads its own scales (not row 0's, not token_base + 576).
  std::vector<uint16_t> y(d);
  ref::fp8_decode_token_bf16(Fp8Layout::kModel1, page.data(), page_size, 1, y.data());
  for (int k = 0; k < 7; ++k) EXPECT_EQ(ref::bf16_to_float(y[k * 64 + 1]), std::ldexp(448.0f, 1 + k));
}

}  // namespace
