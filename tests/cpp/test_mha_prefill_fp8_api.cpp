// Dense MHA prefill with FP8 (float8_e4m3fn) q, k, v: the validation errors of the FP8 path of mha_prefill, the
// parameters it builds (descale strides, the output type), and that 16-bit calls refuse descales. Fake, aligned device
// pointers: validate_mha_prefill(_fp8) makes no CUDA call.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>

#include "api/mha_prefill_internal.h"
#include "heuristics/mha_prefill_launch.h"
#include "mha_prefill_fixture.h"
#include "openmla/prefill.h"

namespace openmla {
namespace {

void* fake_ptr(int i) { return reinterpret_cast<void*>(uintptr_t{0x10000000} + uintptr_t(i) * 0x10000000); }

MhaPrefillProblem fp8_problem() {
  MhaPrefillProblem p = testing::mha_fixture_problem(132);
  p.dtype = DType::kFloat8E4M3;
  return p;
}

MhaPrefillArgs fp8_args() {
  MhaPrefillArgs a = testing::mha_fixture_args(fake_ptr);
  for (TensorRef* t : {&a.q, &a.k, &a.v}) t->dtype = DType::kFloat8E4M3;
  a.q_descale = make_tensor(fake_ptr(9), DType::kFloat32, {4, 2});
  a.k_descale = make_tensor(fake_ptr(10), DType::kFloat32, {4, 2}, {1, 4});  // a transposed view
  a.v_descale = make_tensor(fake_ptr(11), DType::kFloat32, {});              // one value
  return a;
}

void expect_fp8_error(const std::function<void(MhaPrefillProblem&, MhaPrefillArgs&)>& mutate,
                      const std::string& needle, StatusCode code = StatusCode::kInvalidArgument) {
  MhaPrefillProblem p = fp8_problem();
  MhaPrefillArgs a = fp8_args();
  mutate(p, a);
  const Status s = p.dtype == DType::kFloat8E4M3 ? detail::validate_mha_prefill_fp8(p, a, nullptr)
                                                 : detail::validate_mha_prefill(p, a, nullptr);
  ASSERT_FALSE(s.is_ok()) << "expected an error naming " << needle;
  EXPECT_EQ(s.code(), code) << s.message();
  EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
}

TEST(MhaPrefillFp8Api, ValidCallBuildsParams) {
  kernels::MhaPrefillFp8Params p;
  const Status st = detail::validate_mha_prefill_fp8(fp8_problem(), fp8_args(), &p);
  ASSERT_TRUE(st.is_ok()) << st.message();
  EXPECT_EQ(p.base.d_qk, 192);
  EXPECT_EQ(p.base.q_stride_t, 16 * 192);  // elements = bytes
  EXPECT_EQ(p.base.h_kv, 2);
  EXPECT_FALSE(p.base.fp16);
  EXPECT_FALSE(p.base.staged_out);
  EXPECT_FALSE(p.out_fp16);
  EXPECT_EQ(p.q_descale, fake_ptr(9));
  EXPECT_EQ(p.q_descale_stride_b, 2);
  EXPECT_EQ(p.q_descale_stride_h, 1);
  EXPECT_EQ(p.k_descale_stride_b, 1);
  EXPECT_EQ(p.k_descale_stride_h, 4);
  EXPECT_EQ(p.v_descale, fake_ptr(11));
  EXPECT_EQ(p.v_descale_stride_b, 0);
  EXPECT_EQ(p.v_descale_stride_h, 0);
  EXPECT_EQ(p.base.grid, 132);
}

// The key block (decision fp8-d5): OPENMLA_FP8_BLOCK_N's parse, the override of the Python layer's setter, and the
// parameter the launcher dispatches on.
TEST(MhaPrefillFp8Api, BlockNParse) {
  EXPECT_EQ(heuristics::parse_mha_prefill_fp8_block_n(nullptr), heuristics::kMhaPrefillFp8BlockN);
  EXPECT_EQ(heuristics::parse_mha_prefill_fp8_block_n(""), heuristics::kMhaPrefillFp8BlockN);
  EXPECT_EQ(heuristics::parse_mha_prefill_fp8_block_n("128"), 128);
  EXPECT_EQ(heuristics::parse_mha_prefill_fp8_block_n("192"), 192);
  for (const char* bad : {"256", "160", "128 ", "0x80", "-1", "abc"})
    EXPECT_EQ(heuristics::parse_mha_prefill_fp8_block_n(bad), 0) << bad;
  EXPECT_TRUE(heuristics::kMhaPrefillFp8BlockN == 128 || heuristics::kMhaPrefillFp8BlockN == 192);
}

TEST(MhaPrefillFp8Api, BlockNOverrideReachesParams) {
  const int from_env = heuristics::mha_prefill_fp8_block_n();  // this process's environment (or the default)
  for (int block_n : {128, 192}) {
    heuristics::set_mha_prefill_fp8_block_n(block_n);
    EXPECT_EQ(heuristics::mha_prefill_fp8_block_n(), block_n);
    kernels::MhaPrefillFp8Params p;
    const Status st = detail::validate_mha_prefill_fp8(fp8_problem(), fp8_args(), &p);
    ASSERT_TRUE(st.is_ok()) << st.message();
    EXPECT_EQ(p.block_n, block_n);
  }
  heuristics::set_mha_prefill_fp8_block_n(256);  // not a kernel: clears the override
  EXPECT_EQ(heuristics::mha_prefill_fp8_block_n(), from_env);
  heuristics::set_mha_prefill_fp8_block_n(0);
  EXPECT_EQ(heuristics::mha_prefill_fp8_block_n(), from_env);
}

TEST(MhaPrefillFp8Api, OptionalDescalesAndFp16Out) {
  MhaPrefillArgs a = fp8_args();
  a.q_descale = a.k_descale = TensorRef{};
  a.v_descale = make_tensor(fake_ptr(11), DType::kFloat32, {1});
  a.out.dtype = DType::kFloat16;
  kernels::MhaPrefillFp8Params p;
  const Status st = detail::validate_mha_prefill_fp8(fp8_problem(), a, &p);
  ASSERT_TRUE(st.is_ok()) << st.message();
  EXPECT_EQ(p.q_descale, nullptr);
  EXPECT_EQ(p.k_descale, nullptr);
  EXPECT_TRUE(p.out_fp16);
  EXPECT_EQ(p.v_descale_stride_b, 0);
}

TEST(MhaPrefillFp8Api, Errors) {
  expect_fp8_error([](auto&, auto& a) { a.k.dtype = DType::kBFloat16; },
                   "'k' has dtype bfloat16, expected float8_e4m3fn");
  expect_fp8_error([](auto&, auto& a) { a.q.stride[1] = 200; }, "multiple of 16 elements");
  expect_fp8_error([](auto&, auto& a) { a.q.data = static_cast<char*>(a.q.data) + 8; }, "'q' data pointer");
  expect_fp8_error([](auto&, auto& a) { a.out.dtype = DType::kFloat8E4M3; }, "'out'");
  expect_fp8_error([](auto&, auto& a) { a.out.dtype = DType::kFloat32; }, "'out' has dtype float32");
  expect_fp8_error([](auto&, auto& a) { a.q_descale = make_tensor(fake_ptr(9), DType::kFloat32, {4, 3}); },
                   "'q_descale' has shape (4, 3); expected (batch, h_kv) = (4, 2) or a single value");
  expect_fp8_error([](auto&, auto& a) { a.k_descale.dtype = DType::kBFloat16; }, "'k_descale' has dtype bfloat16");
  expect_fp8_error([](auto&, auto& a) { a.v_descale.device = DeviceType::kCPU; }, "'v_descale' must be a CUDA tensor");
  expect_fp8_error([](auto&, auto& a) { a.q_descale.data = static_cast<char*>(a.q_descale.data) + 2; },
                   "'q_descale' data pointer");
  expect_fp8_error([](auto& p, auto&) { p.d_qk = 576; }, "(d_qk, d_v) = (192, 128)", StatusCode::kUnsupported);
}

TEST(MhaPrefillFp8Api, SixteenBitCallsRefuseDescales) {
  MhaPrefillProblem p = testing::mha_fixture_problem(132);
  MhaPrefillArgs a = testing::mha_fixture_args(fake_ptr);
  a.v_descale = make_tensor(fake_ptr(11), DType::kFloat32, {4, 2});
  const Status s = detail::validate_mha_prefill(p, a, nullptr);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("'v_descale': only float8_e4m3fn q, k, v take descales"), std::string::npos)
      << s.message();
}

TEST(MhaPrefillFp8Api, BackwardRefusesFp8) {
  // FP8 is forward-only: the backward's problem check names the dtype.
  MhaPrefillBwdProblem p;
  p.batch = 1;
  p.total_q = 10;
  p.h_q = p.h_kv = 2;
  p.dtype = DType::kFloat8E4M3;
  MhaPrefillBwdWorkspaceSizes sizes;
  const Status s = get_mha_prefill_bwd_workspace_size(p, &sizes);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("'problem.dtype' is float8_e4m3fn"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace openmla
