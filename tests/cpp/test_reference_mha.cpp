// CPU reference, dense MHA prefill: hand case, bottom-right causal mask, GQA, varlen = separate calls,
// split keys + merge = whole, and the backward against central finite differences of sum(out * dout).
#include "test_reference_util.h"

namespace openmla::ref::testing {
namespace {

struct MhaCase {
  int64_t h_q = 1, h_kv = 1, d_qk = 1, d_v = 1;
  std::vector<int32_t> cu_q, cu_k;
  std::vector<double> q, k, v;
  double scale = 1.0;
  bool causal = false;

  int64_t batch() const { return static_cast<int64_t>(cu_q.size()) - 1; }
  int64_t total_q() const { return cu_q.back(); }
  int64_t total_k() const { return cu_k.back(); }
  MhaArgs args() const {
    return {.batch = batch(), .h_q = h_q, .h_kv = h_kv, .d_qk = d_qk, .d_v = d_v, .cu_seqlens_q = cu_q.data(),
            .cu_seqlens_k = cu_k.data(), .q = view(q, {total_q(), h_q, d_qk}), .k = view(k, {total_k(), h_kv, d_qk}),
            .v = view(v, {total_k(), h_kv, d_v}), .softmax_scale = scale, .causal = causal};
  }
  void forward(std::vector<double>& out, std::vector<double>& lse) const {
    out.assign(static_cast<size_t>(total_q() * h_q * d_v), kNaN);
    lse.assign(static_cast<size_t>(total_q() * h_q), kNaN);
    mha_forward(args(), out.data(), lse.data());
  }
};

MhaCase random_mha(Rng& rng, std::vector<int32_t> cu_q, std::vector<int32_t> cu_k, int64_t h_q, int64_t h_kv,
                   int64_t d_qk, int64_t d_v, bool causal) {
  MhaCase c{.h_q = h_q, .h_kv = h_kv, .d_qk = d_qk, .d_v = d_v, .cu_q = cu_q, .cu_k = cu_k};
  c.q = rng.bf16_vector(static_cast<size_t>(c.total_q() * h_q * d_qk));
  c.k = rng.bf16_vector(static_cast<size_t>(c.total_k() * h_kv * d_qk));
  c.v = rng.bf16_vector(static_cast<size_t>(c.total_k() * h_kv * d_v));
  c.scale = 1.0 / std::sqrt(static_cast<double>(d_qk));
  c.causal = causal;
  return c;
}

// One query, keys k = [0], [ln 3] with q = [1]: p = (1/4, 3/4); v = [2, 10], [4, 20] -> out = [3.5, 17.5].
TEST(ReferenceMha, HandComputed) {
  MhaCase c{.d_v = 2, .cu_q = {0, 1}, .cu_k = {0, 2}, .q = {1.0}, .k = {0.0, std::log(3.0)},
            .v = {2.0, 10.0, 4.0, 20.0}};
  std::vector<double> out, lse;
  c.forward(out, lse);
  EXPECT_NEAR(out[0], 3.5, 1e-14);
  EXPECT_NEAR(out[1], 17.5, 1e-14);
  EXPECT_NEAR(lse[0], std::log(4.0), 1e-14);
}

// Bottom-right causal: with s_q = 4, s_k = 2, queries 0 and 1 see nothing (out 0, lse +inf, no gradient),
// query 2 sees key 0, query 3 sees both keys.
TEST(ReferenceMha, CausalBottomRight) {
  Rng rng(31);
  MhaCase c = random_mha(rng, {0, 4}, {0, 2}, 1, 1, 4, 3, true);
  std::vector<double> out, lse;
  c.forward(out, lse);
  for (int64_t i : {0, 1}) {
    EXPECT_EQ(lse[i], kInf);
    for (int64_t d = 0; d < 3; ++d) EXPECT_EQ(out[i * 3 + d], 0.0);
  }
  for (int64_t d = 0; d < 3; ++d) EXPECT_EQ(out[2 * 3 + d], c.v[d]);
  MhaCase full = c;
  full.causal = false;
  std::vector<double> out_full, lse_full;
  full.forward(out_full, lse_full);
  EXPECT_EQ(lse[3], lse_full[3]);
  for (int64_t d = 0; d < 3; ++d) EXPECT_EQ(out[3 * 3 + d], out_full[3 * 3 + d]);
  std::vector<double> dout = rng.bf16_vector(out.size()), dq(c.q.size()), dk(c.k.size()), dv(c.v.size());
  mha_backward(c.args(), view(dout, {4, 1, 3}), dq.data(), dk.data(), dv.data());
  for (int64_t i = 0; i < 2 * 4; ++i) EXPECT_EQ(dq[i], 0.0);  // rows 0, 1 have no key
}

// GQA (h_q 4 over h_kv 2) equals MHA with each kv head repeated; varlen equals separate single-request calls.
TEST(ReferenceMha, GqaAndVarlen) {
  Rng rng(32);
  MhaCase gqa = random_mha(rng, {0, 3, 8}, {0, 5, 7}, 4, 2, 6, 5, true);
  MhaCase rep = gqa;
  rep.h_kv = 4;
  rep.k.clear();
  rep.v.clear();
  for (int64_t j = 0; j < gqa.total_k(); ++j)
    for (int64_t h = 0; h < 4; ++h) {
      for (int64_t c = 0; c < 6; ++c) rep.k.push_back(gqa.k[(j * 2 + h / 2) * 6 + c]);
      for (int64_t c = 0; c < 5; ++c) rep.v.push_back(gqa.v[(j * 2 + h / 2) * 5 + c]);
    }
  std::vector<double> out_g, lse_g, out_r, lse_r;
  gqa.forward(out_g, lse_g);
  rep.forward(out_r, lse_r);
  EXPECT_EQ(out_g, out_r);
  EXPECT_EQ(lse_g, lse_r);
  // Request 1 alone.
  MhaCase second = gqa;
  second.cu_q = {0, 5};
  second.cu_k = {0, 2};
  second.q.assign(gqa.q.begin() + 3 * 4 * 6, gqa.q.end());
  second.k.assign(gqa.k.begin() + 5 * 2 * 6, gqa.k.end());
  second.v.assign(gqa.v.begin() + 5 * 2 * 5, gqa.v.end());
  std::vector<double> out_s, lse_s;
  second.forward(out_s, lse_s);
  EXPECT_EQ(std::vector<double>(out_g.begin() + 3 * 4 * 5, out_g.end()), out_s);
  EXPECT_EQ(std::vector<double>(lse_g.begin() + 3 * 4, lse_g.end()), lse_s);
}

// Keys split in two halves run as two "requests" over the same queries (non-causal), merged in base 2
// (the GPU's partial format), equal the whole.
TEST(ReferenceMha, SplitKeysAndMergeEqualsWhole) {
  Rng rng(33);
  const int64_t s_q = 3, s_k = 11, cut = 4, h = 2, d_qk = 8, d_v = 6;
  MhaCase whole = random_mha(rng, {0, s_q}, {0, s_k}, h, 1, d_qk, d_v, false);
  MhaCase parts = whole;
  parts.cu_q = {0, s_q, 2 * s_q};
  parts.cu_k = {0, cut, s_k};
  parts.q.insert(parts.q.end(), whole.q.begin(), whole.q.end());
  std::vector<double> out_w, lse_w, out_p, lse_p;
  whole.forward(out_w, lse_w);
  parts.forward(out_p, lse_p);
  for (int64_t row = 0; row < s_q * h; ++row) {
    std::vector<double> o(out_p.begin() + row * d_v, out_p.begin() + (row + 1) * d_v);
    o.insert(o.end(), out_p.begin() + (s_q * h + row) * d_v, out_p.begin() + (s_q * h + row + 1) * d_v);
    const std::vector<double> l = {lse_p[row] / std::log(2.0), lse_p[s_q * h + row] / std::log(2.0)};
    std::vector<double> merged(static_cast<size_t>(d_v));
    double merged_lse;
    merge_partials(MergeArgs{.num_partials = 2, .d_v = d_v, .o = view(o, {2, d_v}), .lse = view(l, {2}),
                             .lse_base = LseBase::kTwo},
                   merged.data(), &merged_lse);
    EXPECT_NEAR(merged_lse, lse_w[row], 1e-12);
    for (int64_t d = 0; d < d_v; ++d) EXPECT_NEAR(merged[d], out_w[row * d_v + d], 1e-12);
  }
}

// loss = sum(out * dout); central differences with step 1e-5 in double agree with the analytic gradients
// to ~1e-8. Varlen, causal with an empty row, GQA, d_qk != d_v.
TEST(ReferenceMha, BackwardMatchesFiniteDifferences) {
  Rng rng(34);
  MhaCase c = random_mha(rng, {0, 3, 5}, {0, 2, 6}, 4, 2, 5, 3, true);
  const std::vector<double> dout = rng.bf16_vector(static_cast<size_t>(c.total_q() * c.h_q * c.d_v));
  std::vector<double> dq(c.q.size()), dk(c.k.size()), dv(c.v.size());
  mha_backward(c.args(), view(dout, {c.total_q(), c.h_q, c.d_v}), dq.data(), dk.data(), dv.data());
  auto loss = [&](const MhaCase& m) {
    std::vector<double> out, lse;
    m.forward(out, lse);
    double s = 0.0;
    for (size_t i = 0; i < out.size(); ++i) s += out[i] * dout[i];
    return s;
  };
  constexpr double kStep = 1e-5;
  auto check = [&](std::vector<double> MhaCase::*tensor, const std::vector<double>& grad, const char* name) {
    for (size_t i = 0; i < grad.size(); ++i) {
      MhaCase plus = c, minus = c;
      (plus.*tensor)[i] += kStep;
      (minus.*tensor)[i] -= kStep;
      const double fd = (loss(plus) - loss(minus)) / (2 * kStep);
      ASSERT_NEAR(grad[i], fd, 1e-8) << name << "[" << i << "]";
    }
  };
  check(&MhaCase::q, dq, "dq");
  check(&MhaCase::k, dk, "dk");
  check(&MhaCase::v, dv, "dv");
  double norm = 0.0;
  for (double g : dk) norm += std::fabs(g);
  EXPECT_GT(norm, 1e-3);  // the check is not vacuous
}

}  // namespace
}  // namespace openmla::ref::testing
