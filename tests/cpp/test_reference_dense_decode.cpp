// CPU reference, dense paged decode: hand-computed cases and invariances (page permutation, NaN poisoning,
// GQA = MHA with repeated KV, split + merge = whole, bf16 input path).
#include <algorithm>
#include <numeric>
#include <stdexcept>

#include "test_reference_util.h"

namespace openmla::ref::testing {
namespace {

constexpr int32_t kGarbagePage = 2147480000;  // what FlashMLA's tests write past a request's pages

// A paged cache built from per-request token arrays ((L_b, h_kv, d_qk) each).
struct DenseCase {
  int64_t batch = 0, s_q = 1, h_q = 1, h_kv = 1, d_qk = 1, d_v = 1, page_size = 1;
  int64_t num_blocks = 0, max_blocks = 0;
  std::vector<std::vector<double>> tokens;
  std::vector<double> q, cache;
  std::vector<int32_t> table, seqlens;
  double scale = 1.0;
  bool causal = false;

  // Pages are handed out in the order `page_order` (a permutation of [0, total pages) or empty for
  // identity); spare pages, tail rows and table entries past each request's pages are poisoned.
  void build(const std::vector<int64_t>& page_order = {}, int64_t spare_pages = 2) {
    batch = static_cast<int64_t>(tokens.size());
    seqlens.clear();
    int64_t used = 0;
    max_blocks = 1;
    for (auto& t : tokens) {
      const int64_t len = static_cast<int64_t>(t.size()) / (h_kv * d_qk);
      seqlens.push_back(static_cast<int32_t>(len));
      const int64_t pages = (len + page_size - 1) / page_size;
      used += pages;
      max_blocks = std::max(max_blocks, pages + 1);  // one extra garbage entry per row at least
    }
    num_blocks = used + spare_pages;
    cache.assign(static_cast<size_t>(num_blocks * page_size * h_kv * d_qk), kNaN);
    table.assign(static_cast<size_t>(batch * max_blocks), kGarbagePage);
    int64_t next = 0;
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t len = seqlens[b];
      for (int64_t p = 0; p * page_size < len; ++p) {
        const int64_t page = page_order.empty() ? next : page_order[next];
        ++next;
        table[b * max_blocks + p] = static_cast<int32_t>(page);
        for (int64_t r = 0; r < page_size && p * page_size + r < len; ++r)
          for (int64_t k = 0; k < h_kv * d_qk; ++k)
            cache[(page * page_size + r) * h_kv * d_qk + k] = tokens[b][(p * page_size + r) * h_kv * d_qk + k];
      }
    }
  }

  DenseDecodeArgs args() const {
    return {.batch = batch, .s_q = s_q, .h_q = h_q, .h_kv = h_kv, .d_qk = d_qk, .d_v = d_v,
            .num_blocks = num_blocks, .page_size = page_size, .max_blocks_per_seq = max_blocks,
            .q = view(q, {batch, s_q, h_q, d_qk}), .k_cache = view(cache, {num_blocks, page_size, h_kv, d_qk}),
            .block_table = index_view(table, {batch, max_blocks}), .cache_seqlens = seqlens.data(),
            .softmax_scale = scale, .causal = causal};
  }

