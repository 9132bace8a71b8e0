// Decode API: workspace sizes and every validation error of plan_decode / dense_decode / sparse_decode, through the
// family structs (DenseDecodeProblem, SparseDecodeProblem) and the compatibility form (DecodeProblem), which must
// give the same messages. Uses fake, aligned, non-null "device" pointers and problem.num_sms > 0: all checks run
// before any CUDA call, so no GPU is needed and nothing is ever launched on the fake pointers.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "api/decode_internal.h"
#include "openmla/decode.h"
#include "openmla/test_hooks.h"

namespace openmla {
namespace {

// Fake device pointers 64 GiB apart: no two arguments of a test call overlap (the API rejects outputs that do).
void* fake_ptr(int i) { return reinterpret_cast<void*>(uintptr_t{0x10000000} + (uintptr_t(i) << 36)); }

constexpr int kSms = 132;

// The internal validators take the family structs; the mutation tables below edit the compatibility form (it has
// every field, `sparse` included), converted the way the public compatibility functions convert it.
Status validate_dense(const DecodeProblem& p, const DenseDecodeArgs& a, int* parts) {
  DenseDecodeProblem dense;
  OPENMLA_RETURN_IF_ERROR(detail::to_dense_problem(p, &dense));
  return detail::validate_dense_decode(dense, a, parts);
}

Status validate_sparse(const DecodeProblem& p, const SparseDecodeArgs& a, int* parts) {
  SparseDecodeProblem sparse;
  OPENMLA_RETURN_IF_ERROR(detail::to_sparse_problem(p, /*for_decode=*/true, &sparse));
  return detail::validate_sparse_decode(sparse, a, parts);
}

Status validate_plan(const DecodeProblem& p, const TensorRef& seqlens, const TensorRef& topk_len,
                     const TensorRef& extra_len, const DecodeSchedule& sched, int* parts) {
  if (!p.sparse) return detail::validate_plan_decode(p.as_dense(), seqlens, sched, parts);
  SparseDecodeProblem sparse;
  OPENMLA_RETURN_IF_ERROR(detail::to_sparse_problem(p, /*for_decode=*/false, &sparse));
  return detail::validate_plan_decode(sparse, topk_len, extra_len, sched, parts);
}

DecodeProblem dense_problem() {
  DecodeProblem p;
  p.batch = 2;
  p.s_q = 2;
  p.h_q = 16;
  p.h_kv = 1;
  p.causal = true;
  p.num_sms = kSms;  // no device query
  return p;
}

// A valid dense call: b = 2, s_q = 2, h_q = 16, h_kv = 1 -> num_sm_parts = 132 / 1 / 1 = 132.
DenseDecodeArgs dense_args(const DecodeProblem& p) {
  const int64_t parts = 132;
  const int64_t rows = (p.batch + parts) * p.s_q * p.h_q;
  DenseDecodeArgs a;
  a.q = make_tensor(fake_ptr(1), DType::kBFloat16, {p.batch, p.s_q, p.h_q, 576});
  a.k_cache = make_tensor(fake_ptr(2), DType::kBFloat16, {10, 64, p.h_kv, 576});
  a.block_table = make_tensor(fake_ptr(3), DType::kInt32, {p.batch, 4});
  a.cache_seqlens = make_tensor(fake_ptr(4), DType::kInt32, {p.batch});
  a.schedule.metadata = make_tensor(fake_ptr(5), DType::kInt32, {parts, kDecodeScheduleRecordInts});
  a.schedule.num_splits = make_tensor(fake_ptr(6), DType::kInt32, {p.batch + 1});
  // One counter per (request, kv head, m-block): s_q * h_q / h_kv = 32 rows -> 1 m-block.
  a.schedule.merge_counters = make_tensor(fake_ptr(16), DType::kInt32, {p.batch * p.h_kv});
  a.split.partial_o = make_tensor(fake_ptr(7), DType::kFloat32, {rows, 512});
  a.split.partial_lse = make_tensor(fake_ptr(8), DType::kFloat32, {rows});
  a.out = make_tensor(fake_ptr(9), DType::kBFloat16, {p.batch, p.s_q, p.h_q, 512});
  a.lse = make_tensor(fake_ptr(10), DType::kFloat32, {p.batch, p.h_q, p.s_q});
  return a;
}

TEST(DecodeApi, WorkspaceSizesDense) {
  DecodeProblem p;
  p.batch = 128;
  p.s_q = 1;
  p.h_q = 128;
  p.num_sms = kSms;
  DecodeWorkspaceSizes s;
  ASSERT_TRUE(get_decode_workspace_sizes(p, &s).is_ok());
  EXPECT_EQ(s.num_sm_parts, 66);
  EXPECT_EQ(s.metadata_ints, 66 * 8);
  EXPECT_EQ(s.num_splits_ints, 129);
  EXPECT_EQ(s.partial_rows, (128 + 66) * 128);
  EXPECT_EQ(s.partial_o_bytes, size_t((128 + 66) * 128) * 512 * 4);
  EXPECT_EQ(s.partial_lse_bytes, size_t((128 + 66) * 128) * 4);
  EXPECT_EQ(s.merge_counter_ints, 128 * 2);  // one per (request, m-block): 128 rows = 2 m-blocks

  p.s_q = 2;
  p.h_q = 64;
  p.h_kv = 2;  // 64 rows per kv head: one m-block, 132 / 2 = 66
  ASSERT_TRUE(get_decode_workspace_sizes(p, &s).is_ok());
  EXPECT_EQ(s.num_sm_parts, 66);
  EXPECT_EQ(s.partial_rows, (128 + 66) * 2 * 64);
  EXPECT_EQ(s.merge_counter_ints, 128 * 2 * 1);  // (request, kv head, m-block)
  p.h_q = 130;
  p.h_kv = 1;  // 260 rows: 5 m-blocks
  ASSERT_TRUE(get_decode_workspace_sizes(p, &s).is_ok());
  EXPECT_EQ(s.merge_counter_ints, 128 * 5);
}

TEST(DecodeApi, WorkspaceSizesSparse) {
  DecodeProblem p;
  p.batch = 4;
  p.s_q = 2;
  p.h_q = 128;
  p.sparse = true;
  p.topk = 2048;
  p.d_qk = 576;
  p.cache_format = KVCacheFormat::kFp8V32;
  p.num_sms = kSms;
  DecodeWorkspaceSizes s;
  ASSERT_TRUE(get_decode_workspace_sizes(p, &s).is_ok());
  EXPECT_EQ(s.num_sm_parts, 33);
  EXPECT_EQ(s.partial_rows, (4 + 33) * 2 * 128);
  EXPECT_EQ(s.merge_counter_ints, 4 * 2 * 2);  // (request, query position, 64-head tile)
}

TEST(DecodeApi, WorkspaceSizesErrors) {
  DecodeProblem p = dense_problem();
  Status st = get_decode_workspace_sizes(p, nullptr);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("sizes"), std::string::npos);
  DecodeWorkspaceSizes s;
  p.h_kv = 3;
  st = get_decode_workspace_sizes(p, &s);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("problem.h_q"), std::string::npos) << st.message();
  p = dense_problem();
  p.sparse = true;
  p.topk = 0;
  st = get_decode_workspace_sizes(p, &s);
  EXPECT_NE(st.message().find("problem.topk"), std::string::npos) << st.message();
}

