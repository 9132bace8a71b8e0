// Checked mode (include/openmla/checked.h): the checks each entry builds, the rules the check kernel applies (run here
// on host arrays: kernels/input_check/rules.h is host and device code), the first violation and its message, the
// switch. The GPU cases run the check kernel itself on the same inputs and require the record the host rules give
// (skipped without a Hopper GPU); tests/python/test_faults.py drives checked mode through the Python entries.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "api/checked.h"
#include "api/decode_internal.h"
#include "heuristics/decode_schedule.h"
#include "kernels/input_check/launch.h"
#include "kernels/input_check/rules.h"
#include "openmla/capability.h"
#include "openmla/checked.h"
#include "openmla/decode.h"

namespace openmla {
namespace {

using kernels::CheckedArgument;
using kernels::CheckedEntry;
using kernels::CheckKind;
using kernels::InputCheckParams;
using kernels::InputCheckRecord;

constexpr int32_t kIntMax = std::numeric_limits<int32_t>::max();
constexpr int32_t kIntMin = std::numeric_limits<int32_t>::min();

TensorRef host_tensor(void* data, DType dtype, std::initializer_list<int64_t> shape) {
  return make_tensor(data, dtype, shape, DeviceType::kCUDA, 0);  // host memory posing as device memory: the rules
}  // are run on the host here

// The record the check kernel keeps for one call: the host run of the same rules.
struct Found {
  bool found = false;
  InputCheckRecord record{};
};

Found run_rules(CheckedEntry entry, InputCheckParams p) {
  p.entry = entry;
  Found f;
  int check = 0;
  int64_t element = 0;
  kernels::input_check::Violation v{};
  if (!kernels::input_check::first_violation(p, &check, &element, &v)) return f;
  f.found = true;
  InputCheckRecord& r = f.record;
  r.found = 1;
  r.entry = entry;
  r.argument = p.checks[check].argument;
  r.kind = p.checks[check].kind;
  r.check = check;
  r.element = element;
  for (int k = 0; k < 3; ++k) r.coords[k] = v.coords[k];
  r.value = v.value;
  r.bound = v.bound;
  r.detail = v.detail;
  return f;
}

void expect_message(const Found& f, const std::vector<std::string>& fragments) {
  ASSERT_TRUE(f.found) << "no violation found";
  const std::string m = detail::describe_violation(f.record);
  for (const auto& s : fragments) EXPECT_NE(m.find(s), std::string::npos) << "expected \"" << s << "\" in: " << m;
}

// ---- A dense call: b = 4, 3 block-table columns, 10 pages, planned schedule ---------------------------------------

struct DenseCall {
  DenseDecodeProblem problem{.batch = 4, .s_q = 1, .h_q = 128, .num_sms = 8, .max_blocks_per_seq = 3};
  std::vector<int32_t> seqlens = {100, 192, 0, 1};
  std::vector<int32_t> block_table = {0, 1, 77, 2, 3, 4, -5, 9, 8, 5, 12345, kIntMax};  // past the lengths: garbage
  heuristics::DecodeScheduleHost schedule;
  int parts = 0;
  DenseDecodeArgs args;

