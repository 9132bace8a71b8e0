// Small cases of decode with per-request query lengths (DenseDecodeProblem::varlen_q, SparseDecodeProblem::varlen_q)
// for compute-sanitizer (see sanitize_main.cpp for the contract): get_decode_workspace_sizes, plan_decode with
// seqused_q (the lengths kernel, then the scheduler), and the call, on problems whose requests have 0, 1 and up to s_q
// query rows, with split and unsplit requests, page 64 and 32, causal and not (dense), an FP8 V3.2 cache at h_q 128
// and 64 (sparse). Query rows past each request's length, cache rows past each length and the spare pages hold NaN;
// sparse index rows past a request's length hold garbage (2147480000) and are never read. Checks: a row past its
// request's length has out = 0 and lse = +inf; every other value is finite.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <vector>

#include "openmla/decode.h"
#include "openmla/kv_cache.h"
#include "openmla_ref/numeric.h"

namespace {

using openmla::DType;
using openmla::KVCacheFormat;
using openmla::make_tensor;
using openmla::Status;

constexpr int64_t kDv = 512;
const float kNaN = std::numeric_limits<float>::quiet_NaN();

uint16_t bf16(float v) { return openmla::ref::float_to_bf16(v); }
float from_bf16(uint16_t b) { return openmla::ref::bf16_to_float(b); }

// Device buffers freed at the end of a case.
struct Buffers {
  std::vector<void*> ptrs;
  ~Buffers() {
    for (void* p : ptrs) cudaFree(p);
  }
  template <typename T>
  T* upload(const std::vector<T>& v) {
    void* d = nullptr;
    if (cudaMalloc(&d, v.size() * sizeof(T) + 16) != cudaSuccess) return nullptr;
    ptrs.push_back(d);
    if (cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice) != cudaSuccess) return nullptr;
    return static_cast<T*>(d);
  }
};

bool report(const char* family, const char* name, const char* what, const Status& st) {
  if (st.is_ok()) return true;
  std::printf("decode_varlen_q sanitize [%s %s]: %s failed: %s\n", family, name, what, st.message().c_str());
  return false;
}

// Checks the (b, s_q, h_q, 512) bf16 out and the (b, s_q, h_q)-stored lse: rows past seqused (and rows without a
// visible key) exactly 0 / +inf, the others finite. Returns the number of bad values.
int check_rows(const std::vector<uint16_t>& out, const std::vector<float>& lse, int64_t b, int64_t s_q, int64_t h_q,
               const std::vector<int32_t>& used, const std::vector<bool>& no_keys) {
  int bad = 0;
  for (int64_t r = 0; r < b; ++r)
    for (int64_t s = 0; s < s_q; ++s) {
      const bool empty = s >= used[r] || no_keys[r * s_q + s];
      for (int64_t h = 0; h < h_q; ++h) {
        const float l = lse[(r * s_q + s) * h_q + h];
        if (empty ? !(std::isinf(l) && l > 0) : !std::isfinite(l)) ++bad;
        for (int64_t d = 0; d < kDv; ++d) {
          const float o = from_bf16(out[((r * s_q + s) * h_q + h) * kDv + d]);
          if (empty ? o != 0.f : !std::isfinite(o)) ++bad;
        }
      }
    }
  return bad;
}

struct DenseCase {
  const char* name;
  int64_t h_q, page;
  bool causal;
  int num_sms;  // 0: the device's (requests split); 1: one partition
};

