// Sparse prefill from the FP8 cache, API: every validation error of sparse_prefill_fp8 and the parameters it builds.
// Fake, aligned, non-null "device" pointers: validate_sparse_prefill_fp8 makes no CUDA call (no GPU needed, nothing is
// launched).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>

#include "api/sparse_prefill_internal.h"
#include "openmla/prefill.h"

namespace openmla {
namespace {

void* fake_ptr(int i) { return reinterpret_cast<void*>(uintptr_t{0x10000000} + uintptr_t(i) * 0x10000000); }

// A valid call: s_q = 100, h_q = 128, V3.2 cache of 50 pages x 64 tokens, topk = 2048, both optional inputs.
SparsePrefillFp8Args valid_args() {
  SparsePrefillFp8Args a;
  a.q = make_tensor(fake_ptr(1), DType::kBFloat16, {100, 128, 576});
  a.kv_cache = make_tensor(fake_ptr(2), DType::kUInt8, {50, 64, 1, 656});
  a.cache_format = KVCacheFormat::kFp8V32;
  a.indices = make_tensor(fake_ptr(3), DType::kInt32, {100, 1, 2048});
  a.topk_length = make_tensor(fake_ptr(4), DType::kInt32, {100});
  a.attn_sink = make_tensor(fake_ptr(5), DType::kFloat32, {128});
  a.softmax_scale = 0.5f;
  a.out = make_tensor(fake_ptr(6), DType::kBFloat16, {100, 128, 512});
  a.max_logits = make_tensor(fake_ptr(7), DType::kFloat32, {100, 128});
  a.lse = make_tensor(fake_ptr(8), DType::kFloat32, {100, 128});
  a.num_sms = 132;
  return a;
}

void expect_error(const std::function<void(SparsePrefillFp8Args&)>& mutate, const std::string& needle,
                  StatusCode code = StatusCode::kInvalidArgument) {
  SparsePrefillFp8Args a = valid_args();
  mutate(a);
  const Status s = detail::validate_sparse_prefill_fp8(a, nullptr);
  ASSERT_FALSE(s.is_ok()) << "expected an error naming " << needle;
  EXPECT_EQ(s.code(), code) << s.message();
  EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
}

TEST(SparsePrefillFp8Api, ValidCallBuildsParams) {
  kernels::SparsePrefillFp8Params p;
  ASSERT_TRUE(detail::validate_sparse_prefill_fp8(valid_args(), &p).is_ok());
  EXPECT_EQ(p.base.s_q, 100);
  EXPECT_EQ(p.base.h_q, 128);
  EXPECT_EQ(p.base.d_qk, 576);
  EXPECT_EQ(p.base.s_kv, 50 * 64);  // cache slots
  EXPECT_EQ(p.base.topk, 2048);
  EXPECT_EQ(p.base.num_head_tiles, 2);
  EXPECT_EQ(p.base.num_tiles, 200);
  EXPECT_EQ(p.base.grid, 132);
  EXPECT_EQ(p.base.kv, nullptr);
  EXPECT_EQ(p.base.indices_stride_s, 2048);
  EXPECT_FLOAT_EQ(p.base.scale_log2, 0.5f * 1.4426950408889634f);
  EXPECT_EQ(p.cache, fake_ptr(2));
  EXPECT_EQ(p.page_size, 64);
  EXPECT_EQ(p.page_stride, 64 * 656);
}

TEST(SparsePrefillFp8Api, Model1AnyPageSizeAndPageStride) {
  SparsePrefillFp8Args a = valid_args();
  a.cache_format = KVCacheFormat::kFp8Model1;
  a.q = make_tensor(fake_ptr(1), DType::kBFloat16, {3, 16, 512});
  a.out = make_tensor(fake_ptr(6), DType::kBFloat16, {3, 16, 512});
  a.max_logits = make_tensor(fake_ptr(7), DType::kFloat32, {3, 16});
  a.lse = make_tensor(fake_ptr(8), DType::kFloat32, {3, 16});
  a.indices = make_tensor(fake_ptr(3), DType::kInt32, {3, 1, 5});
  a.topk_length = TensorRef{};
  a.attn_sink = TensorRef{};
  a.softmax_scale = 0.f;
  // page size 53, page stride ceil(53 * 584 / 576) * 576 (the MODEL1 reference allocator's) = 31104, a multiple of 16.
  a.kv_cache = make_tensor(fake_ptr(2), DType::kFloat8E4M3, {7, 53, 1, 584}, {31104, 584, 584, 1});
  kernels::SparsePrefillFp8Params p;
  ASSERT_TRUE(detail::validate_sparse_prefill_fp8(a, &p).is_ok());
  EXPECT_EQ(p.base.d_qk, 512);
  EXPECT_EQ(p.base.s_kv, 7 * 53);
  EXPECT_EQ(p.page_size, 53);
  EXPECT_EQ(p.page_stride, 31104);
  EXPECT_EQ(p.base.topk_length, nullptr);
  EXPECT_FLOAT_EQ(p.base.scale_log2, static_cast<float>(1.4426950408889634 / std::sqrt(512.0)));
  // One page of one token: the page stride is never used.
  a.kv_cache = make_tensor(fake_ptr(2), DType::kInt8, {1, 1, 1, 584}, {5, 3, 7, 1});
  ASSERT_TRUE(detail::validate_sparse_prefill_fp8(a, &p).is_ok());
  EXPECT_EQ(p.base.s_kv, 1);
}

TEST(SparsePrefillFp8Api, ErrorsNameTheArgument) {
  expect_error([](auto& a) { a.cache_format = KVCacheFormat::kBFloat16; }, "argument 'cache_format'");
  expect_error([](auto& a) { a.cache_format = KVCacheFormat::kFp8Model1; }, "argument 'q' has head dimension 576");
  expect_error([](auto& a) { a.q = make_tensor(fake_ptr(1), DType::kFloat16, {100, 128, 576}); }, "argument 'q'");
  expect_error([](auto& a) { a.kv_cache = make_tensor(fake_ptr(2), DType::kBFloat16, {50, 64, 1, 656}); },
               "argument 'kv_cache'");
  expect_error([](auto& a) { a.kv_cache = make_tensor(fake_ptr(2), DType::kUInt8, {50, 64, 1, 584}); },
               "bytes per token");
  expect_error([](auto& a) { a.kv_cache = make_tensor(fake_ptr(2), DType::kUInt8, {50, 64, 2, 656}); },
               "argument 'kv_cache'");
  expect_error([](auto& a) { a.kv_cache = make_tensor(fake_ptr(2), DType::kUInt8, {3200, 656}); },
               "argument 'kv_cache'");
  expect_error([](auto& a) { a.kv_cache = make_tensor(fake_ptr(2), DType::kUInt8, {0, 64, 1, 656}); },
               "num_blocks >= 1");
  // Page stride not a multiple of 16, or smaller than a page; tokens not 656 bytes apart.
  expect_error([](auto& a) { a.kv_cache = make_tensor(fake_ptr(2), DType::kUInt8, {50, 64, 1, 656}, {64 * 656 + 8, 656, 656, 1}); },
               "page stride");
  expect_error([](auto& a) { a.kv_cache = make_tensor(fake_ptr(2), DType::kUInt8, {50, 64, 1, 656}, {63 * 656, 656, 656, 1}); },
               "page stride");
  expect_error([](auto& a) { a.kv_cache = make_tensor(fake_ptr(2), DType::kUInt8, {50, 64, 1, 656}, {64 * 672, 672, 672, 1}); },
               "each page must be contiguous");
  expect_error([](auto& a) {
    a.kv_cache = make_tensor(reinterpret_cast<void*>(uintptr_t{0x10000008}), DType::kUInt8, {50, 64, 1, 656});
  }, "argument 'kv_cache'");
  expect_error([](auto& a) { a.kv_cache = make_tensor(fake_ptr(2), DType::kUInt8, {int64_t{1} << 26, 64, 1, 656}); },
               "2^31 - 1 cache slots");
  expect_error([](auto& a) { a.kv_cache = make_tensor(fake_ptr(2), DType::kUInt8, {1, int64_t{1} << 22, 1, 656}); },
               "tokens per page");
  expect_error([](auto& a) { a.indices = make_tensor(fake_ptr(3), DType::kInt64, {100, 1, 2048}); }, "argument 'indices'");
  expect_error([](auto& a) { a.indices = make_tensor(fake_ptr(3), DType::kInt32, {99, 1, 2048}); }, "argument 'indices'");
  expect_error([](auto& a) { a.indices = make_tensor(fake_ptr(3), DType::kInt32, {100, 1, 0}); }, "topk >= 1");
  expect_error([](auto& a) { a.topk_length = make_tensor(fake_ptr(4), DType::kInt32, {101}); }, "argument 'topk_length'");
  expect_error([](auto& a) { a.attn_sink = make_tensor(fake_ptr(5), DType::kFloat32, {64}); }, "argument 'attn_sink'");
  expect_error([](auto& a) { a.d_v = 576; }, "argument 'd_v'");
  expect_error([](auto& a) { a.softmax_scale = -1.f; }, "argument 'softmax_scale'");
  expect_error([](auto& a) { a.softmax_scale = INFINITY; }, "argument 'softmax_scale'");
  expect_error([](auto& a) { a.out = make_tensor(fake_ptr(6), DType::kBFloat16, {100, 128, 576}); }, "argument 'out'");
  expect_error([](auto& a) { a.max_logits = make_tensor(fake_ptr(7), DType::kFloat32, {100, 64}); }, "argument 'max_logits'");
  expect_error([](auto& a) { a.lse = make_tensor(fake_ptr(8), DType::kBFloat16, {100, 128}); }, "argument 'lse'");
  expect_error([](auto& a) { a.num_sms = -1; }, "argument 'num_sms'");
  // An output on top of the cache.
  expect_error([](auto& a) { a.lse = make_tensor(fake_ptr(2), DType::kFloat32, {100, 128}); }, "argument 'lse'");
}

}  // namespace
}  // namespace openmla
