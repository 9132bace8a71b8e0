// Small dense-decode cases for compute-sanitizer (see sanitize_main.cpp for the contract): the whole
// public call sequence — workspace query, plan_decode (GPU scheduler), dense_decode (main kernel +
// PDL combine) — on tiny problems that hit empty requests, partial pages, split and unsplit requests,
// causal and not, h_kv = 1 and 2, bf16 and fp16. Cache rows past each length and the spare pages hold
// NaN, unused block-table entries hold garbage, so an out-of-bounds use shows up in the checks too.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "openmla/decode.h"
#include "openmla/test_hooks.h"

namespace {

using openmla::DType;
using openmla::Status;

struct Case {
  const char* name;
  int64_t h_kv;
  bool causal;
  bool fp16;
  int num_sms;  // 0: the device's (many partitions, so requests split); 1: one partition, no split
  bool counters = true;         // schedule with merge counters: two-chunk requests merged in the main kernel
  bool publish_always = false;  // test hook: every chunk publishes first; the last publisher merges
  int64_t page = 64;            // tokens per cache page (the any-page kernel for other sizes)
  bool invariant = false;       // batch-invariant schedule: request 2 has 8392 tokens (3 chunks), merged in the main
                                // kernel by the chunk that publishes last (with counters) or by the combine
  bool counters_at_call_only = false;  // planned without counters, called with zeroed ones (the tensor style: its
                                       // plan has none, its calls bring the pool's): the records' request order
};

uint16_t to_bits(float v, bool fp16) {
  if (fp16) return static_cast<__half_raw>(__float2half_rn(v)).x;
  return static_cast<__nv_bfloat16_raw>(__float2bfloat16_rn(v)).x;
}

float from_bits(uint16_t bits, bool fp16) {
  if (fp16) {
    __half_raw raw;
    raw.x = bits;
    return __half2float(__half(raw));
  }
  __nv_bfloat16_raw raw;
  raw.x = bits;
  return __bfloat162float(__nv_bfloat16(raw));
}

template <typename T>
T* upload(const std::vector<T>& v) {
  void* d = nullptr;
  if (cudaMalloc(&d, v.size() * sizeof(T)) != cudaSuccess) return nullptr;
  if (cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice) != cudaSuccess) return nullptr;
  return static_cast<T*>(d);
}

bool report(const char* case_name, const char* what, const Status& st) {
  if (st.is_ok()) return true;
  std::printf("dense_decode sanitize [%s]: %s failed: %s\n", case_name, what, st.message().c_str());
  return false;
}

