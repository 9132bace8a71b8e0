// Private helpers of the CPU reference: one query row of softmax attention in double.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>

#include "openmla_ref/attention.h"

namespace openmla::ref::detail {

inline constexpr double kInf = std::numeric_limits<double>::infinity();

struct RowStats {
  double max_logit;  // -inf when the row has no key
  double lse;        // natural log; +inf when the row has no key
};

// Softmax attention of one query row over n keys whose scaled logits are logits[0..n) and whose value rows
// start at v + j * v_stride (d_v doubles each). Writes out[0..d_v). The sink (may be null) scales out by
// 1 / (1 + exp(sink - lse)); it never changes the returned statistics. n == 0: out = 0, lse = +inf.
inline RowStats softmax_attend(const double* logits, int64_t n, const double* v, int64_t v_stride, int64_t d_v,
                               const float* sink, double* out) {
  for (int64_t c = 0; c < d_v; ++c) out[c] = 0.0;
  if (n == 0) return {-kInf, kInf};
  double m = -kInf;
  for (int64_t j = 0; j < n; ++j) m = std::fmax(m, logits[j]);
  double sum = 0.0;
  for (int64_t j = 0; j < n; ++j) sum += std::exp(logits[j] - m);
  const double lse = m + std::log(sum);
  for (int64_t j = 0; j < n; ++j) {
    const double p = std::exp(logits[j] - lse);
    const double* vj = v + j * v_stride;
    for (int64_t c = 0; c < d_v; ++c) out[c] += p * vj[c];
  }
  if (sink != nullptr) {
    // exp(+inf) = inf gives factor 0 (sink swallows everything); exp(-inf) = 0 gives factor 1.
    const double factor = 1.0 / (1.0 + std::exp(static_cast<double>(*sink) - lse));
    for (int64_t c = 0; c < d_v; ++c) out[c] *= factor;
  }
  return {m, lse};
}

[[noreturn]] inline void fail(const std::string& argument, const std::string& what) {
  throw std::invalid_argument("argument '" + argument + "': " + what);
}

inline void require(bool ok, const std::string& argument, const std::string& what) {
  if (!ok) fail(argument, what);
}

inline void require_view(const RealView& v, const char* name) { require(v.defined(), name, "must not be null"); }

}  // namespace openmla::ref::detail
