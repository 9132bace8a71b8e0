// merge_attn_states API: every validation error (each message names its argument) and the parameters a valid call
// builds. Fake, aligned, non-null "device" pointers: validate_merge_states makes no CUDA call, so no GPU is needed
// and nothing is launched on them. The kernel itself is tested on a GPU (tests/python/test_merge_states.py,
// tests/gpu/sanitize_merge_states.cpp).
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>

#include "api/merge_states_internal.h"
#include "openmla/merge.h"

namespace openmla {
namespace {

namespace ms = kernels::merge_states;

// Fake device pointers 64 GiB apart: no two arguments overlap.
void* fake_ptr(int i) { return reinterpret_cast<void*>(uintptr_t{0x10000000} + (uintptr_t(i) << 36)); }

// A valid call: 4 partials, 128 tokens, 16 heads, d_v 512, bf16 in, bf16 out, with lse_out.
MergeStatesArgs valid_args() {
  MergeStatesArgs a;
  a.outs = make_tensor(fake_ptr(1), DType::kBFloat16, {4, 128, 16, 512});
  a.lses = make_tensor(fake_ptr(2), DType::kFloat32, {4, 128, 16});
  a.out = make_tensor(fake_ptr(3), DType::kBFloat16, {128, 16, 512});
  a.lse_out = make_tensor(fake_ptr(4), DType::kFloat32, {128, 16});
  return a;
}

void expect_error(const std::function<void(MergeStatesArgs&)>& mutate, const std::string& needle,
                  const std::string& also = "") {
  MergeStatesArgs a = valid_args();
  mutate(a);
  const Status s = detail::validate_merge_states(a, nullptr);
  ASSERT_FALSE(s.is_ok()) << "expected an error naming " << needle;
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.message();
  EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
  if (!also.empty()) EXPECT_NE(s.message().find(also), std::string::npos) << s.message();
}

TEST(MergeStatesApi, ValidCallBuildsParams) {
  detail::MergeStatesLaunch l;
  const Status st = detail::validate_merge_states(valid_args(), &l);
  ASSERT_TRUE(st.is_ok()) << st.message();
  EXPECT_EQ(l.in, ms::Element::kBFloat16);
  EXPECT_EQ(l.out, ms::Element::kBFloat16);
  EXPECT_EQ(l.params.num_partials, 4);
  EXPECT_EQ(l.params.heads, 16);
  EXPECT_EQ(l.params.d_v, 512);
  EXPECT_EQ(l.params.rows, 128 * 16);
  EXPECT_EQ(l.params.outs_stride_partial, 128 * 16 * 512);
  EXPECT_EQ(l.params.outs_stride_token, 16 * 512);
  EXPECT_EQ(l.params.outs_stride_head, 512);
  EXPECT_EQ(l.params.lses_stride_partial, 128 * 16);
  EXPECT_EQ(l.params.lses_stride_token, 16);
  EXPECT_EQ(l.params.lses_stride_head, 1);
  EXPECT_EQ(l.params.out_stride_token, 16 * 512);
  EXPECT_EQ(l.params.out_stride_head, 512);
  EXPECT_EQ(l.params.lse_out, fake_ptr(4));
  EXPECT_EQ(l.params.lse_out_stride_token, 16);
  EXPECT_EQ(l.params.lse_out_stride_head, 1);
}

// Every dtype pair; d_v 128 and 8; one partial; no lse_out; strided views (lses transposed as decode returns them,
// an out with padded rows, a size-1 dimension with any stride).
TEST(MergeStatesApi, DtypesShapesAndStrides) {
  const DType types[] = {DType::kBFloat16, DType::kFloat16, DType::kFloat32};
  const ms::Element elements[] = {ms::Element::kBFloat16, ms::Element::kFloat16, ms::Element::kFloat32};
  for (int i = 0; i < 3; ++i) {
    for (int o = 0; o < 3; ++o) {
      MergeStatesArgs a = valid_args();
      a.outs.dtype = types[i];
      a.out.dtype = types[o];
      detail::MergeStatesLaunch l;
      ASSERT_TRUE(detail::validate_merge_states(a, &l).is_ok());
      EXPECT_EQ(l.in, elements[i]);
      EXPECT_EQ(l.out, elements[o]);
    }
  }
  MergeStatesArgs a;
  a.outs = make_tensor(fake_ptr(1), DType::kFloat32, {1, 3, 5, 8});
  a.lses = make_tensor(fake_ptr(2), DType::kFloat32, {1, 3, 5}, {7, 1, 3});  // (tokens, heads) stored transposed
  a.out = make_tensor(fake_ptr(3), DType::kBFloat16, {3, 5, 8}, {48, 8, 1});  // padded token rows
  detail::MergeStatesLaunch l;
  const Status st = detail::validate_merge_states(a, &l);
  ASSERT_TRUE(st.is_ok()) << st.message();
  EXPECT_EQ(l.params.lse_out, nullptr);
  EXPECT_EQ(l.params.lses_stride_token, 1);
  EXPECT_EQ(l.params.lses_stride_head, 3);
  EXPECT_EQ(l.params.out_stride_token, 48);
  EXPECT_EQ(l.params.d_v, 8);
  EXPECT_EQ(l.params.num_partials, 1);

  a = valid_args();
  a.outs = make_tensor(fake_ptr(1), DType::kBFloat16, {8, 1, 128, 128}, {128 * 128, 5, 128, 1});
  a.lses = make_tensor(fake_ptr(2), DType::kFloat32, {8, 1, 128});
  a.out = make_tensor(fake_ptr(3), DType::kFloat16, {1, 128, 128});
  a.lse_out = make_tensor(fake_ptr(4), DType::kFloat32, {1, 128});
  ASSERT_TRUE(detail::validate_merge_states(a, &l).is_ok());
  EXPECT_EQ(l.params.rows, 128);
  EXPECT_EQ(l.params.outs_stride_token, 128 * 128);  // the size-1 dimension's stride replaced by the packed one
}

// Zero tokens: valid, nothing to launch; the views may carry null pointers.
TEST(MergeStatesApi, EmptyCallIsValid) {
  MergeStatesArgs a;
  a.outs = make_tensor(nullptr, DType::kBFloat16, {3, 0, 16, 512});
  a.lses = make_tensor(nullptr, DType::kFloat32, {3, 0, 16});
  a.out = make_tensor(nullptr, DType::kBFloat16, {0, 16, 512});
  a.lse_out = make_tensor(nullptr, DType::kFloat32, {0, 16});
  detail::MergeStatesLaunch l;
  const Status st = detail::validate_merge_states(a, &l);
  ASSERT_TRUE(st.is_ok()) << st.message();
  EXPECT_EQ(l.params.rows, 0);
}

TEST(MergeStatesApi, OutsErrors) {
  expect_error([](MergeStatesArgs& a) { a.outs = TensorRef{}; }, "argument 'outs' is required");
  expect_error([](MergeStatesArgs& a) { a.outs.device = DeviceType::kCPU; }, "argument 'outs' must be a CUDA tensor");
  expect_error([](MergeStatesArgs& a) { a.outs.dtype = DType::kInt32; }, "argument 'outs' has dtype int32");
  expect_error([](MergeStatesArgs& a) { a.outs = make_tensor(fake_ptr(1), DType::kBFloat16, {128, 16, 512}); },
               "argument 'outs' must have 4 dimensions");
  expect_error([](MergeStatesArgs& a) { a.outs.shape[0] = 0; }, "argument 'outs' has 0 partials", "at least 1");
  expect_error([](MergeStatesArgs& a) { a.outs.shape[3] = 500; }, "argument 'outs' has d_v = 500",
               "multiple of 8");
  expect_error([](MergeStatesArgs& a) { a.outs.shape[3] = 4; }, "argument 'outs' has d_v = 4");
  expect_error([](MergeStatesArgs& a) { a.outs.stride[3] = 2; }, "argument 'outs' must be contiguous in its last");
  expect_error([](MergeStatesArgs& a) { a.outs.stride[2] = 516; }, "argument 'outs' has stride 516 in dimension 2",
               "16-byte vector access");
  expect_error([](MergeStatesArgs& a) { a.outs.data = static_cast<char*>(fake_ptr(1)) + 8; },
               "argument 'outs' data pointer must be 16-byte aligned");
  expect_error([](MergeStatesArgs& a) { a.outs.stride[0] = -a.outs.stride[0]; }, "argument 'outs' has stride -",
               "negative strides");
  expect_error([](MergeStatesArgs& a) { a.outs.ndim = TensorRef::kInvalidNdim; }, "argument 'outs' has ndim = -1");
}

TEST(MergeStatesApi, FloatOutsAlignWithFourElementStrides) {
  MergeStatesArgs a = valid_args();
  a.outs = make_tensor(fake_ptr(1), DType::kFloat32, {4, 128, 16, 512}, {128 * 16 * 516, 16 * 516, 516, 1});
  EXPECT_TRUE(detail::validate_merge_states(a, nullptr).is_ok());  // 516 fp32 = 2064 bytes, a multiple of 16
  a.outs.stride[2] = 514;
  const Status s = detail::validate_merge_states(a, nullptr);
  EXPECT_NE(s.message().find("multiple of 4 elements"), std::string::npos) << s.message();
}

TEST(MergeStatesApi, LsesErrors) {
  expect_error([](MergeStatesArgs& a) { a.lses = TensorRef{}; }, "argument 'lses' is required");
  expect_error([](MergeStatesArgs& a) { a.lses.dtype = DType::kBFloat16; }, "argument 'lses' has dtype bfloat16",
               "expected float32");
  expect_error([](MergeStatesArgs& a) { a.lses = make_tensor(fake_ptr(2), DType::kFloat32, {4, 128, 16, 1}); },
               "argument 'lses' must have 3 dimensions");
  expect_error([](MergeStatesArgs& a) { a.lses.shape[0] = 3; }, "argument 'lses' has size 3 in dimension 0",
               "(partials), expected 4");
  expect_error([](MergeStatesArgs& a) { a.lses.shape[1] = 64; }, "argument 'lses' has size 64 in dimension 1",
               "(tokens)");
  expect_error([](MergeStatesArgs& a) { a.lses.shape[2] = 8; }, "argument 'lses' has size 8 in dimension 2",
               "(heads)");
  expect_error([](MergeStatesArgs& a) { a.lses.data = static_cast<char*>(fake_ptr(2)) + 2; },
               "argument 'lses' data pointer must be 4-byte aligned");
  expect_error([](MergeStatesArgs& a) { a.lses.device_id = 1; }, "argument 'lses' is on cuda:1",
               "same device");
}

TEST(MergeStatesApi, OutErrors) {
  expect_error([](MergeStatesArgs& a) { a.out = TensorRef{}; }, "argument 'out' is required");
  expect_error([](MergeStatesArgs& a) { a.out.dtype = DType::kUInt8; }, "argument 'out' has dtype uint8");
  expect_error([](MergeStatesArgs& a) { a.out = make_tensor(fake_ptr(3), DType::kBFloat16, {128, 16 * 512}); },
               "argument 'out' must have 3 dimensions");
  expect_error([](MergeStatesArgs& a) { a.out.shape[0] = 127; }, "argument 'out' has size 127 in dimension 0");
  expect_error([](MergeStatesArgs& a) { a.out.shape[1] = 15; }, "argument 'out' has size 15 in dimension 1");
  expect_error([](MergeStatesArgs& a) { a.out.shape[2] = 256; }, "argument 'out' has size 256 in dimension 2",
               "(d_v)");
  expect_error([](MergeStatesArgs& a) { a.out.stride[2] = 2; }, "argument 'out' must be contiguous in its last");
  expect_error([](MergeStatesArgs& a) { a.out.stride[0] = 16 * 512 + 4; }, "argument 'out' has stride 8196");
  expect_error([](MergeStatesArgs& a) { a.out.data = static_cast<char*>(fake_ptr(3)) + 4; },
               "argument 'out' data pointer must be 16-byte aligned");
  expect_error([](MergeStatesArgs& a) { a.out.stride[0] = 0; }, "argument 'out' is written by the call");
  expect_error([](MergeStatesArgs& a) { a.out.device_id = 2; }, "argument 'out' is on cuda:2");
}

TEST(MergeStatesApi, LseOutErrors) {
  expect_error([](MergeStatesArgs& a) { a.lse_out.dtype = DType::kFloat16; }, "argument 'lse_out' has dtype float16");
  expect_error([](MergeStatesArgs& a) { a.lse_out = make_tensor(fake_ptr(4), DType::kFloat32, {128, 16, 1}); },
               "argument 'lse_out' must have 2 dimensions");
  expect_error([](MergeStatesArgs& a) { a.lse_out.shape[0] = 1; }, "argument 'lse_out' has size 1 in dimension 0");
  expect_error([](MergeStatesArgs& a) { a.lse_out.shape[1] = 32; }, "argument 'lse_out' has size 32 in dimension 1");
  expect_error([](MergeStatesArgs& a) { a.lse_out.stride[1] = 0; }, "argument 'lse_out' is written by the call");
  expect_error([](MergeStatesArgs& a) { a.lse_out.device = DeviceType::kCPU; },
               "argument 'lse_out' must be a CUDA tensor");
}

// What the call writes shares no byte with what it reads, or with its other output.
TEST(MergeStatesApi, OverlapErrors) {
  expect_error([](MergeStatesArgs& a) { a.out.data = a.outs.data; }, "argument 'out' overlaps argument 'outs'");
  expect_error([](MergeStatesArgs& a) { a.lse_out.data = a.lses.data; },
               "argument 'lse_out' overlaps argument 'lses'");
  expect_error([](MergeStatesArgs& a) { a.lse_out.data = a.out.data; }, "argument 'out' overlaps argument 'lse_out'");
  // In place over partial 0 is refused too: the result would depend on the order the rows run in.
  expect_error(
      [](MergeStatesArgs& a) {
        a.out = make_tensor(a.outs.data, DType::kBFloat16, {128, 16, 512});
      },
      "argument 'out' overlaps argument 'outs'");
}

}  // namespace
}  // namespace openmla
