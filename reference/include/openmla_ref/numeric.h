// Scalar number formats for the CPU reference: bf16 and fp16 bit patterns <-> float, round to nearest even.
// Deliberately plain C++: the reference shares no code with src/.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace openmla::ref {

inline float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint32_t float_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline float bf16_to_float(uint16_t h) { return bits_to_float(static_cast<uint32_t>(h) << 16); }

// Round to nearest even; NaN stays NaN (quiet), infinities stay infinite.
inline uint16_t float_to_bf16(float f) {
  uint32_t u = float_to_bits(f);
  if (std::isnan(f)) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  uint32_t rounding = 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding) >> 16);
}

inline float fp16_to_float(uint16_t h) {
  uint32_t sign = (h >> 15) & 1u, exp = (h >> 10) & 0x1Fu, mant = h & 0x3FFu;
  float v;
  if (exp == 0) v = std::ldexp(static_cast<float>(mant), -24);
  else if (exp == 31) v = mant ? NAN : INFINITY;
  else v = std::ldexp(static_cast<float>(mant | 0x400u), static_cast<int>(exp) - 25);
  return sign ? -v : v;
}

// Round to nearest even with overflow to infinity.
inline uint16_t float_to_fp16(float f) {
  uint32_t u = float_to_bits(f);
  uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  if (std::isnan(f)) return static_cast<uint16_t>(sign | 0x7E00u);
  float a = std::fabs(f);
  if (a >= 65520.0f) return static_cast<uint16_t>(sign | 0x7C00u);
  if (a < 6.103515625e-05f) {  // subnormal range: quantum 2^-24
    float q = std::nearbyint(a * 16777216.0f);  // default rounding mode is to nearest even
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(q));
  }
  int e;
  float m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  float q = std::nearbyint(m * 2048.0f);  // 11 significant bits
  if (q == 2048.0f) {
    q = 1024.0f;
    ++e;
  }
  uint32_t exp_field = static_cast<uint32_t>(e - 1 + 15);
  if (exp_field >= 31) return static_cast<uint16_t>(sign | 0x7C00u);
  return static_cast<uint16_t>(sign | (exp_field << 10) | (static_cast<uint32_t>(q) - 1024u));
}

}  // namespace openmla::ref
