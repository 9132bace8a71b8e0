// FP8 dense decode API (openmla/dense_decode_fp8.h): every validation error names its argument, and the parameters a
// valid call would launch with (strides in bytes, folded scales, the combine's view). Fake, aligned, non-null "device"
// pointers and problem.num_sms > 0: every check runs before any CUDA call, so no GPU is needed.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "api/dense_decode_fp8_internal.h"
#include "openmla/dense_decode_fp8.h"

namespace openmla {
namespace {

void* fake_ptr(int i) { return reinterpret_cast<void*>(uintptr_t{0x10000000} + (uintptr_t(i) << 36)); }

constexpr int kSms = 132;

DenseDecodeProblem fp8_problem() {
  DenseDecodeProblem p;
  p.batch = 2;
  p.s_q = 2;
  p.h_q = 16;
  p.h_kv = 1;
  p.causal = true;
  p.page_block_size = 64;
  p.cache_format = KVCacheFormat::kFp8E4M3;
  p.num_sms = kSms;
  return p;
}

// A valid call: b = 2, s_q = 2, h_q = 16 -> 32 rows, one m-block, num_sm_parts = 132.
DenseDecodeFp8Args fp8_args(const DenseDecodeProblem& p) {
  const int64_t parts = 132;
  const int64_t rows = (p.batch + parts) * p.s_q * p.h_q;
  DenseDecodeFp8Args a;
  a.q = make_tensor(fake_ptr(1), DType::kBFloat16, {p.batch, p.s_q, p.h_q, 576});
  a.k_cache = make_tensor(fake_ptr(2), DType::kFloat8E4M3, {10, p.page_block_size, 1, 576});
  a.block_table = make_tensor(fake_ptr(3), DType::kInt32, {p.batch, 4});
  a.cache_seqlens = make_tensor(fake_ptr(4), DType::kInt32, {p.batch});
  a.schedule.metadata = make_tensor(fake_ptr(5), DType::kInt32, {parts, kDecodeScheduleRecordInts});
  a.schedule.num_splits = make_tensor(fake_ptr(6), DType::kInt32, {p.batch + 1});
  a.split.partial_o = make_tensor(fake_ptr(7), DType::kFloat32, {rows, 512});
  a.split.partial_lse = make_tensor(fake_ptr(8), DType::kFloat32, {rows});
  a.out = make_tensor(fake_ptr(9), DType::kBFloat16, {p.batch, p.s_q, p.h_q, 512});
  a.lse = make_tensor(fake_ptr(10), DType::kFloat32, {p.batch, p.h_q, p.s_q});
  a.descale_k = make_tensor(fake_ptr(11), DType::kFloat32, {1});
  return a;
}

Status validate(const DenseDecodeProblem& p, const DenseDecodeFp8Args& a) {
  int parts = 0;
  return detail::validate_dense_decode_fp8(p, a, &parts);
}

void expect_invalid(const Status& s, const std::vector<std::string>& needles) {
  ASSERT_FALSE(s.is_ok()) << "expected an error mentioning " << needles[0];
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.message();
  for (const std::string& n : needles) EXPECT_NE(s.message().find(n), std::string::npos) << s.message();
}

TEST(DenseDecodeFp8Api, ValidCallPasses) {
  const DenseDecodeProblem p = fp8_problem();
  int parts = 0;
  const Status s = detail::validate_dense_decode_fp8(p, fp8_args(p), &parts);
  ASSERT_TRUE(s.is_ok()) << s.message();
  EXPECT_EQ(parts, 132);
  // An e4m3 q, host scales, any page size.
  DenseDecodeFp8Args a = fp8_args(p);
  a.q = make_tensor(fake_ptr(1), DType::kFloat8E4M3, {2, 2, 16, 576});
  a.descale_q_value = 0.25f;
  a.descale_k = TensorRef{};
  a.descale_k_value = 3.5f;
  EXPECT_TRUE(validate(p, a).is_ok()) << validate(p, a).message();
  for (int64_t page : {1, 7, 16, 100, 256, 1024}) {
    DenseDecodeProblem pp = p;
    pp.page_block_size = page;
    DenseDecodeFp8Args ap = fp8_args(pp);
    EXPECT_TRUE(validate(pp, ap).is_ok()) << page << ": " << validate(pp, ap).message();
  }
  // A 0-d scale and a uint8 view of the cache.
  a = fp8_args(p);
  a.descale_k = make_tensor(fake_ptr(11), DType::kFloat32, {});
  a.k_cache = make_tensor(fake_ptr(2), DType::kUInt8, {10, 64, 1, 576});
  EXPECT_TRUE(validate(p, a).is_ok()) << validate(p, a).message();
}

struct Mutation {
  const char* what;
  std::function<void(DenseDecodeProblem&, DenseDecodeFp8Args&)> apply;
  std::vector<std::string> needles;
};

TEST(DenseDecodeFp8Api, NotWithPerRequestQueryLengths) {
  DenseDecodeProblem p = fp8_problem();
  p.varlen_q = true;
  const Status s = validate(p, fp8_args(p));
  EXPECT_EQ(s.code(), StatusCode::kUnsupported) << s.message();
  EXPECT_NE(s.message().find("'problem.varlen_q'"), std::string::npos) << s.message();
}

TEST(DenseDecodeFp8Api, EveryBadArgumentIsNamed) {
  const std::vector<Mutation> mutations = {
      {"bf16 format", [](auto& p, auto&) { p.cache_format = KVCacheFormat::kBFloat16; },
       {"'problem.cache_format'", "dense_decode_fp8"}},
      {"V3.2 format", [](auto& p, auto&) { p.cache_format = KVCacheFormat::kFp8V32; }, {"'problem.cache_format'"}},
      {"h_kv 2", [](auto& p, auto& a) {
         p.h_kv = 2;
         a.k_cache = make_tensor(fake_ptr(2), DType::kFloat8E4M3, {10, 64, 2, 576});
       }, {"h_kv"}},
      {"d_qk 512", [](auto& p, auto&) { p.d_qk = 512; }, {"d_qk"}},
      {"fp16 q", [](auto&, auto& a) { a.q = make_tensor(fake_ptr(1), DType::kFloat16, {2, 2, 16, 576}); },
       {"argument 'q' has dtype float16", "bfloat16 or float8_e4m3"}},
      {"uint8 q", [](auto&, auto& a) { a.q = make_tensor(fake_ptr(1), DType::kUInt8, {2, 2, 16, 576}); },
       {"argument 'q'"}},
      {"bf16 cache", [](auto&, auto& a) { a.k_cache = make_tensor(fake_ptr(2), DType::kBFloat16, {10, 64, 1, 576}); },
       {"'k_cache'"}},
      {"cache 656 bytes", [](auto&, auto& a) { a.k_cache = make_tensor(fake_ptr(2), DType::kUInt8, {10, 64, 1, 656}); },
       {"'k_cache'"}},
      {"cache page size", [](auto&, auto& a) { a.k_cache = make_tensor(fake_ptr(2), DType::kFloat8E4M3, {10, 32, 1, 576}); },
       {"'k_cache'"}},
      {"cache row stride 584", [](auto&, auto& a) {
         a.k_cache = make_tensor(fake_ptr(2), DType::kFloat8E4M3, {10, 64, 1, 576}, {64 * 584, 584, 584, 1});
       }, {"'k_cache'", "row stride"}},
      {"descale_k bf16", [](auto&, auto& a) { a.descale_k = make_tensor(fake_ptr(11), DType::kBFloat16, {1}); },
       {"'descale_k'"}},
      {"descale_k two values", [](auto&, auto& a) { a.descale_k = make_tensor(fake_ptr(11), DType::kFloat32, {2}); },
       {"'descale_k'", "one float32 value"}},
      {"descale_q host", [](auto&, auto& a) {
         a.descale_q = make_tensor(fake_ptr(12), DType::kFloat32, {1});
         a.descale_q.device = DeviceType::kCPU;
       }, {"'descale_q'"}},
      {"descale_k twice", [](auto&, auto& a) { a.descale_k_value = 2.f; }, {"'descale_k'", "'descale_k_value'"}},
      {"descale_q_value 0", [](auto&, auto& a) { a.descale_q_value = 0.f; }, {"'descale_q_value'"}},
      {"descale_q_value inf", [](auto&, auto& a) { a.descale_q_value = INFINITY; }, {"'descale_q_value'"}},
      {"fp16 out", [](auto&, auto& a) { a.out = make_tensor(fake_ptr(9), DType::kFloat16, {2, 2, 16, 512}); },
       {"'out'"}},
      {"batch_invariant", [](auto& p, auto&) {
         p.batch_invariant = true;
         p.max_blocks_per_seq = 4;
       }, {"batch_invariant"}},
      {"block table width", [](auto& p, auto&) { p.max_blocks_per_seq = 5; }, {"'block_table'"}},
      {"schedule parts", [](auto&, auto& a) {
         a.schedule.metadata = make_tensor(fake_ptr(5), DType::kInt32, {66, kDecodeScheduleRecordInts});
       }, {"'schedule.metadata'"}},
      {"out overlaps q", [](auto&, auto& a) { a.out.data = a.q.data; }, {"'out'", "'q'"}},
  };
  for (const Mutation& m : mutations) {
    DenseDecodeProblem p = fp8_problem();
    DenseDecodeFp8Args a = fp8_args(p);
    m.apply(p, a);
    SCOPED_TRACE(m.what);
    expect_invalid(validate(p, a), m.needles);
  }
}

TEST(DenseDecodeFp8Api, ParamsOfAValidCall) {
  DenseDecodeProblem p = fp8_problem();
  p.page_block_size = 100;
  DenseDecodeFp8Args a = fp8_args(p);
  a.k_cache = make_tensor(fake_ptr(2), DType::kFloat8E4M3, {10, 100, 1, 576}, {100 * 592 + 16, 592, 576, 1});
  a.q = make_tensor(fake_ptr(1), DType::kFloat8E4M3, {2, 2, 16, 576});
  a.descale_q_value = 0.5f;
  a.softmax_scale = 0.1f;
  int parts = 0;
  ASSERT_TRUE(detail::validate_dense_decode_fp8(p, a, &parts).is_ok()) << detail::validate_dense_decode_fp8(p, a, &parts).message();
  const detail::DenseDecodeFp8Call call = detail::prepare_dense_decode_fp8(p, a, parts);
  EXPECT_TRUE(call.q_fp8);
  EXPECT_EQ(call.params.rows, 32);
  EXPECT_EQ(call.params.num_m_blocks, 1);
  EXPECT_EQ(call.params.num_sm_parts, 132);
  EXPECT_TRUE(call.params.causal);
  EXPECT_EQ(call.params.page_stride, 100 * 592 + 16);
  EXPECT_EQ(call.params.row_stride, 592);
  EXPECT_EQ(call.params.page_size, 100);
  EXPECT_EQ(call.params.num_pages, 10);
  EXPECT_EQ(call.params.max_blocks_per_seq, 4);
  EXPECT_EQ(call.params.descale_q, nullptr);
  EXPECT_FLOAT_EQ(call.params.descale_q_value, 0.5f);
  EXPECT_EQ(call.params.descale_k, static_cast<const float*>(fake_ptr(11)));
  EXPECT_FLOAT_EQ(call.params.descale_k_value, 1.f);
  EXPECT_FLOAT_EQ(call.params.softmax_scale, 0.1f);
  EXPECT_FLOAT_EQ(call.params.scale_log2, 0.1f * 1.4426950408889634f);
  EXPECT_EQ(call.combine.h_kv, 1);
  EXPECT_EQ(call.combine.merged_in_kernel, 1);  // every split chunk leaves a partial for the combine
  EXPECT_FALSE(call.params.hold_pv_r);  // the plan does not hold P V_R (decision dense-fp8-v2)
  EXPECT_TRUE(detail::prepare_dense_decode_fp8(p, a, parts, {.hold_pv_r = detail::HoldPvR::kOn}).params.hold_pv_r);
  EXPECT_FALSE(call.params.early_qk);
  EXPECT_FALSE(call.params.k_l1_no_allocate);
  EXPECT_TRUE(detail::prepare_dense_decode_fp8(p, a, parts, {.early_qk = true}).params.early_qk);
  EXPECT_FALSE(detail::dense_fp8_hold_pv_r(2));  // measured slower: never by default
  EXPECT_FALSE(detail::dense_fp8_hold_pv_r(1));
  // s_q = 1: no causal mask.
  p.s_q = 1;
  a = fp8_args(p);
  a.k_cache = make_tensor(fake_ptr(2), DType::kFloat8E4M3, {10, 100, 1, 576});
  ASSERT_TRUE(detail::validate_dense_decode_fp8(p, a, &parts).is_ok());
  EXPECT_FALSE(detail::prepare_dense_decode_fp8(p, a, parts).params.causal);
}

}  // namespace
}  // namespace openmla