bool run_dense(const DenseCase& c) {
  constexpr int64_t kB = 4, kSq = 3, kDqk = 576, kCapacity = 256;
  const std::vector<int32_t> seqlens = {70, 200, 1, 130};
  const std::vector<int32_t> used = {0, 3, 1, 2};
  const int64_t page = c.page, cols = kCapacity / page;
  int64_t num_blocks = 2;  // spare pages
  for (int32_t L : seqlens) num_blocks += (L + page - 1) / page;
  const openmla::DenseDecodeProblem problem{.batch = kB, .s_q = kSq, .h_q = c.h_q, .h_kv = 1, .page_block_size = page,
                                            .causal = c.causal, .num_sms = c.num_sms, .varlen_q = true};
  openmla::DecodeWorkspaceSizes ws;
  if (!report("dense", c.name, "get_decode_workspace_sizes", openmla::get_decode_workspace_sizes(problem, &ws)))
    return false;
  std::vector<uint16_t> q(kB * kSq * c.h_q * kDqk);
  for (int64_t r = 0; r < kB; ++r)
    for (int64_t s = 0; s < kSq; ++s)
      for (int64_t i = 0; i < c.h_q * kDqk; ++i)
        q[(r * kSq + s) * c.h_q * kDqk + i] =
            s < used[r] ? bf16(static_cast<float>(static_cast<int>((i * 37 + s) % 23) - 11) / 16.f) : bf16(kNaN);
  std::vector<uint16_t> k(num_blocks * page * kDqk, bf16(kNaN));
  std::vector<int32_t> bt(kB * cols, 2147480000);
  int32_t next = 1;  // page 0 is a spare
  for (int64_t r = 0; r < kB; ++r)
    for (int64_t j = 0; j * page < seqlens[r]; ++j) {
      bt[r * cols + j] = next;
      for (int64_t t = 0; t < page && j * page + t < seqlens[r]; ++t)
        for (int64_t d = 0; d < kDqk; ++d)
          k[(next * page + t) * kDqk + d] = bf16(static_cast<float>(static_cast<int>((t * 13 + d * 7 + r) % 29) - 14) / 32.f);
      ++next;
    }
  Buffers mem;
  auto* d_q = mem.upload(q);
  auto* d_k = mem.upload(k);
  auto* d_bt = mem.upload(bt);
  auto* d_len = mem.upload(seqlens);
  auto* d_used = mem.upload(used);
  auto* d_meta = mem.upload(std::vector<int32_t>(ws.metadata_ints, 0));
  auto* d_splits = mem.upload(std::vector<int32_t>(ws.num_splits_ints, 0));
  auto* d_counters = mem.upload(std::vector<int32_t>(ws.merge_counter_ints, 0x5a5a5a5a));
  auto* d_vl = mem.upload(std::vector<int32_t>(ws.varlen_ints, -7));
  auto* d_po = mem.upload(std::vector<float>(ws.partial_rows * kDv, kNaN));
  auto* d_pl = mem.upload(std::vector<float>(ws.partial_rows, kNaN));
  auto* d_out = mem.upload(std::vector<uint16_t>(kB * kSq * c.h_q * kDv, bf16(kNaN)));
  auto* d_lse = mem.upload(std::vector<float>(kB * kSq * c.h_q, kNaN));
  if (!(d_q && d_k && d_bt && d_len && d_used && d_meta && d_splits && d_counters && d_vl && d_po && d_pl && d_out &&
        d_lse)) {
    std::printf("decode_varlen_q sanitize [dense %s]: allocation or upload failed\n", c.name);
    return false;
  }
  openmla::DenseDecodeArgs a;
  a.q = make_tensor(d_q, DType::kBFloat16, {kB, kSq, c.h_q, kDqk});
  a.k_cache = make_tensor(d_k, DType::kBFloat16, {num_blocks, page, 1, kDqk});
  a.block_table = make_tensor(d_bt, DType::kInt32, {kB, cols});
  a.cache_seqlens = make_tensor(d_len, DType::kInt32, {kB});
  a.seqused_q = make_tensor(d_used, DType::kInt32, {kB});
  a.schedule.metadata = make_tensor(d_meta, DType::kInt32, {ws.num_sm_parts, openmla::kDecodeScheduleRecordInts});
  a.schedule.num_splits = make_tensor(d_splits, DType::kInt32, {kB + 1});
  a.schedule.merge_counters = make_tensor(d_counters, DType::kInt32, {ws.merge_counter_ints});
  a.schedule.varlen_lengths = make_tensor(d_vl, DType::kInt32, {ws.varlen_ints});
  a.split.partial_o = make_tensor(d_po, DType::kFloat32, {ws.partial_rows, kDv});
  a.split.partial_lse = make_tensor(d_pl, DType::kFloat32, {ws.partial_rows});
  a.out = make_tensor(d_out, DType::kBFloat16, {kB, kSq, c.h_q, kDv});
  a.lse = make_tensor(d_lse, DType::kFloat32, {kB, c.h_q, kSq}, {kSq * c.h_q, 1, c.h_q});
  bool ok = report("dense", c.name, "plan_decode",
                   openmla::plan_decode(problem, a.cache_seqlens, a.seqused_q, a.schedule, nullptr)) &&
            report("dense", c.name, "dense_decode", openmla::dense_decode(problem, a, nullptr));
  if (ok && cudaDeviceSynchronize() != cudaSuccess) {
    std::printf("decode_varlen_q sanitize [dense %s]: kernels failed\n", c.name);
    return false;
  }
  if (!ok) return false;
  std::vector<uint16_t> out(kB * kSq * c.h_q * kDv);
  std::vector<float> lse(kB * kSq * c.h_q);
  cudaMemcpy(out.data(), d_out, out.size() * 2, cudaMemcpyDeviceToHost);
  cudaMemcpy(lse.data(), d_lse, lse.size() * 4, cudaMemcpyDeviceToHost);
  std::vector<bool> no_keys(kB * kSq, false);
  for (int64_t r = 0; r < kB; ++r)
    for (int64_t s = 0; s < used[r]; ++s)  // causal, bottom-right per request: keys < L - used + 1 + s
      no_keys[r * kSq + s] = c.causal && seqlens[r] - used[r] + 1 + s <= 0;
  const int bad = check_rows(out, lse, kB, kSq, c.h_q, used, no_keys);
  std::printf("decode_varlen_q sanitize [dense %s]: num_sm_parts %d, %s\n", c.name, ws.num_sm_parts,
              bad == 0 ? "ok" : "FAILED");
  if (bad) std::printf("decode_varlen_q sanitize [dense %s]: %d unexpected values\n", c.name, bad);
  return bad == 0;
}