  void run(std::vector<double>& out, std::vector<double>& lse) const {
    out.assign(static_cast<size_t>(batch * s_q * h_q * d_v), kNaN);
    lse.assign(static_cast<size_t>(batch * h_q * s_q), kNaN);
    dense_decode(args(), out.data(), lse.data());
  }
};

DenseCase random_case(Rng& rng, const std::vector<int64_t>& lens, int64_t s_q, int64_t h_q, int64_t h_kv,
                      int64_t d_qk, int64_t d_v, int64_t page_size, bool causal) {
  DenseCase c;
  c.s_q = s_q, c.h_q = h_q, c.h_kv = h_kv, c.d_qk = d_qk, c.d_v = d_v, c.page_size = page_size;
  c.causal = causal;
  c.scale = 1.0 / std::sqrt(static_cast<double>(d_qk));
  for (int64_t len : lens) c.tokens.push_back(rng.bf16_vector(static_cast<size_t>(len * h_kv * d_qk), 0.5));
  c.q = rng.bf16_vector(static_cast<size_t>(lens.size() * s_q * h_q * d_qk));
  return c;
}

// q = [0, 1], keys [2, 0] and [4, ln 3], V = first dim: p = (1/4, 3/4), out = 2/4 + 4*3/4 = 3.5, lse = ln 4.
TEST(ReferenceDenseDecode, HandComputedTwoKeys) {
  DenseCase c;
  c.d_qk = 2, c.d_v = 1, c.page_size = 1;
  c.tokens = {{2.0, 0.0, 4.0, std::log(3.0)}};
  c.q = {0.0, 1.0};
  c.build({1, 0});  // the two pages in reverse order
  std::vector<double> out, lse;
  c.run(out, lse);
  EXPECT_NEAR(out[0], 3.5, 1e-14);
  EXPECT_NEAR(lse[0], std::log(4.0), 1e-14);
}

// Same keys, two causal queries: query 0 sees key 0 only (out 2, lse 0), query 1 sees both.
TEST(ReferenceDenseDecode, HandComputedCausal) {
  DenseCase c;
  c.d_qk = 2, c.d_v = 1, c.page_size = 2, c.s_q = 2, c.causal = true;
  c.tokens = {{2.0, 0.0, 4.0, std::log(3.0)}};
  c.q = {0.0, 1.0, 0.0, 1.0};
  c.build();
  std::vector<double> out, lse;
  c.run(out, lse);
  EXPECT_NEAR(out[0], 2.0, 1e-14);
  EXPECT_NEAR(lse[0], 0.0, 1e-14);
  EXPECT_NEAR(out[1], 3.5, 1e-14);
  EXPECT_NEAR(lse[1], std::log(4.0), 1e-14);
}

// A zero-length request and queries whose causal window is empty (L = 1 < s_q = 3) give out 0, lse +inf.
TEST(ReferenceDenseDecode, EmptyRows) {
  Rng rng(1);
  DenseCase c = random_case(rng, {0, 1}, 3, 2, 1, 8, 4, 4, true);
  c.build();
  std::vector<double> out, lse;
  c.run(out, lse);
  for (int64_t h = 0; h < 2; ++h) {
    for (int64_t i = 0; i < 3; ++i) {
      const bool empty = i < 2;  // request 1 (L = 1): rows 0 and 1 see no key
      EXPECT_EQ(lse[(0 * 2 + h) * 3 + i], kInf);
      EXPECT_EQ(lse[(1 * 2 + h) * 3 + i] == kInf, empty);
      for (int64_t d = 0; d < 4; ++d) {
        EXPECT_EQ(out[((0 * 3 + i) * 2 + h) * 4 + d], 0.0);
        if (empty) {
          EXPECT_EQ(out[((1 * 3 + i) * 2 + h) * 4 + d], 0.0);
        }
      }
    }
  }
  // Row 2 of request 1 sees its single key: out = V of that key, lse = its logit.
  const auto& t = c.tokens[1];
  for (int64_t h = 0; h < 2; ++h) {
    double dot = 0.0;
    for (int64_t k = 0; k < 8; ++k) dot += c.q[((1 * 3 + 2) * 2 + h) * 8 + k] * t[k];
    EXPECT_NEAR(lse[(1 * 2 + h) * 3 + 2], dot * c.scale, 1e-12);
    for (int64_t d = 0; d < 4; ++d) EXPECT_EQ(out[((1 * 3 + 2) * 2 + h) * 4 + d], t[d]);
  }
}

// Pages permuted (and the block table with them) give bit-identical results; NaN in spare pages, in the tail
// of the last page and garbage table entries never leak.
TEST(ReferenceDenseDecode, PermutedPagesAndPoisoning) {
  Rng rng(2);
  DenseCase c = random_case(rng, {7, 1, 13, 0, 6}, 2, 4, 2, 16, 12, 3, true);
  c.build({}, 0);
  std::vector<double> out_a, lse_a, out_b, lse_b;
  c.run(out_a, lse_a);
  std::vector<int64_t> order(static_cast<size_t>(c.num_blocks));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng.gen);
  c.build(order, 3);
  c.run(out_b, lse_b);
  for (double v : out_b) ASSERT_FALSE(std::isnan(v));
  EXPECT_EQ(out_a, out_b);
  EXPECT_EQ(lse_a, lse_b);
}

// h_q = 6 over h_kv = 3 equals h_q = 6 over h_kv = 6 with each kv head repeated twice.
TEST(ReferenceDenseDecode, GqaEqualsRepeatedKv) {
  Rng rng(3);
  DenseCase gqa = random_case(rng, {9, 4}, 2, 6, 3, 8, 8, 4, true);
  gqa.build();
  DenseCase mha = gqa;
  mha.h_kv = 6;
  for (auto& t : mha.tokens) {
    std::vector<double> rep;
    for (size_t j = 0; j < t.size() / (3 * 8); ++j)
      for (int64_t h = 0; h < 6; ++h)
        for (int64_t k = 0; k < 8; ++k) rep.push_back(t[(j * 3 + h / 2) * 8 + k]);
    t = rep;
  }
  mha.build();
  std::vector<double> out_a, lse_a, out_b, lse_b;
  gqa.run(out_a, lse_a);
  mha.run(out_b, lse_b);
  EXPECT_EQ(out_a, out_b);
  EXPECT_EQ(lse_a, lse_b);
}

