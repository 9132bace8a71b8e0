// Fault injection on the host (no GPU): the inputs engines really produce and the mistakes they really make, each
// checked against what the library must do with it: take it (the stride of a size-1 dimension never matters), name
// it (bad strides, misaligned pointers, outputs sharing memory with other arguments, a view of too many dimensions),
// or make it harmless (a schedule planned for another call). The GPU side of the same suite is
// tests/python/test_faults.py (marker `gpu`) and the sanitizer cases in tests/gpu/.
//
// Fake device pointers, 64 GiB apart and 256-byte aligned; problem.num_sms > 0, so the validators and the call
// builders (api/decode_internal.h) make no CUDA call and nothing is launched on the fake pointers.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "api/decode_internal.h"
#include "api/sparse_prefill_internal.h"
#include "api/validate.h"
#include "heuristics/decode_launch.h"
#include "heuristics/decode_schedule.h"
#include "kernels/decode_scheduler/partition_walk.h"
#include "openmla/capability.h"
#include "openmla/decode.h"
#include "openmla/kv_cache.h"
#include "openmla/prefill.h"

namespace openmla {
namespace {

void* fake_ptr(int i) { return reinterpret_cast<void*>(uintptr_t{0x10000000} + (uintptr_t(i) << 36)); }
void* offset(void* p, int64_t bytes) { return static_cast<char*>(p) + bytes; }

constexpr int kSms = 132;
constexpr int64_t kHuge = std::numeric_limits<int64_t>::max();

void expect_invalid(const Status& st, const std::vector<std::string>& fragments, const std::string& what = "") {
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << what << ": " << st.message();
  for (const auto& f : fragments)
    EXPECT_NE(st.message().find(f), std::string::npos) << what << ": expected \"" << f << "\" in: " << st.message();
}

// ---- Builders of valid calls ---------------------------------------------------------------------------------

DenseDecodeProblem dense_problem(int64_t b = 2, int64_t s_q = 2, int64_t h_q = 16, int64_t h_kv = 1, int sms = kSms) {
  return DenseDecodeProblem{.batch = b, .s_q = s_q, .h_q = h_q, .h_kv = h_kv, .causal = true, .num_sms = sms};
}

DenseDecodeArgs dense_args(const DenseDecodeProblem& p, int64_t num_blocks = 10, int64_t max_blocks = 4) {
  DecodeWorkspaceSizes ws;
  EXPECT_TRUE(get_decode_workspace_sizes(p, &ws).is_ok());
  DenseDecodeArgs a;
  a.q = make_tensor(fake_ptr(1), DType::kBFloat16, {p.batch, p.s_q, p.h_q, 576});
  a.k_cache = make_tensor(fake_ptr(2), DType::kBFloat16, {num_blocks, 64, p.h_kv, 576});
  a.block_table = make_tensor(fake_ptr(3), DType::kInt32, {p.batch, max_blocks});
  a.cache_seqlens = make_tensor(fake_ptr(4), DType::kInt32, {p.batch});
  a.schedule.metadata = make_tensor(fake_ptr(5), DType::kInt32, {ws.num_sm_parts, kDecodeScheduleRecordInts});
  a.schedule.num_splits = make_tensor(fake_ptr(6), DType::kInt32, {p.batch + 1});
  a.schedule.merge_counters = make_tensor(fake_ptr(11), DType::kInt32, {ws.merge_counter_ints});
  a.split.partial_o = make_tensor(fake_ptr(7), DType::kFloat32, {ws.partial_rows, 512});
  a.split.partial_lse = make_tensor(fake_ptr(8), DType::kFloat32, {ws.partial_rows});
  a.out = make_tensor(fake_ptr(9), DType::kBFloat16, {p.batch, p.s_q, p.h_q, 512});
  a.lse = make_tensor(fake_ptr(10), DType::kFloat32, {p.batch, p.h_q, p.s_q});
  return a;
}

SparseDecodeProblem sparse_problem(int64_t b = 2, int64_t s_q = 2, int64_t h_q = 128, int64_t topk = 2048,
                                   int64_t page = 64, KVCacheFormat format = KVCacheFormat::kFp8V32) {
  return SparseDecodeProblem{.batch = b,
                             .s_q = s_q,
                             .h_q = h_q,
                             .d_qk = kv_cache_fp8_head_dim(format),
                             .page_block_size = page,
                             .cache_format = format,
                             .topk = topk,
                             .num_sms = kSms};
}

SparseDecodeArgs sparse_args(const SparseDecodeProblem& p, int64_t num_blocks = 10) {
  DecodeWorkspaceSizes ws;
  EXPECT_TRUE(get_decode_workspace_sizes(p, &ws).is_ok());
  const int64_t bpt = kv_cache_bytes_per_token(p.cache_format, p.d_qk);
  SparseDecodeArgs a;
  a.q = make_tensor(fake_ptr(1), DType::kBFloat16, {p.batch, p.s_q, p.h_q, p.d_qk});
  a.k_cache = make_tensor(fake_ptr(2), DType::kUInt8, {num_blocks, p.page_block_size, 1, bpt},
                          {(p.page_block_size * bpt + 15) / 16 * 16, bpt, bpt, 1});
  a.indices = make_tensor(fake_ptr(3), DType::kInt32, {p.batch, p.s_q, p.topk});
  a.schedule.metadata = make_tensor(fake_ptr(5), DType::kInt32, {ws.num_sm_parts, kDecodeScheduleRecordInts});
  a.schedule.num_splits = make_tensor(fake_ptr(6), DType::kInt32, {p.batch + 1});
  a.split.partial_o = make_tensor(fake_ptr(7), DType::kFloat32, {ws.partial_rows, 512});
  a.split.partial_lse = make_tensor(fake_ptr(8), DType::kFloat32, {ws.partial_rows});
  a.out = make_tensor(fake_ptr(9), DType::kBFloat16, {p.batch, p.s_q, p.h_q, 512});
  a.lse = make_tensor(fake_ptr(10), DType::kFloat32, {p.batch, p.h_q, p.s_q});
  return a;
}

SparsePrefillArgs prefill_args(int64_t s_q = 100, int64_t h_q = 128, int64_t s_kv = 4096, int64_t topk = 2048) {
  SparsePrefillArgs a;
  a.q = make_tensor(fake_ptr(1), DType::kBFloat16, {s_q, h_q, 576});
  a.kv = make_tensor(fake_ptr(2), DType::kBFloat16, {s_kv, 1, 576});
  a.indices = make_tensor(fake_ptr(3), DType::kInt32, {s_q, 1, topk});
  a.topk_length = make_tensor(fake_ptr(4), DType::kInt32, {s_q});
  a.attn_sink = make_tensor(fake_ptr(5), DType::kFloat32, {h_q});
  a.out = make_tensor(fake_ptr(6), DType::kBFloat16, {s_q, h_q, 512});
  a.max_logits = make_tensor(fake_ptr(7), DType::kFloat32, {s_q, h_q});
  a.lse = make_tensor(fake_ptr(8), DType::kFloat32, {s_q, h_q});
  a.num_sms = kSms;
  return a;
}

Status validate(const DenseDecodeProblem& p, const DenseDecodeArgs& a) {
  int parts = 0;
  return detail::validate_dense_decode(p, a, &parts);
}
Status validate(const SparseDecodeProblem& p, const SparseDecodeArgs& a) {
  int parts = 0;
  return detail::validate_sparse_decode(p, a, &parts);
}

// Every size-1 dimension of `t` gets stride `v`.
void set_size1_strides(TensorRef& t, int64_t v) {
  for (int i = 0; i < t.ndim; ++i)
    if (t.shape[i] == 1) t.stride[i] = v;
}

// Strides a framework may export for a size-1 dimension: 0, 1 (torch <= 2.8 through DLPack), arbitrary, negative,
// huge.
const int64_t kSize1Strides[] = {0, 1, 7, -3, int64_t{1} << 40, kHuge};

// ---- make_tensor -----------------------------------------------------------------------------------------------

TEST(Faults, MakeTensorWithTooManyDimensionsWritesNothingPastItsArrays) {
  // The device fields sit right after the stride array: an over-long shape used to write the 7th stride over them.
  const TensorRef t = make_tensor(fake_ptr(1), DType::kInt32, {1, 2, 3, 4, 5, 6, 7}, DeviceType::kCUDA, 3);
  EXPECT_EQ(t.ndim, TensorRef::kInvalidNdim);
  EXPECT_EQ(t.device, DeviceType::kCUDA);
  EXPECT_EQ(t.device_id, 3);
  EXPECT_EQ(t.data, fake_ptr(1));
  for (int i = 0; i < TensorRef::kMaxDims; ++i) EXPECT_EQ(t.shape[i], 0) << i;
  EXPECT_TRUE(t.defined());
  EXPECT_FALSE(t.valid_ndim());
  EXPECT_EQ(t.numel(), 0);
  EXPECT_FALSE(t.is_contiguous());
  const TensorRef s = make_tensor(fake_ptr(1), DType::kInt32, {2, 3}, {3}, DeviceType::kCUDA, 2);  // stride list short
  EXPECT_EQ(s.ndim, TensorRef::kInvalidNdim);
  EXPECT_EQ(s.device_id, 2);
  const TensorRef l = make_tensor(fake_ptr(1), DType::kInt32, {2}, {1, 1, 1, 1, 1, 1, 1, 1}, DeviceType::kCUDA, 5);
  EXPECT_EQ(l.ndim, TensorRef::kInvalidNdim);
  EXPECT_EQ(l.device_id, 5);
  // Every entry names the argument.
  const DenseDecodeProblem p = dense_problem();
  DenseDecodeArgs a = dense_args(p);
  a.q = make_tensor(fake_ptr(1), DType::kBFloat16, {2, 2, 16, 576, 1, 1, 1});
  expect_invalid(validate(p, a), {"argument 'q'", "ndim = -1", "make_tensor"});
  a = dense_args(p);
  a.lse.ndim = 9;  // a hand-built view: the message must not read past the arrays either
  expect_invalid(validate(p, a), {"argument 'lse'", "ndim = 9"});
  SparsePrefillArgs pa = prefill_args();
  pa.attn_sink = make_tensor(fake_ptr(5), DType::kFloat32, {1, 1, 1, 1, 1, 1, 128});
  expect_invalid(detail::validate_sparse_prefill(pa, nullptr), {"argument 'attn_sink'", "ndim = -1"});
}

// ---- The stride of a size-1 dimension never matters ---------------------------------------------------------------

// k_cache.unsqueeze(-2): torch <= 2.8 exports stride 1 for the size-1 head dimension; the TMA descriptor used to be
// built from it (a 2-byte stride: cuTensorMapEncodeTiled failed). One page: its page stride was fed in the same way.
TEST(Faults, DenseCacheTmaStridesNeverComeFromASize1Dimension) {
  const DenseDecodeProblem p = dense_problem();
  for (const int64_t v : kSize1Strides) {
    for (const int64_t num_blocks : {int64_t{10}, int64_t{1}}) {
      DenseDecodeArgs a = dense_args(p, num_blocks);
      a.k_cache.stride[2] = v;
      if (num_blocks == 1) a.k_cache.stride[0] = v;
      int parts = 0;
      const Status st = detail::validate_dense_decode(p, a, &parts);
      ASSERT_TRUE(st.is_ok()) << "stride " << v << ", " << num_blocks << " pages: " << st.message();
      const detail::DenseDecodeCall call = detail::prepare_dense_decode(p, a, parts);
      // The launcher builds the descriptor's byte strides from these: positive, whole 16-byte units.
      EXPECT_EQ(call.params.k_stride_head, 576) << v;
      EXPECT_EQ(call.params.k_stride_row, 576) << v;
      EXPECT_EQ(call.params.k_stride_block, 64 * 576) << v;
    }
  }
}

TEST(Faults, DenseSize1StridesOfEveryArgumentGiveTheSameCall) {
  // b = 1, s_q = 1, h_kv = 1, one page, one block-table column, one partition: every tensor has size-1 dimensions.
  const DenseDecodeProblem p = dense_problem(/*b=*/1, /*s_q=*/1, /*h_q=*/16, /*h_kv=*/1, /*sms=*/1);
  const DenseDecodeArgs ref_args = dense_args(p, /*num_blocks=*/1, /*max_blocks=*/1);
  int parts = 0;
  ASSERT_TRUE(detail::validate_dense_decode(p, ref_args, &parts).is_ok());
  ASSERT_EQ(parts, 1);
  const detail::DenseDecodeCall ref = detail::prepare_dense_decode(p, ref_args, parts);
  for (const int64_t v : kSize1Strides) {
    DenseDecodeArgs a = ref_args;
    for (TensorRef* t : {&a.q, &a.k_cache, &a.block_table, &a.cache_seqlens, &a.out, &a.lse, &a.schedule.metadata,
                         &a.schedule.num_splits, &a.schedule.merge_counters, &a.split.partial_o, &a.split.partial_lse})
      set_size1_strides(*t, v);
    const Status st = detail::validate_dense_decode(p, a, &parts);
    ASSERT_TRUE(st.is_ok()) << "size-1 strides " << v << ": " << st.message();
    const detail::DenseDecodeCall c = detail::prepare_dense_decode(p, a, parts);
    EXPECT_EQ(c.params.q_stride_b, ref.params.q_stride_b) << v;
    EXPECT_EQ(c.params.q_stride_s, ref.params.q_stride_s) << v;
    EXPECT_EQ(c.params.q_stride_h, ref.params.q_stride_h) << v;
    EXPECT_EQ(c.params.q_tma, ref.params.q_tma) << v;
    EXPECT_EQ(c.params.k_stride_block, ref.params.k_stride_block) << v;
    EXPECT_EQ(c.params.k_stride_head, ref.params.k_stride_head) << v;
    EXPECT_EQ(c.params.block_table_stride, ref.params.block_table_stride) << v;
    EXPECT_EQ(c.params.output.out_stride_b, ref.params.output.out_stride_b) << v;
    EXPECT_EQ(c.params.output.out_stride_s, ref.params.output.out_stride_s) << v;
    EXPECT_EQ(c.params.output.lse_stride_b, ref.params.output.lse_stride_b) << v;
    EXPECT_EQ(c.params.output.lse_stride_s, ref.params.output.lse_stride_s) << v;
    EXPECT_EQ(c.combine.output.out_stride_b, ref.combine.output.out_stride_b) << v;
    EXPECT_EQ(c.combine.output.lse_stride_s, ref.combine.output.lse_stride_s) << v;
  }
}

TEST(Faults, SparseSize1StridesOfEveryArgumentGiveTheSameCall) {
  // One page of an odd MODEL1 page size: its page stride (never used) need not be a multiple of 16 bytes.
  SparseDecodeProblem p =
      sparse_problem(/*b=*/1, /*s_q=*/1, /*h_q=*/64, /*topk=*/1, /*page=*/61, KVCacheFormat::kFp8Model1);
  p.extra_topk = 1;
  p.extra_page_block_size = 1;
  SparseDecodeArgs ref_args = sparse_args(p, /*num_blocks=*/1);
  ref_args.topk_length = make_tensor(fake_ptr(12), DType::kInt32, {1});
  ref_args.attn_sink = make_tensor(fake_ptr(13), DType::kFloat32, {64});
  ref_args.extra_k_cache = make_tensor(fake_ptr(14), DType::kUInt8, {1, 1, 1, 584});
  ref_args.extra_indices = make_tensor(fake_ptr(15), DType::kInt32, {1, 1, 1});
  ref_args.extra_topk_length = make_tensor(fake_ptr(16), DType::kInt32, {1});
  int parts = 0;
  ASSERT_TRUE(detail::validate_sparse_decode(p, ref_args, &parts).is_ok());
  const detail::SparseDecodeCall ref = detail::prepare_sparse_decode(p, ref_args, parts);
  for (const int64_t v : kSize1Strides) {
    SparseDecodeArgs a = ref_args;
    for (TensorRef* t : {&a.q, &a.k_cache, &a.indices, &a.topk_length, &a.attn_sink, &a.extra_k_cache, &a.extra_indices,
                         &a.extra_topk_length, &a.out, &a.lse})
      set_size1_strides(*t, v);
    const Status st = detail::validate_sparse_decode(p, a, &parts);
    ASSERT_TRUE(st.is_ok()) << "size-1 strides " << v << ": " << st.message();
    const detail::SparseDecodeCall c = detail::prepare_sparse_decode(p, a, parts);
    EXPECT_EQ(c.params.q_stride_b, ref.params.q_stride_b) << v;
    EXPECT_EQ(c.params.q_stride_s, ref.params.q_stride_s) << v;
    EXPECT_EQ(c.params.main.page_stride, ref.params.main.page_stride) << v;
    EXPECT_EQ(c.params.main.idx_stride_b, ref.params.main.idx_stride_b) << v;
    EXPECT_EQ(c.params.extra.page_stride, ref.params.extra.page_stride) << v;
    EXPECT_EQ(c.params.output.out_stride_b, ref.params.output.out_stride_b) << v;
    EXPECT_EQ(c.params.output.lse_stride_b, ref.params.output.lse_stride_b) << v;
  }
}

TEST(Faults, PlanAndPrefillSize1Strides) {
  const DenseDecodeProblem p = dense_problem(/*b=*/1, 1, 16, 1, /*sms=*/1);
  DenseDecodeArgs a = dense_args(p, 1, 1);
  for (const int64_t v : kSize1Strides) {
    TensorRef seqlens = a.cache_seqlens;
    DecodeSchedule sched = a.schedule;
    set_size1_strides(seqlens, v);
    for (TensorRef* t : {&sched.metadata, &sched.num_splits, &sched.merge_counters}) set_size1_strides(*t, v);
    int parts = 0;
    const Status st = detail::validate_plan_decode(p, seqlens, sched, &parts);
    EXPECT_TRUE(st.is_ok()) << v << ": " << st.message();
  }
  for (const int64_t v : kSize1Strides) {
    SparsePrefillArgs pa = prefill_args(/*s_q=*/1, /*h_q=*/16, /*s_kv=*/1, /*topk=*/1);
    for (TensorRef* t : {&pa.q, &pa.kv, &pa.indices, &pa.topk_length, &pa.attn_sink, &pa.out, &pa.max_logits, &pa.lse})
      set_size1_strides(*t, v);
    kernels::SparsePrefillParams params;
    const Status st = detail::validate_sparse_prefill(pa, &params);
    ASSERT_TRUE(st.is_ok()) << v << ": " << st.message();
    EXPECT_EQ(params.kv_stride_s, 576) << v;
    EXPECT_EQ(params.indices_stride_s, 1) << v;
  }
}

// The codec's entries validate inside the call: with fake pointers they get past validation to the launch context,
// which fails without a GPU (skipped where one exists: the fake pointers would be launched on; FaultsGpu runs the
// same shapes on real memory).
TEST(Faults, CodecSize1StridesPassValidation) {
  int n = 0;
  if (cudaGetDeviceCount(&n) == cudaSuccess && n > 0) GTEST_SKIP() << "a GPU is present: fake pointers would fault";
  (void)cudaGetLastError();
  for (const int64_t v : kSize1Strides) {
    // One page of one token: every dimension but the last has size 1.
    const TensorRef dst = make_tensor(fake_ptr(2), DType::kUInt8, {1, 1, 1, 584}, {v, v, v, 1});
    const TensorRef src512 = make_tensor(fake_ptr(1), DType::kBFloat16, {1, 1, 1, 512}, {v, v, v, 1});
    Status st = quantize_kv_cache(src512, dst, KVCacheFormat::kFp8Model1, nullptr);
    EXPECT_NE(st.code(), StatusCode::kInvalidArgument) << v << ": " << st.message();
    st = dequantize_kv_cache(dst, src512, KVCacheFormat::kFp8Model1, nullptr);
    EXPECT_NE(st.code(), StatusCode::kInvalidArgument) << v << ": " << st.message();
    const TensorRef cache = make_tensor(fake_ptr(3), DType::kUInt8, {1, 61, 1, 656}, {v, 656, v, 1});
    const TensorRef rows = make_tensor(fake_ptr(4), DType::kBFloat16, {1, 1, 576}, {v, v, 1});
    const TensorRef slots = make_tensor(fake_ptr(5), DType::kInt64, {1}, {v});
    st = append_kv_cache(rows, slots, cache, KVCacheFormat::kFp8V32, nullptr);
    EXPECT_NE(st.code(), StatusCode::kInvalidArgument) << v << ": " << st.message();
    (void)cudaGetLastError();
  }
}

// ---- Strides: negative or huge, named -----------------------------------------------------------------------------

TEST(Faults, NegativeAndHugeStridesAreNamed) {
  const DenseDecodeProblem p = dense_problem();
  using Mut = std::function<void(DenseDecodeArgs&)>;
  const std::vector<std::pair<Mut, std::vector<std::string>>> cases = {
      {[](DenseDecodeArgs& a) { a.q.stride[0] = -a.q.stride[0]; }, {"argument 'q'", "negative strides"}},
      {[](DenseDecodeArgs& a) { a.block_table.stride[0] = -4; }, {"argument 'block_table'", "negative strides"}},
      {[](DenseDecodeArgs& a) { a.lse.stride[1] = -1; }, {"argument 'lse'", "negative strides"}},
      {[](DenseDecodeArgs& a) { a.lse.stride[0] = int64_t{1} << 50; }, {"argument 'lse'", "2^48"}},
      {[](DenseDecodeArgs& a) { a.lse.stride[0] = kHuge; }, {"argument 'lse'", "2^48"}},
      {[](DenseDecodeArgs& a) { a.k_cache.stride[0] = int64_t{1} << 40; }, {"argument 'k_cache'", "2^40"}},
      {[](DenseDecodeArgs& a) { a.k_cache.stride[0] = int64_t{1} << 46; }, {"argument 'k_cache'", "2^48"}},
      {[](DenseDecodeArgs& a) { a.k_cache.stride[1] = 0; }, {"argument 'k_cache'", "TMA", "positive strides"}},
      {[](DenseDecodeArgs& a) { a.cache_seqlens.stride[0] = kHuge; }, {"argument 'cache_seqlens'"}},
      {[](DenseDecodeArgs& a) { a.out.shape[0] = -2; }, {"argument 'out'", "negative size"}},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    DenseDecodeArgs a = dense_args(p);
    cases[i].first(a);
    expect_invalid(validate(p, a), cases[i].second, "case " + std::to_string(i));
  }
  SparsePrefillArgs pa = prefill_args();
  pa.kv.stride[0] = kHuge;
  expect_invalid(detail::validate_sparse_prefill(pa, nullptr), {"argument 'kv'", "2^48"});
  const SparseDecodeProblem sp = sparse_problem();
  SparseDecodeArgs sa = sparse_args(sp);
  sa.indices.stride[1] = -sa.indices.stride[1];
  expect_invalid(validate(sp, sa), {"argument 'indices'", "negative strides"});
}

// ---- Alignment of every pointer a kernel dereferences -----------------------------------------------------------

TEST(Faults, MisalignedPointersAreNamed) {
  const DenseDecodeProblem p = dense_problem();
  const std::vector<std::pair<std::function<void(DenseDecodeArgs&)>, std::string>> dense_cases = {
      {[](DenseDecodeArgs& a) { a.lse.data = offset(a.lse.data, 2); }, "'lse' data pointer must be 4-byte aligned"},
      {[](DenseDecodeArgs& a) { a.cache_seqlens.data = offset(a.cache_seqlens.data, 2); }, "'cache_seqlens' data"},
      {[](DenseDecodeArgs& a) { a.block_table.data = offset(a.block_table.data, 1); }, "'block_table' data"},
      {[](DenseDecodeArgs& a) { a.schedule.num_splits.data = offset(a.schedule.num_splits.data, 2); },
       "'schedule.num_splits' data"},
      {[](DenseDecodeArgs& a) { a.schedule.merge_counters.data = offset(a.schedule.merge_counters.data, 2); },
       "'schedule.merge_counters' data"},
      {[](DenseDecodeArgs& a) { a.split.partial_lse.data = offset(a.split.partial_lse.data, 2); },
       "'split.partial_lse' data"},
      {[](DenseDecodeArgs& a) { a.q.data = offset(a.q.data, 8); }, "'q' data pointer must be 16-byte aligned"},
  };
  for (const auto& [mutate, needle] : dense_cases) {
    DenseDecodeArgs a = dense_args(p);
    mutate(a);
    expect_invalid(validate(p, a), {needle}, needle);
  }
  const SparseDecodeProblem sp = [] {
    SparseDecodeProblem s = sparse_problem();
    s.extra_topk = 64;
    s.extra_page_block_size = 64;
    return s;
  }();
  auto full = [&] {
    SparseDecodeArgs a = sparse_args(sp);
    a.topk_length = make_tensor(fake_ptr(12), DType::kInt32, {sp.batch});
    a.attn_sink = make_tensor(fake_ptr(13), DType::kFloat32, {sp.h_q});
    a.extra_k_cache = make_tensor(fake_ptr(14), DType::kUInt8, {4, 64, 1, 656});
    a.extra_indices = make_tensor(fake_ptr(15), DType::kInt32, {sp.batch, sp.s_q, 64});
    a.extra_topk_length = make_tensor(fake_ptr(16), DType::kInt32, {sp.batch});
    return a;
  };
  ASSERT_TRUE(validate(sp, full()).is_ok()) << validate(sp, full()).message();
  const std::vector<std::pair<std::function<void(SparseDecodeArgs&)>, std::string>> sparse_cases = {
      {[](SparseDecodeArgs& a) { a.indices.data = offset(a.indices.data, 2); }, "'indices' data"},
      {[](SparseDecodeArgs& a) { a.topk_length.data = offset(a.topk_length.data, 1); }, "'topk_length' data"},
      {[](SparseDecodeArgs& a) { a.attn_sink.data = offset(a.attn_sink.data, 2); }, "'attn_sink' data"},
      {[](SparseDecodeArgs& a) { a.extra_indices.data = offset(a.extra_indices.data, 2); }, "'extra_indices' data"},
      {[](SparseDecodeArgs& a) { a.extra_topk_length.data = offset(a.extra_topk_length.data, 2); },
       "'extra_topk_length' data"},
      {[](SparseDecodeArgs& a) { a.lse.data = offset(a.lse.data, 2); }, "'lse' data"},
  };
  for (const auto& [mutate, needle] : sparse_cases) {
    SparseDecodeArgs a = full();
    mutate(a);
    expect_invalid(validate(sp, a), {needle}, needle);
  }
  SparsePrefillArgs pa = prefill_args();
  pa.max_logits.data = offset(pa.max_logits.data, 2);
  expect_invalid(detail::validate_sparse_prefill(pa, nullptr), {"'max_logits' data"});
}

// ---- Outputs sharing memory with other arguments ------------------------------------------------------------------

TEST(Faults, OutputsAliasingInputsOrSplitBuffersAreRejected) {
  const DenseDecodeProblem p = dense_problem();
  const std::vector<std::pair<std::function<void(DenseDecodeArgs&)>, std::vector<std::string>>> cases = {
      {[](DenseDecodeArgs& a) { a.out.data = a.q.data; }, {"'out' overlaps argument 'q'"}},
      {[](DenseDecodeArgs& a) { a.out.data = offset(a.split.partial_o.data, 4096); },
       {"'out' overlaps argument 'split.partial_o'"}},
      {[](DenseDecodeArgs& a) { a.lse.data = offset(a.out.data, 64); }, {"'out' overlaps argument 'lse'"}},
      {[](DenseDecodeArgs& a) { a.split.partial_o.data = a.k_cache.data; },
       {"'split.partial_o' overlaps argument 'k_cache'"}},
      {[](DenseDecodeArgs& a) { a.schedule.merge_counters.data = a.cache_seqlens.data; },
       {"'schedule.merge_counters' overlaps argument 'cache_seqlens'"}},
      {[](DenseDecodeArgs& a) { a.split.partial_lse.data = a.schedule.num_splits.data; },
       {"'split.partial_lse' overlaps argument 'schedule.num_splits'"}},
      {[](DenseDecodeArgs& a) { a.lse.stride[1] = 0; }, {"'lse'", "must not overlap themselves"}},
      {[](DenseDecodeArgs& a) { a.out.stride[2] = 256; }, {"'out'", "must not overlap themselves"}},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    DenseDecodeArgs a = dense_args(p);
    cases[i].first(a);
    expect_invalid(validate(p, a), cases[i].second, "case " + std::to_string(i));
  }
  const SparseDecodeProblem sp = sparse_problem();
  SparseDecodeArgs sa = sparse_args(sp);
  sa.out.data = sa.indices.data;
  expect_invalid(validate(sp, sa), {"'out' overlaps argument 'indices'"});
  // plan_decode writes the schedule.
  DenseDecodeArgs a = dense_args(p);
  DecodeSchedule sched = a.schedule;
  sched.num_splits.data = a.cache_seqlens.data;
  int parts = 0;
  expect_invalid(detail::validate_plan_decode(p, a.cache_seqlens, sched, &parts),
                 {"'schedule.num_splits' overlaps argument 'cache_seqlens'"});
}

// ---- The block table's capacity -------------------------------------------------------------------------------

TEST(Faults, BlockTableCapacityIsChecked) {
  DenseDecodeProblem p = dense_problem();
  DenseDecodeArgs a = dense_args(p, 10, kMaxBlocksPerSeq + 1);  // * 64 would overflow the kernel's int32 clamp
  expect_invalid(validate(p, a), {"argument 'block_table'", "33554431"});
  a = dense_args(p, 10, kMaxBlocksPerSeq);
  EXPECT_TRUE(validate(p, a).is_ok()) << validate(p, a).message();
  p.max_blocks_per_seq = 5;  // planned for another block table
  a = dense_args(p, 10, 4);
  expect_invalid(validate(p, a), {"argument 'block_table'", "problem.max_blocks_per_seq is 5"});
  p.max_blocks_per_seq = 4;
  EXPECT_TRUE(validate(p, a).is_ok());
  for (const int64_t bad : {int64_t{-1}, kMaxBlocksPerSeq + 1}) {
    p.max_blocks_per_seq = bad;
    int parts = 0;
    expect_invalid(detail::validate_plan_decode(p, a.cache_seqlens, a.schedule, &parts),
                   {"problem.max_blocks_per_seq"});
  }
}

// ---- A schedule planned for another call (sparse host records) ----------------------------------------------------

// Sparse decode with b <= 16 and no topk_length takes the partition records the host computes, but used to take the
// split-slot prefix sums from the device schedule. Planned with topk_length [topk, 0] (plan_decode's schedule,
// replayed here on the host walk the GPU scheduler runs), then called without: the main kernel wrote a partial row
// past the split buffers (b + num_sm_parts slots): the call (h_q = 128, topk = 16384, 132 SMs) at slot 83 of
// 68, and the smaller one of the sanitizer program (tests/gpu/sanitize_faults.cpp: h_q = 64, topk = 4096, 8 SMs) at
// slot 11 of 10.
void expect_no_write_past_the_split_buffers(int64_t h_q, int64_t topk, int num_sms, int parts_expected,
                                            int32_t slot_before) {
  SparseDecodeProblem p = sparse_problem(/*b=*/2, /*s_q=*/1, h_q, topk);
  p.num_sms = num_sms;
  const int parts = heuristics::decode_num_sm_parts(p, num_sms);
  ASSERT_EQ(parts, parts_expected);
  const int64_t slots = p.batch + parts;  // the split buffers hold (b + num_sm_parts) * s_q * h_q rows
  // The device schedule plan_decode writes for topk_length = [topk, 0].
  const std::vector<int32_t> planned_lengths = {static_cast<int32_t>(topk), 0};
  std::vector<int32_t> blocks;
  for (const int32_t& len : planned_lengths)
    blocks.push_back(heuristics::sparse_request_blocks(p.topk, &len, 0, nullptr));
  const heuristics::DecodeScheduleHost device = heuristics::walk_decode_schedule(
      blocks, {}, parts, heuristics::decode_schedule_payload(blocks, parts));
  ASSERT_TRUE(device.all_assigned);

  // The call, without topk_length: host records. Its "device" num_splits points at the plan's (never dereferenced by
  // the call builder; read here the way the kernels read it).
  SparseDecodeArgs a = sparse_args(p);
  a.schedule.num_splits.data = const_cast<int32_t*>(device.num_splits.data());
  int checked_parts = 0;
  ASSERT_TRUE(detail::validate_sparse_decode(p, a, &checked_parts).is_ok());
  const detail::SparseDecodeCall call = detail::prepare_sparse_decode(p, a, checked_parts);
  ASSERT_GT(call.params.uniform_blocks, 0) << "small batch without lengths: host records";

  // Every split chunk's slot, as the main kernel computes it; and as it used to (device prefix sums).
  int32_t max_slot = -1, max_slot_before = -1;
  for (int part = 0; part < parts; ++part) {
    const kernels::DecodeScheduleRecord rec = kernels::unpack_partition_record(call.params.uniform_records[part]);
    if (rec.begin_req >= p.batch) continue;
    for (int req = rec.begin_req; req <= rec.end_req; ++req) {
      const bool split =
          (req == rec.begin_req && rec.is_first_req_split) || (req == rec.end_req && rec.is_last_req_split);
      if (!split) continue;
      const int32_t ordinal = req == rec.begin_req ? rec.begin_split : 0;
      max_slot = std::max(max_slot, kernels::sparse_split_base(call.params, req) + ordinal);
      max_slot_before = std::max(max_slot_before, device.num_splits[req] + ordinal);
    }
  }
  EXPECT_LT(max_slot, slots) << "a partial row past the split buffers";
  EXPECT_EQ(max_slot_before, slot_before)
      << "the reproduction: the device prefix sums put slot " << max_slot_before << " of " << slots;
  EXPECT_GE(max_slot_before, slots);
  // The combine reads the same prefix sums: every request's chunks inside the buffers, as many as the kernel wrote.
  ASSERT_TRUE(call.combine.use_host_num_splits);
  for (int req = 0; req < p.batch; ++req) {
    const int32_t first = kernels::combine_split_base(call.combine, req);
    const int32_t last = kernels::combine_split_base(call.combine, req + 1);
    EXPECT_LE(0, first);
    EXPECT_LE(first, last);
    EXPECT_LE(last, slots);
  }
  EXPECT_EQ(kernels::combine_split_base(call.combine, static_cast<int>(p.batch)), max_slot + 1);

  // The other way round (planned without lengths, called with): the call reads the device schedule, which is
  // consistent with itself, so its slots stay below num_splits[b] <= b + num_sm_parts.
  a.topk_length = make_tensor(fake_ptr(12), DType::kInt32, {p.batch});
  ASSERT_TRUE(validate(p, a).is_ok());
  const detail::SparseDecodeCall with_lengths = detail::prepare_sparse_decode(p, a, checked_parts);
  EXPECT_EQ(with_lengths.params.uniform_blocks, 0);
  EXPECT_FALSE(with_lengths.combine.use_host_num_splits);
}

TEST(Faults, ScheduleFromAnotherPlanNeverWritesPastTheSplitBuffers) {
  expect_no_write_past_the_split_buffers(/*h_q=*/128, /*topk=*/16384, /*num_sms=*/132, /*parts=*/66,
                                         /*slot_before=*/83);
  expect_no_write_past_the_split_buffers(/*h_q=*/64, /*topk=*/4096, /*num_sms=*/8, /*parts=*/8, /*slot_before=*/11);
}

// ---- On a GPU: the launch context ------------------------------------------------------------------------------

class FaultsGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    const Capability cap = query_capability(Feature::kKVCacheQuantize);
    if (!cap.supported) GTEST_SKIP() << "GPU test skipped: " << cap.reason;
    (void)cudaGetLastError();
    ASSERT_EQ(cudaMalloc(&src_, 2 * 64 * 576 * 2), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&dst_, 2 * 64 * 656), cudaSuccess);
    ASSERT_EQ(cudaMemset(src_, 0, 2 * 64 * 576 * 2), cudaSuccess);
  }
  void TearDown() override {
    if (src_ != nullptr) cudaFree(src_);
    if (dst_ != nullptr) cudaFree(dst_);
  }
  Status quantize(int device_id = 0, cudaStream_t stream = nullptr) {
    return quantize_kv_cache(make_tensor(src_, DType::kBFloat16, {2, 64, 1, 576}, DeviceType::kCUDA, device_id),
                             make_tensor(dst_, DType::kUInt8, {2, 64, 1, 656}, DeviceType::kCUDA, device_id),
                             KVCacheFormat::kFp8V32, stream);
  }
  void* src_ = nullptr;
  void* dst_ = nullptr;
};