bool run_sparse(const char* name, int64_t h_q, int num_sms) {
  constexpr int64_t kB = 3, kSq = 2, kTopk = 100, kPage = 64, kBlocks = 6;
  const KVCacheFormat format = KVCacheFormat::kFp8V32;
  const int64_t d = openmla::kv_cache_fp8_head_dim(format), bpt = openmla::kv_cache_bytes_per_token(format, d);
  const std::vector<int32_t> used = {2, 0, 1};
  const std::vector<int32_t> topk_length = {80, 100, 3};
  const openmla::SparseDecodeProblem problem{.batch = kB, .s_q = kSq, .h_q = h_q, .d_qk = d, .page_block_size = kPage,
                                             .cache_format = format, .topk = kTopk, .num_sms = num_sms,
                                             .varlen_q = true};
  openmla::DecodeWorkspaceSizes ws;
  if (!report("sparse", name, "get_decode_workspace_sizes", openmla::get_decode_workspace_sizes(problem, &ws)))
    return false;
  // Tokens 0 .. 255 hold data; the rest of the cache (2 pages) is NaN.
  const int64_t tokens = kBlocks * kPage, data_tokens = 256;
  std::vector<uint16_t> kv(tokens * d, bf16(kNaN));
  for (int64_t t = 0; t < data_tokens; ++t)
    for (int64_t i = 0; i < d; ++i) kv[t * d + i] = bf16(static_cast<float>(static_cast<int>((t * 7 + i * 3) % 31) - 15) / 64.f);
  std::vector<int32_t> idx(kB * kSq * kTopk, 2147480000);
  for (int64_t r = 0; r < kB; ++r)
    for (int64_t s = 0; s < used[r]; ++s)
      for (int64_t j = 0; j < kTopk; ++j)
        idx[(r * kSq + s) * kTopk + j] = j < topk_length[r] ? static_cast<int32_t>((j * 5 + r * 11 + s) % data_tokens) : -1;
  std::vector<uint16_t> q(kB * kSq * h_q * d);
  for (int64_t r = 0; r < kB; ++r)
    for (int64_t s = 0; s < kSq; ++s)
      for (int64_t i = 0; i < h_q * d; ++i)
        q[(r * kSq + s) * h_q * d + i] = s < used[r] ? bf16(static_cast<float>(static_cast<int>(i % 17) - 8) / 16.f) : bf16(kNaN);
  Buffers mem;
  auto* d_kv = mem.upload(kv);
  uint8_t* d_fp8 = mem.upload(std::vector<uint8_t>(tokens * bpt, 0xFF));
  auto* d_idx = mem.upload(idx);
  auto* d_q = mem.upload(q);
  auto* d_used = mem.upload(used);
  auto* d_tl = mem.upload(topk_length);
  auto* d_meta = mem.upload(std::vector<int32_t>(ws.metadata_ints, 0));
  auto* d_splits = mem.upload(std::vector<int32_t>(ws.num_splits_ints, 0));
  auto* d_counters = mem.upload(std::vector<int32_t>(ws.merge_counter_ints, 0));
  auto* d_vl = mem.upload(std::vector<int32_t>(ws.varlen_ints, -7));
  auto* d_po = mem.upload(std::vector<float>(ws.partial_rows * kDv, kNaN));
  auto* d_pl = mem.upload(std::vector<float>(ws.partial_rows, kNaN));
  auto* d_out = mem.upload(std::vector<uint16_t>(kB * kSq * h_q * kDv, bf16(kNaN)));
  auto* d_lse = mem.upload(std::vector<float>(kB * kSq * h_q, kNaN));
  if (!(d_kv && d_fp8 && d_idx && d_q && d_used && d_tl && d_meta && d_splits && d_counters && d_vl && d_po && d_pl &&
        d_out && d_lse)) {
    std::printf("decode_varlen_q sanitize [sparse %s]: allocation or upload failed\n", name);
    return false;
  }
  const auto cache = make_tensor(d_fp8, DType::kUInt8, {kBlocks, kPage, 1, bpt});
  if (!report("sparse", name, "quantize_kv_cache",
              openmla::quantize_kv_cache(make_tensor(d_kv, DType::kBFloat16, {kBlocks, kPage, 1, d}), cache, format,
                                         nullptr)))
    return false;
  openmla::SparseDecodeArgs a;
  a.q = make_tensor(d_q, DType::kBFloat16, {kB, kSq, h_q, d});
  a.k_cache = cache;
  a.indices = make_tensor(d_idx, DType::kInt32, {kB, kSq, kTopk});
  a.topk_length = make_tensor(d_tl, DType::kInt32, {kB});
  a.seqused_q = make_tensor(d_used, DType::kInt32, {kB});
  a.schedule.metadata = make_tensor(d_meta, DType::kInt32, {ws.num_sm_parts, openmla::kDecodeScheduleRecordInts});
  a.schedule.num_splits = make_tensor(d_splits, DType::kInt32, {ws.num_splits_ints});
  a.schedule.merge_counters = make_tensor(d_counters, DType::kInt32, {ws.merge_counter_ints});
  a.schedule.varlen_lengths = make_tensor(d_vl, DType::kInt32, {ws.varlen_ints});
  a.split.partial_o = make_tensor(d_po, DType::kFloat32, {ws.partial_rows, kDv});
  a.split.partial_lse = make_tensor(d_pl, DType::kFloat32, {ws.partial_rows});
  a.out = make_tensor(d_out, DType::kBFloat16, {kB, kSq, h_q, kDv});
  a.lse = make_tensor(d_lse, DType::kFloat32, {kB, h_q, kSq}, {kSq * h_q, 1, h_q});
  bool ok = report("sparse", name, "plan_decode",
                   openmla::plan_decode(problem, a.topk_length, openmla::TensorRef{}, a.seqused_q, a.schedule,
                                        nullptr)) &&
            report("sparse", name, "sparse_decode", openmla::sparse_decode(problem, a, nullptr));
  if (ok && cudaDeviceSynchronize() != cudaSuccess) {
    std::printf("decode_varlen_q sanitize [sparse %s]: kernels failed\n", name);
    return false;
  }
  if (!ok) return false;
  std::vector<uint16_t> out(kB * kSq * h_q * kDv);
  std::vector<float> lse(kB * kSq * h_q);
  cudaMemcpy(out.data(), d_out, out.size() * 2, cudaMemcpyDeviceToHost);
  cudaMemcpy(lse.data(), d_lse, lse.size() * 4, cudaMemcpyDeviceToHost);
  const int bad = check_rows(out, lse, kB, kSq, h_q, used, std::vector<bool>(kB * kSq, false));
  std::printf("decode_varlen_q sanitize [sparse %s]: num_sm_parts %d, %s\n", name, ws.num_sm_parts,
              bad == 0 ? "ok" : "FAILED");
  if (bad) std::printf("decode_varlen_q sanitize [sparse %s]: %d unexpected values\n", name, bad);
  return bad == 0;
}

}  // namespace

// Contract of sanitize_main.cpp: returns the number of failed cases.
int run_decode_varlen_q_sanitize_cases() {
  const DenseCase dense[] = {
      {"h_q=16 causal page 64 split", 16, 64, true, 0},
      {"h_q=128 causal page 64 split", 128, 64, true, 0},
      {"h_q=64 page 64 one partition", 64, 64, false, 1},
      {"h_q=16 causal page 32 split", 16, 32, true, 0},
  };
  int failed = 0;
  for (const DenseCase& c : dense) failed += run_dense(c) ? 0 : 1;
  failed += run_sparse("v32 h_q=128", 128, 0) ? 0 : 1;
  failed += run_sparse("v32 h_q=64 one partition", 64, 1) ? 0 : 1;
  return failed;
}