// Returns true on success.
bool run_case(const Case& c) {
  constexpr int64_t kB = 3, kSq = 2, kHq = 16, kDqk = 576, kDv = 512;
  // Every block table holds 256 tokens (batch-invariant cases: 8448, for a request of 3 chunks of 4096 tokens).
  const int64_t kCapacity = c.invariant ? 8448 : 256;
  const int64_t kPage = c.page, kCols = kCapacity / kPage;
  const std::vector<int32_t> seqlens = {0, 70, c.invariant ? 8392 : 200};
  const int64_t h_kv = c.h_kv;
  // Pages in a permuted order (at page 64: request 1 -> pages {5, 2}, request 2 -> {7, 0, 3, 6}; pages 1 and 4
  // unused), 2 spare pages (NaN) at every page size.
  std::vector<std::vector<int32_t>> pages(kB);
  int64_t num_blocks = 2;
  for (int64_t r = 0; r < kB; ++r) num_blocks += (seqlens[r] + kPage - 1) / kPage;
  {
    std::vector<int32_t> order(num_blocks);
    for (int64_t i = 0; i < num_blocks; ++i) order[i] = static_cast<int32_t>(i);
    if (kPage == 64 && !c.invariant) {
      order = {5, 2, 7, 0, 3, 6, 1, 4};
    } else {
      uint32_t state = 12345;  // a fixed shuffle
      for (int64_t i = num_blocks - 1; i > 0; --i) {
        state = state * 1664525u + 1013904223u;
        std::swap(order[i], order[state % (i + 1)]);
      }
    }
    size_t next = 0;
    for (int64_t r = 0; r < kB; ++r)
      for (int64_t j = 0; j < (seqlens[r] + kPage - 1) / kPage; ++j) pages[r].push_back(order[next++]);
  }
  const DType dtype = c.fp16 ? DType::kFloat16 : DType::kBFloat16;

  const openmla::DenseDecodeProblem problem{
      .batch = kB,
      .s_q = kSq,
      .h_q = kHq,
      .h_kv = h_kv,
      .page_block_size = kPage,
      .cache_format = c.fp16 ? openmla::KVCacheFormat::kFloat16 : openmla::KVCacheFormat::kBFloat16,
      .causal = c.causal,
      .num_sms = c.num_sms,
      .max_blocks_per_seq = c.invariant ? kCols : 0,
      .batch_invariant = c.invariant,
  };
  openmla::DecodeWorkspaceSizes ws;
  if (!report(c.name, "get_decode_workspace_sizes", openmla::get_decode_workspace_sizes(problem, &ws))) return false;

  // Inputs: a simple deterministic pattern of small exact values.
  std::vector<uint16_t> q(kB * kSq * kHq * kDqk);
  for (size_t i = 0; i < q.size(); ++i) q[i] = to_bits(static_cast<float>(static_cast<int>(i * 37 % 23) - 11) / 16.f, c.fp16);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<uint16_t> k(num_blocks * kPage * h_kv * kDqk, to_bits(nan, c.fp16));
  std::vector<int32_t> block_table(kB * kCols, 2147480000);  // garbage in unused entries
  for (int64_t r = 0; r < kB; ++r) {
    for (size_t j = 0; j < pages[r].size(); ++j) {
      block_table[r * kCols + j] = pages[r][j];
      for (int64_t t = 0; t < kPage; ++t) {
        if (static_cast<int64_t>(j) * kPage + t >= seqlens[r]) break;  // tail rows stay NaN
        for (int64_t h = 0; h < h_kv; ++h)
          for (int64_t d = 0; d < kDqk; ++d) {
            const int64_t token = static_cast<int64_t>(j) * kPage + t;
            const int v = static_cast<int>((token * 13 + d * 7 + h * 5 + r) % 29) - 14;
            k[((pages[r][j] * kPage + t) * h_kv + h) * kDqk + d] = to_bits(static_cast<float>(v) / 32.f, c.fp16);
          }
      }
    }
  }

  uint16_t* d_q = upload(q);
  uint16_t* d_k = upload(k);
  int32_t* d_bt = upload(block_table);
  int32_t* d_len = upload(seqlens);
  int32_t* d_meta = upload(std::vector<int32_t>(ws.metadata_ints, 0));
  int32_t* d_splits = upload(std::vector<int32_t>(ws.num_splits_ints, 0));
  // Garbage in the counters: plan_decode must zero them (zeros where the plan does not see them).
  int32_t* d_counters = upload(std::vector<int32_t>(ws.merge_counter_ints, c.counters_at_call_only ? 0 : 0x5a5a5a5a));
  float* d_po = upload(std::vector<float>(ws.partial_rows * kDv, nan));
  float* d_pl = upload(std::vector<float>(ws.partial_rows, nan));
  uint16_t* d_out = upload(std::vector<uint16_t>(kB * kSq * kHq * kDv, to_bits(nan, c.fp16)));
  float* d_lse = upload(std::vector<float>(kB * kHq * kSq, nan));
  bool ok = d_q && d_k && d_bt && d_len && d_meta && d_splits && d_counters && d_po && d_pl && d_out && d_lse;
  if (!ok) std::printf("dense_decode sanitize [%s]: allocation or upload failed\n", c.name);

  using openmla::make_tensor;
  openmla::DenseDecodeArgs args;
  args.q = make_tensor(d_q, dtype, {kB, kSq, kHq, kDqk});
  args.k_cache = make_tensor(d_k, dtype, {num_blocks, kPage, h_kv, kDqk});
  args.block_table = make_tensor(d_bt, DType::kInt32, {kB, kCols});
  args.cache_seqlens = make_tensor(d_len, DType::kInt32, {kB});
  args.schedule.metadata = make_tensor(d_meta, DType::kInt32, {ws.num_sm_parts, openmla::kDecodeScheduleRecordInts});
  args.schedule.num_splits = make_tensor(d_splits, DType::kInt32, {ws.num_splits_ints});
  if (c.counters && !c.counters_at_call_only)
    args.schedule.merge_counters = make_tensor(d_counters, DType::kInt32, {ws.merge_counter_ints});
  args.split.partial_o = make_tensor(d_po, DType::kFloat32, {ws.partial_rows, kDv});
  args.split.partial_lse = make_tensor(d_pl, DType::kFloat32, {ws.partial_rows});
  args.out = make_tensor(d_out, dtype, {kB, kSq, kHq, kDv});
  // lse stored (b, s_q, h_q) and viewed as (b, h_q, s_q), as the Python layer returns it.
  args.lse = make_tensor(d_lse, DType::kFloat32, {kB, kHq, kSq}, {kSq * kHq, 1, kHq});

  cudaStream_t stream = nullptr;
  if (ok) ok = cudaStreamCreate(&stream) == cudaSuccess;
  if (ok) ok = report(c.name, "plan_decode", openmla::plan_decode(problem, args.cache_seqlens, args.schedule, stream));
  if (c.counters_at_call_only) args.schedule.merge_counters = make_tensor(d_counters, DType::kInt32, {ws.merge_counter_ints});
  const openmla::test_hooks::DenseDecodeOptions options{.merge_publish_always = c.publish_always};
  if (ok) ok = report(c.name, "dense_decode", openmla::test_hooks::dense_decode(problem, args, options, stream));
  if (ok) {
    const cudaError_t err = cudaStreamSynchronize(stream);
    if (err != cudaSuccess) {
      std::printf("dense_decode sanitize [%s]: kernels failed: %s\n", c.name, cudaGetErrorString(err));
      ok = false;
    }
  }

  // Light result checks: request 0 is empty (out 0, lse +inf); every other value is finite.
  int bad = 0;
  if (ok) {
    std::vector<uint16_t> out(kB * kSq * kHq * kDv);
    std::vector<float> lse(kB * kHq * kSq);
    std::vector<int32_t> splits(kB + 1);
    std::vector<int32_t> counters(ws.merge_counter_ints);
    ok = cudaMemcpy(counters.data(), d_counters, counters.size() * 4, cudaMemcpyDeviceToHost) == cudaSuccess &&
         cudaMemcpy(out.data(), d_out, out.size() * 2, cudaMemcpyDeviceToHost) == cudaSuccess &&
         cudaMemcpy(lse.data(), d_lse, lse.size() * 4, cudaMemcpyDeviceToHost) == cudaSuccess &&
         cudaMemcpy(splits.data(), d_splits, splits.size() * 4, cudaMemcpyDeviceToHost) == cudaSuccess;
    for (int64_t r = 0; ok && r < kB; ++r) {
      for (int64_t s = 0; s < kSq; ++s) {
        // Causal, bottom-right: position s sees keys j <= L - s_q + s; none when that is negative.
        const bool no_keys = seqlens[r] == 0 || (c.causal && seqlens[r] - kSq + s < 0);
        for (int64_t h = 0; h < kHq; ++h) {
          const float l = lse[(r * kSq + s) * kHq + h];
          if (no_keys ? !(std::isinf(l) && l > 0) : !std::isfinite(l)) ++bad;
          for (int64_t d = 0; d < kDv; ++d) {
            const float o = from_bits(out[((r * kSq + s) * kHq + h) * kDv + d], c.fp16);
            if (no_keys ? o != 0.f : !std::isfinite(o)) ++bad;
          }
        }
      }
    }
    // A schedule with counters: plan_decode zeroed them and the call left them zero. A batch-invariant plan with
    // counters keeps its walk order's successor list after them (the last kB ints): a chain through every request
    // from the one nobody names, -1 after the last (docs/decode-schedule.md, decision schedule-v5).
    const bool listed = c.counters && c.invariant && !c.counters_at_call_only;
    const int64_t counter_ints = ws.merge_counter_ints - (c.invariant ? kB : 0);
    for (int64_t i = 0; i < ws.merge_counter_ints; ++i)
      if (c.counters && (i < counter_ints || !listed) && counters[i] != 0) ++bad;
    if (listed) {
      std::vector<int> named(kB, 0);
      for (int64_t r = 0; r < kB; ++r) {
        const int32_t n = counters[counter_ints + r];
        if (n >= 0 && n < kB && n != r) ++named[n];
        else if (n != -1) ++bad;
      }
      int64_t req = -1, visited = 0;
      for (int64_t r = 0; r < kB; ++r)
        if (named[r] == 0) req = r;  // the walk's first request (one at most in a chain)
      for (; req >= 0 && req < kB && visited <= kB; ++visited) req = counters[counter_ints + req];
      if (visited != kB) ++bad;
    }
    int two_chunk = 0;
    for (int64_t r = 0; r < kB; ++r) two_chunk += splits[r + 1] - splits[r] == 2;
    if (bad) std::printf("dense_decode sanitize [%s]: %d unexpected output or counter values\n", c.name, bad);
    std::printf("dense_decode sanitize [%s]: %d two-chunk request(s)\n", c.name, two_chunk);
    std::printf("dense_decode sanitize [%s]: num_sm_parts %d, split slots %d, %s\n", c.name, ws.num_sm_parts,
                splits[kB], bad == 0 && ok ? "ok" : "FAILED");
  }

  if (stream) cudaStreamDestroy(stream);
  for (void* p : {static_cast<void*>(d_q), static_cast<void*>(d_k), static_cast<void*>(d_bt),
                  static_cast<void*>(d_len), static_cast<void*>(d_meta), static_cast<void*>(d_splits),
                  static_cast<void*>(d_counters),
                  static_cast<void*>(d_po), static_cast<void*>(d_pl), static_cast<void*>(d_out),
                  static_cast<void*>(d_lse)})
    if (p) cudaFree(p);
  return ok && bad == 0;
}

}  // namespace