TEST(DecodeApi, ValidDenseCallPassesValidation) {
  const DecodeProblem p = dense_problem();
  int parts = 0;
  const Status st = validate_dense(p, dense_args(p), &parts);
  ASSERT_TRUE(st.is_ok()) << st.message();
  EXPECT_EQ(parts, 132);

  // The merge counters are optional.
  DenseDecodeArgs a = dense_args(p);
  a.schedule.merge_counters = TensorRef{};
  EXPECT_TRUE(validate_dense(p, a, &parts).is_ok());
  // Larger split buffers than needed are fine (an engine sizes them for its largest batch).
  a = dense_args(p);
  a.split.partial_o.shape[0] += 1000;
  a.split.partial_lse.shape[0] += 1000;
  EXPECT_TRUE(validate_dense(p, a, &parts).is_ok());
  // fp16 everywhere.
  DecodeProblem p16 = p;
  p16.cache_format = KVCacheFormat::kFloat16;
  a = dense_args(p16);
  a.q.dtype = a.k_cache.dtype = a.out.dtype = DType::kFloat16;
  EXPECT_TRUE(validate_dense(p16, a, &parts).is_ok());
  // Free strides (multiples of 8 elements) on q, k_cache, out; any strides on lse.
  a = dense_args(p);
  a.q.stride[0] = 4 * 16 * 576;
  a.k_cache.stride[0] = 64 * 576 + 8;
  a.out.stride[1] = 16 * 512 + 64;
  a.out.stride[0] = 2 * a.out.stride[1];  // rows of different requests must not overlap (checked since)
  a.lse = make_tensor(fake_ptr(10), DType::kFloat32, {2, 16, 2}, {32, 1, 16});  // (b, s_q, h_q) storage
  const Status strided = validate_dense(p, a, &parts);
  EXPECT_TRUE(strided.is_ok()) << strided.message();
}

struct Mutation {
  const char* what;
  std::function<void(DecodeProblem&, DenseDecodeArgs&)> apply;
  const char* expect_in_message;
};