// One request split into two "requests" (first part fully visible to every causal query), merged with the
// partial merge, equals the whole request.
TEST(ReferenceDenseDecode, SplitAndMergeEqualsWhole) {
  Rng rng(4);
  const int64_t len = 40, cut = 17, s_q = 2, h = 3, d_qk = 24, d_v = 16;
  DenseCase whole = random_case(rng, {len}, s_q, h, 1, d_qk, d_v, 5, true);
  whole.build();
  // The first part is entirely visible to both queries, so it runs without a mask; the second part keeps
  // the bottom-right mask, which lines up with the whole request's because both end at the same key.
  const auto& t = whole.tokens[0];
  DenseCase part_a = whole, part_b = whole;
  part_a.tokens = {std::vector<double>(t.begin(), t.begin() + cut * d_qk)};
  part_a.causal = false;
  part_b.tokens = {std::vector<double>(t.begin() + cut * d_qk, t.end())};
  part_a.build();
  part_b.build();
  std::vector<double> out_w, lse_w, out_a, lse_a, out_b, lse_b;
  whole.run(out_w, lse_w);
  part_a.run(out_a, lse_a);
  part_b.run(out_b, lse_b);
  for (int64_t i = 0; i < s_q; ++i) {
    for (int64_t hh = 0; hh < h; ++hh) {
      std::vector<double> o(2 * d_v), l(2);
      for (int64_t d = 0; d < d_v; ++d) {
        o[d] = out_a[(i * h + hh) * d_v + d];
        o[d_v + d] = out_b[(i * h + hh) * d_v + d];
      }
      l = {lse_a[hh * s_q + i], lse_b[hh * s_q + i]};
      std::vector<double> merged(d_v);
      double merged_lse = 0.0;
      merge_partials(MergeArgs{.num_partials = 2, .d_v = d_v, .o = view(o, {2, d_v}), .lse = view(l, {2}),
                               .lse_base = LseBase::kNatural},
                     merged.data(), &merged_lse);
      EXPECT_NEAR(merged_lse, lse_w[hh * s_q + i], 1e-12);
      for (int64_t d = 0; d < d_v; ++d) EXPECT_NEAR(merged[d], out_w[(i * h + hh) * d_v + d], 1e-12);
    }
  }
}

// bf16 bit patterns and float views with padded strides give exactly the float64 result; float output too.
TEST(ReferenceDenseDecode, Bf16StridedInputs) {
  Rng rng(5);
  DenseCase c = random_case(rng, {11, 5}, 1, 2, 1, 8, 8, 4, false);
  c.build();
  std::vector<double> out_a, lse_a;
  c.run(out_a, lse_a);
  DenseDecodeArgs a = c.args();
  // q as bf16 bits in a (b, s_q, h_q, d_qk + 3) buffer.
  std::vector<uint16_t> qb(static_cast<size_t>(2 * 1 * 2 * 11), 0xFFFF);
  for (int64_t r = 0; r < 4; ++r)
    for (int64_t k = 0; k < 8; ++k) qb[r * 11 + k] = float_to_bf16(static_cast<float>(c.q[r * 8 + k]));
  a.q = RealView{.data = qb.data(), .type = ElemType::kBFloat16, .stride = {22, 22, 11, 1}};
  std::vector<float> cf(c.cache.begin(), c.cache.end());
  a.k_cache = RealView{.data = cf.data(), .type = ElemType::kFloat32, .stride = {32, 8, 8, 1}};
  std::vector<float> out_f(out_a.size()), lse_f(lse_a.size());
  dense_decode(a, out_f.data(), lse_f.data());
  for (size_t i = 0; i < out_a.size(); ++i) EXPECT_EQ(out_f[i], static_cast<float>(out_a[i]));
  for (size_t i = 0; i < lse_a.size(); ++i) EXPECT_EQ(lse_f[i], static_cast<float>(lse_a[i]));
}

TEST(ReferenceDenseDecode, BadPageIdNamesBlockTable) {
  Rng rng(6);
  DenseCase c = random_case(rng, {5}, 1, 1, 1, 4, 4, 4, false);
  c.build();
  c.table[1] = 1000;  // a used entry now points outside the cache
  std::vector<double> out, lse;
  try {
    c.run(out, lse);
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("block_table"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace openmla::ref::testing
