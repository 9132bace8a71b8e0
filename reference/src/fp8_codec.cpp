// CPU codec of the FP8 KV-cache layouts: the truth the GPU kernels are compared against bit for bit.
// Plain scalar C++ on purpose: every step is written the way the recipe states it, with the power-of-two
// rounding done on the float's bits (never through log2), so there is nothing approximate to disagree on.
#include "openmla_ref/fp8_codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "openmla_ref/numeric.h"

namespace openmla::ref {

namespace {

constexpr int64_t kV32BytesPerToken = 656;
constexpr int64_t kModel1BytesPerToken = 584;
constexpr int64_t kModel1DataBytesPerToken = 576;  // 448 e4m3 + 64 bf16; the 8 scale bytes live elsewhere
constexpr int64_t kModel1ScaleBytesPerToken = 8;   // 7 UE8M0 + 1 pad
constexpr int64_t kRopeDim = 64;
constexpr uint32_t kCanonicalNaNBits = 0x7FC00000u;

struct LayoutInfo {
  int64_t head_dim;
  int64_t nope_dim;
  int64_t tile_dim;
  int64_t num_tiles;
  int64_t rope_offset;  // byte offset of the bf16 RoPE inside the token's data record
};

LayoutInfo info(Fp8Layout layout) {
  if (layout == Fp8Layout::kV32) return {576, 512, 128, 4, 528};  // after 512 e4m3 + 16 scale bytes
  return {512, 448, 64, 7, 448};                                  // right after the 448 e4m3 bytes
}

// Scale of one tile from its bf16 values, or NaN if the tile holds a NaN or an infinity.
// amax is the largest magnitude bit pattern: for non-negative IEEE numbers the integer order is the numeric
// order, and every NaN/inf pattern (exponent all ones) is above every finite one.
float tile_scale(const uint16_t* x, int64_t n) {
  uint32_t amax_bits = 0;
  for (int64_t i = 0; i < n; ++i) amax_bits = std::max<uint32_t>(amax_bits, x[i] & 0x7FFFu);
  if (amax_bits >= 0x7F80u) return bits_to_float(kCanonicalNaNBits);
  return fp8_tile_scale(bf16_to_float(static_cast<uint16_t>(amax_bits)));
}

// Encodes one tile of `n` bf16 values with scale `s` (NaN = poisoned tile).
void encode_tile(const uint16_t* x, int64_t n, float s, uint8_t* q) {
  if (std::isnan(s)) {
    std::memset(q, kFp8E4M3NaN, static_cast<size_t>(n));
    return;
  }
  for (int64_t i = 0; i < n; ++i) q[i] = float_to_e4m3fn(bf16_to_float(x[i]) / s);  // exact: s is 2^k
}

}  // namespace

int64_t fp8_bytes_per_token(Fp8Layout layout) {
  return layout == Fp8Layout::kV32 ? kV32BytesPerToken : kModel1BytesPerToken;
}
int64_t fp8_head_dim(Fp8Layout layout) { return info(layout).head_dim; }
int64_t fp8_nope_dim(Fp8Layout layout) { return info(layout).nope_dim; }
int64_t fp8_tile_dim(Fp8Layout layout) { return info(layout).tile_dim; }

uint8_t float_to_e4m3fn(float x) {
  const uint32_t u = float_to_bits(x);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  if (std::isnan(x)) return kFp8E4M3NaN;
  const float a = std::fabs(x);
  uint32_t code;
  if (a < 0.015625f) {
    // Subnormal range (below 2^-6): multiples of 2^-9. a * 512 is exact; nearbyint rounds half to even under the
    // default rounding mode. A result of 8 is the smallest normal (exponent field 1, mantissa 0): same encoding.
    code = static_cast<uint32_t>(std::nearbyint(a * 512.0f));
  } else {
    int e;
    const float m = std::frexp(a, &e);    // a = m * 2^e, m in [0.5, 1)
    float q = std::nearbyint(m * 16.0f);  // 4 significant bits, half to even
    if (q == 16.0f) {
      q = 8.0f;
      ++e;
    }
    const int biased = e - 1 + 7;
    code = biased > 15 ? 0x7Fu : (static_cast<uint32_t>(biased) << 3) | (static_cast<uint32_t>(q) - 8u);
  }
  if (code > 0x7Eu) code = 0x7Eu;  // saturate to 448 (satfinite); the recipe never needs it for finite tiles
  return static_cast<uint8_t>(sign | code);
}

float e4m3fn_to_float(uint8_t v) {
  const uint32_t exp = (v >> 3) & 0xFu, mant = v & 0x7u;
  if (exp == 0xFu && mant == 0x7u) return std::numeric_limits<float>::quiet_NaN();
  const float mag = exp == 0 ? std::ldexp(static_cast<float>(mant), -9)
                             : std::ldexp(static_cast<float>(mant | 0x8u), static_cast<int>(exp) - 10);
  return (v & 0x80u) ? -mag : mag;
}

float fp8_tile_scale(float amax) {
  if (!(std::fabs(amax) <= std::numeric_limits<float>::max())) return bits_to_float(kCanonicalNaNBits);
  float s = amax / kFp8E4M3Max;  // IEEE division, round to nearest (the GPU uses __fdiv_rn)
  if (!(s >= kFp8MinScaleArg)) s = kFp8MinScaleArg;
  // Round up to a power of two on the bits: s >= 1e-4 is normal, so a non-zero mantissa means "not a power of
  // two" and the next power is the next exponent. s <= FLT_MAX/448 < 2^120, so no overflow.
  uint32_t u = float_to_bits(s);
  if (u & 0x007FFFFFu) u = (u & 0x7F800000u) + 0x00800000u;
  return bits_to_float(u);
}

uint8_t fp8_scale_to_ue8m0(float scale) {
  if (!std::isfinite(scale)) return kUe8m0NaN;
  return static_cast<uint8_t>((float_to_bits(scale) >> 23) & 0xFFu);
}

float fp8_ue8m0_to_float(uint8_t e) {
  if (e == kUe8m0NaN) return bits_to_float(kCanonicalNaNBits);
  if (e == 0) return bits_to_float(0x00400000u);  // 2^-127 is subnormal in fp32
  return bits_to_float(static_cast<uint32_t>(e) << 23);
}

uint16_t fp8_decoded_float_to_bf16(float v) {
  if (std::isnan(v)) return 0x7FC0u;
  return float_to_bf16(v);
}

int64_t fp8_data_offset(Fp8Layout layout, int64_t row) {
  return row * (layout == Fp8Layout::kV32 ? kV32BytesPerToken : kModel1DataBytesPerToken);
}

int64_t fp8_scale_offset(Fp8Layout layout, int64_t page_size, int64_t row) {
  if (layout == Fp8Layout::kV32) return row * kV32BytesPerToken + 512;
  return page_size * kModel1DataBytesPerToken + row * kModel1ScaleBytesPerToken;
}

void fp8_encode_token(Fp8Layout layout, const uint16_t* src, uint8_t* page_base, int64_t page_size, int64_t row) {
  const LayoutInfo li = info(layout);
  uint8_t* data = page_base + fp8_data_offset(layout, row);
  uint8_t* scales = page_base + fp8_scale_offset(layout, page_size, row);
  for (int64_t t = 0; t < li.num_tiles; ++t) {
    const uint16_t* x = src + t * li.tile_dim;
    const float s = tile_scale(x, li.tile_dim);
    encode_tile(x, li.tile_dim, s, data + t * li.tile_dim);
    if (layout == Fp8Layout::kV32) {
      const uint32_t bits = float_to_bits(s);
      std::memcpy(scales + 4 * t, &bits, 4);  // little-endian fp32, as the GPU stores it
    } else {
      scales[t] = fp8_scale_to_ue8m0(s);
    }
  }
  if (layout == Fp8Layout::kModel1) scales[li.num_tiles] = 0;  // pad byte
  // RoPE: bf16 copied bit for bit.
  std::memcpy(data + li.rope_offset, src + li.nope_dim, static_cast<size_t>(kRopeDim) * 2);
}

void fp8_decode_token_bf16(Fp8Layout layout, const uint8_t* page_base, int64_t page_size, int64_t row, uint16_t* dst) {
  const LayoutInfo li = info(layout);
  const uint8_t* data = page_base + fp8_data_offset(layout, row);
  const uint8_t* scales = page_base + fp8_scale_offset(layout, page_size, row);
  for (int64_t t = 0; t < li.num_tiles; ++t) {
    float s;
    if (layout == Fp8Layout::kV32) {
      uint32_t bits;
      std::memcpy(&bits, scales + 4 * t, 4);
      s = bits_to_float(bits);
    } else {
      s = fp8_ue8m0_to_float(scales[t]);
    }
    for (int64_t i = 0; i < li.tile_dim; ++i) {
      const int64_t d = t * li.tile_dim + i;
      dst[d] = fp8_decoded_float_to_bf16(e4m3fn_to_float(data[d]) * s);
    }
  }
  std::memcpy(dst + li.nope_dim, data + li.rope_offset, static_cast<size_t>(kRopeDim) * 2);
}

void fp8_decode_token(Fp8Layout layout, const uint8_t* page_base, int64_t page_size, int64_t row, float* dst) {
  uint16_t bits[576];
  fp8_decode_token_bf16(layout, page_base, page_size, row, bits);
  for (int64_t d = 0; d < fp8_head_dim(layout); ++d) dst[d] = bf16_to_float(bits[d]);
}

void fp8_encode_page(Fp8Layout layout, const uint16_t* src, int64_t row_stride, uint8_t* page_base, int64_t page_size) {
  for (int64_t r = 0; r < page_size; ++r) fp8_encode_token(layout, src + r * row_stride, page_base, page_size, r);
}

void fp8_decode_page_bf16(Fp8Layout layout, const uint8_t* page_base, int64_t page_size, uint16_t* dst,
                          int64_t row_stride) {
  for (int64_t r = 0; r < page_size; ++r) fp8_decode_token_bf16(layout, page_base, page_size, r, dst + r * row_stride);
}

}  // namespace openmla::ref