TEST(DecodeApi, DenseDecodeValidationErrors) {
  const std::vector<Mutation> mutations = {
      {"batch 0", [](DecodeProblem& p, DenseDecodeArgs&) { p.batch = 0; }, "problem.batch"},
      {"s_q 0", [](DecodeProblem& p, DenseDecodeArgs&) { p.s_q = 0; }, "problem.s_q"},
      {"h_q not multiple of h_kv", [](DecodeProblem& p, DenseDecodeArgs&) { p.h_kv = 3; }, "problem.h_q"},
      {"h_kv 0", [](DecodeProblem& p, DenseDecodeArgs&) { p.h_kv = 0; }, "problem.h_kv"},
      {"d_v", [](DecodeProblem& p, DenseDecodeArgs&) { p.d_v = 576; }, "problem.d_v"},
      {"d_qk", [](DecodeProblem& p, DenseDecodeArgs&) { p.d_qk = 512; }, "problem.d_qk"},
      {"page size 8", [](DecodeProblem& p, DenseDecodeArgs&) { p.page_block_size = 8; }, "problem.page_block_size"},
      {"page size 48", [](DecodeProblem& p, DenseDecodeArgs&) { p.page_block_size = 48; }, "problem.page_block_size"},
      {"page size 512", [](DecodeProblem& p, DenseDecodeArgs&) { p.page_block_size = 512; }, "problem.page_block_size"},
      {"page size 1", [](DecodeProblem& p, DenseDecodeArgs&) { p.page_block_size = 1; }, "problem.page_block_size"},
      {"sparse", [](DecodeProblem& p, DenseDecodeArgs&) { p.sparse = true; p.topk = 64; }, "problem.sparse"},
      {"fp8 format", [](DecodeProblem& p, DenseDecodeArgs&) { p.cache_format = KVCacheFormat::kFp8V32; },
       "problem.cache_format"},
      {"num_sms", [](DecodeProblem& p, DenseDecodeArgs&) { p.num_sms = -1; }, "problem.num_sms"},
      {"huge s_q*h_q", [](DecodeProblem& p, DenseDecodeArgs&) { p.s_q = 1 << 20; }, "problem.s_q"},
      // q
      {"q missing", [](DecodeProblem&, DenseDecodeArgs& a) { a.q = TensorRef{}; }, "'q'"},
      {"q on cpu", [](DecodeProblem&, DenseDecodeArgs& a) { a.q.device = DeviceType::kCPU; }, "'q'"},
      {"q float32", [](DecodeProblem&, DenseDecodeArgs& a) { a.q.dtype = DType::kFloat32; }, "'q'"},
      {"q fp16 vs bf16 cache", [](DecodeProblem&, DenseDecodeArgs& a) { a.q.dtype = DType::kFloat16; }, "'q'"},
      {"q 3-D", [](DecodeProblem&, DenseDecodeArgs& a) { a.q.ndim = 3; }, "'q'"},
      {"q batch", [](DecodeProblem&, DenseDecodeArgs& a) { a.q.shape[0] = 3; }, "'q'"},
      {"q s_q", [](DecodeProblem&, DenseDecodeArgs& a) { a.q.shape[1] = 1; }, "'q'"},
      {"q h_q", [](DecodeProblem&, DenseDecodeArgs& a) { a.q.shape[2] = 8; }, "'q'"},
      {"q d 512", [](DecodeProblem&, DenseDecodeArgs& a) { a.q.shape[3] = 512; }, "'q'"},
      {"q last dim strided", [](DecodeProblem&, DenseDecodeArgs& a) { a.q.stride[3] = 2; }, "'q'"},
      {"q stride not 16 B", [](DecodeProblem&, DenseDecodeArgs& a) { a.q.stride[2] = 580; }, "'q'"},
      {"q misaligned", [](DecodeProblem&, DenseDecodeArgs& a) { a.q.data = static_cast<char*>(a.q.data) + 8; }, "'q'"},
      {"q stride > int32", [](DecodeProblem&, DenseDecodeArgs& a) { a.q.stride[0] = int64_t{1} << 32; }, "'q'"},
      // k_cache
      {"k missing", [](DecodeProblem&, DenseDecodeArgs& a) { a.k_cache = TensorRef{}; }, "'k_cache'"},
      {"k dtype", [](DecodeProblem&, DenseDecodeArgs& a) { a.k_cache.dtype = DType::kFloat16; }, "'k_cache'"},
      {"k 3-D", [](DecodeProblem&, DenseDecodeArgs& a) { a.k_cache.ndim = 3; }, "'k_cache'"},
      {"k page 32 vs problem 64", [](DecodeProblem&, DenseDecodeArgs& a) { a.k_cache.shape[1] = 32; },
       "argument 'k_cache'"},
      {"k h_kv", [](DecodeProblem&, DenseDecodeArgs& a) { a.k_cache.shape[2] = 2; }, "'k_cache'"},
      {"k d", [](DecodeProblem&, DenseDecodeArgs& a) { a.k_cache.shape[3] = 512; }, "'k_cache'"},
      {"k no blocks", [](DecodeProblem&, DenseDecodeArgs& a) { a.k_cache.shape[0] = 0; }, "'k_cache'"},
      {"k last dim strided", [](DecodeProblem&, DenseDecodeArgs& a) { a.k_cache.stride[3] = 2; }, "'k_cache'"},
      {"k stride not 16 B", [](DecodeProblem&, DenseDecodeArgs& a) { a.k_cache.stride[1] = 580; }, "'k_cache'"},
      {"k misaligned", [](DecodeProblem&, DenseDecodeArgs& a) { a.k_cache.data = static_cast<char*>(a.k_cache.data) + 2; },
       "'k_cache'"},
      {"k on cpu", [](DecodeProblem&, DenseDecodeArgs& a) { a.k_cache.device = DeviceType::kCPU; }, "'k_cache'"},
      // block_table, cache_seqlens
      {"bt dtype", [](DecodeProblem&, DenseDecodeArgs& a) { a.block_table.dtype = DType::kInt64; }, "'block_table'"},
      {"bt 1-D", [](DecodeProblem&, DenseDecodeArgs& a) { a.block_table.ndim = 1; }, "'block_table'"},
      {"bt batch", [](DecodeProblem&, DenseDecodeArgs& a) { a.block_table.shape[0] = 1; }, "'block_table'"},
      {"bt strided", [](DecodeProblem&, DenseDecodeArgs& a) { a.block_table.stride[1] = 2; }, "'block_table'"},
      {"bt empty", [](DecodeProblem&, DenseDecodeArgs& a) { a.block_table.shape[1] = 0; }, "'block_table'"},
      {"seqlens missing", [](DecodeProblem&, DenseDecodeArgs& a) { a.cache_seqlens = TensorRef{}; }, "'cache_seqlens'"},
      {"seqlens int64", [](DecodeProblem&, DenseDecodeArgs& a) { a.cache_seqlens.dtype = DType::kInt64; },
       "'cache_seqlens'"},
      {"seqlens shape", [](DecodeProblem&, DenseDecodeArgs& a) { a.cache_seqlens.shape[0] = 3; }, "'cache_seqlens'"},
      {"seqlens strided", [](DecodeProblem&, DenseDecodeArgs& a) { a.cache_seqlens.stride[0] = 2; }, "'cache_seqlens'"},
      {"seqlens on cpu", [](DecodeProblem&, DenseDecodeArgs& a) { a.cache_seqlens.device = DeviceType::kCPU; },
       "'cache_seqlens'"},
      // out, lse
      {"out missing", [](DecodeProblem&, DenseDecodeArgs& a) { a.out = TensorRef{}; }, "'out'"},
      {"out dtype", [](DecodeProblem&, DenseDecodeArgs& a) { a.out.dtype = DType::kFloat32; }, "'out'"},
      {"out d_v", [](DecodeProblem&, DenseDecodeArgs& a) { a.out.shape[3] = 576; }, "'out'"},
      {"out h_q", [](DecodeProblem&, DenseDecodeArgs& a) { a.out.shape[2] = 32; }, "'out'"},
      {"out last dim strided", [](DecodeProblem&, DenseDecodeArgs& a) { a.out.stride[3] = 2; }, "'out'"},
      {"out stride not 16 B", [](DecodeProblem&, DenseDecodeArgs& a) { a.out.stride[2] = 516; }, "'out'"},
      {"lse dtype", [](DecodeProblem&, DenseDecodeArgs& a) { a.lse.dtype = DType::kBFloat16; }, "'lse'"},
      {"lse (b, s_q, h_q)", [](DecodeProblem&, DenseDecodeArgs& a) { a.lse.shape[1] = 2; a.lse.shape[2] = 16; }, "'lse'"},
      {"lse 2-D", [](DecodeProblem&, DenseDecodeArgs& a) { a.lse.ndim = 2; }, "'lse'"},
      // schedule, split buffers
      {"metadata missing", [](DecodeProblem&, DenseDecodeArgs& a) { a.schedule.metadata = TensorRef{}; },
       "schedule.metadata"},
      {"metadata parts", [](DecodeProblem&, DenseDecodeArgs& a) { a.schedule.metadata.shape[0] = 66; },
       "schedule.metadata"},
      {"metadata width", [](DecodeProblem&, DenseDecodeArgs& a) { a.schedule.metadata.shape[1] = 4; a.schedule.metadata.stride[0] = 4; },
       "schedule.metadata"},
      {"metadata dtype", [](DecodeProblem&, DenseDecodeArgs& a) { a.schedule.metadata.dtype = DType::kInt64; },
       "schedule.metadata"},
      {"num_splits shape", [](DecodeProblem&, DenseDecodeArgs& a) { a.schedule.num_splits.shape[0] = 2; },
       "schedule.num_splits"},
      {"num_splits dtype", [](DecodeProblem&, DenseDecodeArgs& a) { a.schedule.num_splits.dtype = DType::kFloat32; },
       "schedule.num_splits"},
      {"num_sms differs from plan", [](DecodeProblem& p, DenseDecodeArgs&) { p.num_sms = 66; }, "schedule.metadata"},
      {"partial_o missing", [](DecodeProblem&, DenseDecodeArgs& a) { a.split.partial_o = TensorRef{}; },
       "split.partial_o"},
      {"partial_o rows", [](DecodeProblem&, DenseDecodeArgs& a) { a.split.partial_o.shape[0] -= 1; },
       "split.partial_o"},
      {"partial_o width", [](DecodeProblem&, DenseDecodeArgs& a) { a.split.partial_o.shape[1] = 576; a.split.partial_o.stride[0] = 576; },
       "split.partial_o"},
      {"partial_o dtype", [](DecodeProblem&, DenseDecodeArgs& a) { a.split.partial_o.dtype = DType::kBFloat16; },
       "split.partial_o"},
      {"partial_o strided", [](DecodeProblem&, DenseDecodeArgs& a) { a.split.partial_o.stride[0] = 1024; },
       "split.partial_o"},
      {"partial_lse rows", [](DecodeProblem&, DenseDecodeArgs& a) { a.split.partial_lse.shape[0] = 10; },
       "split.partial_lse"},
      {"partial_lse dtype", [](DecodeProblem&, DenseDecodeArgs& a) { a.split.partial_lse.dtype = DType::kInt32; },
       "split.partial_lse"},
      // devices, scale
      {"out on another GPU", [](DecodeProblem&, DenseDecodeArgs& a) { a.out.device_id = 1; }, "'out'"},
      {"partial_lse on another GPU", [](DecodeProblem&, DenseDecodeArgs& a) { a.split.partial_lse.device_id = 1; },
       "split.partial_lse"},
      {"scale nan", [](DecodeProblem&, DenseDecodeArgs& a) { a.softmax_scale = std::nanf(""); }, "softmax_scale"},
      {"scale inf", [](DecodeProblem&, DenseDecodeArgs& a) { a.softmax_scale = INFINITY; }, "softmax_scale"},
      // merge counters (optional; dense_args gives valid ones)
      {"counters int64", [](DecodeProblem&, DenseDecodeArgs& a) { a.schedule.merge_counters.dtype = DType::kInt64; },
       "schedule.merge_counters"},
      {"counters 2-D", [](DecodeProblem&, DenseDecodeArgs& a) { a.schedule.merge_counters.ndim = 2; },
       "schedule.merge_counters"},
      {"counters too few", [](DecodeProblem&, DenseDecodeArgs& a) { a.schedule.merge_counters.shape[0] = 1; },
       "schedule.merge_counters"},
      {"counters strided", [](DecodeProblem&, DenseDecodeArgs& a) { a.schedule.merge_counters.stride[0] = 2; },
       "schedule.merge_counters"},
      {"counters on cpu", [](DecodeProblem&, DenseDecodeArgs& a) { a.schedule.merge_counters.device = DeviceType::kCPU; },
       "schedule.merge_counters"},
      {"counters on another GPU", [](DecodeProblem&, DenseDecodeArgs& a) { a.schedule.merge_counters.device_id = 1; },
       "schedule.merge_counters"},
  };
  for (const Mutation& m : mutations) {
    DecodeProblem p = dense_problem();
    DenseDecodeArgs a = dense_args(p);
    m.apply(p, a);
    int parts = 0;
    const Status st = validate_dense(p, a, &parts);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << m.what << ": " << st.message();
    EXPECT_NE(st.message().find(m.expect_in_message), std::string::npos)
        << m.what << ": message does not name " << m.expect_in_message << ": " << st.message();
    // The public entry points fail the same way (and launch nothing): the compatibility form, and the family
    // struct for every field it has.
    const Status pub = dense_decode(p, a, nullptr);
    EXPECT_EQ(pub.code(), StatusCode::kInvalidArgument) << m.what;
    EXPECT_EQ(pub.message(), st.message()) << m.what;
    if (!p.sparse) EXPECT_EQ(dense_decode(p.as_dense(), a, nullptr).message(), st.message()) << m.what;
  }
}

