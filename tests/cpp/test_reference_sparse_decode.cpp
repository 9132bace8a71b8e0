// CPU reference, sparse decode: hand cases, equality with dense decode over the same (dequantised) tokens for
// both FP8 layouts, topk_length, sinks, the extra cache, poisoning, bad indices.
#include <algorithm>
#include <climits>
#include <numeric>
#include <stdexcept>

#include "openmla_ref/fp8_codec.h"
#include "test_reference_util.h"

namespace openmla::ref::testing {
namespace {

struct Outputs {
  std::vector<double> out, lse;
};

Outputs run_sparse(const SparseDecodeArgs& a) {
  Outputs r;
  r.out.assign(static_cast<size_t>(a.batch * a.s_q * a.h_q * a.d_v), kNaN);
  r.lse.assign(static_cast<size_t>(a.batch * a.h_q * a.s_q), kNaN);
  sparse_decode(a, r.out.data(), r.lse.data());
  return r;
}

// Dense decode over a token cache viewed with one token per page: the block table row of request b lists
// the token indices it attends, so dense decode attends exactly `sel[b]` (in that order).
Outputs run_dense_over(const std::vector<double>& tokens, int64_t d_qk, int64_t d_v, const std::vector<double>& q,
                       int64_t s_q, int64_t h_q, const std::vector<std::vector<int32_t>>& sel, double scale) {
  const int64_t batch = static_cast<int64_t>(sel.size());
  int64_t width = 1;
  for (auto& s : sel) width = std::max<int64_t>(width, static_cast<int64_t>(s.size()));
  std::vector<int32_t> table(static_cast<size_t>(batch * width), INT_MAX), lens;
  for (int64_t b = 0; b < batch; ++b) {
    std::copy(sel[b].begin(), sel[b].end(), table.begin() + b * width);
    lens.push_back(static_cast<int32_t>(sel[b].size()));
  }
  const int64_t n = static_cast<int64_t>(tokens.size()) / d_qk;
  DenseDecodeArgs a{.batch = batch, .s_q = s_q, .h_q = h_q, .h_kv = 1, .d_qk = d_qk, .d_v = d_v,
                    .num_blocks = n, .page_size = 1, .max_blocks_per_seq = width,
                    .q = view(q, {batch, s_q, h_q, d_qk}), .k_cache = view(tokens, {n, 1, 1, d_qk}),
                    .block_table = index_view(table, {batch, width}), .cache_seqlens = lens.data(),
                    .softmax_scale = scale};
  Outputs r;
  r.out.resize(static_cast<size_t>(batch * s_q * h_q * d_v));
  r.lse.resize(static_cast<size_t>(batch * h_q * s_q));
  dense_decode(a, r.out.data(), r.lse.data());
  return r;
}

// Index rows (batch, s_q, topk): every position of request b holds sel[b] in its own random order, padded
// with -1 at random slots.
std::vector<int32_t> scatter_indices(Rng& rng, const std::vector<std::vector<int32_t>>& sel, int64_t s_q,
                                     int64_t topk) {
  std::vector<int32_t> idx;
  for (const auto& s : sel) {
    for (int64_t i = 0; i < s_q; ++i) {
      std::vector<int32_t> row(s);
      row.resize(static_cast<size_t>(topk), -1);
      std::shuffle(row.begin(), row.end(), rng.gen);
      idx.insert(idx.end(), row.begin(), row.end());
    }
  }
  return idx;
}

// Distinct random token ids in [0, n) per request, of the given sizes.
std::vector<std::vector<int32_t>> random_selection(Rng& rng, int64_t n, const std::vector<int64_t>& sizes) {
  std::vector<std::vector<int32_t>> sel;
  for (int64_t size : sizes) {
    std::vector<int32_t> all(static_cast<size_t>(n));
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng.gen);
    sel.emplace_back(all.begin(), all.begin() + size);
  }
  return sel;
}

// Tokens not referenced by any selection become NaN (FlashMLA's tests poison them the same way).
void poison_unreferenced(std::vector<double>& tokens, int64_t d_qk, const std::vector<std::vector<int32_t>>& sel) {
  std::vector<bool> used(tokens.size() / d_qk, false);
  for (auto& s : sel)
    for (int32_t t : s) used[t] = true;
  for (size_t t = 0; t < used.size(); ++t)
    if (!used[t]) std::fill(tokens.begin() + t * d_qk, tokens.begin() + (t + 1) * d_qk, kNaN);
}

// Keys [2, 0] (twice, through a duplicate index) and [4, ln 3]: weights 1, 1, 3 -> out = 16/5, lse = ln 5.
// A sink of ln 5 halves the output and leaves lse alone.
TEST(ReferenceSparseDecode, HandComputedDuplicatesAndSink) {
  const std::vector<double> cache = {2.0, 0.0, 4.0, std::log(3.0), kNaN, kNaN};  // 3 tokens, page size 3
  const std::vector<double> q = {0.0, 1.0};
  const std::vector<int32_t> idx = {0, -1, 1, 0};
  SparseDecodeArgs a{.batch = 1, .s_q = 1, .h_q = 1, .d_qk = 2, .d_v = 1, .q = view(q, {1, 1, 1, 2}),
                     .cache = {.num_blocks = 1, .page_size = 3, .values = view(cache, {1, 3, 2})},
                     .topk = 4, .indices = index_view(idx, {1, 1, 4}), .softmax_scale = 1.0};
  Outputs r = run_sparse(a);
  EXPECT_NEAR(r.out[0], 3.2, 1e-14);
  EXPECT_NEAR(r.lse[0], std::log(5.0), 1e-14);
  const float sink = static_cast<float>(std::log(5.0));
  a.attn_sink = &sink;
  r = run_sparse(a);
  EXPECT_NEAR(r.out[0], 1.6, 1e-6);  // sink is a float: ln 5 rounded to float
  EXPECT_NEAR(r.lse[0], std::log(5.0), 1e-14);
}

// The dequantised-float path equals dense decode over the same selection; NaN in unreferenced tokens does
// not leak.
TEST(ReferenceSparseDecode, FloatCacheEqualsDenseOverSelection) {
  Rng rng(11);
  const int64_t d_qk = 24, d_v = 16, page = 7, blocks = 6, n = page * blocks, s_q = 2, h_q = 3, topk = 12;
  std::vector<double> tokens = rng.bf16_vector(static_cast<size_t>(n * d_qk), 0.5);
  const auto sel = random_selection(rng, n, {12, 5, 1, 0});
  poison_unreferenced(tokens, d_qk, sel);
  const std::vector<double> q = rng.bf16_vector(static_cast<size_t>(sel.size() * s_q * h_q * d_qk));
  const auto idx = scatter_indices(rng, sel, s_q, topk);
  const double scale = std::pow(static_cast<double>(d_qk), -0.55);
  SparseDecodeArgs a{.batch = 4, .s_q = s_q, .h_q = h_q, .d_qk = d_qk, .d_v = d_v, .q = view(q, {4, s_q, h_q, d_qk}),
                     .cache = {.num_blocks = blocks, .page_size = page, .values = view(tokens, {blocks, page, d_qk})},
                     .topk = topk, .indices = index_view(idx, {4, s_q, topk}), .softmax_scale = scale};
  const Outputs sparse = run_sparse(a);
  const Outputs dense = run_dense_over(tokens, d_qk, d_v, q, s_q, h_q, sel, scale);
  expect_near_all(sparse.out, dense.out, 1e-12, "out");
  expect_near_all(sparse.lse, dense.lse, 1e-12, "lse");
  for (int64_t i = 0; i < s_q * h_q; ++i) EXPECT_EQ(sparse.lse[3 * s_q * h_q + i], kInf);  // request 3: empty
}

// Both FP8 layouts: tokens encoded by the codec into pages with a padded stride (unreferenced tokens encoded
// from NaN), sparse decode through the codec equals dense decode over the decoded tokens.
void check_fp8_layout(Fp8Layout layout, uint64_t seed) {
  Rng rng(seed);
  const int64_t d_qk = fp8_head_dim(layout), d_v = 512, page = 5, blocks = 4, n = page * blocks;
  const int64_t bpt = fp8_bytes_per_token(layout), stride = page * bpt + 96;
  const int64_t s_q = 2, h_q = 2, topk = 8;
  std::vector<double> values = rng.bf16_vector(static_cast<size_t>(n * d_qk), 0.1);
  const auto sel = random_selection(rng, n, {8, 3, 0});
  poison_unreferenced(values, d_qk, sel);
  std::vector<uint8_t> bytes(static_cast<size_t>(blocks * stride), 0xAB);
  const std::vector<uint16_t> bits = to_bf16_bits(values);
  for (int64_t t = 0; t < n; ++t)
    fp8_encode_token(layout, bits.data() + t * d_qk, bytes.data() + (t / page) * stride, page, t % page);
  std::vector<double> decoded(static_cast<size_t>(n * d_qk));
  std::vector<float> tmp(static_cast<size_t>(d_qk));
  for (int64_t t = 0; t < n; ++t) {
    fp8_decode_token(layout, bytes.data() + (t / page) * stride, page, t % page, tmp.data());
    std::copy(tmp.begin(), tmp.end(), decoded.begin() + t * d_qk);
  }
  const std::vector<double> q = rng.bf16_vector(static_cast<size_t>(sel.size() * s_q * h_q * d_qk));
  const auto idx = scatter_indices(rng, sel, s_q, topk);
  const double scale = std::pow(static_cast<double>(d_qk), -0.55);
  SparseDecodeArgs a{.batch = 3, .s_q = s_q, .h_q = h_q, .d_qk = d_qk, .d_v = d_v, .q = view(q, {3, s_q, h_q, d_qk}),
                     .cache = {.num_blocks = blocks, .page_size = page, .fp8 = bytes.data(), .layout = layout,
                               .page_stride_bytes = stride},
                     .topk = topk, .indices = index_view(idx, {3, s_q, topk}), .softmax_scale = scale};
  const Outputs fp8 = run_sparse(a);
  const Outputs dense = run_dense_over(decoded, d_qk, d_v, q, s_q, h_q, sel, scale);
  expect_near_all(fp8.out, dense.out, 1e-12, "out");
  expect_near_all(fp8.lse, dense.lse, 1e-12, "lse");
  // The dequantised-float variant over the decoded tokens is the same computation in the same order.
  a.cache.fp8 = nullptr;
  a.cache.values = view(decoded, {blocks, page, d_qk});
  const Outputs flt = run_sparse(a);
  EXPECT_EQ(fp8.out, flt.out);
  EXPECT_EQ(fp8.lse, flt.lse);
  // The quantisation error is small: against the original bf16 tokens the output moves by far less than 0.1.
  a.cache.values = view(values, {blocks, page, d_qk});
  const Outputs orig = run_sparse(a);
  expect_near_all(fp8.out, orig.out, 5e-2, "out vs unquantised");
}

TEST(ReferenceSparseDecode, Fp8V32EqualsDenseOverDecodedTokens) { check_fp8_layout(Fp8Layout::kV32, 12); }
TEST(ReferenceSparseDecode, Fp8Model1EqualsDenseOverDecodedTokens) { check_fp8_layout(Fp8Layout::kModel1, 13); }

// Slots >= topk_length (per request) are never read: filling them with INT_MAX changes nothing (reading one
// would throw), and the result equals the same rows with those slots set to -1.
TEST(ReferenceSparseDecode, TopkLengthPerRequest) {
  Rng rng(14);
  const int64_t d_qk = 8, d_v = 8, page = 3, blocks = 5, n = page * blocks, s_q = 2, h_q = 2, topk = 6;
  const std::vector<double> tokens = rng.bf16_vector(static_cast<size_t>(n * d_qk));
  const auto sel = random_selection(rng, n, {6, 6, 6});
  std::vector<int32_t> idx = scatter_indices(rng, sel, s_q, topk), masked = idx;
  const std::vector<int32_t> lens = {4, 0, 6};
  for (int64_t b = 0; b < 3; ++b)
    for (int64_t s = 0; s < s_q; ++s)
      for (int64_t t = lens[b]; t < topk; ++t) {
        idx[(b * s_q + s) * topk + t] = INT_MAX;
        masked[(b * s_q + s) * topk + t] = -1;
      }
  const std::vector<double> q = rng.bf16_vector(static_cast<size_t>(3 * s_q * h_q * d_qk));
  SparseDecodeArgs a{.batch = 3, .s_q = s_q, .h_q = h_q, .d_qk = d_qk, .d_v = d_v, .q = view(q, {3, s_q, h_q, d_qk}),
                     .cache = {.num_blocks = blocks, .page_size = page, .values = view(tokens, {blocks, page, d_qk})},
                     .topk = topk, .indices = index_view(idx, {3, s_q, topk}), .topk_length = lens.data(),
                     .softmax_scale = 0.3};
  const Outputs with_len = run_sparse(a);
  a.indices = index_view(masked, {3, s_q, topk});
  a.topk_length = nullptr;
  const Outputs with_mask = run_sparse(a);
  EXPECT_EQ(with_len.out, with_mask.out);
  EXPECT_EQ(with_len.lse, with_mask.lse);
  for (int64_t i = 0; i < s_q * h_q; ++i) EXPECT_EQ(with_len.lse[s_q * h_q + i], kInf);
}

// Sinks per head: finite scales out by 1/(1+exp(sink-lse)), +inf zeroes it, -inf is a no-op; lse never
// changes; a row without valid tokens stays out 0 / lse +inf whatever the sink.
TEST(ReferenceSparseDecode, SinkBehaviour) {
  Rng rng(15);
  const int64_t d_qk = 8, d_v = 4, n = 10, h_q = 4, topk = 4;
  const std::vector<double> tokens = rng.bf16_vector(static_cast<size_t>(n * d_qk));
  const std::vector<int32_t> idx = {3, 7, -1, 1, /* request 1: */ -1, -1, -1, -1};
  const std::vector<double> q = rng.bf16_vector(static_cast<size_t>(2 * h_q * d_qk));
  const std::vector<float> sinks = {0.25f, static_cast<float>(kInf), -static_cast<float>(kInf), -1.5f};
  SparseDecodeArgs a{.batch = 2, .s_q = 1, .h_q = h_q, .d_qk = d_qk, .d_v = d_v, .q = view(q, {2, 1, h_q, d_qk}),
                     .cache = {.num_blocks = 1, .page_size = n, .values = view(tokens, {1, n, d_qk})},
                     .topk = topk, .indices = index_view(idx, {2, 1, topk}), .softmax_scale = 0.5};
  const Outputs plain = run_sparse(a);
  a.attn_sink = sinks.data();
  const Outputs sunk = run_sparse(a);
  EXPECT_EQ(plain.lse, sunk.lse);
  for (int64_t h = 0; h < h_q; ++h) {
    const double lse = plain.lse[h];
    const double factor = h == 1 ? 0.0 : h == 2 ? 1.0 : 1.0 / (1.0 + std::exp(sinks[h] - lse));
    for (int64_t d = 0; d < d_v; ++d) EXPECT_NEAR(sunk.out[h * d_v + d], plain.out[h * d_v + d] * factor, 1e-15);
    EXPECT_EQ(sunk.lse[h_q + h], kInf);
    for (int64_t d = 0; d < d_v; ++d) EXPECT_EQ(sunk.out[(h_q + h) * d_v + d], 0.0);
  }
}

// Main + extra cache under one softmax: equals a single cache holding both (viewed with one token per page),
// and equals merging the main-only and extra-only results; extra_topk_length is honoured.
TEST(ReferenceSparseDecode, ExtraCacheJoinsTheSoftmax) {
  Rng rng(16);
  const int64_t d_qk = 12, d_v = 12, s_q = 2, h_q = 2, batch = 2;
  const int64_t page = 4, blocks = 3, n = page * blocks, topk = 5;
  const int64_t xpage = 3, xblocks = 4, xn = xpage * xblocks, xtopk = 4;
  std::vector<double> main_tokens = rng.bf16_vector(static_cast<size_t>(n * d_qk));
  std::vector<double> extra_tokens = rng.bf16_vector(static_cast<size_t>(xn * d_qk));
  const auto idx = scatter_indices(rng, random_selection(rng, n, {4, 5}), s_q, topk);
  auto xidx = scatter_indices(rng, random_selection(rng, xn, {4, 2}), s_q, xtopk);
  const std::vector<int32_t> xlens = {3, 4};
  for (int64_t s = 0; s < s_q; ++s) xidx[(0 * s_q + s) * xtopk + 3] = INT_MIN;  // past extra_topk_length
  const std::vector<double> q = rng.bf16_vector(static_cast<size_t>(batch * s_q * h_q * d_qk));
  const std::vector<float> sinks = {0.5f, -0.5f};
  SparseDecodeArgs a{.batch = batch, .s_q = s_q, .h_q = h_q, .d_qk = d_qk, .d_v = d_v,
                     .q = view(q, {batch, s_q, h_q, d_qk}),
                     .cache = {.num_blocks = blocks, .page_size = page, .values = view(main_tokens, {blocks, page, d_qk})},
                     .topk = topk, .indices = index_view(idx, {batch, s_q, topk}), .attn_sink = sinks.data(),
                     .has_extra = true,
                     .extra_cache = {.num_blocks = xblocks, .page_size = xpage,
                                     .values = view(extra_tokens, {xblocks, xpage, d_qk})},
                     .extra_topk = xtopk, .extra_indices = index_view(xidx, {batch, s_q, xtopk}),
                     .extra_topk_length = xlens.data(), .softmax_scale = 0.4};
  const Outputs joint = run_sparse(a);

  // One cache holding main tokens then extra tokens, one token per page; index rows concatenated.
  std::vector<double> both = main_tokens;
  both.insert(both.end(), extra_tokens.begin(), extra_tokens.end());
  std::vector<int32_t> cat;
  for (int64_t r = 0; r < batch * s_q; ++r) {
    cat.insert(cat.end(), idx.begin() + r * topk, idx.begin() + (r + 1) * topk);
    for (int64_t t = 0; t < xtopk; ++t) {
      const int32_t x = xidx[r * xtopk + t];
      cat.push_back(t >= xlens[r / s_q] || x == -1 ? -1 : static_cast<int32_t>(x + n));
    }
  }
  SparseDecodeArgs single = a;
  single.has_extra = false;
  single.cache = {.num_blocks = n + xn, .page_size = 1, .values = view(both, {n + xn, 1, d_qk})};
  single.topk = topk + xtopk;
  single.indices = index_view(cat, {batch, s_q, topk + xtopk});
  const Outputs one = run_sparse(single);
  EXPECT_EQ(joint.out, one.out);
  EXPECT_EQ(joint.lse, one.lse);

  // Main-only and extra-only (no sinks) merged with the sink equal the joint result.
  SparseDecodeArgs main_only = a, extra_only = a;
  main_only.has_extra = false;
  main_only.attn_sink = nullptr;
  extra_only.cache = a.extra_cache;
  extra_only.topk = xtopk;
  extra_only.indices = a.extra_indices;
  extra_only.topk_length = xlens.data();
  extra_only.has_extra = false;
  extra_only.attn_sink = nullptr;
  const Outputs pm = run_sparse(main_only), px = run_sparse(extra_only);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t s = 0; s < s_q; ++s)
      for (int64_t h = 0; h < h_q; ++h) {
        const int64_t row = (b * s_q + s) * h_q + h, lrow = (b * h_q + h) * s_q + s;
        std::vector<double> o(pm.out.begin() + row * d_v, pm.out.begin() + (row + 1) * d_v);
        o.insert(o.end(), px.out.begin() + row * d_v, px.out.begin() + (row + 1) * d_v);
        const std::vector<double> l = {pm.lse[lrow], px.lse[lrow]};
        std::vector<double> merged(static_cast<size_t>(d_v));
        double merged_lse;
        merge_partials(MergeArgs{.num_partials = 2, .d_v = d_v, .o = view(o, {2, d_v}), .lse = view(l, {2}),
                                 .lse_base = LseBase::kNatural, .attn_sink = &sinks[h]},
                       merged.data(), &merged_lse);
        EXPECT_NEAR(merged_lse, joint.lse[lrow], 1e-12);
        for (int64_t d = 0; d < d_v; ++d) EXPECT_NEAR(merged[d], joint.out[row * d_v + d], 1e-12);
      }
}

TEST(ReferenceSparseDecode, OnlyMinusOneIsInvalid) {
  const std::vector<double> cache(4 * 2, 1.0);
  const std::vector<double> q = {1.0, 1.0};
  for (int32_t bad : {-2, 4, INT_MAX}) {
    const std::vector<int32_t> idx = {0, bad};
    SparseDecodeArgs a{.batch = 1, .s_q = 1, .h_q = 1, .d_qk = 2, .d_v = 2, .q = view(q, {1, 1, 1, 2}),
                       .cache = {.num_blocks = 2, .page_size = 2, .values = view(cache, {2, 2, 2})},
                       .topk = 2, .indices = index_view(idx, {1, 1, 2}), .softmax_scale = 1.0};
    try {
      run_sparse(a);
      FAIL() << "index " << bad << " should be rejected";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("'indices'"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace openmla::ref::testing
