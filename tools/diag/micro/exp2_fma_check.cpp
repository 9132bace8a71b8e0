// Host check of exp2_fma (src/kernels/mha_prefill/exp2_fma.h), the polynomial 2^x of the FP8 prefill forward's
// exponentials on the FMA pipe: the host form computes the device's values (see the header), checked here against
// exp2 in double over a dense grid and random values, the special values, and P's e4m3 rounding.
//
//   g++ -std=c++20 -O2 -I src tools/diag/micro/exp2_fma_check.cpp -o /tmp/exp2_fma_check && /tmp/exp2_fma_check
//
// Exit status 0 when every check holds; prints the measured figures.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>

#include "kernels/mha_prefill/exp2_fma.h"

using openmla::kernels::mha_prefill::fp8::exp2_fma;

namespace {

uint32_t bits_of(float v) {
  uint32_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
}

// The spacing of e4m3 values at v >= 0: 2^(e - 3) in binade e >= -6, 2^-9 among the subnormals.
double e4m3_step(double v) {
  if (v < std::ldexp(1.0, -6)) return std::ldexp(1.0, -9);
  return std::ldexp(1.0, static_cast<int>(std::floor(std::log2(v))) - 3);
}

// Round-to-nearest-even to e4m3 (satfinite: 448), for v >= 0; subnormals below 2^-6 in steps of 2^-9.
double to_e4m3(double v) {
  if (v >= 448.0) return 448.0;
  const double step = e4m3_step(v);
  return std::nearbyint(v / step) * step;
}

struct Stats {
  double max_rel = 0, worst_x = 0;
  long count = 0, e4m3_differ = 0, e4m3_far = 0, not_zero_below = 0;
};

void check_value(float x, Stats& s) {
  const float y = exp2_fma(x);
  ++s.count;
  if (x < -126.f) {
    if (bits_of(y) != 0u) ++s.not_zero_below;
    return;
  }
  const double want = std::exp2(static_cast<double>(x));
  const double rel = std::fabs(static_cast<double>(y) / want - 1.0);
  if (rel > s.max_rel) {
    s.max_rel = rel;
    s.worst_x = x;
  }
  // P as the kernel quantises it: p' = 2^x <= 2^8 (x <= 8), rounded to e4m3.
  if (x <= 8.f) {
    const double a = to_e4m3(want), b = to_e4m3(static_cast<double>(y));
    if (a != b) {
      ++s.e4m3_differ;
      if (std::fabs(a - b) > 1.01 * e4m3_step(std::fmax(a, b))) ++s.e4m3_far;
    }
  }
}

}  // namespace

int main() {
  Stats grid, rnd;
  // Dense grid: every multiple of 2^-16 in [-130, 9].
  for (long k = -130L * 65536; k <= 9L * 65536; ++k)
    check_value(static_cast<float>(std::ldexp(static_cast<double>(k), -16)), grid);
  // Random fp32 values in [-130, 9] (every bit pattern's neighbourhood, not only the grid).
  std::mt19937_64 rng(1);
  std::uniform_real_distribution<float> dist(-130.f, 9.f);
  for (int i = 0; i < 20000000; ++i) check_value(dist(rng), rnd);
  // Every fp32 value in [-1, 1) near 0 (tiny magnitudes: f close to 0 or to 1).
  Stats tiny;
  for (int e = -149; e <= -1; ++e)
    for (int m = 0; m < 64; ++m) {
      const float v = std::ldexp(1.f + m / 64.f, e);
      check_value(v, tiny);
      check_value(-v, tiny);
    }

  bool ok = true;
  const double kMaxRel = 7.6e-5;  // the cubic's 7.48e-5 plus the fp32 roundings of Horner and the scale
  for (const Stats* s : {&grid, &rnd, &tiny}) {
    std::printf("%ld values: max relative error %.3e (log2 %.2f) at x = %.9g; e4m3(P) differs from e4m3(2^x) on %ld "
                "(%.3g %%), by more than one e4m3 step on %ld; nonzero results below -126: %ld\n",
                s->count, s->max_rel, std::log2(s->max_rel), s->worst_x, s->e4m3_differ,
                100.0 * static_cast<double>(s->e4m3_differ) / static_cast<double>(s->count), s->e4m3_far,
                s->not_zero_below);
    ok = ok && s->max_rel <= kMaxRel && s->e4m3_far == 0 && s->not_zero_below == 0;
  }

  // Special values: -inf and very negative -> +0 exactly, NaN -> NaN, the boundaries of the flush.
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  struct Special {
    float x;
    const char* what;
  };
  const Special specials[] = {{-inf, "-inf"},   {-1e30f, "-1e30"},   {-300.f, "-300"}, {-127.f, "-127"},
                              {-126.5f, "-126.5"}, {std::nextafter(-126.f, -200.f), "below -126"}};
  for (const Special& c : specials) {
    const float y = exp2_fma(c.x);
    std::printf("exp2_fma(%s) = %g (bits %08x)\n", c.what, y, bits_of(y));
    ok = ok && bits_of(y) == 0u;
  }
  {
    const float y = exp2_fma(nan), y2 = exp2_fma(-nan);
    std::printf("exp2_fma(NaN) = %g, exp2_fma(-NaN) = %g\n", y, y2);
    ok = ok && std::isnan(y) && std::isnan(y2);
  }
  for (const float x : {-126.f, 0.f, 1.f, 8.f, 8.0001f, 127.f}) {
    const float y = exp2_fma(x);
    std::printf("exp2_fma(%g) = %.9g, 2^x = %.9g, rel %.2e\n", x, y, std::exp2(static_cast<double>(x)),
                y / std::exp2(static_cast<double>(x)) - 1.0);
    ok = ok && std::isfinite(y) && std::fabs(y / std::exp2(static_cast<double>(x)) - 1.0) <= kMaxRel;
  }
  // The step at integers (p(1) 2^j against p(0) 2^(j + 1)): the relative jump, bounded by twice the error.
  {
    const float below = exp2_fma(std::nextafter(1.f, 0.f)), at = exp2_fma(1.f);
    std::printf("jump at an integer: %.3e relative\n", static_cast<double>(at) / below - 1.0);
  }
  std::printf(ok ? "exp2_fma check: ok\n" : "exp2_fma check: FAILED\n");
  return ok ? 0 : 1;
}