TEST(DecodeApi, PlanValidation) {
  const DecodeProblem p = dense_problem();
  const DenseDecodeArgs a = dense_args(p);
  int parts = 0;
  Status st = validate_plan(p, a.cache_seqlens, {}, {}, a.schedule, &parts);
  ASSERT_TRUE(st.is_ok()) << st.message();
  EXPECT_EQ(parts, 132);

  const auto expect_error = [&](const DecodeProblem& pp, const TensorRef& seqlens, const TensorRef& topk_len,
                                const TensorRef& extra_len, const DecodeSchedule& sched, const char* needle) {
    int n = 0;
    const Status s = validate_plan(pp, seqlens, topk_len, extra_len, sched, &n);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << needle << ": " << s.message();
    EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
    const Status pub = plan_decode(pp, seqlens, topk_len, extra_len, sched, nullptr);
    EXPECT_EQ(pub.code(), StatusCode::kInvalidArgument) << needle;
  };
  expect_error(p, TensorRef{}, {}, {}, a.schedule, "cache_seqlens");
  TensorRef bad = a.cache_seqlens;
  bad.dtype = DType::kInt64;
  expect_error(p, bad, {}, {}, a.schedule, "cache_seqlens");
  bad = a.cache_seqlens;
  bad.device = DeviceType::kCPU;
  expect_error(p, bad, {}, {}, a.schedule, "cache_seqlens");
  DecodeSchedule sched = a.schedule;
  sched.metadata.shape[0] = 10;
  expect_error(p, a.cache_seqlens, {}, {}, sched, "schedule.metadata");
  sched = a.schedule;
  sched.num_splits.shape[0] = 5;
  expect_error(p, a.cache_seqlens, {}, {}, sched, "schedule.num_splits");
  sched = a.schedule;
  sched.num_splits.device_id = 3;
  expect_error(p, a.cache_seqlens, {}, {}, sched, "schedule.num_splits");
  sched = a.schedule;
  sched.merge_counters.shape[0] = 1;
  expect_error(p, a.cache_seqlens, {}, {}, sched, "schedule.merge_counters");
  sched = a.schedule;
  sched.merge_counters.dtype = DType::kFloat32;
  expect_error(p, a.cache_seqlens, {}, {}, sched, "schedule.merge_counters");
  DecodeProblem bad_problem = p;
  bad_problem.batch = -1;
  expect_error(bad_problem, a.cache_seqlens, {}, {}, a.schedule, "problem.batch");

  // Sparse: lengths optional, extra lengths only with an extra cache.
  DecodeProblem sp = p;
  sp.sparse = true;
  sp.topk = 2048;
  sp.h_q = 128;
  sp.cache_format = KVCacheFormat::kFp8V32;
  DecodeSchedule ssched = a.schedule;
  ssched.metadata.shape[0] = 33;  // 132 / 2 / 2
  ssched.merge_counters.shape[0] = 2 * 2 * 2;  // (request, query position, 64-head tile)
  st = validate_plan(sp, {}, {}, {}, ssched, &parts);
  ASSERT_TRUE(st.is_ok()) << st.message();
  EXPECT_EQ(parts, 33);
  st = validate_plan(sp, {}, a.cache_seqlens, {}, ssched, &parts);
  EXPECT_TRUE(st.is_ok()) << st.message();
  expect_error(sp, {}, a.cache_seqlens, a.cache_seqlens, ssched, "extra_topk_length");
  TensorRef bad_len = a.cache_seqlens;
  bad_len.shape[0] = 7;
  expect_error(sp, {}, bad_len, {}, ssched, "topk_length");
  sp.extra_topk = -1;
  expect_error(sp, {}, {}, {}, ssched, "problem.extra_topk");
}


