// CPU reference, merging split-KV partials: hand cases in both lse bases, empty partials, sinks.
#include "test_reference_util.h"

namespace openmla::ref::testing {
namespace {

struct Merged {
  std::vector<double> out;
  double lse;
};

Merged merge(const std::vector<double>& o, const std::vector<double>& lse, int64_t d_v, LseBase base,
             const float* sink = nullptr) {
  const int64_t n = static_cast<int64_t>(lse.size());
  Merged m{std::vector<double>(static_cast<size_t>(d_v), kNaN), kNaN};
  merge_partials(MergeArgs{.num_partials = n, .d_v = d_v, .o = view(o, {n, d_v}), .lse = view(lse, {n}),
                           .lse_base = base, .attn_sink = sink},
                 m.out.data(), &m.lse);
  return m;
}

// Partials with row sums 1 and 3 and outputs 1 and 3: out = (1 + 9) / 4 = 2.5, lse = ln 4.
TEST(ReferenceMerge, HandComputedBothBases) {
  const Merged nat = merge({1.0, 3.0}, {0.0, std::log(3.0)}, 1, LseBase::kNatural);
  EXPECT_NEAR(nat.out[0], 2.5, 1e-15);
  EXPECT_NEAR(nat.lse, std::log(4.0), 1e-15);
  const Merged two = merge({1.0, 3.0}, {0.0, std::log2(3.0)}, 1, LseBase::kTwo);
  EXPECT_NEAR(two.out[0], 2.5, 1e-15);
  EXPECT_NEAR(two.lse, std::log(4.0), 1e-15);  // the result is natural log whatever the input base
}

// An empty partial (lse -inf) is skipped without reading its O (NaN there must not leak).
TEST(ReferenceMerge, EmptyPartialIgnored) {
  const Merged m = merge({kNaN, kNaN, 5.0, -1.0}, {-kInf, 0.5}, 2, LseBase::kTwo);
  EXPECT_EQ(m.out[0], 5.0);
  EXPECT_EQ(m.out[1], -1.0);
  EXPECT_NEAR(m.lse, 0.5 * std::log(2.0), 1e-15);
}

// +inf is empty too (an attention row without keys: the state a DCP rank with an empty slice returns), in both
// bases, alone or beside -inf.
TEST(ReferenceMerge, PlusInfPartialIsEmpty) {
  const Merged nat = merge({kNaN, 7.0, 2.0, -3.0}, {kInf, 1.5}, 2, LseBase::kNatural);
  EXPECT_EQ(nat.out[0], 2.0);
  EXPECT_EQ(nat.out[1], -3.0);
  EXPECT_NEAR(nat.lse, 1.5, 1e-15);
  const Merged both = merge({kNaN, kNaN}, {kInf, -kInf}, 1, LseBase::kNatural);
  EXPECT_EQ(both.out[0], 0.0);
  EXPECT_EQ(both.lse, kInf);
  const Merged two = merge({kNaN, kNaN}, {kInf, kInf}, 1, LseBase::kTwo);
  EXPECT_EQ(two.out[0], 0.0);
  EXPECT_EQ(two.lse, kInf);
}

// A NaN lse is garbage, not an empty partial: the row comes out NaN (out and lse), never silently dropped.
TEST(ReferenceMerge, NanLsePoisonsTheRow) {
  for (const double other : {0.5, -kInf, kInf}) {
    const Merged m = merge({1.0, 2.0}, {kNaN, other}, 1, LseBase::kNatural);
    EXPECT_TRUE(std::isnan(m.out[0]));
    EXPECT_TRUE(std::isnan(m.lse));
  }
}

// No partial has keys (or there are none): out 0 and lse +inf, whatever the sink.
TEST(ReferenceMerge, AllEmpty) {
  for (float sink : {0.0f, static_cast<float>(kInf), -static_cast<float>(kInf)}) {
    for (const float* s : std::vector<const float*>{nullptr, &sink}) {
      const Merged m = merge({kNaN, kNaN}, {-kInf, -kInf}, 1, LseBase::kTwo, s);
      EXPECT_EQ(m.out[0], 0.0);
      EXPECT_EQ(m.lse, kInf);
      const Merged none = merge({}, {}, 1, LseBase::kNatural, s);
      EXPECT_EQ(none.out[0], 0.0);
      EXPECT_EQ(none.lse, kInf);
    }
  }
}

// Sink ln 4 over a total of 4: out halves; +inf zeroes; -inf leaves it; lse stays ln 4 throughout.
TEST(ReferenceMerge, Sink) {
  const float ln4 = static_cast<float>(std::log(4.0)), pinf = static_cast<float>(kInf), ninf = -pinf;
  const Merged half = merge({1.0, 3.0}, {0.0, std::log(3.0)}, 1, LseBase::kNatural, &ln4);
  EXPECT_NEAR(half.out[0], 1.25, 1e-6);  // the sink is ln 4 rounded to float
  EXPECT_NEAR(half.lse, std::log(4.0), 1e-15);
  const Merged zero = merge({1.0, 3.0}, {0.0, std::log(3.0)}, 1, LseBase::kNatural, &pinf);
  EXPECT_EQ(zero.out[0], 0.0);
  EXPECT_NEAR(zero.lse, std::log(4.0), 1e-15);
  const Merged same = merge({1.0, 3.0}, {0.0, std::log(3.0)}, 1, LseBase::kNatural, &ninf);
  EXPECT_NEAR(same.out[0], 2.5, 1e-15);
}

}  // namespace
}  // namespace openmla::ref::testing
