// Per-request query lengths in the decode API (DenseDecodeProblem::varlen_q, SparseDecodeProblem::varlen_q): the
// workspace, the plan's and the calls' validation on consistent arguments (fake device pointers, num_sms > 0: no CUDA
// call), and the sparse call's one-row view. The error of each bad argument is tested through the binding
// (tests/python/test_decode_varlen_q_api.py); the kernels on the GPU (tests/python/test_decode_varlen_q.py).
#include <gtest/gtest.h>

#include <cstdint>

#include "api/decode_internal.h"
#include "api/decode_varlen_q.h"
#include "openmla/decode.h"

namespace openmla {
namespace {

void* fake_ptr(int i) { return reinterpret_cast<void*>(uintptr_t{0x10000000} + (uintptr_t(i) << 36)); }

constexpr int kSms = 132;

DenseDecodeProblem dense_problem(int64_t h_q) {
  return DenseDecodeProblem{.batch = 4, .s_q = 3, .h_q = h_q, .h_kv = 1, .causal = true, .num_sms = kSms,
                            .varlen_q = true};
}

// The dense call and its schedule, sized by get_decode_workspace_sizes.
struct DenseCall {
  DecodeWorkspaceSizes ws;
  DenseDecodeArgs args;
  TensorRef seqused;
};

DenseCall dense_call(const DenseDecodeProblem& p) {
  DenseCall c;
  EXPECT_TRUE(get_decode_workspace_sizes(p, &c.ws).is_ok());
  DenseDecodeArgs& a = c.args;
  a.q = make_tensor(fake_ptr(1), DType::kBFloat16, {p.batch, p.s_q, p.h_q, 576});
  a.k_cache = make_tensor(fake_ptr(2), DType::kBFloat16, {10, 64, 1, 576});
  a.block_table = make_tensor(fake_ptr(3), DType::kInt32, {p.batch, 4});
  a.cache_seqlens = make_tensor(fake_ptr(4), DType::kInt32, {p.batch});
  a.schedule.metadata = make_tensor(fake_ptr(5), DType::kInt32, {c.ws.num_sm_parts, kDecodeScheduleRecordInts});
  a.schedule.num_splits = make_tensor(fake_ptr(6), DType::kInt32, {c.ws.num_splits_ints});
  a.schedule.merge_counters = make_tensor(fake_ptr(7), DType::kInt32, {c.ws.merge_counter_ints});
  a.schedule.varlen_lengths = make_tensor(fake_ptr(8), DType::kInt32, {c.ws.varlen_ints});
  a.split.partial_o = make_tensor(fake_ptr(9), DType::kFloat32, {c.ws.partial_rows, 512});
  a.split.partial_lse = make_tensor(fake_ptr(10), DType::kFloat32, {c.ws.partial_rows});
  a.out = make_tensor(fake_ptr(11), DType::kBFloat16, {p.batch, p.s_q, p.h_q, 512});
  a.lse = make_tensor(fake_ptr(12), DType::kFloat32, {p.batch, p.h_q, p.s_q}, {p.s_q * p.h_q, 1, p.h_q});
  a.seqused_q = make_tensor(fake_ptr(13), DType::kInt32, {p.batch});
  return c;
}

TEST(DecodeVarlenQ, DenseWorkspaceHasTheOnePositionPartitionCount) {
  // h_q 128, s_q 3: six m-blocks per request; the varlen problem plans as many partitions as s_q = 1 would.
  DecodeWorkspaceSizes uniform, varlen, one;
  DenseDecodeProblem p = dense_problem(128);
  ASSERT_TRUE(get_decode_workspace_sizes(p, &varlen).is_ok());
  p.varlen_q = false;
  ASSERT_TRUE(get_decode_workspace_sizes(p, &uniform).is_ok());
  p.s_q = 1;
  ASSERT_TRUE(get_decode_workspace_sizes(p, &one).is_ok());
  EXPECT_EQ(uniform.num_sm_parts, 22);
  EXPECT_EQ(varlen.num_sm_parts, one.num_sm_parts);
  EXPECT_EQ(varlen.num_sm_parts, 66);
  EXPECT_EQ(varlen.partial_rows, (4 + 66) * 3 * 128);
  EXPECT_EQ(varlen.varlen_ints, 4);
  EXPECT_EQ(uniform.varlen_ints, 0);
}

TEST(DecodeVarlenQ, DensePlanAndCallValidateWithTheWorkspaceSizes) {
  for (int64_t h_q : {16, 64, 128}) {
    const DenseDecodeProblem p = dense_problem(h_q);
    DenseCall c = dense_call(p);
    int parts = 0;
    DecodeSchedule sched = c.args.schedule;
    sched.varlen_lengths = TensorRef{};
    // What the seqused_q overload validates (its own problem's partition count) and the call.
    EXPECT_TRUE(detail::validate_plan_decode(p, c.args.cache_seqlens, sched, &parts).is_ok()) << h_q;
    EXPECT_EQ(parts, c.ws.num_sm_parts);
    const Status st = detail::validate_dense_decode(p, c.args, &parts);
    EXPECT_TRUE(st.is_ok()) << h_q << ": " << st.message();
    EXPECT_EQ(parts, c.ws.num_sm_parts);
  }
}

TEST(DecodeVarlenQ, DenseUniformEntriesRejectTheVarlenForms) {
  DenseDecodeProblem p = dense_problem(16);
  DenseCall c = dense_call(p);
  // The plan overload without seqused_q refuses a varlen problem; a call without seqused_q too.
  const Status plan = plan_decode(p, c.args.cache_seqlens, c.args.schedule, nullptr);
  EXPECT_FALSE(plan.is_ok());
  EXPECT_NE(plan.message().find("seqused_q"), std::string::npos) << plan.message();
  DenseDecodeArgs no_lengths = c.args;
  no_lengths.seqused_q = TensorRef{};
  int parts = 0;
  Status st = detail::validate_dense_decode(p, no_lengths, &parts);
  EXPECT_NE(st.message().find("'seqused_q' is required"), std::string::npos) << st.message();
  // And a uniform problem refuses seqused_q.
  p.varlen_q = false;
  st = detail::validate_dense_decode(p, c.args, &parts);
  EXPECT_NE(st.message().find("'seqused_q' was given"), std::string::npos) << st.message();
}

TEST(DecodeVarlenQ, NotWithBatchInvariance) {
  DenseDecodeProblem d = dense_problem(16);
  d.batch_invariant = true;
  d.max_blocks_per_seq = 4;
  DecodeWorkspaceSizes ws;
  EXPECT_EQ(get_decode_workspace_sizes(d, &ws).code(), StatusCode::kUnsupported);
  SparseDecodeProblem s{.batch = 2, .s_q = 2, .h_q = 64, .topk = 64, .num_sms = kSms, .batch_invariant = true,
                        .varlen_q = true};
  EXPECT_EQ(get_decode_workspace_sizes(s, &ws).code(), StatusCode::kUnsupported);
}

TEST(DecodeVarlenQ, DenseNotWithPagesBelow16) {
  DenseDecodeProblem d = dense_problem(16);
  d.page_block_size = 8;
  DecodeWorkspaceSizes ws;
  const Status st = get_decode_workspace_sizes(d, &ws);
  EXPECT_EQ(st.code(), StatusCode::kUnsupported) << st.message();
  EXPECT_NE(st.message().find("'problem.page_block_size'"), std::string::npos) << st.message();
  d.page_block_size = 16;
  EXPECT_TRUE(get_decode_workspace_sizes(d, &ws).is_ok());
}

TEST(DecodeVarlenQ, SparseCallIsTheOneRowView) {
  const SparseDecodeProblem p{.batch = 3, .s_q = 4, .h_q = 64, .topk = 128, .num_sms = kSms, .varlen_q = true};
  DecodeWorkspaceSizes ws;
  ASSERT_TRUE(get_decode_workspace_sizes(p, &ws).is_ok());
  EXPECT_EQ(ws.num_splits_ints, 13);
  EXPECT_EQ(ws.varlen_ints, 12);
  SparseDecodeArgs a;
  a.q = make_tensor(fake_ptr(1), DType::kBFloat16, {3, 4, 64, 576});
  a.k_cache = make_tensor(fake_ptr(2), DType::kUInt8, {10, 64, 1, 656});
  a.indices = make_tensor(fake_ptr(3), DType::kInt32, {3, 4, 128});
  a.schedule.metadata = make_tensor(fake_ptr(4), DType::kInt32, {ws.num_sm_parts, kDecodeScheduleRecordInts});
  a.schedule.num_splits = make_tensor(fake_ptr(5), DType::kInt32, {ws.num_splits_ints});
  a.schedule.varlen_lengths = make_tensor(fake_ptr(6), DType::kInt32, {ws.varlen_ints});
  a.split.partial_o = make_tensor(fake_ptr(7), DType::kFloat32, {ws.partial_rows, 512});
  a.split.partial_lse = make_tensor(fake_ptr(8), DType::kFloat32, {ws.partial_rows});
  a.out = make_tensor(fake_ptr(9), DType::kBFloat16, {3, 4, 64, 512});
  a.lse = make_tensor(fake_ptr(10), DType::kFloat32, {3, 64, 4}, {4 * 64, 1, 64});
  a.seqused_q = make_tensor(fake_ptr(11), DType::kInt32, {3});
  SparseDecodeArgs flat;
  ASSERT_TRUE(detail::flatten_sparse_varlen_args(p, a, &flat).is_ok());
  EXPECT_EQ(flat.q.shape[0], 12);
  EXPECT_EQ(flat.q.shape[1], 1);
  EXPECT_EQ(flat.q.stride[0], 64 * 576);
  EXPECT_EQ(flat.lse.shape[0], 12);
  EXPECT_EQ(flat.lse.stride[0], 64);  // the s_q stride of the (b, s_q, h_q) storage
  EXPECT_EQ(flat.lse.shape[2], 1);
  EXPECT_EQ(flat.topk_length.data, a.schedule.varlen_lengths.data);
  EXPECT_EQ(flat.topk_length.shape[0], 12);
  EXPECT_FALSE(flat.extra_topk_length.defined());
  EXPECT_FALSE(flat.seqused_q.defined());
  int parts = 0;
  const Status st = detail::validate_sparse_decode(p, a, &parts);
  EXPECT_TRUE(st.is_ok()) << st.message();
  EXPECT_EQ(parts, ws.num_sm_parts);
}

}  // namespace
}  // namespace openmla
