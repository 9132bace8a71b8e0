// Dense MHA prefill backward: every validation error of mha_prefill_bwd, the parameters it builds and the workspace
// size. Uses fake, aligned, non-null "device" pointers: validate_mha_prefill_bwd makes no CUDA call, so no GPU is
// needed and nothing is ever launched on them.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>

#include "api/mha_prefill_internal.h"
#include "kernels/mha_prefill_bwd/params.h"
#include "openmla/capability.h"
#include "openmla/prefill.h"

namespace openmla {
namespace {

// Arguments 256 MB apart, each 256-byte aligned: no two ever overlap.
void* fake_ptr(int i) { return reinterpret_cast<void*>(uintptr_t{0x10000000} + uintptr_t(i) * 0x10000000); }

// 4 sequences packed into 1000 query rows and 1500 key rows, h_q = 16, h_kv = 2 (GQA 8), (d_qk, d_v) = (192, 128),
// causal, bf16, flash_mla's transposed lse (the forward's fixture, tests/cpp/mha_prefill_fixture.h, plus the
// backward's tensors).
MhaPrefillBwdProblem valid_problem() {
  return MhaPrefillBwdProblem{.batch = 4,
                              .total_q = 1000,
                              .h_q = 16,
                              .h_kv = 2,
                              .d_qk = 192,
                              .d_v = 128,
                              .dtype = DType::kBFloat16,
                              .causal = true,
                              .deterministic = false,
                              .num_sms = 132};
}

size_t valid_workspace_bytes() {
  MhaPrefillBwdWorkspaceSizes sizes;
  EXPECT_TRUE(get_mha_prefill_bwd_workspace_size(valid_problem(), &sizes).is_ok());
  return sizes.workspace_bytes;
}

MhaPrefillBwdArgs valid_args() {
  MhaPrefillBwdArgs a;
  a.q = make_tensor(fake_ptr(1), DType::kBFloat16, {1000, 16, 192});
  a.k = make_tensor(fake_ptr(2), DType::kBFloat16, {1500, 2, 192});
  a.v = make_tensor(fake_ptr(3), DType::kBFloat16, {1500, 2, 128});
  a.out = make_tensor(fake_ptr(4), DType::kBFloat16, {1000, 16, 128});
  a.dout = make_tensor(fake_ptr(5), DType::kBFloat16, {1000, 16, 128});
  a.lse = make_tensor(fake_ptr(6), DType::kFloat32, {1000, 16}, {1, 1000});
  a.cu_seqlens_qo = make_tensor(fake_ptr(7), DType::kInt32, {5});
  a.cu_seqlens_kv = make_tensor(fake_ptr(8), DType::kInt32, {5});
  a.softmax_scale = 0.125f;
  a.workspace = make_tensor(fake_ptr(9), DType::kUInt8, {static_cast<int64_t>(valid_workspace_bytes())});
  a.dq = make_tensor(fake_ptr(10), DType::kBFloat16, {1000, 16, 192});
  a.dk = make_tensor(fake_ptr(11), DType::kBFloat16, {1500, 2, 192});
  a.dv = make_tensor(fake_ptr(12), DType::kBFloat16, {1500, 2, 128});
  return a;
}

void expect_error(const std::function<void(MhaPrefillBwdProblem&, MhaPrefillBwdArgs&)>& mutate,
                  const std::string& needle, StatusCode code = StatusCode::kInvalidArgument) {
  MhaPrefillBwdProblem p = valid_problem();
  MhaPrefillBwdArgs a = valid_args();
  mutate(p, a);
  const Status s = detail::validate_mha_prefill_bwd(p, a, nullptr);
  ASSERT_FALSE(s.is_ok()) << "expected an error naming " << needle;
  EXPECT_EQ(s.code(), code) << s.message();
  EXPECT_NE(s.message().find(needle), std::string::npos) << "expected \"" << needle << "\" in: " << s.message();
}

char* plus(void* p, int64_t bytes) { return static_cast<char*>(p) + bytes; }

TEST(MhaPrefillBwdApi, ValidCallBuildsParams) {
  kernels::MhaPrefillBwdParams p;
  const Status st = detail::validate_mha_prefill_bwd(valid_problem(), valid_args(), &p);
  ASSERT_TRUE(st.is_ok()) << st.message();
  EXPECT_EQ(p.seqs.batch, 4);
  EXPECT_EQ(p.seqs.total_q, 1000);
  EXPECT_EQ(p.seqs.total_k, 1500);
  EXPECT_EQ(p.seqs.cu_seqlens_q, fake_ptr(7));
  EXPECT_EQ(p.seqs.cu_seqlens_k, fake_ptr(8));
  EXPECT_EQ(p.h_q, 16);
  EXPECT_EQ(p.h_kv, 2);
  EXPECT_EQ(p.heads_per_kv, 8);
  EXPECT_EQ(p.d_qk, 192);
  EXPECT_FALSE(p.fp16);
  EXPECT_TRUE(p.causal);
  EXPECT_FALSE(p.deterministic);
  EXPECT_FLOAT_EQ(p.scale, 0.125f);
  EXPECT_FLOAT_EQ(p.scale_log2, 0.125f * 1.4426950408889634f);
  EXPECT_EQ(p.q, fake_ptr(1));
  EXPECT_EQ(p.k, fake_ptr(2));
  EXPECT_EQ(p.v, fake_ptr(3));
  EXPECT_EQ(p.out, fake_ptr(4));
  EXPECT_EQ(p.dout, fake_ptr(5));
  EXPECT_EQ(p.lse, fake_ptr(6));
  EXPECT_EQ(p.dq, fake_ptr(10));
  EXPECT_EQ(p.dk, fake_ptr(11));
  EXPECT_EQ(p.dv, fake_ptr(12));
  EXPECT_EQ(p.q_stride_t, 16 * 192);
  EXPECT_EQ(p.q_stride_h, 192);
  EXPECT_EQ(p.k_stride_t, 2 * 192);
  EXPECT_EQ(p.v_stride_t, 2 * 128);
  EXPECT_EQ(p.dout_stride_t, 16 * 128);
  EXPECT_EQ(p.out_stride_h, 128);
  EXPECT_EQ(p.lse_stride_t, 1);  // flash_mla's transposed lse
  EXPECT_EQ(p.lse_stride_h, 1000);
  EXPECT_EQ(p.dq_stride_t, 16 * 192);
  EXPECT_EQ(p.dk_stride_h, 192);
  EXPECT_EQ(p.dv_stride_t, 2 * 128);
  // The workspace's parts lie inside it, in the layout's order.
  const detail::MhaPrefillBwdWorkspaceLayout l = detail::mha_prefill_bwd_workspace_layout(valid_problem());
  EXPECT_EQ(p.pad_blocks, l.pad_blocks);
  EXPECT_EQ(static_cast<void*>(p.lse2), plus(fake_ptr(9), l.lse2));
  EXPECT_EQ(static_cast<void*>(p.tile_counter), plus(fake_ptr(9), l.tile_counter));
  EXPECT_EQ(static_cast<void*>(p.dq_order), plus(fake_ptr(9), l.dq_order));
  EXPECT_EQ(static_cast<void*>(p.dsum), plus(fake_ptr(9), l.dsum));
  EXPECT_EQ(static_cast<void*>(p.dq_accum), plus(fake_ptr(9), l.dq_accum));
  EXPECT_LT(l.dq_accum, l.end);
  // 2 kv heads x (1500 / 128 + 4 sequences) key blocks at most = 30 tiles < 132 SMs.
  EXPECT_EQ(p.grid, 30);

  MhaPrefillBwdProblem det = valid_problem();
  det.deterministic = true;
  det.dtype = DType::kFloat16;
  det.d_qk = 128;
  det.num_sms = 8;
  MhaPrefillBwdArgs a = valid_args();
  for (TensorRef* t : {&a.q, &a.k, &a.v, &a.out, &a.dout, &a.dq, &a.dk, &a.dv}) t->dtype = DType::kFloat16;
  for (TensorRef* t : {&a.q, &a.k, &a.dq, &a.dk}) *t = make_tensor(t->data, DType::kFloat16, {t->shape[0], t->shape[1], 128});
  a.softmax_scale = 0.f;
  ASSERT_TRUE(detail::validate_mha_prefill_bwd(det, a, &p).is_ok());
  EXPECT_TRUE(p.deterministic);
  EXPECT_TRUE(p.fp16);
  EXPECT_EQ(p.d_qk, 128);
  EXPECT_FLOAT_EQ(p.scale, 1.f / std::sqrt(128.f));  // 0: d_qk ** -0.5
  EXPECT_EQ(p.grid, 8);                              // at most num_sms CTAs
}

TEST(MhaPrefillBwdApi, PackedViewsAndEmptyTensors) {
  // flash_attn_varlen_qkvpacked_func: q | k | v as views of one (total, h, 192 + 192 + 128) tensor. (Its gradients
  // are separate tensors: the overlap check compares byte ranges, so interleaved views of one output are refused.)
  MhaPrefillBwdProblem pr = valid_problem();
  pr.h_q = pr.h_kv = 8;
  pr.batch = 1;
  pr.total_q = 300;
  const int64_t row = 8 * 512;
  MhaPrefillBwdArgs a = valid_args();
  auto views = [&](void* base, TensorRef* q, TensorRef* k, TensorRef* v) {
    *q = make_tensor(base, DType::kBFloat16, {300, 8, 192}, {row, 512, 1});
    *k = make_tensor(plus(base, 2 * 192), DType::kBFloat16, {300, 8, 192}, {row, 512, 1});
    *v = make_tensor(plus(base, 2 * 384), DType::kBFloat16, {300, 8, 128}, {row, 512, 1});
  };
  views(fake_ptr(1), &a.q, &a.k, &a.v);
  a.dq = make_tensor(fake_ptr(10), DType::kBFloat16, {300, 8, 192});
  a.dk = make_tensor(fake_ptr(11), DType::kBFloat16, {300, 8, 192});
  a.dv = make_tensor(fake_ptr(12), DType::kBFloat16, {300, 8, 128});
  a.out = make_tensor(fake_ptr(4), DType::kBFloat16, {300, 8, 128});
  a.dout = make_tensor(fake_ptr(5), DType::kBFloat16, {300, 8, 128});
  a.lse = make_tensor(fake_ptr(6), DType::kFloat32, {300, 8});
  a.cu_seqlens_qo = make_tensor(fake_ptr(7), DType::kInt32, {2});
  a.cu_seqlens_kv = make_tensor(fake_ptr(8), DType::kInt32, {2});
  MhaPrefillBwdWorkspaceSizes ws;
  ASSERT_TRUE(get_mha_prefill_bwd_workspace_size(pr, &ws).is_ok());
  a.workspace = make_tensor(fake_ptr(9), DType::kUInt8, {static_cast<int64_t>(ws.workspace_bytes)});
  kernels::MhaPrefillBwdParams p;
  Status st = detail::validate_mha_prefill_bwd(pr, a, &p);
  ASSERT_TRUE(st.is_ok()) << st.message();
  EXPECT_EQ(p.q_stride_t, row);
  EXPECT_EQ(p.k_stride_t, row);
  EXPECT_EQ(p.v, plus(fake_ptr(1), 2 * 384));
  EXPECT_EQ(p.dk_stride_t, 8 * 192);

  // No query row (total_q = 0): q, out, dout, dq may be empty views without an address.
  pr.total_q = 0;
  a.q = make_tensor(nullptr, DType::kBFloat16, {0, 8, 192});
  a.out = make_tensor(nullptr, DType::kBFloat16, {0, 8, 128});
  a.dout = make_tensor(nullptr, DType::kBFloat16, {0, 8, 128});
  a.dq = make_tensor(nullptr, DType::kBFloat16, {0, 8, 192});
  a.lse = make_tensor(fake_ptr(6), DType::kFloat32, {0, 8});
  ASSERT_TRUE(get_mha_prefill_bwd_workspace_size(pr, &ws).is_ok());
  a.workspace = make_tensor(fake_ptr(9), DType::kUInt8, {static_cast<int64_t>(ws.workspace_bytes)});
  st = detail::validate_mha_prefill_bwd(pr, a, &p);
  ASSERT_TRUE(st.is_ok()) << st.message();
  EXPECT_EQ(p.seqs.total_q, 0);
}

TEST(MhaPrefillBwdApi, ProblemFields) {
  expect_error([](auto& p, auto&) { p.batch = 0; }, "'problem.batch' is 0");
  expect_error([](auto& p, auto&) { p.batch = (int64_t{1} << 24) + 1; }, "'problem.batch' is 16777217; must be at most");
  expect_error([](auto& p, auto&) { p.total_q = -1; }, "'problem.total_q' is -1");
  expect_error([](auto& p, auto&) { p.total_q = (int64_t{1} << 30) + 1; }, "'problem.total_q' is 1073741825");
  expect_error([](auto& p, auto&) { p.h_kv = 0; }, "'problem.h_kv' is 0");
  expect_error([](auto& p, auto&) { p.h_q = 13; }, "'problem.h_q' is 13; must be a positive multiple of h_kv = 2");
  expect_error([](auto& p, auto&) { p.h_q = p.h_kv = 65538; }, "'problem.h_q' is 65538; must be at most 65536");
  expect_error([](auto& p, auto&) { p.d_qk = 576; }, "(d_qk, d_v) = (192, 128) or (128, 128)",
               StatusCode::kUnsupported);
  expect_error([](auto& p, auto&) { p.d_v = 192; }, "'problem.d_qk' / 'problem.d_v' is 192 / 192",
               StatusCode::kUnsupported);
  expect_error([](auto& p, auto&) { p.dtype = DType::kFloat32; }, "'problem.dtype' is float32");
  expect_error([](auto& p, auto&) { p.num_sms = -2; }, "'problem.num_sms' is -2");
  expect_error(
      [](auto& p, auto&) {
        p.total_q = int64_t{1} << 30;
        p.h_q = p.h_kv = 65536;
      },
      "more than 2^31 blocks of 64 rows in the dq accumulator");
}

TEST(MhaPrefillBwdApi, QKV) {
  expect_error([](auto&, auto& a) { a.q = TensorRef{}; }, "'q' is required");
  expect_error([](auto&, auto& a) { a.q.device = DeviceType::kCPU; }, "'q' must be a CUDA tensor");
  expect_error([](auto&, auto& a) { a.q.dtype = DType::kFloat32; },
               "'q' has dtype float32, expected bfloat16 or float16");
  expect_error([](auto&, auto& a) { a.q.dtype = DType::kFloat16; },
               "'q' has dtype float16, expected bfloat16 (problem.dtype: q, k, v, out, dout, dq, dk and dv");
  expect_error([](auto&, auto& a) { a.q.ndim = 4; }, "'q' must have 3 dimensions");
  expect_error([](auto&, auto& a) { a.q.shape[1] = 8; }, "'q' has size 8 in dimension 1 (h_q)");
  expect_error([](auto&, auto& a) { a.q.shape[2] = 128; }, "'q' has size 128 in dimension 2 (d_qk)");
  expect_error([](auto&, auto& a) { a.q.shape[0] = 999; }, "'q' has size 999 in dimension 0 (problem.total_q)");
  expect_error([](auto&, auto& a) { a.q.stride[2] = 2; }, "'q' must be contiguous in its last dimension");
  expect_error([](auto&, auto& a) { a.q.stride[1] = 196; }, "'q' has stride 196 in dimension 1");
  expect_error([](auto&, auto& a) { a.q.stride[0] = -a.q.stride[0]; }, "negative strides are not supported");
  expect_error([](auto&, auto& a) { a.q.stride[0] = int64_t{1} << 33; }, "below 2^32");
  expect_error([](auto&, auto& a) { a.q.data = plus(a.q.data, 8); }, "'q' data pointer must be 16-byte");
  expect_error([](auto&, auto& a) { a.k = TensorRef{}; }, "'k' is required");
  expect_error([](auto&, auto& a) { a.k.device_id = 1; }, "all tensors must be on the same device");
  expect_error([](auto&, auto& a) { a.k.shape[1] = 4; }, "'k' has size 4 in dimension 1 (h_kv)");
  expect_error([](auto&, auto& a) { a.k.shape[2] = 128; }, "'k' has size 128 in dimension 2 (d_qk)");
  expect_error([](auto&, auto& a) { a.k.stride[0] = 388; }, "'k' has stride 388 in dimension 0");
  expect_error([](auto&, auto& a) { a.v = TensorRef{}; }, "'v' is required");
  expect_error([](auto&, auto& a) { a.v.shape[2] = 192; }, "'v' has size 192 in dimension 2 (d_v)");
  expect_error([](auto&, auto& a) { a.v.shape[0] = 1499; }, "'v' has size 1499 in dimension 0 (total_k, as k)");
  expect_error([](auto&, auto& a) { a.v.dtype = DType::kFloat16; }, "'v' has dtype float16");
}

TEST(MhaPrefillBwdApi, ForwardResultsAndDout) {
  expect_error([](auto&, auto& a) { a.out = TensorRef{}; }, "'out' is required");
  expect_error([](auto&, auto& a) { a.out.dtype = DType::kFloat16; }, "'out' has dtype float16");
  expect_error([](auto&, auto& a) { a.out.shape[0] = 999; }, "'out' has size 999 in dimension 0 (total_q, as q)");
  expect_error([](auto&, auto& a) { a.out.shape[2] = 192; }, "'out' has size 192 in dimension 2 (d_v)");
  expect_error([](auto&, auto& a) { a.out.device_id = 3; }, "all tensors must be on the same device");
  expect_error([](auto&, auto& a) { a.dout = TensorRef{}; }, "'dout' is required");
  expect_error([](auto&, auto& a) { a.dout.device = DeviceType::kCPU; }, "'dout' must be a CUDA tensor");
  expect_error([](auto&, auto& a) { a.dout.dtype = DType::kFloat32; }, "'dout' has dtype float32");
  expect_error([](auto&, auto& a) { a.dout.shape[1] = 15; }, "'dout' has size 15 in dimension 1 (h_q)");
  expect_error([](auto&, auto& a) { a.dout.shape[0] = 1001; }, "'dout' has size 1001 in dimension 0 (total_q, as q)");
  // out.sum()'s gradient is an expanded tensor: stride 0 is refused (the Python layer packs it first).
  expect_error([](auto&, auto& a) { a.dout = make_tensor(a.dout.data, DType::kBFloat16, {1000, 16, 128}, {0, 0, 1}); },
               "'dout' has stride 0 in dimension 0");
  expect_error([](auto&, auto& a) { a.dout.data = plus(a.dout.data, 2); }, "'dout' data pointer must be 16-byte");
  expect_error([](auto&, auto& a) { a.lse = TensorRef{}; }, "'lse' is required");
  expect_error([](auto&, auto& a) { a.lse.dtype = DType::kBFloat16; }, "'lse' has dtype bfloat16");
  expect_error([](auto&, auto& a) { a.lse.ndim = 3; }, "'lse' must have 2 dimensions");
  expect_error([](auto&, auto& a) { a.lse.shape[0] = 10; }, "'lse' has size 10 in dimension 0 (total_q, as q)");
  expect_error([](auto&, auto& a) { a.lse.shape[1] = 2; }, "'lse' has size 2 in dimension 1 (h_q)");
  expect_error([](auto&, auto& a) { a.lse.data = plus(a.lse.data, 2); }, "'lse' data pointer must be 4-byte");
  expect_error([](auto&, auto& a) { a.lse.device_id = 2; }, "all tensors must be on the same device");
}

TEST(MhaPrefillBwdApi, CumulativeLengths) {
  expect_error([](auto&, auto& a) { a.cu_seqlens_qo = TensorRef{}; }, "'cu_seqlens_qo' is required");
  expect_error([](auto&, auto& a) { a.cu_seqlens_qo.dtype = DType::kInt64; }, "'cu_seqlens_qo' has dtype int64");
  expect_error([](auto&, auto& a) { a.cu_seqlens_qo.shape[0] = 4; },
               "'cu_seqlens_qo' has size 4 in dimension 0 (batch + 1)");
  expect_error([](auto&, auto& a) { a.cu_seqlens_qo.data = plus(a.cu_seqlens_qo.data, 2); },
               "'cu_seqlens_qo' data pointer must be 4-byte");
  expect_error([](auto&, auto& a) { a.cu_seqlens_kv.device = DeviceType::kCPU; },
               "'cu_seqlens_kv' must be a CUDA tensor");
  expect_error([](auto&, auto& a) { a.cu_seqlens_kv = make_tensor(a.cu_seqlens_kv.data, DType::kInt32, {5}, {2}); },
               "'cu_seqlens_kv' must be contiguous");
  expect_error([](auto&, auto& a) { a.cu_seqlens_kv.device_id = 1; }, "all tensors must be on the same device");
}

TEST(MhaPrefillBwdApi, Scalars) {
  expect_error([](auto&, auto& a) { a.softmax_scale = -1.f; }, "'softmax_scale' is -1");
  expect_error([](auto&, auto& a) { a.softmax_scale = NAN; }, "'softmax_scale'");
  expect_error([](auto&, auto& a) { a.softmax_scale = INFINITY; }, "'softmax_scale'");
}

TEST(MhaPrefillBwdApi, WorkspaceAndGradients) {
  const std::string asks = "get_mha_prefill_bwd_workspace_size asks for " + std::to_string(valid_workspace_bytes());
  expect_error([](auto&, auto& a) { a.workspace = TensorRef{}; }, "'workspace' is required");
  expect_error([](auto&, auto& a) { a.workspace.shape[0] -= 1; }, asks);
  expect_error([](auto&, auto& a) { a.workspace.shape[0] = 8; }, "'workspace' has 8 bytes; " + asks);
  expect_error([](auto&, auto& a) { a.workspace.data = plus(a.workspace.data, 16); },
               "'workspace' data pointer must be 256-byte");
  expect_error([](auto&, auto& a) { a.workspace.device = DeviceType::kCPU; }, "'workspace' must be a CUDA tensor");
  expect_error([](auto&, auto& a) { a.workspace.device_id = 1; }, "all tensors must be on the same device");
  expect_error(
      [](auto&, auto& a) {
        a.workspace = make_tensor(a.workspace.data, DType::kUInt8, {a.workspace.shape[0] / 2}, {2});
      },
      "'workspace' must be contiguous");
  expect_error([](auto&, auto& a) { a.dq = TensorRef{}; }, "'dq' is required");
  expect_error([](auto&, auto& a) { a.dq.dtype = DType::kFloat32; }, "'dq' has dtype float32");
  expect_error([](auto&, auto& a) { a.dq.shape[0] = 999; }, "'dq' has size 999 in dimension 0 (total_q, as q)");
  expect_error([](auto&, auto& a) { a.dq.shape[2] = 128; }, "'dq' has size 128 in dimension 2 (d_qk)");
  expect_error([](auto&, auto& a) { a.dq.stride[1] = 100; }, "'dq' has stride 100 in dimension 1");
  expect_error([](auto&, auto& a) { a.dq.data = plus(a.dq.data, 2); }, "'dq' data pointer must be 16-byte");
  expect_error([](auto&, auto& a) { a.dq.device_id = 1; }, "all tensors must be on the same device");
  expect_error([](auto&, auto& a) { a.dk = TensorRef{}; }, "'dk' is required");
  expect_error([](auto&, auto& a) { a.dk.dtype = DType::kFloat16; }, "'dk' has dtype float16");
  expect_error([](auto&, auto& a) { a.dk.shape[0] = 1499; }, "'dk' has size 1499 in dimension 0 (total_k, as k)");
  expect_error([](auto&, auto& a) { a.dk.shape[1] = 16; }, "'dk' has size 16 in dimension 1 (h_kv)");
  expect_error([](auto&, auto& a) { a.dv = TensorRef{}; }, "'dv' is required");
  expect_error([](auto&, auto& a) { a.dv.shape[2] = 192; }, "'dv' has size 192 in dimension 2 (d_v)");
  expect_error([](auto&, auto& a) { a.dv.shape[0] = 1501; }, "'dv' has size 1501 in dimension 0 (total_k, as k)");
  expect_error([](auto&, auto& a) { a.dv.device = DeviceType::kCPU; }, "'dv' must be a CUDA tensor");
}

TEST(MhaPrefillBwdApi, GradientsMustNotAliasAnything) {
  // An output overlapping itself: rows 8 elements apart.
  expect_error([](auto&, auto& a) { a.dq.stride[0] = 8; }, "'dq' is written by the call, but its stride 8");
  expect_error([](auto&, auto& a) { a.dk.stride[0] = 64; }, "'dk' is written by the call");
  expect_error([](auto&, auto& a) { a.dv.stride[0] = 8; a.dv.stride[1] = 8; }, "'dv' is written by the call");
  // An output overlapping an input.
  expect_error([](auto&, auto& a) { a.dq.data = a.q.data; }, "'dq' overlaps argument 'q'");
  expect_error([](auto&, auto& a) { a.dk.data = plus(a.dout.data, 4096); }, "'dk' overlaps argument 'dout'");
  expect_error([](auto&, auto& a) { a.dv.data = plus(a.out.data, 256); }, "'dv' overlaps argument 'out'");
  expect_error([](auto&, auto& a) { a.dq.data = plus(a.lse.data, 0); }, "'dq' overlaps argument 'lse'");
  expect_error([](auto&, auto& a) { a.workspace.data = a.cu_seqlens_kv.data; },
               "'workspace' overlaps argument 'cu_seqlens_kv'");
  // Two outputs overlapping each other.
  expect_error([](auto&, auto& a) { a.dv.data = plus(a.dk.data, 1024); }, "'dk' overlaps argument 'dv'");
  expect_error([](auto&, auto& a) { a.workspace.data = a.dq.data; }, "'dq' overlaps argument 'workspace'");
}

TEST(MhaPrefillBwdApi, WorkspaceSize) {
  MhaPrefillBwdWorkspaceSizes ws;
  ASSERT_TRUE(get_mha_prefill_bwd_workspace_size(valid_problem(), &ws).is_ok());
  EXPECT_EQ(ws.workspace_bytes, detail::mha_prefill_bwd_workspace_layout(valid_problem()).end);
  // The header's account: at least the fp32 dq accumulator, h_q x (total_q + 64 batch + 64) x d_qk x 4 bytes, plus two
  // floats per padded row and head; the counters add little.
  const size_t rows = 1000 + 64 * 4 + 64;
  EXPECT_GE(ws.workspace_bytes, 16 * rows * (192 * 4 + 8));
  EXPECT_LE(ws.workspace_bytes, 16 * (rows + 128) * (192 * 4 + 8 + 4) + 4096);
  // It grows with total_q, batch, h_q and d_qk, not with the number of keys or the flags.
  MhaPrefillBwdProblem p = valid_problem();
  MhaPrefillBwdWorkspaceSizes other;
  p.causal = false;
  p.deterministic = true;
  p.num_sms = 0;
  ASSERT_TRUE(get_mha_prefill_bwd_workspace_size(p, &other).is_ok());
  EXPECT_EQ(other.workspace_bytes, ws.workspace_bytes);
  p.d_qk = 128;
  ASSERT_TRUE(get_mha_prefill_bwd_workspace_size(p, &other).is_ok());
  EXPECT_LT(other.workspace_bytes, ws.workspace_bytes);
  p = valid_problem();
  p.total_q = 0;
  ASSERT_TRUE(get_mha_prefill_bwd_workspace_size(p, &other).is_ok());
  EXPECT_GT(other.workspace_bytes, 0u);
  EXPECT_LT(other.workspace_bytes, ws.workspace_bytes);

  MhaPrefillBwdProblem bad = valid_problem();
  bad.h_q = 3;
  const Status st = get_mha_prefill_bwd_workspace_size(bad, &ws);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("'problem.h_q'"), std::string::npos) << st.message();
  bad = valid_problem();
  bad.d_qk = 64;
  EXPECT_EQ(get_mha_prefill_bwd_workspace_size(bad, &ws).code(), StatusCode::kUnsupported);
  EXPECT_FALSE(get_mha_prefill_bwd_workspace_size(valid_problem(), nullptr).is_ok());
}

// As the forward's RunsWithoutAnySwitch (test_mha_prefill_api.cpp): argument errors first; then a build without the
// family answers "not built"; without a visible device a valid call fails at the launch context with a CUDA error.
// (With a device it would launch on the fake pointers, so it is made only without one.)
TEST(MhaPrefillBwdApi, ArgumentErrorsComeFirst) {
  MhaPrefillBwdArgs bad = valid_args();
  bad.dv.shape[1] = 3;
  const Status st_bad = mha_prefill_bwd(valid_problem(), bad, nullptr);
  EXPECT_EQ(st_bad.code(), StatusCode::kInvalidArgument) << st_bad.message();
  EXPECT_NE(st_bad.message().find("'dv'"), std::string::npos) << st_bad.message();

  const Capability cap = query_capability(Feature::kDensePrefill);
  if (cap.reason == "dense_prefill: compiled out (OPENMLA_ENABLE_MHA_PREFILL=OFF)") {
    const Status st = mha_prefill_bwd(valid_problem(), valid_args(), nullptr);
    EXPECT_EQ(st.code(), StatusCode::kUnsupported) << st.message();
    EXPECT_NE(st.message().find("mha_prefill_bwd: this build has no"), std::string::npos) << st.message();
    return;
  }
  if (cap.supported || cap.reason.find("no CUDA device is visible") == std::string::npos)
    GTEST_SKIP() << "a CUDA device is visible: a valid call would launch on the fake pointers (" << cap.reason << ")";
  const Status st = mha_prefill_bwd(valid_problem(), valid_args(), nullptr);
  EXPECT_EQ(st.code(), StatusCode::kCudaError) << st.message();
}

}  // namespace
}  // namespace openmla