// ---------------------------------------------------------------------------------------------------------
// Sparse decode
// ---------------------------------------------------------------------------------------------------------
DecodeProblem sparse_problem() {
  DecodeProblem p;
  p.batch = 2;
  p.s_q = 2;
  p.h_q = 128;
  p.h_kv = 1;
  p.d_qk = 576;
  p.sparse = true;
  p.topk = 100;  // any value, not only multiples of 64
  p.page_block_size = 61;
  p.cache_format = KVCacheFormat::kFp8V32;
  p.num_sms = kSms;
  return p;
}

// A valid V3.2 call: b = 2, s_q = 2, h_q = 128 -> num_sm_parts = 132 / 2 / 2 = 33. Padded pages.
SparseDecodeArgs sparse_args(const DecodeProblem& p) {
  const int64_t parts = 33;
  const int64_t rows = (p.batch + parts) * p.s_q * p.h_q;
  const int64_t bpt = p.d_qk == 576 ? 656 : 584;
  SparseDecodeArgs a;
  a.q = make_tensor(fake_ptr(1), DType::kBFloat16, {p.batch, p.s_q, p.h_q, p.d_qk});
  a.k_cache = make_tensor(fake_ptr(2), DType::kUInt8, {10, p.page_block_size, 1, bpt},
                          {(p.page_block_size + 1) * bpt, bpt, bpt, 1});
  a.indices = make_tensor(fake_ptr(3), DType::kInt32, {p.batch, p.s_q, p.topk});
  a.schedule.metadata = make_tensor(fake_ptr(5), DType::kInt32, {parts, kDecodeScheduleRecordInts});
  a.schedule.num_splits = make_tensor(fake_ptr(6), DType::kInt32, {p.batch + 1});
  // One counter per (request, query position, 64-head tile).
  a.schedule.merge_counters = make_tensor(fake_ptr(16), DType::kInt32, {p.batch * p.s_q * ((p.h_q + 63) / 64)});
  a.split.partial_o = make_tensor(fake_ptr(7), DType::kFloat32, {rows, 512});
  a.split.partial_lse = make_tensor(fake_ptr(8), DType::kFloat32, {rows});
  a.out = make_tensor(fake_ptr(9), DType::kBFloat16, {p.batch, p.s_q, p.h_q, 512});
  a.lse = make_tensor(fake_ptr(10), DType::kFloat32, {p.batch, p.h_q, p.s_q});
  return a;
}

// Adds the optional inputs (sink, lengths, extra cache) to a valid call.
void add_sparse_options(DecodeProblem& p, SparseDecodeArgs& a) {
  p.extra_topk = 70;
  p.extra_page_block_size = 53;
  const int64_t bpt = p.d_qk == 576 ? 656 : 584;
  a.topk_length = make_tensor(fake_ptr(11), DType::kInt32, {p.batch});
  a.attn_sink = make_tensor(fake_ptr(12), DType::kFloat32, {p.h_q});
  a.extra_k_cache = make_tensor(fake_ptr(13), DType::kFloat8E4M3, {4, 53, 1, bpt});
  a.extra_indices = make_tensor(fake_ptr(14), DType::kInt32, {p.batch, p.s_q, 70});
  a.extra_topk_length = make_tensor(fake_ptr(15), DType::kInt32, {p.batch});
}

TEST(DecodeApi, ValidSparseCallsPassValidation) {
  int parts = 0;
  DecodeProblem p = sparse_problem();
  Status st = validate_sparse(p, sparse_args(p), &parts);
  ASSERT_TRUE(st.is_ok()) << st.message();
  EXPECT_EQ(parts, 33);
  // Every optional input, with the V3.2 layout too (FlashMLA's Hopper kernel allows them only with MODEL1).
  SparseDecodeArgs a = sparse_args(p);
  add_sparse_options(p, a);
  st = validate_sparse(p, a, &parts);
  EXPECT_TRUE(st.is_ok()) << st.message();
  // MODEL1, int8 bytes, small head counts (64-head tiles padded), a page of 1 token, s_q = 3.
  for (int64_t h_q : {8, 16, 32, 64, 100}) {
    DecodeProblem m = sparse_problem();
    m.cache_format = KVCacheFormat::kFp8Model1;
    m.d_qk = 512;
    m.h_q = h_q;
    m.s_q = 3;
    m.page_block_size = 1;
    SparseDecodeArgs ma = sparse_args(m);
    ma.k_cache.dtype = DType::kInt8;
    const int64_t want_parts = std::max<int64_t>(132 / 3 / ((h_q + 63) / 64), 1);
    ma.schedule.metadata.shape[0] = want_parts;
    ma.split.partial_o.shape[0] = ma.split.partial_lse.shape[0] = (m.batch + want_parts) * m.s_q * m.h_q;
    st = validate_sparse(m, ma, &parts);
    EXPECT_TRUE(st.is_ok()) << "h_q " << h_q << ": " << st.message();
    EXPECT_EQ(parts, want_parts);
  }
}

struct SparseMutation {
  const char* what;
  std::function<void(DecodeProblem&, SparseDecodeArgs&)> apply;
  const char* expect_in_message;
};