// An error someone else's earlier call left pending is not reported as OpenMLA's, and not cleared: the entry says
// so and launches nothing. Before, the launch went ahead and its error check picked that error up as its own
// ("quantize_kv_cache: kernel launch: CUDA error ...") and cleared it.
TEST_F(FaultsGpu, AnErrorLeftPendingByAnotherCallIsAttributedAndKept) {
  ASSERT_TRUE(quantize().is_ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  // A non-sticky error of the caller's own: an invalid copy direction.
  EXPECT_NE(cudaMemcpy(dst_, src_, 16, static_cast<cudaMemcpyKind>(77)), cudaSuccess);
  const cudaError_t pending = cudaPeekAtLastError();
  ASSERT_NE(pending, cudaSuccess);
  const Status st = quantize();
  EXPECT_EQ(st.code(), StatusCode::kCudaError);
  EXPECT_NE(st.message().find("left by an earlier operation (not OpenMLA's)"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find(cudaGetErrorName(pending)), std::string::npos) << st.message();
  EXPECT_EQ(cudaPeekAtLastError(), pending) << "the caller's error must be left in place";
  EXPECT_EQ(cudaGetLastError(), pending);
  const Status again = quantize();
  EXPECT_TRUE(again.is_ok()) << again.message();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

// One page, one token, size-1 strides 0, 1, 7, -3, 2^40, INT64_MAX: the same bytes as the packed call.
TEST_F(FaultsGpu, CodecSize1StridesGiveTheSameBytes) {
  void* one_src = nullptr;
  void* one_dst = nullptr;
  ASSERT_EQ(cudaMalloc(&one_src, 576 * 2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&one_dst, 2 * 656), cudaSuccess);
  std::vector<uint16_t> values(576);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<uint16_t>(0x3c00 + (i * 37) % 512);  // bf16
  ASSERT_EQ(cudaMemcpy(one_src, values.data(), 576 * 2, cudaMemcpyHostToDevice), cudaSuccess);
  auto* dst_bytes = static_cast<uint8_t*>(one_dst);
  ASSERT_TRUE(quantize_kv_cache(make_tensor(one_src, DType::kBFloat16, {1, 1, 1, 576}),
                                make_tensor(dst_bytes, DType::kUInt8, {1, 1, 1, 656}), KVCacheFormat::kFp8V32, nullptr)
                  .is_ok());
  for (const int64_t v : kSize1Strides) {
    const Status st = quantize_kv_cache(make_tensor(one_src, DType::kBFloat16, {1, 1, 1, 576}, {v, v, v, 1}),
                                        make_tensor(dst_bytes + 656, DType::kUInt8, {1, 1, 1, 656}, {v, v, v, 1}),
                                        KVCacheFormat::kFp8V32, nullptr);
    ASSERT_TRUE(st.is_ok()) << v << ": " << st.message();
    std::vector<uint8_t> got(2 * 656);
    ASSERT_EQ(cudaMemcpy(got.data(), one_dst, got.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_TRUE(std::equal(got.begin(), got.begin() + 656, got.begin() + 656)) << v;
  }
  cudaFree(one_src);
  cudaFree(one_dst);
}

// The codec entries check the current device against the tensors' (and the stream's device).
TEST_F(FaultsGpu, CodecChecksTheCurrentDeviceAndTheStream) {
  int count = 0;
  ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  expect_invalid(quantize(/*device_id=*/count), {"argument 'src' is on cuda:", "current device is cuda:0"});
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  EXPECT_TRUE(quantize(0, stream).is_ok());
  EXPECT_TRUE(quantize(0, cudaStreamPerThread).is_ok());
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  if (count > 1) {  // a stream of another device
    cudaStream_t other = nullptr;
    ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
    ASSERT_EQ(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    expect_invalid(quantize(0, other), {"argument 'stream' belongs to cuda:1"});
    cudaStreamDestroy(other);
  }
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace openmla
