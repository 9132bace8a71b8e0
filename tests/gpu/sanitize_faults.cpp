// Garbage inputs under compute-sanitizer (see sanitize_main.cpp for the contract): every kind of garbage the
// fault-injection suite names (tests/python/test_faults.py, tests/cpp/test_faults.cpp), through the public C++ calls,
// on small problems. Each case must launch, finish without a CUDA error, give finite results to the requests whose
// inputs are valid, and touch no byte outside the buffers (memcheck); with checked mode on, the check kernel runs too
// (and its record is read back and must name the garbage).
//
//   dense decode   block-table entries -1, INT_MIN, INT_MAX, num_blocks in a page a request uses; lengths 2^31 - 1
//                  (with and without the block table's capacity in the plan), -5, INT_MIN; a schedule planned for
//                  other lengths; a one-page cache whose size-1 strides are arbitrary (k_cache.unsqueeze(-2)).
//   sparse decode  indices INT_MIN, INT_MAX, -1, the cache's size, 10^9 in used slots; topk_length above topk and
//                  negative; a NaN sink; a schedule planned with topk_length used by a call without it (the call
//                  that wrote past the split buffers, scaled down: slot 11 of 10), and the other way round.
//   append         slots at and past the cache's size (int32 and int64), negative.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "openmla/checked.h"
#include "openmla/decode.h"
#include "openmla/kv_cache.h"