TEST(DecodeApi, SparseDecodeValidationErrors) {
  using P = DecodeProblem;
  using A = SparseDecodeArgs;
  const std::vector<SparseMutation> mutations = {
      {"not sparse", [](P& p, A&) { p.sparse = false; }, "problem.sparse"},
      {"topk 0", [](P& p, A&) { p.topk = 0; }, "problem.topk"},
      {"bf16 format", [](P& p, A&) { p.cache_format = KVCacheFormat::kBFloat16; }, "problem.cache_format"},
      {"d_qk vs format", [](P& p, A&) { p.d_qk = 512; }, "problem.d_qk"},
      {"h_kv 2", [](P& p, A&) { p.h_kv = 2; }, "problem.h_kv"},
      {"causal", [](P& p, A&) { p.causal = true; }, "problem.causal"},
      {"page size 0", [](P& p, A&) { p.page_block_size = 0; }, "problem.page_block_size"},
      {"s_q > 65535", [](P& p, A&) { p.s_q = 70000; p.h_q = 1; }, "problem.s_q"},
      {"extra_topk without cache", [](P& p, A&) { p.extra_topk = 64; }, "problem.extra_topk"},
      {"extra cache without extra_topk", [](P& p, A& a) { add_sparse_options(p, a); p.extra_topk = 0; },
       "extra_k_cache"},
      {"extra_indices without cache", [](P& p, A& a) { add_sparse_options(p, a); a.extra_k_cache = TensorRef{}; p.extra_topk = 0; },
       "extra_indices"},
      {"extra page size 0", [](P& p, A& a) { add_sparse_options(p, a); p.extra_page_block_size = 0; },
       "problem.extra_page_block_size"},
      // q
      {"q fp16", [](P&, A& a) { a.q.dtype = DType::kFloat16; }, "'q'"},
      {"q d_qk", [](P&, A& a) { a.q.shape[3] = 512; }, "'q'"},
      {"q stride not 16 B", [](P&, A& a) { a.q.stride[2] = 580; }, "'q'"},
      // k_cache
      {"k missing", [](P&, A& a) { a.k_cache = TensorRef{}; }, "'k_cache'"},
      {"k bf16", [](P&, A& a) { a.k_cache.dtype = DType::kBFloat16; }, "'k_cache'"},
      {"k page size", [](P&, A& a) { a.k_cache.shape[1] = 64; }, "'k_cache'"},
      {"k two heads", [](P&, A& a) { a.k_cache.shape[2] = 2; }, "'k_cache'"},
      {"k bytes per token", [](P&, A& a) { a.k_cache.shape[3] = 584; }, "'k_cache'"},
      {"k page not contiguous", [](P&, A& a) { a.k_cache.stride[1] = 672; }, "'k_cache'"},
      {"k page stride not 16 B", [](P&, A& a) { a.k_cache.stride[0] = 62 * 656 + 8; }, "'k_cache'"},
      {"k pages overlap", [](P&, A& a) { a.k_cache.stride[0] = 60 * 656; }, "'k_cache'"},
      {"k misaligned", [](P&, A& a) { a.k_cache.data = static_cast<char*>(a.k_cache.data) + 8; }, "'k_cache'"},
      // indices, lengths, sink
      {"indices missing", [](P&, A& a) { a.indices = TensorRef{}; }, "'indices'"},
      {"indices int64", [](P&, A& a) { a.indices.dtype = DType::kInt64; }, "'indices'"},
      {"indices topk", [](P&, A& a) { a.indices.shape[2] = 64; }, "'indices'"},
      {"indices s_q", [](P&, A& a) { a.indices.shape[1] = 1; }, "'indices'"},
      {"indices strided", [](P&, A& a) { a.indices.stride[2] = 2; }, "'indices'"},
      {"topk_length shape", [](P&, A& a) { a.topk_length = make_tensor(fake_ptr(11), DType::kInt32, {3}); },
       "'topk_length'"},
      {"sink shape", [](P&, A& a) { a.attn_sink = make_tensor(fake_ptr(12), DType::kFloat32, {64}); }, "'attn_sink'"},
      {"sink dtype", [](P&, A& a) { a.attn_sink = make_tensor(fake_ptr(12), DType::kBFloat16, {128}); },
       "'attn_sink'"},
      // extra cache
      {"extra cache page size", [](P& p, A& a) { add_sparse_options(p, a); a.extra_k_cache.shape[1] = 64; },
       "'extra_k_cache'"},
      {"extra cache layout", [](P& p, A& a) { add_sparse_options(p, a); a.extra_k_cache.shape[3] = 584; },
       "'extra_k_cache'"},
      {"extra indices missing", [](P& p, A& a) { add_sparse_options(p, a); a.extra_indices = TensorRef{}; },
       "'extra_indices'"},
      {"extra indices topk", [](P& p, A& a) { add_sparse_options(p, a); a.extra_indices.shape[2] = 64; },
       "'extra_indices'"},
      {"extra_topk_length dtype", [](P& p, A& a) { add_sparse_options(p, a); a.extra_topk_length.dtype = DType::kInt64; },
       "'extra_topk_length'"},
      // outputs, schedule, devices
      {"out fp16", [](P&, A& a) { a.out.dtype = DType::kFloat16; }, "'out'"},
      {"lse shape", [](P&, A& a) { a.lse.shape[2] = 3; }, "'lse'"},
      {"metadata parts", [](P&, A& a) { a.schedule.metadata.shape[0] = 66; }, "schedule.metadata"},
      {"partial_o rows", [](P&, A& a) { a.split.partial_o.shape[0] -= 1; }, "split.partial_o"},
      {"indices on another GPU", [](P&, A& a) { a.indices.device_id = 1; }, "'indices'"},
      {"sink on another GPU", [](P& p, A& a) { add_sparse_options(p, a); a.attn_sink.device_id = 1; }, "'attn_sink'"},
      {"scale nan", [](P&, A& a) { a.softmax_scale = std::nanf(""); }, "softmax_scale"},
  };
  for (const SparseMutation& m : mutations) {
    DecodeProblem p = sparse_problem();
    SparseDecodeArgs a = sparse_args(p);
    m.apply(p, a);
    int parts = 0;
    const Status st = validate_sparse(p, a, &parts);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << m.what << ": " << st.message();
    EXPECT_NE(st.message().find(m.expect_in_message), std::string::npos)
        << m.what << ": message does not name " << m.expect_in_message << ": " << st.message();
    const Status pub = sparse_decode(p, a, nullptr);
    EXPECT_EQ(pub.code(), StatusCode::kInvalidArgument) << m.what;
    EXPECT_EQ(pub.message(), st.message()) << m.what;
    // The family struct has no sparse / h_kv / causal fields: those mutations are compatibility-form errors only.
    if (p.sparse && p.h_kv == 1 && !p.causal)
      EXPECT_EQ(sparse_decode(p.as_sparse(), a, nullptr).message(), st.message()) << m.what;
  }
}

