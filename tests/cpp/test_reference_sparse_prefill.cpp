// CPU reference, sparse prefill: hand case with every kind of invalid index, per-token topk_length, sinks,
// and agreement with the MHA forward when every key is selected.
#include <climits>
#include <numeric>

#include "test_reference_util.h"

namespace openmla::ref::testing {
namespace {

struct PrefillOutputs {
  std::vector<double> out, max_logits, lse;
};

PrefillOutputs run_prefill(const SparsePrefillArgs& a) {
  PrefillOutputs r;
  r.out.assign(static_cast<size_t>(a.s_q * a.h_q * a.d_v), kNaN);
  r.max_logits.assign(static_cast<size_t>(a.s_q * a.h_q), kNaN);
  r.lse.assign(static_cast<size_t>(a.s_q * a.h_q), kNaN);
  sparse_prefill(a, r.out.data(), r.max_logits.data(), r.lse.data());
  return r;
}

// kv = [2, 0], [4, ln 3]; q = [0, 1]. Valid slots select key 1 then key 0; every other value (< 0 or >= s_kv)
// is ignored: p = (1/4, 3/4), out = 3.5, lse = ln 4, max_logits = ln 3. Token 1 has topk_length 1 and its
// only slot is invalid: out 0, max -inf, lse +inf, whatever the sink.
TEST(ReferenceSparsePrefill, HandComputedInvalidIndices) {
  const std::vector<double> kv = {2.0, 0.0, 4.0, std::log(3.0)};
  const std::vector<double> q = {0.0, 1.0, 0.0, 1.0};
  const std::vector<int32_t> idx = {INT_MIN, 1, -1, 2, 114514, 0, INT_MAX, -123456,
                                    /* token 1: */ -1, 0, 1, 0, 1, 0, 1, 0};
  const std::vector<int32_t> lens = {8, 1};
  const float sink = 0.0f;
  SparsePrefillArgs a{.s_q = 2, .s_kv = 2, .h_q = 1, .d_qk = 2, .d_v = 1, .topk = 8, .q = view(q, {2, 1, 2}),
                      .kv = view(kv, {2, 1, 2}), .indices = index_view(idx, {2, 1, 8}), .topk_length = lens.data(),
                      .softmax_scale = 1.0};
  PrefillOutputs r = run_prefill(a);
  EXPECT_NEAR(r.out[0], 3.5, 1e-14);
  EXPECT_NEAR(r.lse[0], std::log(4.0), 1e-14);
  EXPECT_NEAR(r.max_logits[0], std::log(3.0), 1e-14);
  EXPECT_EQ(r.out[1], 0.0);
  EXPECT_EQ(r.max_logits[1], -kInf);
  EXPECT_EQ(r.lse[1], kInf);
  // A sink of 0: out *= 1 / (1 + exp(0 - ln 4)) = 4/5; lse and max_logits unchanged.
  a.attn_sink = &sink;
  r = run_prefill(a);
  EXPECT_NEAR(r.out[0], 3.5 * 0.8, 1e-14);
  EXPECT_NEAR(r.lse[0], std::log(4.0), 1e-14);
  EXPECT_EQ(r.out[1], 0.0);
  EXPECT_EQ(r.lse[1], kInf);
}

// Selecting every key of kv equals the (independently coded) MHA forward with v = first d_v dims of kv; the
// per-token topk_length truncation equals a causal MHA when slot t of token t's row is key t (keys sorted).
TEST(ReferenceSparsePrefill, AllKeysEqualsMhaForward) {
  Rng rng(21);
  const int64_t s_q = 5, s_kv = 5, h_q = 4, d_qk = 16, d_v = 8;
  const std::vector<double> q = rng.bf16_vector(static_cast<size_t>(s_q * h_q * d_qk));
  const std::vector<double> kv = rng.bf16_vector(static_cast<size_t>(s_kv * d_qk));
  std::vector<double> v(static_cast<size_t>(s_kv * d_v));
  for (int64_t j = 0; j < s_kv; ++j)
    for (int64_t c = 0; c < d_v; ++c) v[j * d_v + c] = kv[j * d_qk + c];
  std::vector<int32_t> idx;
  for (int64_t t = 0; t < s_q; ++t)
    for (int32_t j = 0; j < s_kv; ++j) idx.push_back(j);
  std::vector<int32_t> lens(s_q);
  std::iota(lens.begin(), lens.end(), 1);  // token t sees keys 0..t
  const std::vector<int32_t> cu_q = {0, static_cast<int32_t>(s_q)}, cu_k = {0, static_cast<int32_t>(s_kv)};
  for (bool causal : {false, true}) {
    SparsePrefillArgs a{.s_q = s_q, .s_kv = s_kv, .h_q = h_q, .d_qk = d_qk, .d_v = d_v, .topk = s_kv,
                        .q = view(q, {s_q, h_q, d_qk}), .kv = view(kv, {s_kv, 1, d_qk}),
                        .indices = index_view(idx, {s_q, 1, s_kv}), .topk_length = causal ? lens.data() : nullptr,
                        .softmax_scale = 0.5};
    const PrefillOutputs sp = run_prefill(a);
    MhaArgs m{.batch = 1, .h_q = h_q, .h_kv = 1, .d_qk = d_qk, .d_v = d_v, .cu_seqlens_q = cu_q.data(),
              .cu_seqlens_k = cu_k.data(), .q = view(q, {s_q, h_q, d_qk}), .k = view(kv, {s_kv, 1, d_qk}),
              .v = view(v, {s_kv, 1, d_v}), .softmax_scale = 0.5, .causal = causal};
    std::vector<double> out(sp.out.size()), lse(sp.lse.size());
    mha_forward(m, out.data(), lse.data());
    expect_near_all(sp.out, out, 1e-12, "out");
    expect_near_all(sp.lse, lse, 1e-12, "lse");
  }
}

// Sinks per head (+inf zeroes, -inf no-op) over a random case with h_kv = 1 and NaN in unselected kv rows.
TEST(ReferenceSparsePrefill, SinksAndPoisonedRows) {
  Rng rng(22);
  const int64_t s_q = 3, s_kv = 9, h_q = 3, d_qk = 8, d_v = 4, topk = 4;
  const std::vector<double> q = rng.bf16_vector(static_cast<size_t>(s_q * h_q * d_qk));
  std::vector<double> kv = rng.bf16_vector(static_cast<size_t>(s_kv * d_qk));
  const std::vector<int32_t> idx = {0, 2, 4, 9, /**/ 6, -1, 2, 2, /**/ 5, 3, 1, 0};
  for (int64_t j : {7, 8}) std::fill(kv.begin() + j * d_qk, kv.begin() + (j + 1) * d_qk, kNaN);
  const std::vector<float> sinks = {static_cast<float>(kInf), -static_cast<float>(kInf), 1.0f};
  SparsePrefillArgs a{.s_q = s_q, .s_kv = s_kv, .h_q = h_q, .d_qk = d_qk, .d_v = d_v, .topk = topk,
                      .q = view(q, {s_q, h_q, d_qk}), .kv = view(kv, {s_kv, 1, d_qk}),
                      .indices = index_view(idx, {s_q, 1, topk}), .softmax_scale = 0.7};
  const PrefillOutputs plain = run_prefill(a);
  a.attn_sink = sinks.data();
  const PrefillOutputs sunk = run_prefill(a);
  EXPECT_EQ(plain.lse, sunk.lse);
  EXPECT_EQ(plain.max_logits, sunk.max_logits);
  for (int64_t t = 0; t < s_q; ++t)
    for (int64_t h = 0; h < h_q; ++h) {
      const int64_t row = t * h_q + h;
      const double factor = h == 0 ? 0.0 : h == 1 ? 1.0 : 1.0 / (1.0 + std::exp(1.0 - plain.lse[row]));
      for (int64_t d = 0; d < d_v; ++d) {
        ASSERT_FALSE(std::isnan(plain.out[row * d_v + d]));
        EXPECT_NEAR(sunk.out[row * d_v + d], plain.out[row * d_v + d] * factor, 1e-15);
      }
    }
}

}  // namespace
}  // namespace openmla::ref::testing
