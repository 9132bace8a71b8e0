// The combine kernel's scalar merge math (kernels/combine/merge_math.h, shared with the kernel) against
// double-precision formulas, including the empty-row and +/-inf sink corner cases of docs/contracts.md
// (sections 1 and 5) and docs/decode-schedule.md section 6.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/combine/merge_math.h"

namespace openmla::kernels::combine {
namespace {

// The kernel's two-pass merge over chunk lse values (base 2), in one thread.
float merge(const std::vector<float>& lse) {
  float m = -INFINITY;
  for (float l : lse) m = fmaxf(m, l);
  const float shift = lse_shift(m);
  float s = 0.f;
  for (float l : lse) s += exp2f(l - shift);
  return merged_lse_log2(s, shift);
}

double merge_ref(const std::vector<float>& lse) {
  double m = -INFINITY;
  for (float l : lse) m = std::fmax(m, l);
  if (m == -INFINITY) return INFINITY;
  double s = 0;
  for (float l : lse) s += std::exp2(double(l) - m);
  return std::log2(s) + m;
}

TEST(DecodeCombineMath, MergeMatchesDouble) {
  const std::vector<std::vector<float>> cases = {
      {3.5f, 2.25f}, {-INFINITY, 7.f}, {7.f, -INFINITY, -INFINITY}, {100.f, 100.f, 100.f, 100.f},
      {-80.f, 90.f, 12.f}, {0.f}, {1e-3f, -1e-3f}};
  for (const auto& c : cases) {
    const double want = merge_ref(c);
    EXPECT_NEAR(merge(c), want, 1e-6 * std::fmax(1.0, std::fabs(want)));
  }
}

TEST(DecodeCombineMath, AllChunksEmptyGivesPlusInf) {
  EXPECT_EQ(merge({-INFINITY, -INFINITY}), INFINITY);
  EXPECT_EQ(lse_shift(-INFINITY), 0.f);
  // Natural-log lse of an empty row stays +inf after the ln 2 scaling.
  EXPECT_EQ(merge({-INFINITY}) * 0.6931471805599453f, INFINITY);
}

TEST(DecodeCombineMath, Sink) {
  const float g = 10.f;
  EXPECT_EQ(add_sink_log2(g, -INFINITY), g);        // no effect
  EXPECT_EQ(add_sink_log2(g, INFINITY), INFINITY);  // output becomes exactly 0
  for (float t : {-50.f, 0.f, 9.5f, 10.f, 11.f, 40.f}) {
    const double want = std::log2(std::exp2(double(g)) + std::exp2(double(t)));
    EXPECT_NEAR(add_sink_log2(g, t), want, 1e-5) << "t = " << t;
  }
  // Far apart: no overflow of 2^(t - g), the result is the larger one.
  EXPECT_FLOAT_EQ(add_sink_log2(-200.f, 300.f), 300.f);
  EXPECT_FLOAT_EQ(add_sink_log2(300.f, -200.f), 300.f);
  // Weight of a chunk: 2^(l - G') <= 1, and the chunk weights plus the sink share sum to 1.
  const float gs = add_sink_log2(g, 9.f);
  EXPECT_NEAR(std::exp2(double(g) - gs) + std::exp2(9.0 - gs), 1.0, 1e-6);
}

}  // namespace
}  // namespace openmla::kernels::combine