// ---------------------------------------------------------------------------------------------------------
// Family structs and the compatibility form
// ---------------------------------------------------------------------------------------------------------
TEST(DecodeApi, CompatibilityFormConvertsFieldForField) {
  DecodeProblem p = sparse_problem();
  p.extra_topk = 70;
  p.extra_page_block_size = 53;
  const SparseDecodeProblem s = p.as_sparse();
  EXPECT_EQ(s.batch, p.batch);
  EXPECT_EQ(s.s_q, p.s_q);
  EXPECT_EQ(s.h_q, p.h_q);
  EXPECT_EQ(s.d_qk, p.d_qk);
  EXPECT_EQ(s.d_v, p.d_v);
  EXPECT_EQ(s.page_block_size, p.page_block_size);
  EXPECT_EQ(s.cache_format, p.cache_format);
  EXPECT_EQ(s.topk, p.topk);
  EXPECT_EQ(s.extra_topk, 70);
  EXPECT_EQ(s.extra_page_block_size, 53);
  EXPECT_EQ(s.num_sms, p.num_sms);
  const DecodeProblem q = dense_problem();
  const DenseDecodeProblem d = q.as_dense();
  EXPECT_EQ(d.batch, q.batch);
  EXPECT_EQ(d.s_q, q.s_q);
  EXPECT_EQ(d.h_q, q.h_q);
  EXPECT_EQ(d.h_kv, q.h_kv);
  EXPECT_EQ(d.d_qk, q.d_qk);
  EXPECT_EQ(d.d_v, q.d_v);
  EXPECT_EQ(d.page_block_size, q.page_block_size);
  EXPECT_EQ(d.cache_format, q.cache_format);
  EXPECT_EQ(d.causal, q.causal);
  EXPECT_EQ(d.num_sms, q.num_sms);
}

TEST(DecodeApi, FamilyStructsSizeTheWorkspaceAsTheCompatibilityForm) {
  for (const DecodeProblem& p : {dense_problem(), sparse_problem()}) {
    DecodeWorkspaceSizes compat, family;
    ASSERT_TRUE(get_decode_workspace_sizes(p, &compat).is_ok());
    const Status st = p.sparse ? get_decode_workspace_sizes(p.as_sparse(), &family)
                               : get_decode_workspace_sizes(p.as_dense(), &family);
    ASSERT_TRUE(st.is_ok()) << st.message();
    EXPECT_EQ(family.num_sm_parts, compat.num_sm_parts);
    EXPECT_EQ(family.metadata_ints, compat.metadata_ints);
    EXPECT_EQ(family.num_splits_ints, compat.num_splits_ints);
    EXPECT_EQ(family.partial_rows, compat.partial_rows);
    EXPECT_EQ(family.partial_o_bytes, compat.partial_o_bytes);
    EXPECT_EQ(family.partial_lse_bytes, compat.partial_lse_bytes);
    EXPECT_EQ(family.merge_counter_ints, compat.merge_counter_ints);
  }
  DecodeWorkspaceSizes s;
  EXPECT_NE(get_decode_workspace_sizes(DenseDecodeProblem{.batch = 0, .h_q = 16}, &s).message().find("problem.batch"),
            std::string::npos);
  EXPECT_NE(get_decode_workspace_sizes(SparseDecodeProblem{.batch = 1, .h_q = 16, .num_sms = kSms}, &s)
                .message()
                .find("problem.topk"),
            std::string::npos);
  EXPECT_NE(get_decode_workspace_sizes(SparseDecodeProblem{.batch = 1, .h_q = 16, .topk = 8}, nullptr)
                .message()
                .find("'sizes'"),
            std::string::npos);
}

// The compatibility form keeps the rules it had: sizing and planning a sparse problem accept any h_kv that divides
// h_q and either causal flag (sparse_decode rejects them), and its geometry errors name problem.h_kv / h_q.
TEST(DecodeApi, CompatibilityFormKeepsItsRules) {
  DecodeProblem p = sparse_problem();
  p.h_kv = 2;
  p.causal = true;
  DecodeWorkspaceSizes s;
  EXPECT_TRUE(get_decode_workspace_sizes(p, &s).is_ok());
  SparseDecodeArgs a = sparse_args(sparse_problem());
  int parts = 0;
  const Status plan = validate_plan(p, {}, {}, {}, a.schedule, &parts);
  EXPECT_TRUE(plan.is_ok()) << plan.message();
  EXPECT_NE(sparse_decode(p, a, nullptr).message().find("problem.h_kv"), std::string::npos);
  p.h_kv = 1;
  EXPECT_NE(sparse_decode(p, a, nullptr).message().find("problem.causal"), std::string::npos);
  p = sparse_problem();
  p.h_kv = 0;
  EXPECT_NE(get_decode_workspace_sizes(p, &s).message().find("problem.h_kv"), std::string::npos);
  p.h_kv = 3;
  EXPECT_NE(get_decode_workspace_sizes(p, &s).message().find("problem.h_q"), std::string::npos);
  // Planning follows `sparse`: a dense problem ignores the top-k lengths, a sparse one cache_seqlens.
  const DecodeProblem d = dense_problem();
  const DenseDecodeArgs da = dense_args(d);
  TensorRef garbage = da.cache_seqlens;
  garbage.dtype = DType::kFloat32;
  EXPECT_TRUE(validate_plan(d, da.cache_seqlens, garbage, garbage, da.schedule, &parts).is_ok());
  EXPECT_TRUE(validate_plan(sparse_problem(), garbage, {}, {}, a.schedule, &parts).is_ok());
  // The family of a decode call must match.
  EXPECT_NE(dense_decode(sparse_problem(), da, nullptr).message().find("problem.sparse"), std::string::npos);
  EXPECT_NE(sparse_decode(dense_problem(), a, nullptr).message().find("problem.sparse"), std::string::npos);
}