// Contract of sanitize_main.cpp: returns the number of failed cases.
int run_dense_decode_sanitize_cases() {
  const Case cases[] = {
      {"h_kv=1 causal bf16 split", 1, true, false, 0},
      {"h_kv=2 bf16 split", 2, false, false, 0},
      {"h_kv=2 causal fp16 split", 2, true, true, 0},
      {"h_kv=1 causal bf16 one partition", 1, true, false, 1},
      // 8 partitions: request 2 (200 tokens) is split into two chunks (3 + 1 blocks), merged in the main kernel,
      // once by the chunk that finds the other done, once (hook) by the last of two publishers.
      {"h_kv=1 causal bf16 two-chunk merge", 1, true, false, 8},
      {"h_kv=1 bf16 two-chunk merge, both publish", 1, false, false, 8, true, true},
      {"h_kv=1 causal bf16 split, no counters", 1, true, false, 0, false},
      // Other page sizes (docs/dense-decode.md, "Page sizes"): 16 (4 pages per 64-token block, lengths 70 and 200
      // end inside a page), 32 with h_kv = 2 fp16, 256 (a block is a quarter of a page), each split and merged.
      {"page 16 h_kv=1 causal bf16 two-chunk merge", 1, true, false, 8, true, false, 16},
      {"page 16 h_kv=1 bf16 split, no counters", 1, false, false, 0, false, false, 16},
      {"page 32 h_kv=2 causal fp16 split", 2, true, true, 0, true, false, 32},
      {"page 256 h_kv=1 causal bf16 two-chunk merge", 1, true, false, 8, true, false, 256},
      // The gather kernel (page sizes 1-8: "Small pages: the gather kernel"): page 1 (a slot list), merged and split;
      // page 8 with h_kv = 2 fp16 (a page's last rows NaN past the lengths); page 2 through the combine.
      {"page 1 h_kv=1 causal bf16 two-chunk merge", 1, true, false, 8, true, false, 1},
      {"page 1 h_kv=1 bf16 two-chunk merge, both publish", 1, false, false, 8, true, true, 1},
      {"page 8 h_kv=2 causal fp16 split", 2, true, true, 0, true, false, 8},
      {"page 2 h_kv=1 bf16 split, no counters", 1, false, false, 0, false, false, 2},
      // Batch-invariant schedules (docs/decode-schedule.md, "Batch invariance"): request 2's three chunks merged in
      // the main kernel by the last publisher (page 64; page 1: the gather kernel's twin), or by the combine.
      {"batch-invariant h_kv=1 causal bf16 3-chunk merge", 1, true, false, 0, true, false, 64, true},
      {"batch-invariant page 16 h_kv=2 fp16 3-chunk merge", 2, false, true, 0, true, false, 16, true},
      {"batch-invariant page 1 h_kv=1 causal bf16 3-chunk merge", 1, true, false, 0, true, false, 1, true},
      {"batch-invariant h_kv=1 bf16, no counters", 1, false, false, 0, false, false, 64, true},
      // One partition (every request in one record): planned without counters, called with zeroed ones.
      {"batch-invariant h_kv=1 bf16 one partition, counters at the call only", 1, false, false, 1, true, false, 64,
       true, true},
  };
  int failed = 0;
  for (const Case& c : cases) failed += run_case(c) ? 0 : 1;
  return failed;
}
