// Sparse prefill API: every validation error of sparse_prefill and the parameters it builds. Uses fake, aligned,
// non-null "device" pointers: validate_sparse_prefill makes no CUDA call, so no GPU is needed and nothing is ever
// launched on the fake pointers.
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

// A valid call: s_q = 100 tokens, h_q = 128, d_qk = 576, s_kv = 4096, topk = 2048, both optional inputs.
SparsePrefillArgs valid_args() {
  SparsePrefillArgs a;
  a.q = make_tensor(fake_ptr(1), DType::kBFloat16, {100, 128, 576});
  a.kv = make_tensor(fake_ptr(2), DType::kBFloat16, {4096, 1, 576});
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

// Expects `mutate` to make the call fail with `code`, naming `needle` in the message.
void expect_error(const std::function<void(SparsePrefillArgs&)>& mutate, const std::string& needle,
                  StatusCode code = StatusCode::kInvalidArgument) {
  SparsePrefillArgs a = valid_args();
  mutate(a);
  const Status s = detail::validate_sparse_prefill(a, nullptr);
  ASSERT_FALSE(s.is_ok()) << "expected an error naming " << needle;
  EXPECT_EQ(s.code(), code) << s.message();
  EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
}

TEST(SparsePrefillApi, ValidCallBuildsParams) {
  kernels::SparsePrefillParams p;
  ASSERT_TRUE(detail::validate_sparse_prefill(valid_args(), &p).is_ok());
  EXPECT_EQ(p.s_q, 100);
  EXPECT_EQ(p.h_q, 128);
  EXPECT_EQ(p.d_qk, 576);
  EXPECT_EQ(p.topk, 2048);
  EXPECT_EQ(p.num_head_tiles, 2);
  EXPECT_EQ(p.num_tiles, 200);
  EXPECT_EQ(p.grid, 132);
  EXPECT_EQ(p.q_stride_s, 128 * 576);
  EXPECT_EQ(p.indices_stride_s, 2048);
  EXPECT_FLOAT_EQ(p.scale_log2, 0.5f * 1.4426950408889634f);
  EXPECT_NE(p.topk_length, nullptr);
  EXPECT_NE(p.attn_sink, nullptr);
}

TEST(SparsePrefillApi, OptionalInputsAndSmallShapes) {
  SparsePrefillArgs a = valid_args();
  a.topk_length = TensorRef{};
  a.attn_sink = TensorRef{};
  a.softmax_scale = 0.f;  // default d_qk ** -0.5
  kernels::SparsePrefillParams p;
  ASSERT_TRUE(detail::validate_sparse_prefill(a, &p).is_ok());
  EXPECT_EQ(p.topk_length, nullptr);
  EXPECT_EQ(p.attn_sink, nullptr);
  EXPECT_FLOAT_EQ(p.scale_log2, static_cast<float>(1.4426950408889634 / std::sqrt(576.0)));

  // h_q = 16 (one partial head tile), d_qk = 512, s_q = 1, topk = 1, s_kv = 1; the strides of size-1 dimensions
  // may be anything.
  a = valid_args();
  a.q = make_tensor(fake_ptr(1), DType::kBFloat16, {1, 16, 512}, {3, 520, 1});
  a.kv = make_tensor(fake_ptr(2), DType::kBFloat16, {1, 1, 512}, {1, 1, 1});
  a.indices = make_tensor(fake_ptr(3), DType::kInt32, {1, 1, 1}, {0, 0, 7});
  a.topk_length = make_tensor(fake_ptr(4), DType::kInt32, {1});
  a.attn_sink = make_tensor(fake_ptr(5), DType::kFloat32, {16});
  a.out = make_tensor(fake_ptr(6), DType::kBFloat16, {1, 16, 512});
  a.max_logits = make_tensor(fake_ptr(7), DType::kFloat32, {1, 16}, {0, 1});
  a.lse = make_tensor(fake_ptr(8), DType::kFloat32, {1, 16}, {1, 5});
  a.num_sms = 132;
  const Status st = detail::validate_sparse_prefill(a, &p);
  ASSERT_TRUE(st.is_ok()) << st.message();
  EXPECT_EQ(p.num_head_tiles, 1);
  EXPECT_EQ(p.num_tiles, 1);
  EXPECT_EQ(p.grid, 1);
  EXPECT_EQ(p.kv_stride_s, 512);
  EXPECT_EQ(p.indices_stride_s, 1);
}

TEST(SparsePrefillApi, Q) {
  expect_error([](auto& a) { a.q = TensorRef{}; }, "'q' is required");
  expect_error([](auto& a) { a.q.device = DeviceType::kCPU; }, "'q' must be a CUDA tensor");
  expect_error([](auto& a) { a.q.dtype = DType::kFloat16; }, "'q' has dtype float16");
  expect_error([](auto& a) { a.q.ndim = 2; }, "'q' must have 3 dimensions");
  expect_error([](auto& a) { a.q.shape[2] = 192; }, "d_qk = 576", StatusCode::kUnsupported);
  expect_error([](auto& a) { a.q.stride[2] = 2; }, "'q' must be contiguous in its last dimension");
  expect_error([](auto& a) { a.q.stride[1] = 580; }, "'q' has stride 580");
  expect_error([](auto& a) { a.q.stride[0] = -a.q.stride[0]; }, "negative strides are not supported");
  expect_error([](auto& a) { a.q.data = static_cast<char*>(a.q.data) + 8; }, "'q' data pointer must be 16-byte");
}

TEST(SparsePrefillApi, KvAndIndices) {
  expect_error([](auto& a) { a.kv = TensorRef{}; }, "'kv' is required");
  expect_error([](auto& a) { a.kv.device_id = 1; }, "all tensors must be on the same device");
  expect_error([](auto& a) { a.kv.dtype = DType::kFloat8E4M3; }, "'kv' has dtype");
  expect_error([](auto& a) { a.kv.shape[1] = 2; }, "h_kv = 1", StatusCode::kUnsupported);
  expect_error([](auto& a) { a.kv.shape[2] = 512; }, "'kv' has size 512 in dimension 2");
  expect_error([](auto& a) { a.kv.shape[0] = 0; }, "s_kv >= 1");
  expect_error([](auto& a) { a.kv.stride[0] = 580; }, "'kv' has stride 580");
  expect_error([](auto& a) { a.indices = TensorRef{}; }, "'indices' is required");
  expect_error([](auto& a) { a.indices.dtype = DType::kInt64; }, "'indices' has dtype int64");
  expect_error([](auto& a) { a.indices.shape[0] = 99; }, "'indices' has size 99 in dimension 0");
  expect_error([](auto& a) { a.indices.shape[1] = 2; }, "'indices' has size 2 in dimension 1");
  expect_error([](auto& a) { a.indices.shape[2] = 0; }, "topk >= 1");
  expect_error([](auto& a) { a.indices.stride[2] = 2; }, "'indices' must be contiguous in its last dimension");
  expect_error([](auto& a) { a.indices.data = static_cast<char*>(a.indices.data) + 2; }, "'indices' data pointer");
}

TEST(SparsePrefillApi, OptionalInputs) {
  expect_error([](auto& a) { a.topk_length.dtype = DType::kInt64; }, "'topk_length' has dtype int64");
  expect_error([](auto& a) { a.topk_length.shape[0] = 50; }, "one length per query token");
  expect_error([](auto& a) { a.topk_length.device = DeviceType::kCPU; }, "'topk_length' must be a CUDA tensor");
  expect_error([](auto& a) { a.topk_length = make_tensor(a.topk_length.data, DType::kInt32, {100}, {2}); },
               "'topk_length' must be contiguous");
  expect_error([](auto& a) { a.attn_sink.dtype = DType::kBFloat16; }, "'attn_sink' has dtype bfloat16");
  expect_error([](auto& a) { a.attn_sink.shape[0] = 64; }, "'attn_sink' has size 64");
  expect_error([](auto& a) { a.attn_sink.data = static_cast<char*>(a.attn_sink.data) + 2; }, "'attn_sink' data pointer");
}

TEST(SparsePrefillApi, Scalars) {
  expect_error([](auto& a) { a.d_v = 576; }, "'d_v' is 576");
  expect_error([](auto& a) { a.softmax_scale = -0.5f; }, "'softmax_scale' is -0.5");
  expect_error([](auto& a) { a.softmax_scale = NAN; }, "'softmax_scale'");
  expect_error([](auto& a) { a.softmax_scale = INFINITY; }, "'softmax_scale'");
  expect_error([](auto& a) { a.num_sms = -1; }, "'num_sms'");
  expect_error([](auto& a) {
    a.q.shape[0] = int64_t{1} << 30;
    a.indices.shape[0] = a.out.shape[0] = a.max_logits.shape[0] = a.lse.shape[0] = a.topk_length.shape[0] =
        a.q.shape[0];
  }, "head tiles of 64");
}

TEST(SparsePrefillApi, Outputs) {
  expect_error([](auto& a) { a.out = TensorRef{}; }, "'out' is required");
  expect_error([](auto& a) { a.out.dtype = DType::kFloat32; }, "'out' has dtype float32");
  expect_error([](auto& a) { a.out.shape[1] = 64; }, "'out' has size 64 in dimension 1");
  expect_error([](auto& a) { a.out.shape[2] = 576; }, "'out' has size 576 in dimension 2");
  expect_error([](auto& a) { a.out.stride[1] = 516; }, "'out' has stride 516");
  expect_error([](auto& a) { a.out.data = static_cast<char*>(a.out.data) + 4; }, "'out' data pointer");
  expect_error([](auto& a) { a.max_logits = TensorRef{}; }, "'max_logits' is required");
  expect_error([](auto& a) { a.max_logits.shape[0] = 7; }, "'max_logits' has size 7");
  expect_error([](auto& a) { a.lse.dtype = DType::kBFloat16; }, "'lse' has dtype bfloat16");
  expect_error([](auto& a) { a.lse.data = static_cast<char*>(a.lse.data) + 2; }, "'lse' data pointer");
  expect_error([](auto& a) { a.lse.device_id = 3; }, "all tensors must be on the same device");
}

TEST(SparsePrefillApi, OutputsMustNotAlias) {
  expect_error([](auto& a) { a.out.data = a.q.data; }, "'out' overlaps argument 'q'");
  expect_error([](auto& a) { a.lse.data = static_cast<char*>(a.kv.data) + 64; }, "'lse' overlaps argument 'kv'");
  expect_error([](auto& a) { a.max_logits.data = a.lse.data; }, "'max_logits' overlaps argument 'lse'");
  expect_error([](auto& a) { a.lse.data = static_cast<char*>(a.indices.data) + 1024; }, "'lse' overlaps argument 'indices'");
}

}  // namespace
}  // namespace openmla
