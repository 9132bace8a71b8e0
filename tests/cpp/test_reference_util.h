// Helpers shared by the CPU reference tests (tests/cpp/test_reference_*.cpp).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "openmla_ref/attention.h"
#include "openmla_ref/numeric.h"

namespace openmla::ref::testing {

inline constexpr double kInf = std::numeric_limits<double>::infinity();
inline constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Random values rounded to bf16 so the same numbers can be handed over as float, double or bf16 bits.
struct Rng {
  std::mt19937_64 gen;
  explicit Rng(uint64_t seed) : gen(seed) {}
  double normal(double sigma = 1.0) { return std::normal_distribution<double>(0.0, sigma)(gen); }
  double bf16_normal(double sigma = 1.0) {
    return bf16_to_float(float_to_bf16(static_cast<float>(normal(sigma))));
  }
  std::vector<double> bf16_vector(size_t n, double sigma = 1.0) {
    std::vector<double> v(n);
    for (double& x : v) x = bf16_normal(sigma);
    return v;
  }
  int64_t uniform(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(gen); }
};

// Row-major strides (in elements) of a contiguous tensor with the given shape.
inline void contiguous_strides(std::initializer_list<int64_t> shape, int64_t* stride) {
  std::vector<int64_t> s(shape);
  int64_t acc = 1;
  for (int i = static_cast<int>(s.size()) - 1; i >= 0; --i) {
    stride[i] = acc;
    acc *= s[i];
  }
}

inline RealView view(const std::vector<double>& v, std::initializer_list<int64_t> shape) {
  RealView r{.data = v.data(), .type = ElemType::kFloat64};
  contiguous_strides(shape, r.stride);
  return r;
}

inline IndexView index_view(const std::vector<int32_t>& v, std::initializer_list<int64_t> shape) {
  IndexView r{.data = v.data()};
  contiguous_strides(shape, r.stride);
  return r;
}

inline std::vector<uint16_t> to_bf16_bits(const std::vector<double>& v) {
  std::vector<uint16_t> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = float_to_bf16(static_cast<float>(v[i]));
  return r;
}

// Element-wise closeness that treats equal infinities as equal and fails on any NaN.
inline void expect_near_all(const std::vector<double>& a, const std::vector<double>& b, double tol,
                            const char* what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_FALSE(std::isnan(a[i]) || std::isnan(b[i])) << what << " NaN at " << i;
    if (std::isinf(a[i]) || std::isinf(b[i])) {
      ASSERT_EQ(a[i], b[i]) << what << " at " << i;
      continue;
    }
    ASSERT_NEAR(a[i], b[i], tol * (1.0 + std::fabs(b[i]))) << what << " at " << i;
  }
}

}  // namespace openmla::ref::testing
