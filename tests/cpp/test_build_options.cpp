// Build options (CMake OPENMLA_ENABLE_<FAMILY>, OPENMLA_TRACE; src/api/families.h): in every configuration each
// public entry point either has its family or answers kUnsupported naming the entry, the family and the CMake option;
// query_capability says the same; argument errors do not depend on the build; the trace readers (src/api/trace.h)
// name OPENMLA_TRACE or the family's option when they cannot read. The tests read the build from the library's
// OPENMLA_HAS_* definitions (PUBLIC in CMakeLists.txt), so they run unchanged in every configuration.
//
// The calls use fake, aligned, non-null "device" pointers and num_sms > 0: every check runs before the first CUDA call,
// and a family that is not built answers before it. A built family's valid call would launch on the fake pointers, so
// it is made only where no GPU is visible (it then fails at the launch context, never as "not built").
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "api/trace.h"
#include "mha_prefill_fixture.h"
#include "openmla/capability.h"
#include "openmla/decode.h"
#include "openmla/kv_cache.h"
#include "openmla/merge.h"
#include "openmla/prefill.h"
#include "openmla/test_hooks.h"

namespace openmla {
namespace {

#if defined(OPENMLA_HAS_KV_CACHE)
constexpr bool kHasKVCache = true;
#else
constexpr bool kHasKVCache = false;
#endif
#if defined(OPENMLA_HAS_DENSE_DECODE)
constexpr bool kHasDecode = true;
#else
constexpr bool kHasDecode = false;
#endif
#if defined(OPENMLA_HAS_SPARSE_PREFILL)
constexpr bool kHasSparsePrefill = true;
#else
constexpr bool kHasSparsePrefill = false;
#endif
#if defined(OPENMLA_HAS_MHA_PREFILL)
constexpr bool kHasMhaPrefill = true;
#else
constexpr bool kHasMhaPrefill = false;
#endif
#if defined(OPENMLA_HAS_MERGE_STATES)
constexpr bool kHasMergeStates = true;
#else
constexpr bool kHasMergeStates = false;
#endif
#if defined(OPENMLA_HAS_TRACE)
constexpr bool kHasTrace = true;
#else
constexpr bool kHasTrace = false;
#endif

// A family of this build: whether it is built and the CMake option that switches it.
struct Family {
  bool built;
  const char* option;
};
constexpr Family kKVCache{kHasKVCache, "OPENMLA_ENABLE_KV_CACHE"};
constexpr Family kDecode{kHasDecode, "OPENMLA_ENABLE_DENSE_DECODE"};
constexpr Family kSparsePrefill{kHasSparsePrefill, "OPENMLA_ENABLE_SPARSE_PREFILL"};
constexpr Family kMhaPrefill{kHasMhaPrefill, "OPENMLA_ENABLE_MHA_PREFILL"};
constexpr Family kMergeStates{kHasMergeStates, "OPENMLA_ENABLE_MERGE_STATES"};

// Fake device pointers 64 GiB apart: no two arguments of a call overlap.
void* fake_ptr(int i) { return reinterpret_cast<void*>(uintptr_t{0x10000000} + (uintptr_t(i) << 36)); }

constexpr int kSms = 132;

bool gpu_visible() {
  int n = 0;
  const bool any = cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
  cudaGetLastError();
  return any;
}

// "<entry>: this build has no ... (CMake <option>=OFF)"
void expect_not_built(const Status& st, const std::string& entry, const char* option) {
  EXPECT_EQ(st.code(), StatusCode::kUnsupported) << st.message();
  EXPECT_EQ(st.message().rfind(entry + ": this build has no ", 0), 0u) << st.message();
  EXPECT_NE(st.message().find(std::string("(CMake ") + option + "=OFF)"), std::string::npos) << st.message();
}

// A valid call of `entry`: "not built" when the family is absent; else (only without a GPU, see the file comment) an
// error of the launch, never "not built".
void expect_valid_call(const Family& family, const std::string& entry, const std::function<Status()>& call) {
  SCOPED_TRACE(entry);
  if (!family.built) {
    expect_not_built(call(), entry, family.option);
    return;
  }
  if (gpu_visible()) GTEST_SKIP() << "a GPU is present: the valid call would launch on fake pointers";
  const Status st = call();
  EXPECT_NE(st.code(), StatusCode::kUnsupported) << st.message();
  EXPECT_EQ(st.message().find("this build has no"), std::string::npos) << st.message();
}

// ---- Valid calls of each family -------------------------------------------------------------------------------

// Dense: b = 2, s_q = 2, h_q = 16, h_kv = 1 -> 132 partitions.
DenseDecodeProblem dense_problem() {
  return DenseDecodeProblem{.batch = 2, .s_q = 2, .h_q = 16, .h_kv = 1, .causal = true, .num_sms = kSms};
}
DecodeSchedule schedule(int64_t parts, int64_t batch) {
  DecodeSchedule s;
  s.metadata = make_tensor(fake_ptr(5), DType::kInt32, {parts, kDecodeScheduleRecordInts});
  s.num_splits = make_tensor(fake_ptr(6), DType::kInt32, {batch + 1});
  return s;
}
DenseDecodeArgs dense_args() {
  const DenseDecodeProblem p = dense_problem();
  const int64_t parts = 132, rows = (p.batch + parts) * p.s_q * p.h_q;
  DenseDecodeArgs a;
  a.q = make_tensor(fake_ptr(1), DType::kBFloat16, {p.batch, p.s_q, p.h_q, 576});
  a.k_cache = make_tensor(fake_ptr(2), DType::kBFloat16, {10, 64, p.h_kv, 576});
  a.block_table = make_tensor(fake_ptr(3), DType::kInt32, {p.batch, 4});
  a.cache_seqlens = make_tensor(fake_ptr(4), DType::kInt32, {p.batch});
  a.schedule = schedule(parts, p.batch);
  a.split.partial_o = make_tensor(fake_ptr(7), DType::kFloat32, {rows, 512});
  a.split.partial_lse = make_tensor(fake_ptr(8), DType::kFloat32, {rows});
  a.out = make_tensor(fake_ptr(9), DType::kBFloat16, {p.batch, p.s_q, p.h_q, 512});
  a.lse = make_tensor(fake_ptr(10), DType::kFloat32, {p.batch, p.h_q, p.s_q});
  return a;
}

// Sparse, V3.2 cache: b = 2, s_q = 2, h_q = 128 -> 132 / 2 / 2 = 33 partitions.
SparseDecodeProblem sparse_problem() {
  return SparseDecodeProblem{.batch = 2, .s_q = 2, .h_q = 128, .topk = 100, .num_sms = kSms};
}
SparseDecodeArgs sparse_args() {
  const SparseDecodeProblem p = sparse_problem();
  const int64_t parts = 33, rows = (p.batch + parts) * p.s_q * p.h_q;
  SparseDecodeArgs a;
  a.q = make_tensor(fake_ptr(1), DType::kBFloat16, {p.batch, p.s_q, p.h_q, 576});
  a.k_cache = make_tensor(fake_ptr(2), DType::kUInt8, {10, 64, 1, 656});
  a.indices = make_tensor(fake_ptr(3), DType::kInt32, {p.batch, p.s_q, p.topk});
  a.schedule = schedule(parts, p.batch);
  a.split.partial_o = make_tensor(fake_ptr(7), DType::kFloat32, {rows, 512});
  a.split.partial_lse = make_tensor(fake_ptr(8), DType::kFloat32, {rows});
  a.out = make_tensor(fake_ptr(9), DType::kBFloat16, {p.batch, p.s_q, p.h_q, 512});
  a.lse = make_tensor(fake_ptr(10), DType::kFloat32, {p.batch, p.h_q, p.s_q});
  return a;
}

SparsePrefillArgs sparse_prefill_args() {
  SparsePrefillArgs a;
  a.q = make_tensor(fake_ptr(1), DType::kBFloat16, {100, 128, 576});
  a.kv = make_tensor(fake_ptr(2), DType::kBFloat16, {4096, 1, 576});
  a.indices = make_tensor(fake_ptr(3), DType::kInt32, {100, 1, 2048});
  a.out = make_tensor(fake_ptr(6), DType::kBFloat16, {100, 128, 512});
  a.max_logits = make_tensor(fake_ptr(7), DType::kFloat32, {100, 128});
  a.lse = make_tensor(fake_ptr(8), DType::kFloat32, {100, 128});
  a.num_sms = kSms;
  return a;
}

MhaPrefillProblem mha_problem() { return testing::mha_fixture_problem(kSms); }
MhaPrefillArgs mha_args() { return testing::mha_fixture_args(fake_ptr); }

// Merge: 2 partials of 4 tokens x 16 heads x 512.
MergeStatesArgs merge_args() {
  MergeStatesArgs a;
  a.outs = make_tensor(fake_ptr(1), DType::kBFloat16, {2, 4, 16, 512});
  a.lses = make_tensor(fake_ptr(2), DType::kFloat32, {2, 4, 16});
  a.out = make_tensor(fake_ptr(3), DType::kBFloat16, {4, 16, 512});
  a.lse_out = make_tensor(fake_ptr(4), DType::kFloat32, {4, 16});
  return a;
}

TensorRef bf16_pages(int64_t blocks) { return make_tensor(fake_ptr(1), DType::kBFloat16, {blocks, 64, 1, 576}); }
TensorRef fp8_pages(int64_t blocks) { return make_tensor(fake_ptr(2), DType::kUInt8, {blocks, 64, 1, 656}); }

// ---- Capability -----------------------------------------------------------------------------------------------

TEST(BuildOptions, CapabilityNamesTheOptionOfAnAbsentFamily) {
  const struct {
    Feature feature;
    Family family;
  } features[] = {{Feature::kKVCacheQuantize, kKVCache},
                  {Feature::kDenseDecode, kDecode},
                  {Feature::kSparseDecode, kDecode},
                  {Feature::kSparsePrefill, kSparsePrefill},
                  {Feature::kDensePrefill, kMhaPrefill},
                  {Feature::kMergeStates, kMergeStates},
                  {Feature::kDecodeBatchInvariant, kDecode},
                  {Feature::kDenseDecodeFp8, kDecode},
                  {Feature::kDensePrefillFp8, kMhaPrefill},
                  {Feature::kDenseDecodeAnyPageSize, kDecode},
                  {Feature::kDecodeVarlenQ, kDecode},
                  {Feature::kSparsePrefillFp8, kSparsePrefill}};
  for (const auto& f : features) {
    const Capability cap = query_capability(f.feature);
    if (f.family.built) {
      EXPECT_EQ(cap.reason.find("compiled out"), std::string::npos) << cap.reason;
    } else {
      EXPECT_FALSE(cap.supported);
      EXPECT_EQ(cap.reason, std::string(feature_name(f.feature)) + ": compiled out (" + f.family.option + "=OFF)");
    }
  }
}

// ---- Entry points ---------------------------------------------------------------------------------------------

TEST(BuildOptions, DecodeEntries) {
  expect_valid_call(kDecode, "plan_decode", [] {
    return plan_decode(dense_problem(), make_tensor(fake_ptr(4), DType::kInt32, {2}), schedule(132, 2), nullptr);
  });
  expect_valid_call(kDecode, "plan_decode",
                    [] { return plan_decode(sparse_problem(), TensorRef{}, TensorRef{}, schedule(33, 2), nullptr); });
  expect_valid_call(kDecode, "dense_decode", [] { return dense_decode(dense_problem(), dense_args(), nullptr); });
  expect_valid_call(kDecode, "dense_decode", [] {
    return test_hooks::dense_decode(dense_problem(), dense_args(), {.merge_publish_always = true}, nullptr);
  });
  expect_valid_call(kDecode, "sparse_decode", [] { return sparse_decode(sparse_problem(), sparse_args(), nullptr); });
}

// The compatibility form reaches the same answer through the family functions.
TEST(BuildOptions, DecodeCompatibilityEntries) {
  const DecodeProblem dense{.batch = 2, .s_q = 2, .h_q = 16, .causal = true, .num_sms = kSms};
  const DecodeProblem sparse{.batch = 2,
                             .s_q = 2,
                             .h_q = 128,
                             .cache_format = KVCacheFormat::kFp8V32,
                             .sparse = true,
                             .topk = 100,
                             .num_sms = kSms};
  expect_valid_call(kDecode, "plan_decode", [&] {
    return plan_decode(dense, make_tensor(fake_ptr(4), DType::kInt32, {2}), TensorRef{}, TensorRef{}, schedule(132, 2),
                       nullptr);
  });
  expect_valid_call(kDecode, "dense_decode", [&] { return dense_decode(dense, dense_args(), nullptr); });
  expect_valid_call(kDecode, "sparse_decode", [&] { return sparse_decode(sparse, sparse_args(), nullptr); });
}

TEST(BuildOptions, KVCacheEntries) {
  const KVCacheFormat v32 = KVCacheFormat::kFp8V32;
  expect_valid_call(kKVCache, "quantize_kv_cache",
                    [&] { return quantize_kv_cache(bf16_pages(4), fp8_pages(4), v32, nullptr); });
  expect_valid_call(kKVCache, "dequantize_kv_cache", [&] {
    return dequantize_kv_cache(fp8_pages(4), make_tensor(fake_ptr(3), DType::kBFloat16, {4, 64, 1, 576}), v32, nullptr);
  });
  expect_valid_call(kKVCache, "append_kv_cache", [&] {
    return append_kv_cache(make_tensor(fake_ptr(3), DType::kBFloat16, {3, 576}),
                           make_tensor(fake_ptr(4), DType::kInt32, {3}), fp8_pages(4), v32, nullptr);
  });
}

// A call with nothing to do launches nothing and succeeds where the codec is built; without it, it is "not built" like
// any other call (no CUDA call either way, so this runs with or without a GPU).
TEST(BuildOptions, EmptyKVCacheCallsAnswerLikeOthers) {
  const KVCacheFormat v32 = KVCacheFormat::kFp8V32;
  const TensorRef empty_bf16 = make_tensor(nullptr, DType::kBFloat16, {0, 64, 1, 576});
  const TensorRef empty_fp8 = make_tensor(nullptr, DType::kUInt8, {0, 64, 1, 656});
  const std::vector<std::pair<std::string, Status>> calls = {
      {"quantize_kv_cache", quantize_kv_cache(empty_bf16, empty_fp8, v32, nullptr)},
      {"dequantize_kv_cache", dequantize_kv_cache(empty_fp8, empty_bf16, v32, nullptr)},
      {"append_kv_cache", append_kv_cache(make_tensor(nullptr, DType::kBFloat16, {0, 576}),
                                          make_tensor(nullptr, DType::kInt32, {0}), fp8_pages(4), v32, nullptr)}};
  for (const auto& [entry, st] : calls) {
    SCOPED_TRACE(entry);
    if (kHasKVCache)
      EXPECT_TRUE(st.is_ok()) << st.message();
    else
      expect_not_built(st, entry, kKVCache.option);
  }
}

TEST(BuildOptions, PrefillEntries) {
  expect_valid_call(kSparsePrefill, "sparse_prefill", [] { return sparse_prefill(sparse_prefill_args(), nullptr); });
  expect_valid_call(kMhaPrefill, "mha_prefill", [] { return mha_prefill(mha_problem(), mha_args(), nullptr); });
}

TEST(BuildOptions, MergeEntries) {
  expect_valid_call(kMergeStates, "merge_attn_states", [] { return merge_attn_states(merge_args(), nullptr); });
}

// No rows: nothing to launch, ok where the kernel is built, "not built" otherwise (no CUDA call either way).
TEST(BuildOptions, EmptyMergeCallAnswersLikeOthers) {
  MergeStatesArgs a;
  a.outs = make_tensor(nullptr, DType::kBFloat16, {2, 0, 16, 512});
  a.lses = make_tensor(nullptr, DType::kFloat32, {2, 0, 16});
  a.out = make_tensor(nullptr, DType::kBFloat16, {0, 16, 512});
  const Status st = merge_attn_states(a, nullptr);
  if (kHasMergeStates)
    EXPECT_TRUE(st.is_ok()) << st.message();
  else
    expect_not_built(st, "merge_attn_states", kMergeStates.option);
}

// An argument error is the caller's whatever the build: it comes before the family's answer.
TEST(BuildOptions, ArgumentErrorsComeFirstInEveryBuild) {
  auto expect_invalid = [](const Status& st, const char* needle) {
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.message();
    EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
  };
  DenseDecodeArgs dense = dense_args();
  dense.q.dtype = DType::kFloat32;
  expect_invalid(dense_decode(dense_problem(), dense, nullptr), "'q'");
  SparseDecodeArgs sparse = sparse_args();
  sparse.indices = TensorRef{};
  expect_invalid(sparse_decode(sparse_problem(), sparse, nullptr), "'indices'");
  expect_invalid(plan_decode(dense_problem(), make_tensor(fake_ptr(4), DType::kInt32, {3}), schedule(132, 2), nullptr),
                 "'cache_seqlens'");
  expect_invalid(quantize_kv_cache(bf16_pages(4), fp8_pages(5), KVCacheFormat::kFp8V32, nullptr), "'dst'");
  SparsePrefillArgs sp = sparse_prefill_args();
  sp.kv.shape[2] = 512;
  expect_invalid(sparse_prefill(sp, nullptr), "'kv'");
  MhaPrefillArgs mha = mha_args();
  mha.out.shape[1] = 3;
  expect_invalid(mha_prefill(mha_problem(), mha, nullptr), "'out'");
  MergeStatesArgs merge = merge_args();
  merge.lses.shape[2] = 8;
  expect_invalid(merge_attn_states(merge, nullptr), "'lses'");
}

// ---- Trace readers --------------------------------------------------------------------------------------------

TEST(BuildOptions, TraceReadersNameWhatIsMissing) {
  std::vector<unsigned long long> host(16);
  const struct {
    const char* name;
    Family family;
  } kernels[] = {
      {"dense_decode", kDecode},
      {"sparse_decode", kDecode},
      {"sparse_prefill", kSparsePrefill},
      {"mha_prefill", kMhaPrefill},
  };
  for (const auto& k : kernels) {
    SCOPED_TRACE(k.name);
    trace::Kernel kernel;
    ASSERT_TRUE(detail::trace_kernel_from_name(k.name, &kernel).is_ok());  // in every build
    EXPECT_STREQ(detail::trace_kernel_name(kernel), k.name);
    const std::string entry = std::string(k.name) + "_trace";
    size_t count = 0;
    const Status size = detail::trace_values(kernel, &count);
    if (!kHasTrace || !k.family.built) {
      const char* option = kHasTrace ? k.family.option : "OPENMLA_TRACE";
      expect_not_built(size, entry, option);
      expect_not_built(detail::read_trace(kernel, host.data(), host.size(), false), entry, option);
      expect_not_built(detail::read_trace(kernel, nullptr, 0, true), entry, option);
    } else {
      // A trace build with the family: the size needs no device; the read and the clear do (the GPU runs of
      // tools/diag/kernel_trace.py cover them).
      ASSERT_TRUE(size.is_ok()) << size.message();
      EXPECT_GT(count, host.size());
    }
  }
  trace::Kernel kernel;
  const Status unknown = detail::trace_kernel_from_name("dense_prefill", &kernel);
  EXPECT_EQ(unknown.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(unknown.message().find("argument 'kernel'"), std::string::npos) << unknown.message();
  EXPECT_NE(unknown.message().find("'mha_prefill'"), std::string::npos) << unknown.message();
}

}  // namespace
}  // namespace openmla
