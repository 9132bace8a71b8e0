// Dense MHA prefill: every validation error of mha_prefill, the parameters it builds, the workspace size and the launch
// plan (the tile arithmetic it shares with the kernel is tested in test_varlen.cpp). Uses fake, aligned, non-null "device" pointers: validate_mha_prefill makes no CUDA call, so no GPU
// is needed and nothing is ever launched on them.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "api/mha_prefill_internal.h"
#include "heuristics/mha_prefill_launch.h"
#include "mha_prefill_fixture.h"
#include "openmla/capability.h"
#include "openmla/prefill.h"

namespace openmla {
namespace {

void* fake_ptr(int i) { return reinterpret_cast<void*>(uintptr_t{0x10000000} + uintptr_t(i) * 0x10000000); }

MhaPrefillProblem valid_problem() { return testing::mha_fixture_problem(132); }
MhaPrefillArgs valid_args() { return testing::mha_fixture_args(fake_ptr); }

void expect_error(const std::function<void(MhaPrefillProblem&, MhaPrefillArgs&)>& mutate, const std::string& needle,
                  StatusCode code = StatusCode::kInvalidArgument) {
  MhaPrefillProblem p = valid_problem();
  MhaPrefillArgs a = valid_args();
  mutate(p, a);
  const Status s = detail::validate_mha_prefill(p, a, nullptr);
  ASSERT_FALSE(s.is_ok()) << "expected an error naming " << needle;
  EXPECT_EQ(s.code(), code) << s.message();
  EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
}

TEST(MhaPrefillApi, ValidCallBuildsParams) {
  kernels::MhaPrefillParams p;
  const Status st = detail::validate_mha_prefill(valid_problem(), valid_args(), &p);
  ASSERT_TRUE(st.is_ok()) << st.message();
  EXPECT_EQ(p.seqs.batch, 4);
  EXPECT_EQ(p.h_q, 16);
  EXPECT_EQ(p.h_kv, 2);
  EXPECT_EQ(p.heads_per_kv, 8);
  EXPECT_EQ(p.d_qk, 192);
  EXPECT_FALSE(p.fp16);
  EXPECT_TRUE(p.causal);
  EXPECT_EQ(p.seqs.total_q, 1000);
  EXPECT_EQ(p.seqs.total_k, 1500);
  EXPECT_FLOAT_EQ(p.scale_log2, 0.125f * 1.4426950408889634f);
  EXPECT_EQ(p.q_stride_t, 16 * 192);
  EXPECT_EQ(p.q_stride_h, 192);
  EXPECT_EQ(p.k_stride_t, 2 * 192);
  EXPECT_EQ(p.v_stride_t, 2 * 128);
  EXPECT_EQ(p.output.out_stride_b, 16 * 128);  // the packed token is the output view's request
  EXPECT_EQ(p.output.out_stride_s, 0);
  EXPECT_EQ(p.output.out_stride_h, 128);
  EXPECT_EQ(p.output.lse_stride_b, 1);
  EXPECT_EQ(p.output.lse_stride_h, 1000);
  EXPECT_EQ(p.output.lse_stride_s, 0);
  EXPECT_EQ(p.q, fake_ptr(1));
  EXPECT_EQ(p.k, fake_ptr(2));
  EXPECT_EQ(p.tile_counter, fake_ptr(6));
  // (1000 + 127 * 4) / 128 = 11 query blocks at most, x 16 heads = 176 tiles > 132 SMs.
  EXPECT_EQ(p.grid, 132);
  EXPECT_TRUE(p.dynamic_tiles);
}

TEST(MhaPrefillApi, PackedQkvViewsAndDefaults) {
  // flash_attn_varlen_qkvpacked_func: one (total, h, 192 + 192 + 128) tensor split along the last dimension.
  MhaPrefillProblem pr = valid_problem();
  pr.h_q = pr.h_kv = 8;
  pr.causal = false;
  pr.batch = 1;
  pr.dtype = DType::kFloat16;
  pr.max_seqlen_qo = 300;
  const int64_t row = 8 * 512;
  auto* base = static_cast<char*>(fake_ptr(1));
  MhaPrefillArgs a = valid_args();
  a.q = make_tensor(base, DType::kFloat16, {300, 8, 192}, {row, 512, 1});
  a.k = make_tensor(base + 192 * 2, DType::kFloat16, {300, 8, 192}, {row, 512, 1});
  a.v = make_tensor(base + 384 * 2, DType::kFloat16, {300, 8, 128}, {row, 512, 1});
  a.cu_seqlens_qo = make_tensor(fake_ptr(4), DType::kInt32, {2});
  a.cu_seqlens_kv = make_tensor(fake_ptr(5), DType::kInt32, {2});
  a.out = make_tensor(fake_ptr(7), DType::kFloat16, {300, 8, 128});
  a.lse = make_tensor(fake_ptr(8), DType::kFloat32, {300, 8});
  a.softmax_scale = 0.f;
  kernels::MhaPrefillParams p;
  const Status st = detail::validate_mha_prefill(pr, a, &p);
  ASSERT_TRUE(st.is_ok()) << st.message();
  EXPECT_TRUE(p.fp16);
  EXPECT_EQ(p.q_stride_t, row);
  EXPECT_EQ(p.k_stride_h, 512);
  EXPECT_EQ(p.v, base + 768);
  EXPECT_FLOAT_EQ(p.scale_log2, static_cast<float>(1.4426950408889634 / std::sqrt(192.0)));
  // One sequence of at most 300 rows: 3 query blocks x 8 heads; non-causal single sequence: round-robin.
  EXPECT_EQ(p.grid, 24);
  EXPECT_FALSE(p.dynamic_tiles);
}

TEST(MhaPrefillApi, SizeOneDimensionsAndEmptyTensors) {
  MhaPrefillProblem pr = valid_problem();
  pr.h_q = 2;
  pr.h_kv = 1;
  pr.batch = 1;
  MhaPrefillArgs a = valid_args();
  // h_kv = 1 and total_k = 1: strides of size-1 dimensions are never used (anything is accepted and replaced).
  a.q = make_tensor(fake_ptr(1), DType::kBFloat16, {1, 2, 192}, {3, 192, 1});
  a.k = make_tensor(fake_ptr(2), DType::kBFloat16, {1, 1, 192}, {0, 5, 1});
  a.v = make_tensor(fake_ptr(3), DType::kBFloat16, {1, 1, 128}, {7, 0, 1});
  a.cu_seqlens_qo = make_tensor(fake_ptr(4), DType::kInt32, {2});
  a.cu_seqlens_kv = make_tensor(fake_ptr(5), DType::kInt32, {2});
  a.out = make_tensor(fake_ptr(7), DType::kBFloat16, {1, 2, 128});
  a.lse = make_tensor(fake_ptr(8), DType::kFloat32, {1, 2});
  kernels::MhaPrefillParams p;
  Status st = detail::validate_mha_prefill(pr, a, &p);
  ASSERT_TRUE(st.is_ok()) << st.message();
  EXPECT_EQ(p.q_stride_t, 2 * 192);
  EXPECT_EQ(p.k_stride_t, 192);
  EXPECT_EQ(p.k_stride_h, 192);
  EXPECT_EQ(p.v_stride_h, 128);
  EXPECT_EQ(p.grid, 2);

  // No keys at all (every sequence has s_k = 0): k and v may be empty views without an address; the maps are then
  // built on q's address (never read).
  a.k = make_tensor(nullptr, DType::kBFloat16, {0, 1, 192});
  a.v = make_tensor(nullptr, DType::kBFloat16, {0, 1, 128});
  st = detail::validate_mha_prefill(pr, a, &p);
  ASSERT_TRUE(st.is_ok()) << st.message();
  EXPECT_EQ(p.seqs.total_k, 0);
  EXPECT_EQ(p.k, fake_ptr(1));
  EXPECT_EQ(p.v, fake_ptr(1));

  // No query row: nothing to launch.
  a.q = make_tensor(nullptr, DType::kBFloat16, {0, 2, 192});
  a.out = make_tensor(nullptr, DType::kBFloat16, {0, 2, 128});
  a.lse = make_tensor(fake_ptr(8), DType::kFloat32, {0, 2});
  st = detail::validate_mha_prefill(pr, a, &p);
  ASSERT_TRUE(st.is_ok()) << st.message();
  EXPECT_EQ(p.grid, 0);
}

TEST(MhaPrefillApi, ProblemFields) {
  expect_error([](auto& p, auto&) { p.batch = 0; }, "'problem.batch' is 0");
  expect_error([](auto& p, auto&) { p.h_kv = 0; }, "'problem.h_kv' is 0");
  expect_error([](auto& p, auto&) { p.h_q = 13; }, "'problem.h_q' is 13; must be a positive multiple of h_kv = 2");
  expect_error([](auto& p, auto&) { p.d_qk = 576; }, "(d_qk, d_v) = (192, 128)", StatusCode::kUnsupported);
  expect_error([](auto& p, auto&) { p.d_v = 192; }, "'problem.d_qk' / 'problem.d_v' is 192 / 192",
               StatusCode::kUnsupported);
  expect_error([](auto& p, auto&) { p.dtype = DType::kFloat32; }, "'problem.dtype' is float32");
  expect_error([](auto& p, auto&) { p.max_seqlen_qo = -1; }, "'problem.max_seqlen_qo' is -1");
  expect_error([](auto& p, auto&) { p.num_sms = -2; }, "'problem.num_sms' is -2");
  expect_error([](auto& p, auto&) { p.epilogue = static_cast<MhaPrefillEpilogue>(3); },
               "'problem.epilogue' is 3; must be MhaPrefillEpilogue kAuto (0), kRegisters (1) or kStaged (2)");
}

TEST(MhaPrefillApi, QKV) {
  expect_error([](auto&, auto& a) { a.q = TensorRef{}; }, "'q' is required");
  expect_error([](auto&, auto& a) { a.q.device = DeviceType::kCPU; }, "'q' must be a CUDA tensor");
  expect_error([](auto&, auto& a) { a.q.dtype = DType::kFloat32; },
               "'q' has dtype float32, expected bfloat16 or float16");
  expect_error([](auto&, auto& a) { a.q.dtype = DType::kFloat16; },
               "'q' has dtype float16, expected bfloat16 (problem.dtype");
  expect_error([](auto&, auto& a) { a.q.ndim = 4; }, "'q' must have 3 dimensions");
  expect_error([](auto&, auto& a) { a.q.shape[1] = 8; }, "'q' has size 8 in dimension 1 (h_q)");
  expect_error([](auto&, auto& a) { a.q.shape[2] = 128; }, "'q' has size 128 in dimension 2 (d_qk)");
  expect_error([](auto&, auto& a) { a.q.stride[2] = 2; }, "'q' must be contiguous in its last dimension");
  expect_error([](auto&, auto& a) { a.q.stride[1] = 196; }, "'q' has stride 196 in dimension 1");
  expect_error([](auto&, auto& a) { a.q.stride[0] = -a.q.stride[0]; }, "negative strides are not supported");
  expect_error([](auto&, auto& a) { a.q.stride[0] = int64_t{1} << 33; }, "below 2^32");
  expect_error([](auto&, auto& a) { a.q.data = static_cast<char*>(a.q.data) + 8; }, "'q' data pointer must be 16-byte");
  expect_error([](auto&, auto& a) { a.q.shape[0] = a.out.shape[0] = a.lse.shape[0] = (int64_t{1} << 30) + 1; },
               "at most 2^30");
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

TEST(MhaPrefillApi, CumulativeLengths) {
  expect_error([](auto&, auto& a) { a.cu_seqlens_qo = TensorRef{}; }, "'cu_seqlens_qo' is required");
  expect_error([](auto&, auto& a) { a.cu_seqlens_qo.dtype = DType::kInt64; }, "'cu_seqlens_qo' has dtype int64");
  expect_error([](auto&, auto& a) { a.cu_seqlens_qo.shape[0] = 4; },
               "'cu_seqlens_qo' has size 4 in dimension 0 (batch + 1)");
  expect_error([](auto&, auto& a) { a.cu_seqlens_kv.device = DeviceType::kCPU; },
               "'cu_seqlens_kv' must be a CUDA tensor");
  expect_error([](auto&, auto& a) { a.cu_seqlens_kv = make_tensor(a.cu_seqlens_kv.data, DType::kInt32, {5}, {2}); },
               "'cu_seqlens_kv' must be contiguous");
  expect_error([](auto&, auto& a) { a.cu_seqlens_kv.data = static_cast<char*>(a.cu_seqlens_kv.data) + 2; },
               "'cu_seqlens_kv' data pointer must be 4-byte");
}

TEST(MhaPrefillApi, Scalars) {
  expect_error([](auto&, auto& a) { a.softmax_scale = -1.f; }, "'softmax_scale' is -1");
  expect_error([](auto&, auto& a) { a.softmax_scale = NAN; }, "'softmax_scale'");
  expect_error([](auto&, auto& a) { a.softmax_scale = INFINITY; }, "'softmax_scale'");
  // Ten million sequences of 256 heads: up to 2^31 tiles and more (the tile numbers are int32 in the kernel).
  expect_error(
      [](auto& p, auto& a) {
        p.batch = 10'000'000;
        p.h_q = p.h_kv = 256;
        a.q = make_tensor(fake_ptr(1), DType::kBFloat16, {10'000'000, 256, 192});
        a.cu_seqlens_qo = make_tensor(fake_ptr(4), DType::kInt32, {10'000'001});
      },
      "tiles of 128 rows");
}

TEST(MhaPrefillApi, WorkspaceAndOutputs) {
  expect_error([](auto&, auto& a) { a.workspace = TensorRef{}; }, "'workspace' is required");
  expect_error([](auto&, auto& a) { a.workspace.shape[0] = 8; },
               "'workspace' has 8 bytes; get_mha_prefill_workspace_size asks for 16");
  expect_error([](auto&, auto& a) { a.workspace.data = static_cast<char*>(a.workspace.data) + 4; },
               "'workspace' data pointer must be 16-byte");
  expect_error([](auto&, auto& a) { a.workspace.device = DeviceType::kCPU; }, "'workspace' must be a CUDA tensor");
  expect_error([](auto&, auto& a) { a.out = TensorRef{}; }, "'out' is required");
  expect_error([](auto&, auto& a) { a.out.dtype = DType::kFloat32; }, "'out' has dtype float32");
  expect_error([](auto&, auto& a) { a.out.shape[0] = 999; }, "'out' has size 999 in dimension 0 (total_q, as q)");
  expect_error([](auto&, auto& a) { a.out.shape[2] = 192; }, "'out' has size 192 in dimension 2 (d_v)");
  expect_error([](auto&, auto& a) { a.out.stride[1] = 132; }, "'out' has stride 132 in dimension 1");
  expect_error([](auto&, auto& a) { a.out.data = static_cast<char*>(a.out.data) + 2; },
               "'out' data pointer must be 16-byte");
  expect_error([](auto&, auto& a) { a.lse = TensorRef{}; }, "'lse' is required");
  expect_error([](auto&, auto& a) { a.lse.dtype = DType::kBFloat16; }, "'lse' has dtype bfloat16");
  expect_error([](auto&, auto& a) { a.lse.shape[1] = 2; }, "'lse' has size 2 in dimension 1 (h_q)");
  expect_error([](auto&, auto& a) { a.lse.data = static_cast<char*>(a.lse.data) + 2; },
               "'lse' data pointer must be 4-byte");
  expect_error([](auto&, auto& a) { a.lse.device_id = 2; }, "all tensors must be on the same device");
}

TEST(MhaPrefillApi, OutputsMustNotAlias) {
  expect_error([](auto&, auto& a) { a.out.data = a.q.data; }, "'out' overlaps argument 'q'");
  expect_error([](auto&, auto& a) { a.lse.data = static_cast<char*>(a.v.data) + 64; }, "'lse' overlaps argument 'v'");
  expect_error([](auto&, auto& a) { a.workspace.data = a.cu_seqlens_kv.data; },
               "'workspace' overlaps argument 'cu_seqlens_kv'");
  expect_error([](auto&, auto& a) { a.lse.data = static_cast<char*>(a.out.data) + 1024; },
               "'out' overlaps argument 'lse'");
}

TEST(MhaPrefillApi, WorkspaceSize) {
  MhaPrefillWorkspaceSizes ws;
  ASSERT_TRUE(get_mha_prefill_workspace_size(valid_problem(), &ws).is_ok());
  EXPECT_EQ(ws.workspace_bytes, 16u);
  MhaPrefillProblem bad = valid_problem();
  bad.h_q = 3;
  const Status st = get_mha_prefill_workspace_size(bad, &ws);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("'problem.h_q'"), std::string::npos) << st.message();
  EXPECT_FALSE(get_mha_prefill_workspace_size(valid_problem(), nullptr).is_ok());
}

// No run-time switch: the capability of dense prefill is the device answer every built family gets (dense decode's,
// under its own name): supported on a Hopper GPU, else the device reason. Argument errors come first; without a
// visible device a valid call then gets as far as the launch context and fails there with the CUDA error, not as
// unsupported. (With a device the valid call would launch on the fake pointers, so it is made only without one; the
// GPU tests make real calls.) A build without the family (or without dense decode) is recognised by its capability
// reason (tests/cpp/test_build_options.cpp checks that it agrees with the OPENMLA_HAS_* definitions).
TEST(MhaPrefillApi, RunsWithoutAnySwitch) {
  MhaPrefillArgs bad = valid_args();
  bad.out.shape[1] = 3;
  const Status st_bad = mha_prefill(valid_problem(), bad, nullptr);
  EXPECT_EQ(st_bad.code(), StatusCode::kInvalidArgument) << st_bad.message();

  const Capability cap = query_capability(Feature::kDensePrefill);
  if (cap.reason == "dense_prefill: compiled out (OPENMLA_ENABLE_MHA_PREFILL=OFF)") {
    const Status st = mha_prefill(valid_problem(), valid_args(), nullptr);
    EXPECT_EQ(st.code(), StatusCode::kUnsupported) << st.message();
    return;
  }
  const Capability decode = query_capability(Feature::kDenseDecode);
  if (decode.reason == "dense_decode: compiled out (OPENMLA_ENABLE_DENSE_DECODE=OFF)")
    GTEST_SKIP() << "dense decode is compiled out: no other family's device answer to compare with";
  if (decode.supported) {
    EXPECT_TRUE(cap.supported) << cap.reason;
    EXPECT_EQ(cap.reason, "");
    return;
  }
  const std::string decode_prefix = "dense_decode: ";
  ASSERT_EQ(decode.reason.rfind(decode_prefix, 0), 0u) << decode.reason;
  EXPECT_FALSE(cap.supported);
  EXPECT_EQ(cap.reason, "dense_prefill: " + decode.reason.substr(decode_prefix.size()));
  if (decode.reason.find("no CUDA device is visible") == std::string::npos) return;  // a GPU, not a Hopper one
  const Status st = mha_prefill(valid_problem(), valid_args(), nullptr);
  EXPECT_EQ(st.code(), StatusCode::kCudaError) << st.message();
}

// ---- Launch plan --------------------------------------------------------------------------------------------------
TEST(MhaPrefillLaunch, MaxTilesBoundsEverySplit) {
  // Brute force: every split of total_q rows into `batch` sequences has at most the bound's query blocks.
  for (int64_t batch = 1; batch <= 4; ++batch) {
    for (int64_t total = 0; total <= 600; total += 37) {
      int64_t worst = 0;
      // Sequences as long as possible in as many pieces as possible: total - 1 rows... the worst split puts
      // 128 k + 1 rows in each sequence; enumerate splits with the first batch - 1 lengths in steps of 1 (small).
      std::function<void(int64_t, int64_t, int64_t)> rec = [&](int64_t left, int64_t seqs, int64_t blocks) {
        if (seqs == 1) {
          worst = std::max(worst, blocks + (left + 127) / 128);
          return;
        }
        for (int64_t s = 0; s <= left; s += (left > 300 ? 7 : 1)) rec(left - s, seqs - 1, blocks + (s + 127) / 128);
      };
      rec(total, batch, 0);
      const int64_t bound = heuristics::mha_prefill_max_tiles(batch, total, 1, 0);
      EXPECT_GE(bound, worst) << "batch " << batch << " total " << total;
      EXPECT_LE(bound, worst + batch) << "batch " << batch << " total " << total;
    }
  }
  EXPECT_EQ(heuristics::mha_prefill_max_tiles(2, 8192, 128, 0), 65 * 128);  // any split of 8192 rows in 2: <= 65 blocks
  EXPECT_EQ(heuristics::mha_prefill_max_tiles(2, 8192, 128, 4096), 64 * 128);
  EXPECT_EQ(heuristics::mha_prefill_max_tiles(16, 16 * 1024, 128, 1024), 16 * 8 * 128);
  EXPECT_EQ(heuristics::mha_prefill_max_tiles(1000, 1000, 16, 1), 1000 * 16);  // 1000 one-row sequences
  EXPECT_EQ(heuristics::mha_prefill_max_tiles(1000, 1000, 16, 0), (1000 + 127 * 1000) / 128 * 16);
  EXPECT_EQ(heuristics::mha_prefill_max_tiles(3, 0, 16, 0), 0);
}

TEST(MhaPrefillLaunch, GridAndTileHandOut) {
  MhaPrefillProblem p = valid_problem();
  p.batch = 1;
  p.h_q = p.h_kv = 128;
  p.causal = false;
  auto plan = heuristics::plan_mha_prefill_launch(p, 8192, 132);
  EXPECT_EQ(plan.max_tiles, 64 * 128);
  EXPECT_EQ(plan.grid, 132);
  EXPECT_FALSE(plan.dynamic_tiles);  // one sequence, no mask: every tile costs the same
  p.causal = true;
  EXPECT_TRUE(heuristics::plan_mha_prefill_launch(p, 8192, 132).dynamic_tiles);
  p.causal = false;
  p.batch = 2;
  EXPECT_TRUE(heuristics::plan_mha_prefill_launch(p, 8192, 132).dynamic_tiles);
  p.batch = 1;
  p.h_q = p.h_kv = 1;
  plan = heuristics::plan_mha_prefill_launch(p, 200, 132);
  EXPECT_EQ(plan.grid, 2);
  EXPECT_EQ(heuristics::plan_mha_prefill_launch(p, 0, 132).grid, 0);
}

TEST(MhaPrefillLaunch, EpilogueChoice) {
  MhaPrefillProblem p = valid_problem();
  p.batch = 16;
  EXPECT_TRUE(heuristics::plan_mha_prefill_launch(p, 16 * 1024, 132).staged_out);  // short sequences: staged
  EXPECT_TRUE(heuristics::plan_mha_prefill_launch(p, 16 * 2048, 132).staged_out);
  EXPECT_FALSE(heuristics::plan_mha_prefill_launch(p, 16 * 2048 + 1, 132).staged_out);
  p.batch = 2;
  EXPECT_FALSE(heuristics::plan_mha_prefill_launch(p, 2 * 4096, 132).staged_out);  // long: from the registers
  p.epilogue = MhaPrefillEpilogue::kStaged;
  EXPECT_TRUE(heuristics::plan_mha_prefill_launch(p, 2 * 4096, 132).staged_out);
  p.epilogue = MhaPrefillEpilogue::kRegisters;
  EXPECT_FALSE(heuristics::plan_mha_prefill_launch(p, 16, 132).staged_out);
}

}  // namespace
}  // namespace openmla