TEST(DecodeApi, PlanWithFamilyStructs) {
  const DecodeProblem d = dense_problem();
  const DenseDecodeArgs da = dense_args(d);
  int parts = 0;
  ASSERT_TRUE(detail::validate_plan_decode(d.as_dense(), da.cache_seqlens, da.schedule, &parts).is_ok());
  EXPECT_EQ(parts, 132);
  EXPECT_NE(plan_decode(d.as_dense(), TensorRef{}, da.schedule, nullptr).message().find("'cache_seqlens'"),
            std::string::npos);
  DecodeSchedule sched = da.schedule;
  sched.metadata.shape[0] = 66;
  EXPECT_NE(plan_decode(d.as_dense(), da.cache_seqlens, sched, nullptr).message().find("schedule.metadata"),
            std::string::npos);

  const SparseDecodeProblem sp = sparse_problem().as_sparse();
  const SparseDecodeArgs sa = sparse_args(sparse_problem());
  ASSERT_TRUE(detail::validate_plan_decode(sp, {}, {}, sa.schedule, &parts).is_ok());
  EXPECT_EQ(parts, 33);
  TensorRef lengths = make_tensor(fake_ptr(11), DType::kInt32, {sp.batch});
  EXPECT_TRUE(detail::validate_plan_decode(sp, lengths, {}, sa.schedule, &parts).is_ok());
  EXPECT_NE(plan_decode(sp, lengths, lengths, sa.schedule, nullptr).message().find("extra_topk_length"),
            std::string::npos);
  lengths.shape[0] = 7;
  EXPECT_NE(plan_decode(sp, lengths, {}, sa.schedule, nullptr).message().find("'topk_length'"), std::string::npos);
}

// The test entry point with options validates exactly as the production one.
TEST(DecodeApi, DenseDecodeWithOptionsValidatesTheSame) {
  DecodeProblem p = dense_problem();
  DenseDecodeArgs a = dense_args(p);
  a.q.shape[2] = 8;
  const test_hooks::DenseDecodeOptions options{.merge_publish_always = true};
  const Status want = dense_decode(p.as_dense(), a, nullptr);
  EXPECT_EQ(want.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(test_hooks::dense_decode(p.as_dense(), a, options, nullptr).message(), want.message());
  EXPECT_EQ(test_hooks::dense_decode(p, a, options, nullptr).message(), want.message());
  p.sparse = true;
  p.topk = 64;
  EXPECT_NE(test_hooks::dense_decode(p, a, options, nullptr).message().find("problem.sparse"), std::string::npos);
}

// Page sizes other than 64 (docs/dense-decode.md, "Page sizes"): every power of two in [1, 256] validates with a
// cache of that page size; the block table's width is then counted in pages of that size.
TEST(DecodeApi, DenseDecodeAcceptsEveryPowerOfTwoPageSize) {
  for (const int64_t page : {1, 2, 4, 8, 16, 32, 64, 128, 256}) {
    DecodeProblem p = dense_problem();
    p.page_block_size = page;
    DenseDecodeArgs a = dense_args(p);
    a.k_cache.shape[1] = page;
    a.k_cache.stride[0] = page * 576;
    int parts = 0;
    const Status s = validate_dense(p, a, &parts);
    EXPECT_TRUE(s.is_ok()) << "page " << page << ": " << s.message();
    EXPECT_TRUE(kernels::dense_decode_page_size_supported(page));
  }
  for (const int64_t page : {0, 3, 6, 12, 24, 48, 96, 512, 1024})
    EXPECT_FALSE(kernels::dense_decode_page_size_supported(page)) << page;
}

TEST(DecodeApi, DensePageGeometry) {
  const auto g16 = kernels::dense_page_geometry(16);
  EXPECT_EQ(g16.pages_per_block, 4);
  EXPECT_EQ(g16.blocks_per_page_log2, 0);
  const auto g32 = kernels::dense_page_geometry(32);
  EXPECT_EQ(g32.pages_per_block, 2);
  const auto g64 = kernels::dense_page_geometry(64);
  EXPECT_EQ(g64.pages_per_block, 1);
  EXPECT_EQ(g64.blocks_per_page_log2, 0);
  const auto g128 = kernels::dense_page_geometry(128);
  EXPECT_EQ(g128.pages_per_block, 1);
  EXPECT_EQ(g128.blocks_per_page_log2, 1);
  const auto g256 = kernels::dense_page_geometry(256);
  EXPECT_EQ(g256.page_size, 256);
  EXPECT_EQ(g256.blocks_per_page_log2, 2);
}

// The cache's page size must be the problem's, and the block table's width (pages) times the page size must fit int32.
TEST(DecodeApi, DensePageSizeMessagesNameTheArgument) {
  DecodeProblem p = dense_problem();
  p.page_block_size = 16;
  DenseDecodeArgs a = dense_args(p);  // k_cache pages of 64 tokens: not the problem's 16
  int parts = 0;
  Status s = validate_dense(p, a, &parts);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("argument 'k_cache'"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("page_block_size"), std::string::npos) << s.message();

  for (const int64_t bad : {3, 512}) {
    p = dense_problem();
    p.page_block_size = bad;
    s = validate_dense(p, dense_args(p), &parts);
    ASSERT_FALSE(s.is_ok());
    EXPECT_NE(s.message().find("problem.page_block_size"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("1, 2, 4, 8, 16, 32, 64, 128 and 256"), std::string::npos) << s.message();
  }

  EXPECT_EQ(dense_max_blocks_per_seq(64), kMaxBlocksPerSeq);
  EXPECT_EQ(dense_max_blocks_per_seq(16), kMaxBlocksPerSeq);
  EXPECT_EQ(dense_max_blocks_per_seq(128), (int64_t{1} << 24) - 1);
  EXPECT_EQ(dense_max_blocks_per_seq(256), (int64_t{1} << 23) - 1);
  DenseDecodeProblem d{.batch = 2, .s_q = 1, .h_q = 16, .h_kv = 1, .page_block_size = 256, .causal = true,
                       .num_sms = 132, .max_blocks_per_seq = int64_t{1} << 23};
  DecodeWorkspaceSizes ws;
  s = get_decode_workspace_sizes(d, &ws);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("max_blocks_per_seq"), std::string::npos) << s.message();
  d.max_blocks_per_seq = (int64_t{1} << 23) - 1;
  EXPECT_TRUE(get_decode_workspace_sizes(d, &ws).is_ok());
}

}  // namespace
}  // namespace openmla