namespace {

using openmla::DType;
using openmla::KVCacheFormat;
using openmla::make_tensor;
using openmla::Status;

constexpr int32_t kIntMax = std::numeric_limits<int32_t>::max();
constexpr int32_t kIntMin = std::numeric_limits<int32_t>::min();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Exactly the bytes asked for (memcheck then sees an access past a view's last byte).
struct Buffer {
  void* ptr = nullptr;
  Buffer() = default;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() {
    if (ptr) cudaFree(ptr);
  }
  template <typename T>
  T* put(const std::vector<T>& v) {
    if (cudaMalloc(&ptr, v.size() * sizeof(T)) != cudaSuccess) return nullptr;
    if (cudaMemcpy(ptr, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice) != cudaSuccess) return nullptr;
    return static_cast<T*>(ptr);
  }
  template <typename T>
  std::vector<T> get(size_t n) const {
    std::vector<T> v(n);
    if (cudaMemcpy(v.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost) != cudaSuccess) v.clear();
    return v;
  }
};

uint16_t bf16(float v) { return static_cast<__nv_bfloat16_raw>(__float2bfloat16_rn(v)).x; }
float from_bf16(uint16_t b) {
  __nv_bfloat16_raw r;
  r.x = b;
  return __bfloat162float(__nv_bfloat16(r));
}

int g_failed = 0;

void fail(const std::string& name, const std::string& why) {
  std::printf("faults sanitize [%s]: %s\n", name.c_str(), why.c_str());
  ++g_failed;
}

bool ok_status(const std::string& name, const char* what, const Status& st) {
  if (st.is_ok()) return true;
  fail(name, std::string(what) + " failed: " + st.message());
  return false;
}

// With checked mode on: the record must name `needle` (empty: nothing may be recorded).
void expect_checked(const std::string& name, const std::string& needle) {
  const Status st = openmla::checked_mode_status();
  if (needle.empty() ? !st.is_ok() : st.message().find(needle) == std::string::npos)
    fail(name, "checked mode reported \"" + st.message() + "\", expected " + (needle.empty() ? "nothing" : needle));
}

// ---- Dense decode: b = 3, s_q = 2, h_q = 16, h_kv = 1, 8 pages of 64, 4 block-table columns ----------------------
struct DenseSetup {
  std::vector<int32_t> seqlens = {0, 70, 200};
  std::vector<int32_t> plan_lens;                                                      // empty: the call's
  std::vector<int32_t> block_table = {2147480000, 2147480000, 2147480000, 2147480000,  // request 0: empty
                                      5,          2,          2147480000, 2147480000, 7, 0, 3, 6};
  int garbage_req = 2;        // whose results are not checked
  bool check_outputs = true;  // false: a schedule from other lengths leaves the results undefined
  bool capacity = true;       // problem.max_blocks_per_seq given
  bool checked = false;
  std::string checked_needle;
};

void run_dense(const std::string& name, const DenseSetup& s) {
  constexpr int64_t kB = 3, kSq = 2, kHq = 16, kD = 576, kDv = 512, kPage = 64, kCols = 4, kBlocks = 8;
  const openmla::DenseDecodeProblem problem{
      .batch = kB, .s_q = kSq, .h_q = kHq, .causal = true, .max_blocks_per_seq = s.capacity ? kCols : 0};
  openmla::DecodeWorkspaceSizes ws;
  if (!ok_status(name, "workspace sizes", openmla::get_decode_workspace_sizes(problem, &ws))) return;
  std::vector<uint16_t> q(kB * kSq * kHq * kD), k(kBlocks * kPage * kD);
  for (size_t i = 0; i < q.size(); ++i) q[i] = bf16(static_cast<float>(static_cast<int>(i * 37 % 23) - 11) / 16.f);
  for (size_t i = 0; i < k.size(); ++i) k[i] = bf16(static_cast<float>(static_cast<int>(i * 13 % 29) - 14) / 32.f);
  Buffer bq, bk, bbt, blen, bplan, bmeta, bsplits, bcount, bpo, bpl, bout, blse;
  openmla::DenseDecodeArgs a;
  a.q = make_tensor(bq.put(q), DType::kBFloat16, {kB, kSq, kHq, kD});
  a.k_cache = make_tensor(bk.put(k), DType::kBFloat16, {kBlocks, kPage, 1, kD});
  a.block_table = make_tensor(bbt.put(s.block_table), DType::kInt32, {kB, kCols});
  a.cache_seqlens = make_tensor(blen.put(s.seqlens), DType::kInt32, {kB});
  const openmla::TensorRef plan_lens =
      s.plan_lens.empty() ? a.cache_seqlens : make_tensor(bplan.put(s.plan_lens), DType::kInt32, {kB});
  a.schedule.metadata = make_tensor(bmeta.put(std::vector<int32_t>(ws.metadata_ints)), DType::kInt32,
                                    {ws.num_sm_parts, openmla::kDecodeScheduleRecordInts});
  a.schedule.num_splits = make_tensor(bsplits.put(std::vector<int32_t>(kB + 1)), DType::kInt32, {kB + 1});
  a.schedule.merge_counters =
      make_tensor(bcount.put(std::vector<int32_t>(ws.merge_counter_ints)), DType::kInt32, {ws.merge_counter_ints});
  a.split.partial_o =
      make_tensor(bpo.put(std::vector<float>(ws.partial_rows * kDv, kNaN)), DType::kFloat32, {ws.partial_rows, kDv});
  a.split.partial_lse =
      make_tensor(bpl.put(std::vector<float>(ws.partial_rows, kNaN)), DType::kFloat32, {ws.partial_rows});
  a.out = make_tensor(bout.put(std::vector<uint16_t>(kB * kSq * kHq * kDv)), DType::kBFloat16, {kB, kSq, kHq, kDv});
  a.lse = make_tensor(blse.put(std::vector<float>(kB * kHq * kSq)), DType::kFloat32, {kB, kHq, kSq});
  openmla::set_checked_mode(s.checked);
  const bool launched = ok_status(name, "plan_decode", openmla::plan_decode(problem, plan_lens, a.schedule, nullptr)) &&
                        ok_status(name, "dense_decode", openmla::dense_decode(problem, a, nullptr));
  openmla::set_checked_mode(false);
  if (!launched) return;
  const cudaError_t err = cudaDeviceSynchronize();
  if (err != cudaSuccess) return fail(name, std::string("kernels failed: ") + cudaGetErrorString(err));
  if (s.checked) expect_checked(name, s.checked_needle);
  if (!s.check_outputs) return;
  const std::vector<uint16_t> out = bout.get<uint16_t>(kB * kSq * kHq * kDv);
  int bad = 0;
  for (int64_t r = 0; r < kB; ++r)
    if (r != s.garbage_req && s.seqlens[r] > 0)
      for (int64_t i = 0; i < kSq * kHq * kDv; ++i) bad += !std::isfinite(from_bf16(out[r * kSq * kHq * kDv + i]));
  if (bad) fail(name, std::to_string(bad) + " non-finite outputs of valid requests");
}

// One page, b = 1, k_cache.unsqueeze(-2) as torch <= 2.8 exports it (head stride 1), an arbitrary page stride.
void run_dense_one_page(const std::string& name) {
  constexpr int64_t kHq = 64, kD = 576, kDv = 512;
  const openmla::DenseDecodeProblem problem{.batch = 1, .s_q = 1, .h_q = kHq, .max_blocks_per_seq = 1};
  openmla::DecodeWorkspaceSizes ws;
  if (!ok_status(name, "workspace sizes", openmla::get_decode_workspace_sizes(problem, &ws))) return;
  std::vector<uint16_t> q(kHq * kD, bf16(0.25f)), k(64 * kD, bf16(-0.125f));
  Buffer bq, bk, bbt, blen, bmeta, bsplits, bpo, bpl, bout, blse;
  openmla::DenseDecodeArgs a;
  a.q = make_tensor(bq.put(q), DType::kBFloat16, {1, 1, kHq, kD}, {3, 12345, kD, 1});
  a.k_cache = make_tensor(bk.put(k), DType::kBFloat16, {1, 64, 1, kD}, {7, kD, 1, 1});
  a.block_table = make_tensor(bbt.put(std::vector<int32_t>{0}), DType::kInt32, {1, 1}, {0, 0});
  a.cache_seqlens = make_tensor(blen.put(std::vector<int32_t>{50}), DType::kInt32, {1}, {99});
  a.schedule.metadata = make_tensor(bmeta.put(std::vector<int32_t>(ws.metadata_ints)), DType::kInt32,
                                    {ws.num_sm_parts, openmla::kDecodeScheduleRecordInts});
  a.schedule.num_splits = make_tensor(bsplits.put(std::vector<int32_t>(2)), DType::kInt32, {2});
  a.split.partial_o =
      make_tensor(bpo.put(std::vector<float>(ws.partial_rows * kDv)), DType::kFloat32, {ws.partial_rows, kDv});
  a.split.partial_lse = make_tensor(bpl.put(std::vector<float>(ws.partial_rows)), DType::kFloat32, {ws.partial_rows});
  a.out = make_tensor(bout.put(std::vector<uint16_t>(kHq * kDv)), DType::kBFloat16, {1, 1, kHq, kDv}, {1, 1, kDv, 1});
  a.lse = make_tensor(blse.put(std::vector<float>(kHq)), DType::kFloat32, {1, kHq, 1}, {5, 1, 0});
  if (!ok_status(name, "plan_decode", openmla::plan_decode(problem, a.cache_seqlens, a.schedule, nullptr)) ||
      !ok_status(name, "dense_decode", openmla::dense_decode(problem, a, nullptr)))
    return;
  const cudaError_t err = cudaDeviceSynchronize();
  if (err != cudaSuccess) return fail(name, std::string("kernels failed: ") + cudaGetErrorString(err));
  const std::vector<uint16_t> out = bout.get<uint16_t>(kHq * kDv);
  for (uint16_t v : out)  // every key row is the same: out = that row's V = -0.125
    if (from_bf16(v) != -0.125f) return fail(name, "wrong output " + std::to_string(from_bf16(v)));
}

// ---- Sparse decode over a V3.2 FP8 cache (quantised on the GPU) -----------------------------------------------------
struct SparseSetup {
  int64_t b = 2, h_q = 64, topk = 128, pages = 8;
  int num_sms = 0;  // 0: the device's
  std::function<void(std::vector<int32_t>&)> mutate_indices;
  std::vector<int32_t> topk_length;       // empty: not given
  std::vector<int32_t> plan_topk_length;  // empty: plan with the call's (none when the call has none)
  bool plan_without_lengths = false;      // plan without lengths even if the call has them
  int nan_sink_head = -1;                 // >= 0: a sink with NaN there
  bool checked = false;
  std::string checked_needle;
};

void run_sparse(const std::string& name, const SparseSetup& s) {
  constexpr int64_t kPage = 64, kBpt = 656, kD = 576, kDv = 512;
  const int64_t b = s.b, h_q = s.h_q, topk = s.topk, capacity = s.pages * kPage;
  const openmla::SparseDecodeProblem problem{
      .batch = b, .s_q = 1, .h_q = h_q, .page_block_size = kPage, .topk = topk, .num_sms = s.num_sms};
  openmla::DecodeWorkspaceSizes ws;
  if (!ok_status(name, "workspace sizes", openmla::get_decode_workspace_sizes(problem, &ws))) return;
  std::vector<uint16_t> kv(capacity * kD), q(b * h_q * kD);
  for (size_t i = 0; i < kv.size(); ++i) kv[i] = bf16(static_cast<float>(static_cast<int>(i * 13 % 29) - 14) / 32.f);
  for (size_t i = 0; i < q.size(); ++i) q[i] = bf16(static_cast<float>(static_cast<int>(i * 37 % 23) - 11) / 16.f);
  std::vector<int32_t> idx(b * topk);
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<int32_t>((i * 7919) % capacity);
  if (s.mutate_indices) s.mutate_indices(idx);
  std::vector<float> sink(h_q, 0.5f);
  if (s.nan_sink_head >= 0) sink[s.nan_sink_head] = kNaN;
  Buffer bkv, bcache, bq, bidx, blen, bplan, bsink, bmeta, bsplits, bpo, bpl, bout, blse;
  const openmla::TensorRef bf16_cache = make_tensor(bkv.put(kv), DType::kBFloat16, {s.pages, kPage, 1, kD});
  const openmla::TensorRef cache =
      make_tensor(bcache.put(std::vector<uint8_t>(capacity * kBpt)), DType::kUInt8, {s.pages, kPage, 1, kBpt});
  if (!ok_status(name, "quantize", openmla::quantize_kv_cache(bf16_cache, cache, KVCacheFormat::kFp8V32, nullptr)))
    return;
  openmla::SparseDecodeArgs a;
  a.q = make_tensor(bq.put(q), DType::kBFloat16, {b, 1, h_q, kD});
  a.k_cache = cache;
  a.indices = make_tensor(bidx.put(idx), DType::kInt32, {b, 1, topk});
  if (!s.topk_length.empty()) a.topk_length = make_tensor(blen.put(s.topk_length), DType::kInt32, {b});
  if (s.nan_sink_head >= 0) a.attn_sink = make_tensor(bsink.put(sink), DType::kFloat32, {h_q});
  a.schedule.metadata = make_tensor(bmeta.put(std::vector<int32_t>(ws.metadata_ints)), DType::kInt32,
                                    {ws.num_sm_parts, openmla::kDecodeScheduleRecordInts});
  a.schedule.num_splits = make_tensor(bsplits.put(std::vector<int32_t>(b + 1)), DType::kInt32, {b + 1});
  a.split.partial_o =
      make_tensor(bpo.put(std::vector<float>(ws.partial_rows * kDv, kNaN)), DType::kFloat32, {ws.partial_rows, kDv});
  a.split.partial_lse =
      make_tensor(bpl.put(std::vector<float>(ws.partial_rows, kNaN)), DType::kFloat32, {ws.partial_rows});
  a.out = make_tensor(bout.put(std::vector<uint16_t>(b * h_q * kDv)), DType::kBFloat16, {b, 1, h_q, kDv});
  a.lse = make_tensor(blse.put(std::vector<float>(b * h_q)), DType::kFloat32, {b, h_q, 1});
  openmla::TensorRef plan_len = s.plan_without_lengths ? openmla::TensorRef{} : a.topk_length;
  if (!s.plan_topk_length.empty()) plan_len = make_tensor(bplan.put(s.plan_topk_length), DType::kInt32, {b});
  openmla::set_checked_mode(s.checked);
  const bool launched =
      ok_status(name, "plan_decode", openmla::plan_decode(problem, plan_len, {}, a.schedule, nullptr)) &&
      ok_status(name, "sparse_decode", openmla::sparse_decode(problem, a, nullptr));
  openmla::set_checked_mode(false);
  if (!launched) return;
  const cudaError_t err = cudaDeviceSynchronize();
  if (err != cudaSuccess) return fail(name, std::string("kernels failed: ") + cudaGetErrorString(err));
  if (s.checked) expect_checked(name, s.checked_needle);
}

// ---- Append: slots past the cache --------------------------------------------------------------------------------
void run_append(const std::string& name, bool wide, bool checked) {
  constexpr int64_t kPages = 3, kPage = 16, kBpt = 656, kD = 576;
  std::vector<uint16_t> rows(5 * kD, bf16(0.5f));
  Buffer brows, bslots, bcache;
  const openmla::TensorRef new_kv = make_tensor(brows.put(rows), DType::kBFloat16, {5, kD});
  openmla::TensorRef slots;
  if (wide) {
    slots =
        make_tensor(bslots.put(std::vector<int64_t>{0, kPages * kPage, int64_t{1} << 40, -1, 7}), DType::kInt64, {5});
  } else {
    slots = make_tensor(bslots.put(std::vector<int32_t>{0, kPages * kPage, kIntMax, kIntMin, 7}), DType::kInt32, {5});
  }
  const openmla::TensorRef cache =
      make_tensor(bcache.put(std::vector<uint8_t>(kPages * kPage * kBpt)), DType::kUInt8, {kPages, kPage, 1, kBpt});
  openmla::set_checked_mode(checked);
  const bool launched = ok_status(name, "append_kv_cache",
                                  openmla::append_kv_cache(new_kv, slots, cache, KVCacheFormat::kFp8V32, nullptr));
  openmla::set_checked_mode(false);
  if (!launched) return;
  const cudaError_t err = cudaDeviceSynchronize();
  if (err != cudaSuccess) return fail(name, std::string("kernel failed: ") + cudaGetErrorString(err));
  if (checked) expect_checked(name, "argument 'slots'[1] is 48");
}

}  // namespace

// Contract of sanitize_main.cpp: returns the number of failed cases.
int run_faults_sanitize_cases() {
  g_failed = 0;
  (void)openmla::checked_mode_status();  // an empty record to start from
  for (const int32_t v : {-1, kIntMin, kIntMax, 8}) {
    DenseSetup s;
    s.block_table[2 * 4 + 1] = v;
    run_dense("dense block_table " + std::to_string(v), s);
  }
  for (const bool capacity : {true, false}) {
    DenseSetup s;
    s.seqlens[2] = kIntMax;
    s.capacity = capacity;
    run_dense(std::string("dense length 2^31-1") + (capacity ? "" : " (plan without the capacity)"), s);
  }
  for (const int32_t v : {-5, kIntMin}) {
    DenseSetup s;
    s.seqlens[2] = v;
    run_dense("dense length " + std::to_string(v), s);
  }
  {
    DenseSetup s;
    s.plan_lens = {0, 70, 200};
    s.seqlens = {0, 10, 250};  // inside each request's pages: only the schedule is wrong
    s.check_outputs = false;
    s.checked = true;
    s.checked_needle = "argument 'schedule' was planned for other lengths";
    run_dense("dense schedule from other lengths (checked)", s);
  }
  {
    DenseSetup s;
    s.block_table[2 * 4 + 2] = -9;
    s.checked = true;
    s.checked_needle = "argument 'block_table'[2, 2] is -9";
    run_dense("dense block_table -9 (checked)", s);
  }
  run_dense_one_page("dense one page, size-1 strides");

  for (const int32_t v : {kIntMin, kIntMax, -1, 512, 1000000000}) {
    SparseSetup s;
    s.mutate_indices = [v](std::vector<int32_t>& idx) { idx[128 + 3] = v; };
    run_sparse("sparse index " + std::to_string(v), s);
  }
  for (const int32_t v : {129, kIntMax, -7, kIntMin}) {
    SparseSetup s;
    s.topk_length = {100, v};
    run_sparse("sparse topk_length " + std::to_string(v), s);
  }
  {
    SparseSetup s;
    s.nan_sink_head = 5;
    s.mutate_indices = [](std::vector<int32_t>& idx) { idx[7] = kIntMin; };
    s.checked = true;
    s.checked_needle = "argument 'indices'[0, 0, 7] is -2147483648";
    run_sparse("sparse NaN sink and index INT_MIN (checked)", s);
  }
  {
    // The call, scaled down for the sanitizers: planned with topk_length [4096, 0], called without (host
    // records at b = 2). On 8 partitions the device prefix sums used to put a partial at slot 11 of 10 (the issue's
    // b = 2, h_q = 128, topk = 16384 on 132 SMs: slot 83 of 68; tests/cpp/test_faults.cpp replays that one).
    SparseSetup s;
    s.topk = 4096;
    s.pages = 80;
    s.num_sms = 8;
    s.plan_topk_length = {4096, 0};
    run_sparse("sparse planned with topk_length, called without", s);
    s.plan_topk_length.clear();
    s.topk_length = {4096, 0};
    s.plan_without_lengths = true;
    s.checked = true;
    s.checked_needle = "argument 'schedule' was planned for other lengths";
    run_sparse("sparse planned without topk_length, called with (checked)", s);
  }
  run_append("append int32 slots past the cache", false, false);
  run_append("append int64 slots past the cache (checked)", true, true);
  return g_failed;
}