  DenseCall() { plan(seqlens); }
  void plan(const std::vector<int32_t>& planned_lengths) {
    parts = heuristics::decode_num_sm_parts(problem, problem.num_sms);
    std::vector<int32_t> blocks;
    std::vector<bool> empty;
    for (int32_t L : planned_lengths) {
      blocks.push_back(heuristics::dense_request_blocks(L, 3 * 64));
      empty.push_back(heuristics::dense_request_empty(L, 3 * 64));
    }
    schedule = heuristics::walk_decode_schedule(
        blocks, empty, parts, heuristics::decode_schedule_payload(blocks, parts));
  }
  InputCheckParams checks() {
    args.block_table = host_tensor(block_table.data(), DType::kInt32, {4, 3});
    args.cache_seqlens = host_tensor(seqlens.data(), DType::kInt32, {4});
    args.k_cache = make_tensor(nullptr, DType::kBFloat16, {10, 64, 1, 576});
    args.schedule.metadata = host_tensor(schedule.records.data(), DType::kInt32, {parts, 8});
    args.schedule.num_splits = host_tensor(schedule.num_splits.data(), DType::kInt32, {5});
    return detail::dense_decode_checks(problem, args, parts);
  }
};

TEST(CheckedMode, ValidDenseCallHasNoViolation) {
  DenseCall c;
  const InputCheckParams p = c.checks();
  ASSERT_EQ(p.num_checks, 3);
  EXPECT_EQ(p.checks[0].argument, CheckedArgument::kBlockTable);
  EXPECT_EQ(p.checks[1].argument, CheckedArgument::kCacheSeqlens);
  EXPECT_EQ(p.checks[2].argument, CheckedArgument::kSchedule);
  EXPECT_FALSE(run_rules(CheckedEntry::kDenseDecode, p).found);
}

TEST(CheckedMode, BlockTableEntriesOutsideTheCache) {
  for (const int32_t bad : {10, -1, kIntMin, kIntMax, 12345}) {
    DenseCall c;
    c.block_table[3 + 1] = bad;  // request 1 (192 tokens) reads pages 0..2
    const Found f = run_rules(CheckedEntry::kDenseDecode, c.checks());
    expect_message(f, {"checked mode: dense_decode: argument 'block_table'[1, 1] is " + std::to_string(bad),
                       "outside [0, num_blocks = 10)", "request 1 reads page 1"});
    EXPECT_EQ(f.record.coords[0], 1);
    EXPECT_EQ(f.record.coords[1], 1);
  }
  // The first violation: the lowest (request, page).
  DenseCall c;
  c.block_table[3 * 3 + 0] = 99;  // request 3, page 0
  c.block_table[0 * 3 + 1] = -7;  // request 0, page 1
  const Found f = run_rules(CheckedEntry::kDenseDecode, c.checks());
  EXPECT_EQ(f.record.coords[0], 0);
  EXPECT_EQ(f.record.value, -7);
}

TEST(CheckedMode, LengthsNegativeOrPastTheBlockTable) {
  {
    DenseCall c;
    c.seqlens[2] = -3;
    c.plan(c.seqlens);  // planned with the same (garbage) values: only the length is reported
    expect_message(run_rules(CheckedEntry::kDenseDecode, c.checks()),
                   {"argument 'cache_seqlens'[2] is -3, negative", "request 2"});
  }
  {
    DenseCall c;
    c.seqlens[3] = kIntMax;
    c.plan(c.seqlens);
    c.block_table[3 * 3 + 1] = 6;  // its clamped length reads all three pages: make them valid
    c.block_table[3 * 3 + 2] = 7;
    expect_message(run_rules(CheckedEntry::kDenseDecode, c.checks()),
                   {"argument 'cache_seqlens'[3] is 2147483647", "capacity max_blocks_per_seq * page_block_size = 192"});
  }
}

TEST(CheckedMode, ScheduleFromOtherLengthsOrNeverPlanned) {
  {
    DenseCall c;
    c.plan({100, 192, 0, 130});  // request 3 planned with 3 blocks, called with 1 token
    const Found f = run_rules(CheckedEntry::kDenseDecode, c.checks());
    expect_message(f, {"argument 'schedule' was planned for other lengths", "request 3", "plan_decode"});
    EXPECT_EQ(f.record.detail, static_cast<int32_t>(kernels::ScheduleRule::kEndBlock));
  }
  {
    DenseCall c;
    std::memset(c.schedule.records.data(), 0x5a, c.schedule.records.size() * sizeof(c.schedule.records[0]));
    expect_message(run_rules(CheckedEntry::kDenseDecode, c.checks()),
                   {"argument 'schedule' was not planned for this call", "never planned"});
  }
  {
    DenseCall c;
    c.schedule.num_splits[4] = 1000;  // more slots than the split buffers hold
    expect_message(run_rules(CheckedEntry::kDenseDecode, c.checks()),
                   {"argument 'schedule' has inconsistent split counts", "num_splits[4] is 1000"});
  }
}

// A batch-invariant schedule breaks the default pass's rules by design (requests of several chunks take more split
// slots than the default bound of batch + num_sm_parts): the call's inputs are checked, its schedule is not
// (docs/decode-schedule.md, "Batch invariance").
TEST(CheckedMode, BatchInvariantScheduleIsNotCheckedAgainstTheDefaultRules) {
  DenseCall c;
  c.problem.batch_invariant = true;
  c.problem.num_sms = 2;  // one partition: batch + num_sm_parts = 5 split slots in the default rules
  c.parts = heuristics::decode_num_sm_parts(c.problem, c.problem.num_sms);
  ASSERT_EQ(c.parts, 1);
  std::vector<int32_t> blocks;
  std::vector<bool> empty;
  for (int32_t L : c.seqlens) {
    blocks.push_back(heuristics::dense_request_blocks(L, 3 * 64));
    empty.push_back(heuristics::dense_request_empty(L, 3 * 64));
  }
  c.schedule = heuristics::walk_invariant_schedule(blocks, empty, c.parts, 1);  // chunks of one block: 7 split slots
  const InputCheckParams p = c.checks();
  ASSERT_EQ(p.num_checks, 2);
  EXPECT_EQ(p.checks[0].argument, CheckedArgument::kBlockTable);
  EXPECT_EQ(p.checks[1].argument, CheckedArgument::kCacheSeqlens);
  EXPECT_FALSE(run_rules(CheckedEntry::kDenseDecode, p).found);
  // The default rules on the same schedule: a false report (7 slots against 5), which is why they are not applied.
  c.problem.batch_invariant = false;
  expect_message(run_rules(CheckedEntry::kDenseDecode, c.checks()),
                 {"argument 'schedule' has inconsistent split counts", "past the split buffers' 5 slots"});
}

TEST(CheckedMode, PlanDecodeLengths) {
  std::vector<int32_t> lens = {5, -1, 7};
  DenseDecodeProblem p{.batch = 3, .h_q = 16, .num_sms = 8};
  const TensorRef t = host_tensor(lens.data(), DType::kInt32, {3});
  expect_message(run_rules(CheckedEntry::kPlanDecode, detail::plan_decode_checks(p, t)),
                 {"checked mode: plan_decode: argument 'cache_seqlens'[1] is -1, negative"});
  lens = {5, kIntMax, 7};
  EXPECT_FALSE(run_rules(CheckedEntry::kPlanDecode, detail::plan_decode_checks(p, t)).found)
      << "capacity not given: only negative lengths are reported";
  p.max_blocks_per_seq = 2;
  expect_message(run_rules(CheckedEntry::kPlanDecode, detail::plan_decode_checks(p, t)),
                 {"'cache_seqlens'[1] is 2147483647", "= 128"});
  std::vector<int32_t> topk = {3, 9, -2};
  const SparseDecodeProblem sp{.batch = 3, .h_q = 64, .topk = 8, .num_sms = 8};
  expect_message(run_rules(CheckedEntry::kPlanDecode,
                           detail::plan_decode_checks(sp, host_tensor(topk.data(), DType::kInt32, {3}), {})),
                 {"argument 'topk_length'[1] is 9", "outside [0, topk = 8]", "request 1"});
}

// ---- A sparse call: b = 2, s_q = 2, topk 4, 3 pages of 5 tokens, topk_length, sink, extra cache ------------------

struct SparseCall {
  SparseDecodeProblem problem{.batch = 2,
                              .s_q = 2,
                              .h_q = 64,
                              .d_qk = 576,
                              .page_block_size = 5,
                              .topk = 4,
                              .extra_topk = 2,
                              .extra_page_block_size = 4,
                              .num_sms = 8};
  std::vector<int32_t> indices = {0, 14, -1,      kIntMax,  // request 0, query 0: length 3 -> slot 3 unread
                                  3, -1, 2,       kIntMin,  // request 0, query 1
                                  1, 2,  99,      -99,      // request 1: length 2 -> slots 2, 3 unread
                                  5, 6,  kIntMin, 15};
  std::vector<int32_t> topk_length = {3, 2};
  std::vector<float> sink = std::vector<float>(64, 0.5f);
  std::vector<int32_t> extra = {0, 7, -1, -1, 3, 1, 2, 2};  // extra cache: 2 pages x 4 tokens = 8
  std::vector<int32_t> extra_length = {2, 2};
  SparseDecodeArgs args;
  InputCheckParams checks(bool schedule_read = false) {
    sink[1] = INFINITY;
    sink[2] = -INFINITY;
    args.indices = host_tensor(indices.data(), DType::kInt32, {2, 2, 4});
    args.topk_length = host_tensor(topk_length.data(), DType::kInt32, {2});
    args.attn_sink = host_tensor(sink.data(), DType::kFloat32, {64});
    args.k_cache = make_tensor(nullptr, DType::kUInt8, {3, 5, 1, 656});
    args.extra_k_cache = make_tensor(nullptr, DType::kUInt8, {2, 4, 1, 656});
    args.extra_indices = host_tensor(extra.data(), DType::kInt32, {2, 2, 2});
    args.extra_topk_length = host_tensor(extra_length.data(), DType::kInt32, {2});
    return detail::sparse_decode_checks(problem, args, 16, schedule_read);
  }
};

TEST(CheckedMode, ValidSparseCallHasNoViolation) {
  SparseCall c;
  const InputCheckParams p = c.checks();
  ASSERT_EQ(p.num_checks, 5);
  EXPECT_FALSE(run_rules(CheckedEntry::kSparseDecode, p).found);
}

TEST(CheckedMode, SparseIndicesOutsideTheCache) {
  for (const int32_t bad : {kIntMin, kIntMax, -2, 15, 1000}) {
    SparseCall c;
    c.indices[1 * 8 + 0 * 4 + 1] = bad;  // request 1, query 0, slot 1 (< length 2)
    const Found f = run_rules(CheckedEntry::kSparseDecode, c.checks());
    expect_message(f, {"checked mode: sparse_decode: argument 'indices'[1, 0, 1] is " + std::to_string(bad),
                       "neither -1 nor a token of the cache [0, num_blocks * page_block_size = 15)",
                       "request 1, query token 0, slot 1"});
  }
  SparseCall c;
  c.extra[1 * 4 + 1 * 2 + 1] = 8;
  expect_message(run_rules(CheckedEntry::kSparseDecode, c.checks()),
                 {"argument 'extra_indices'[1, 1, 1] is 8", "= 8)"});
}

TEST(CheckedMode, TopkLengthsOutOfRangeAndNaNSink) {
  {
    SparseCall c;
    c.topk_length[1] = 5;  // > topk: its slots 2, 3 are now read too -> make them valid, the length is reported
    c.indices[1 * 8 + 2] = c.indices[1 * 8 + 3] = c.indices[1 * 8 + 6] = c.indices[1 * 8 + 7] = 1;
    expect_message(run_rules(CheckedEntry::kSparseDecode, c.checks()),
                   {"argument 'topk_length'[1] is 5", "outside [0, topk = 4]"});
  }
  {
    SparseCall c;
    c.topk_length[0] = -1;
    expect_message(run_rules(CheckedEntry::kSparseDecode, c.checks()), {"'topk_length'[0] is -1, negative"});
  }
  {
    SparseCall c;
    c.extra_length[1] = 3;
    expect_message(run_rules(CheckedEntry::kSparseDecode, c.checks()),
                   {"'extra_topk_length'[1] is 3", "extra_topk = 2"});
  }
  {
    SparseCall c;
    c.checks();
    c.sink[17] = std::nanf("");
    expect_message(run_rules(CheckedEntry::kSparseDecode, detail::sparse_decode_checks(c.problem, c.args, 16, false)),
                   {"argument 'attn_sink'[17] is NaN", "+-inf are allowed"});
  }
}

TEST(CheckedMode, SparseScheduleFromAnotherPlan) {
  SparseCall c;
  c.checks();
  // This call's work: 2 blocks per request (one main block, then the extra slots). Planned for other lengths: 3 and 1.
  const int parts = 16;
  std::vector<int32_t> blocks = {3, 1};
  heuristics::DecodeScheduleHost planned =
      heuristics::walk_decode_schedule(blocks, {}, parts, /*payload=*/1 + kernels::kDecodeRequestOverheadBlocks);
  c.args.schedule.metadata = host_tensor(planned.records.data(), DType::kInt32, {parts, 8});
  c.args.schedule.num_splits = host_tensor(planned.num_splits.data(), DType::kInt32, {3});
  const InputCheckParams p = detail::sparse_decode_checks(c.problem, c.args, parts, /*schedule_read=*/true);
  ASSERT_EQ(p.num_checks, 6);
  expect_message(run_rules(CheckedEntry::kSparseDecode, p), {"argument 'schedule' was planned for other lengths"});
}

TEST(CheckedMode, AppendSlotsAndPrefill) {
  std::vector<int32_t> slots32 = {0, -1, 39, 40};
  std::vector<int64_t> slots64 = {0, -5, int64_t{1} << 40};
  const TensorRef cache = make_tensor(nullptr, DType::kUInt8, {5, 8, 1, 656});
  expect_message(run_rules(CheckedEntry::kAppendKVCache,
                           detail::append_kv_cache_checks(host_tensor(slots32.data(), DType::kInt32, {4}), cache)),
                 {"checked mode: append_kv_cache: argument 'slots'[3] is 40", "num_blocks * page_size = 40"});
  expect_message(run_rules(CheckedEntry::kAppendKVCache,
                           detail::append_kv_cache_checks(host_tensor(slots64.data(), DType::kInt64, {3}), cache)),
                 {"'slots'[2] is 1099511627776"});
  slots32 = {0, -1, -7, 39};
  EXPECT_FALSE(run_rules(CheckedEntry::kAppendKVCache,
                         detail::append_kv_cache_checks(host_tensor(slots32.data(), DType::kInt32, {4}), cache))
                   .found)
      << "negative slots mark padding";

  std::vector<int32_t> idx = {0, 1, 2, kIntMax, 3, 99, -1, -1};  // s_q = 2, topk = 4, s_kv = 4
  std::vector<int32_t> len = {3, 2};
  std::vector<float> sink(16, 0.f);
  SparsePrefillArgs a;
  a.indices = host_tensor(idx.data(), DType::kInt32, {2, 1, 4});
  a.topk_length = host_tensor(len.data(), DType::kInt32, {2});
  a.attn_sink = host_tensor(sink.data(), DType::kFloat32, {16});
  a.kv = make_tensor(nullptr, DType::kBFloat16, {4, 1, 576});
  expect_message(run_rules(CheckedEntry::kSparsePrefill, detail::sparse_prefill_checks(a)),
                 {"checked mode: sparse_prefill: argument 'indices'[1, 0, 1] is 99", "a row of kv [0, s_kv = 4)",
                  "query token 1, slot 1"});
  idx[5] = 3;
  idx[3] = 0;  // read once the length is clamped to topk
  len[0] = 7;
  expect_message(run_rules(CheckedEntry::kSparsePrefill, detail::sparse_prefill_checks(a)),
                 {"'topk_length'[0] is 7", "query token 0"});
}

TEST(CheckedMode, SwitchAndEnvironment) {
  const bool before = checked_mode();
  set_checked_mode(true);
  EXPECT_TRUE(checked_mode());
  set_checked_mode(false);
  EXPECT_FALSE(checked_mode());
  set_checked_mode(before);
  const char* old = std::getenv("OPENMLA_CHECK");
  const std::string saved = old != nullptr ? old : "";
  for (const auto& [value, on] :
       std::vector<std::pair<const char*, bool>>{{"1", true}, {"yes", true}, {"0", false}, {"", false}}) {
    setenv("OPENMLA_CHECK", value, 1);
    EXPECT_EQ(detail::checked_mode_from_environment(), on) << "OPENMLA_CHECK=" << value;
  }
  unsetenv("OPENMLA_CHECK");
  EXPECT_FALSE(detail::checked_mode_from_environment());
  if (old != nullptr) setenv("OPENMLA_CHECK", saved.c_str(), 1);
}

// ---- The check kernel on a GPU: the record the host rules give --------------------------------------------------

class CheckedModeGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    const Capability cap = query_capability(Feature::kDenseDecode);
    if (!cap.supported) GTEST_SKIP() << "GPU test skipped: " << cap.reason;
    InputCheckRecord stale{};
    ASSERT_TRUE(kernels::take_input_check_record(&stale).is_ok());  // start from an empty record
  }
  template <typename T>
  void* upload(const std::vector<T>& v) {
    void* d = nullptr;
    EXPECT_EQ(cudaMalloc(&d, v.size() * sizeof(T)), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
    owned_.push_back(d);
    return d;
  }
  void TearDown() override {
    for (void* p : owned_) cudaFree(p);
  }
  std::vector<void*> owned_;
};

TEST_F(CheckedModeGpu, KernelRecordsWhatTheHostRulesFind) {
  // Many violations spread over many CTAs: the lowest must win.
  const int64_t b = 64, s_q = 2, topk = 4096, capacity = 1000;
  std::vector<int32_t> idx(b * s_q * topk);
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<int32_t>(i % capacity);
  for (size_t i = idx.size() - 1; i > idx.size() / 3; i -= 997) idx[i] = kIntMin + static_cast<int32_t>(i);
  std::vector<int32_t> lens(b, static_cast<int32_t>(topk));
  InputCheckParams p;
  p.num_checks = 1;
  p.checks[0] = kernels::InputCheck{.kind = CheckKind::kIndices,
                                    .argument = CheckedArgument::kIndices,
                                    .data = idx.data(),
                                    .rows = b,
                                    .cols = s_q,
                                    .depth = topk,
                                    .row_stride = s_q * topk,
                                    .col_stride = topk,
                                    .bound = capacity,
                                    .lengths = lens.data()};
  const Found host = run_rules(CheckedEntry::kSparseDecode, p);
  ASSERT_TRUE(host.found);
  p.checks[0].data = upload(idx);
  p.checks[0].lengths = static_cast<const int32_t*>(upload(lens));
  ASSERT_TRUE(detail::run_input_checks(CheckedEntry::kSparseDecode, p, nullptr).is_ok());
  const Status st = checked_mode_status();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(), detail::describe_violation(host.record));
  EXPECT_TRUE(checked_mode_status().is_ok()) << "the record is cleared once read";
}

TEST_F(CheckedModeGpu, TheEarliestCallWins) {
  std::vector<int32_t> first = {0, -4, 0}, second = {-9, 0, 0};
  InputCheckParams p;
  p.num_checks = 1;
  p.checks[0] = kernels::InputCheck{.kind = CheckKind::kLengths,
                                    .argument = CheckedArgument::kCacheSeqlens,
                                    .data = upload(first),
                                    .rows = 3,
                                    .bound = kIntMax};
  ASSERT_TRUE(detail::run_input_checks(CheckedEntry::kPlanDecode, p, nullptr).is_ok());
  p.checks[0].data = upload(second);
  ASSERT_TRUE(detail::run_input_checks(CheckedEntry::kDenseDecode, p, nullptr).is_ok());
  const Status st = checked_mode_status();
  EXPECT_NE(st.message().find("plan_decode: argument 'cache_seqlens'[1] is -4"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace openmla
