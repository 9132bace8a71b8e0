// Small sparse-decode cases for compute-sanitizer (see sanitize_main.cpp for the contract): the whole public
// call sequence — get_decode_workspace_sizes, plan_decode (GPU scheduler), sparse_decode (main kernel + PDL
// combine) — over FP8 caches built on the GPU with the library's own quantize_kv_cache.
//
// Code paths covered: V3.2 layout with h_q = 128 (CTA-cluster path), 64, 16, 8 and 1 (partial 64-head tiles;
// MODEL1 too at 32); MODEL1 layout with an extra cache,
// topk_length, extra_topk_length and attn_sink (finite and +-inf heads), at h_q 64 and 128; page sizes 64 and 61
// (main and extra); topk not a multiple of 64; requests shorter than topk (-1 padding), -1 sprinkled through every
// index row, a request whose every slot is invalid; a split schedule (b = 2, s_q = 1, topk = 2048 over the device's
// SMs) and a one-partition schedule.
//
// Every token that no USED slot references (slot < topk_length and index != -1) is NaN before quantisation, the
// pages past each request's length and the spare pages included; index slots at or past topk_length hold either
// such a poisoned token or garbage (2147480000). The FP8 caches are allocated to the exact bytes their views span.
// So a read of a token the kernel must not touch shows up as a NaN in out (and memcheck flags a garbage index).
// Checks: a query row with at least one used slot has finite out and lse; a row with none has out = 0, lse = +inf.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <utility>
#include <vector>

#include "openmla/decode.h"
#include "openmla/kv_cache.h"
#include "openmla_ref/numeric.h"

namespace {

using openmla::DType;
using openmla::KVCacheFormat;
using openmla::Status;
using openmla::make_tensor;

constexpr int64_t kDv = 512;
constexpr int32_t kGarbageIndex = 2147480000;
constexpr float kInf = std::numeric_limits<float>::infinity();

struct Case {
  const char* name;
  KVCacheFormat format;
  int64_t b, s_q, h_q, topk, page;
  std::vector<int32_t> lens;         // tokens in the cache of each request (b values)
  bool sink;
  std::vector<int32_t> topk_length;  // empty: not given
  // Extra cache (MODEL1 only in FlashMLA; any layout here): extra_topk == 0 means none.
  int64_t extra_topk = 0, extra_page = 0;
  std::vector<int32_t> extra_lens = {};
  std::vector<int32_t> extra_topk_length = {};
  int num_sms = 0;        // 0: the device's SMs (requests split); 1: one partition (no split)
  bool expect_split = false;
};

// Exactly `bytes` of device memory (so memcheck sees any access past a view's last byte).
struct DeviceBuffer {
  void* ptr = nullptr;
  DeviceBuffer() = default;
  ~DeviceBuffer() { release(); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  bool allocate(size_t bytes) {
    release();
    if (bytes == 0 || cudaMalloc(&ptr, bytes) != cudaSuccess) ptr = nullptr;
    return ptr != nullptr;
  }
  void release() {
    if (ptr) cudaFree(ptr);
    ptr = nullptr;
  }
};

template <typename T>
bool upload(DeviceBuffer& buf, const std::vector<T>& v) {
  return buf.allocate(v.size() * sizeof(T)) &&
         cudaMemcpy(buf.ptr, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice) == cudaSuccess;
}

struct Lcg {
  uint32_t s;
  uint32_t next() { return s = s * 1664525u + 1013904223u; }
  float uniform() { return static_cast<float>(next() >> 8) / 16777216.0f; }  // [0, 1)
  uint32_t below(uint32_t n) { return static_cast<uint32_t>((static_cast<uint64_t>(next()) * n) >> 32); }
};

// One paged FP8 cache and the index rows that select from it.
struct CacheSide {
  CacheSide(const char* what_, KVCacheFormat format_, int64_t page_, int64_t topk_)
      : what(what_), format(format_), page(page_), topk(topk_) {}
  const char* what;
  KVCacheFormat format;
  int64_t page, topk, num_blocks = 0, page_stride = 0, d = 0, bpt = 0;
  std::vector<int32_t> indices;  // (b, s_q, topk)
  std::vector<uint8_t> used;     // per token slot of the cache: referenced by a used slot
  DeviceBuffer bf16, fp8, idx;
};

// Pages of each request scattered through a permutation; per (request, position) distinct random positions
// < len in random order (-1 past len, and every 7th slot from 3 on); slots >= topk_length are unused and hold a
// poisoned token or garbage. Marks the tokens of used slots.
void build_indices(CacheSide& c, int64_t b, int64_t s_q, const std::vector<int32_t>& lens,
                   const std::vector<int32_t>& topk_length, uint32_t seed) {
  Lcg rng{seed};
  std::vector<int64_t> first_page(b + 1, 0);
  for (int64_t r = 0; r < b; ++r) first_page[r + 1] = first_page[r] + (lens[r] + c.page - 1) / c.page;
  c.num_blocks = first_page[b] + 2;  // two spare pages, never referenced (NaN)
  std::vector<int32_t> perm(c.num_blocks);
  for (int64_t i = 0; i < c.num_blocks; ++i) perm[i] = static_cast<int32_t>(i);
  for (int64_t i = c.num_blocks - 1; i > 0; --i) std::swap(perm[i], perm[rng.below(static_cast<uint32_t>(i + 1))]);
  c.used.assign(c.num_blocks * c.page, 0);
  c.indices.assign(b * s_q * c.topk, -1);
  for (int64_t r = 0; r < b; ++r) {
    const int64_t len = lens[r];
    const int64_t limit = topk_length.empty() ? c.topk : std::min<int64_t>(std::max(topk_length[r], 0), c.topk);
    std::vector<int32_t> pos(len);
    for (int64_t s = 0; s < s_q; ++s) {
      for (int64_t i = 0; i < len; ++i) pos[i] = static_cast<int32_t>(i);
      const int64_t take = std::min(len, c.topk);
      for (int64_t i = 0; i < take; ++i) std::swap(pos[i], pos[i + rng.below(static_cast<uint32_t>(len - i))]);
      int32_t* row = &c.indices[(r * s_q + s) * c.topk];
      for (int64_t j = 0; j < take; ++j) {
        const int64_t p = pos[j];
        row[j] = static_cast<int32_t>(perm[first_page[r] + p / c.page] * c.page + p % c.page);
      }
      for (int64_t j = 3; j < c.topk; j += 7) row[j] = -1;
      for (int64_t j = 0; j < c.topk; ++j) {
        if (j < limit) {
          if (row[j] >= 0) c.used[row[j]] = 1;
        } else if (j % 2 == 1) {
          row[j] = kGarbageIndex;  // past topk_length: must never be dereferenced
        }  // even slots past topk_length keep their token, which stays NaN unless another used slot takes it
      }
    }
  }
}

// bf16 values: used tokens a pattern in [-1, 1) / 4, every other token NaN; quantised on the GPU into an FP8
// buffer of exactly the bytes the strided view spans.
bool build_cache(CacheSide& c, const char* case_name, cudaStream_t stream) {
  c.d = openmla::kv_cache_fp8_head_dim(c.format);
  c.bpt = openmla::kv_cache_bytes_per_token(c.format, c.d);
  c.page_stride = (c.page * c.bpt + 15) / 16 * 16;
  const int64_t tokens = c.num_blocks * c.page;
  const uint16_t nan_bits = openmla::ref::float_to_bf16(std::numeric_limits<float>::quiet_NaN());
  std::vector<uint16_t> host(tokens * c.d, nan_bits);
  Lcg rng{static_cast<uint32_t>(tokens * 31 + c.d)};
  for (int64_t t = 0; t < tokens; ++t) {
    if (!c.used[t]) continue;
    for (int64_t i = 0; i < c.d; ++i)
      host[t * c.d + i] = openmla::ref::float_to_bf16((rng.uniform() * 2.f - 1.f) * 0.25f);
  }
  const size_t fp8_bytes = static_cast<size_t>((c.num_blocks - 1) * c.page_stride + c.page * c.bpt);
  if (!upload(c.bf16, host)) return false;
  if (!c.fp8.allocate(fp8_bytes) || cudaMemset(c.fp8.ptr, 0xFF, fp8_bytes) != cudaSuccess) return false;
  const auto src = make_tensor(c.bf16.ptr, DType::kBFloat16, {c.num_blocks, c.page, 1, c.d});
  const auto dst = make_tensor(c.fp8.ptr, DType::kUInt8, {c.num_blocks, c.page, 1, c.bpt},
                               {c.page_stride, c.bpt, c.bpt, 1});
  const Status st = openmla::quantize_kv_cache(src, dst, c.format, stream);
  if (!st.is_ok()) {
    std::printf("sparse_decode sanitize [%s]: quantize_kv_cache (%s cache) failed: %s\n", case_name, c.what,
                st.message().c_str());
    return false;
  }
  return upload(c.idx, c.indices);
}

bool report(const char* case_name, const char* what, const Status& st) {
  if (st.is_ok()) return true;
  std::printf("sparse_decode sanitize [%s]: %s failed: %s\n", case_name, what, st.message().c_str());
  return false;
}

bool run_case(const Case& c) {
  const int64_t d_qk = openmla::kv_cache_fp8_head_dim(c.format);
  const bool extra = c.extra_topk > 0;
  cudaStream_t stream = nullptr;
  if (cudaStreamCreate(&stream) != cudaSuccess) {
    std::printf("sparse_decode sanitize [%s]: cudaStreamCreate failed\n", c.name);
    return false;
  }

  CacheSide main_side{"main", c.format, c.page, c.topk};
  CacheSide extra_side{"extra", c.format, c.extra_page, c.extra_topk};
  build_indices(main_side, c.b, c.s_q, c.lens, c.topk_length, 7u + static_cast<uint32_t>(c.topk * 131 + c.h_q));
  bool ok = build_cache(main_side, c.name, stream);
  if (ok && extra) {
    build_indices(extra_side, c.b, c.s_q, c.extra_lens, c.extra_topk_length, 99u + static_cast<uint32_t>(c.extra_topk));
    ok = build_cache(extra_side, c.name, stream);
  }

  const openmla::SparseDecodeProblem problem{
      .batch = c.b,
      .s_q = c.s_q,
      .h_q = c.h_q,
      .d_qk = d_qk,
      .d_v = kDv,
      .page_block_size = c.page,
      .cache_format = c.format,
      .topk = c.topk,
      .extra_topk = c.extra_topk,
      .extra_page_block_size = extra ? c.extra_page : 0,
      .num_sms = c.num_sms,
  };
  openmla::DecodeWorkspaceSizes ws;
  if (ok) ok = report(c.name, "get_decode_workspace_sizes", openmla::get_decode_workspace_sizes(problem, &ws));

  const float nan = std::numeric_limits<float>::quiet_NaN();
  const int64_t rows = c.b * c.s_q * c.h_q;
  std::vector<uint16_t> q(rows * d_qk);
  for (size_t i = 0; i < q.size(); ++i)
    q[i] = openmla::ref::float_to_bf16(static_cast<float>(static_cast<int>(i * 37 % 23) - 11) / 16.f);
  std::vector<float> sink(c.h_q);
  for (int64_t h = 0; h < c.h_q; ++h) sink[h] = h == 0 ? kInf : h == 1 ? -kInf : static_cast<float>(h % 9) * 0.5f - 2.f;

  DeviceBuffer d_q, d_sink, d_tl, d_etl, d_meta, d_splits, d_po, d_pl, d_out, d_lse;
  if (ok) {
    ok = upload(d_q, q) && (!c.sink || upload(d_sink, sink)) &&
         (c.topk_length.empty() || upload(d_tl, c.topk_length)) &&
         (c.extra_topk_length.empty() || upload(d_etl, c.extra_topk_length)) &&
         upload(d_meta, std::vector<int32_t>(ws.metadata_ints, 0)) &&
         upload(d_splits, std::vector<int32_t>(ws.num_splits_ints, 0)) &&
         upload(d_po, std::vector<float>(ws.partial_rows * kDv, nan)) &&
         upload(d_pl, std::vector<float>(ws.partial_rows, nan)) &&
         upload(d_out, std::vector<uint16_t>(rows * kDv, openmla::ref::float_to_bf16(nan))) &&
         upload(d_lse, std::vector<float>(rows, nan));
    if (!ok) std::printf("sparse_decode sanitize [%s]: allocation or upload failed\n", c.name);
  }

  openmla::SparseDecodeArgs args;
  openmla::TensorRef topk_length_t, extra_topk_length_t;
  if (ok) {
    args.q = make_tensor(d_q.ptr, DType::kBFloat16, {c.b, c.s_q, c.h_q, d_qk});
    args.k_cache = make_tensor(main_side.fp8.ptr, DType::kUInt8, {main_side.num_blocks, c.page, 1, main_side.bpt},
                               {main_side.page_stride, main_side.bpt, main_side.bpt, 1});
    args.indices = make_tensor(main_side.idx.ptr, DType::kInt32, {c.b, c.s_q, c.topk});
    if (!c.topk_length.empty()) topk_length_t = make_tensor(d_tl.ptr, DType::kInt32, {c.b});
    args.topk_length = topk_length_t;
    if (c.sink) args.attn_sink = make_tensor(d_sink.ptr, DType::kFloat32, {c.h_q});
    if (extra) {
      args.extra_k_cache =
          make_tensor(extra_side.fp8.ptr, DType::kUInt8, {extra_side.num_blocks, c.extra_page, 1, extra_side.bpt},
                      {extra_side.page_stride, extra_side.bpt, extra_side.bpt, 1});
      args.extra_indices = make_tensor(extra_side.idx.ptr, DType::kInt32, {c.b, c.s_q, c.extra_topk});
      if (!c.extra_topk_length.empty()) extra_topk_length_t = make_tensor(d_etl.ptr, DType::kInt32, {c.b});
      args.extra_topk_length = extra_topk_length_t;
    }
    args.softmax_scale = 0.f;  // d_qk ** -0.5
    args.schedule.metadata =
        make_tensor(d_meta.ptr, DType::kInt32, {ws.num_sm_parts, openmla::kDecodeScheduleRecordInts});
    args.schedule.num_splits = make_tensor(d_splits.ptr, DType::kInt32, {c.b + 1});
    args.split.partial_o = make_tensor(d_po.ptr, DType::kFloat32, {ws.partial_rows, kDv});
    args.split.partial_lse = make_tensor(d_pl.ptr, DType::kFloat32, {ws.partial_rows});
    args.out = make_tensor(d_out.ptr, DType::kBFloat16, {c.b, c.s_q, c.h_q, kDv});
    // lse stored (b, s_q, h_q) and viewed as (b, h_q, s_q), as the Python layer returns it.
    args.lse = make_tensor(d_lse.ptr, DType::kFloat32, {c.b, c.h_q, c.s_q}, {c.s_q * c.h_q, 1, c.h_q});
  }
  if (ok)
    ok = report(c.name, "plan_decode",
                openmla::plan_decode(problem, topk_length_t, extra_topk_length_t, args.schedule, stream));
  if (ok) ok = report(c.name, "sparse_decode", openmla::sparse_decode(problem, args, stream));
  if (ok) {
    const cudaError_t err = cudaStreamSynchronize(stream);
    if (err != cudaSuccess) {
      std::printf("sparse_decode sanitize [%s]: kernels failed: %s\n", c.name, cudaGetErrorString(err));
      ok = false;
    }
  }

  int bad = 0;
  if (ok) {
    std::vector<uint16_t> out(rows * kDv);
    std::vector<float> lse(rows);
    std::vector<int32_t> splits(c.b + 1);
    ok = cudaMemcpy(out.data(), d_out.ptr, out.size() * 2, cudaMemcpyDeviceToHost) == cudaSuccess &&
         cudaMemcpy(lse.data(), d_lse.ptr, lse.size() * 4, cudaMemcpyDeviceToHost) == cudaSuccess &&
         cudaMemcpy(splits.data(), d_splits.ptr, splits.size() * 4, cudaMemcpyDeviceToHost) == cudaSuccess;
    int first_bad_r = -1, first_bad_s = -1, first_bad_h = -1;
    for (int64_t r = 0; ok && r < c.b; ++r) {
      for (int64_t s = 0; s < c.s_q; ++s) {
        // Does this query row have a used slot (valid index below topk_length) in either cache?
        bool any = false;
        auto scan = [&](const CacheSide& side, const std::vector<int32_t>& tl) {
          const int64_t limit = tl.empty() ? side.topk : std::min<int64_t>(std::max(tl[r], 0), side.topk);
          const int32_t* row = &side.indices[(r * c.s_q + s) * side.topk];
          for (int64_t j = 0; j < limit && !any; ++j) any = row[j] >= 0;
        };
        scan(main_side, c.topk_length);
        if (extra) scan(extra_side, c.extra_topk_length);
        for (int64_t h = 0; h < c.h_q; ++h) {
          const float l = lse[(r * c.s_q + s) * c.h_q + h];
          int row_bad = any ? !std::isfinite(l) : !(std::isinf(l) && l > 0);
          for (int64_t d = 0; d < kDv; ++d) {
            const float o = openmla::ref::bf16_to_float(out[((r * c.s_q + s) * c.h_q + h) * kDv + d]);
            if (any ? !std::isfinite(o) : o != 0.f) ++row_bad;
          }
          if (row_bad && first_bad_r < 0) {
            first_bad_r = static_cast<int>(r);
            first_bad_s = static_cast<int>(s);
            first_bad_h = static_cast<int>(h);
          }
          bad += row_bad;
        }
      }
    }
    if (bad)
      std::printf("sparse_decode sanitize [%s]: %d unexpected output values (first at request %d, position %d, "
                  "head %d)\n", c.name, bad, first_bad_r, first_bad_s, first_bad_h);
    if (ok && c.expect_split && splits[c.b] <= c.b) {
      std::printf("sparse_decode sanitize [%s]: expected a split schedule, got %d split slots for %lld requests "
                  "(the case no longer covers the combine path)\n", c.name, splits[c.b],
                  static_cast<long long>(c.b));
      ++bad;
    }
    std::printf("sparse_decode sanitize [%s]: num_sm_parts %d, split slots %d, %s\n", c.name, ws.num_sm_parts,
                ok ? splits[c.b] : -1, bad == 0 && ok ? "ok" : "FAILED");
  }
  cudaStreamDestroy(stream);
  return ok && bad == 0;
}

}  // namespace

// Contract of sanitize_main.cpp: returns the number of failed cases.
int run_sparse_decode_sanitize_cases() {
  const KVCacheFormat v32 = KVCacheFormat::kFp8V32, model1 = KVCacheFormat::kFp8Model1;
  std::vector<Case> cases;
  // V3.2, h_q = 128 (two 64-head CTAs in a cluster): request 1 shorter than topk (-1 padding), request 2 empty
  // (every slot -1: out 0, lse +inf), topk not a multiple of 64.
  cases.push_back({"v32 h_q=128 cluster, page 64, short + empty request", v32, 3, 2, 128, 160, 64, {300, 90, 0}, true, {}});
  // V3.2, h_q = 64, page 61 (pages straddle the 64-slot blocks), s_q = 3.
  cases.push_back({"v32 h_q=64 page 61", v32, 2, 3, 64, 192, 61, {400, 250}, false, {}});
  // V3.2, h_q = 16 (a partial 64-head tile), sink on.
  cases.push_back({"v32 h_q=16 sink", v32, 2, 1, 16, 64, 64, {130, 64}, true, {}});
  // Few heads (the plain kernel's partial 64-head tile): MODEL1 h_q = 32 with an extra cache, lengths and a sink; V3.2
  // h_q = 8 split over the device's SMs (partials + combine); h_q = 1 in one partition (request switches).
  {
    Case c{"model1 h_q=32 extra + topk_length + sink", model1, 3, 2, 32, 128, 61, {300, 200, 150}, true,
           {128, 37, 0}};
    c.extra_topk = 64;
    c.extra_page = 64;
    c.extra_lens = {100, 80, 70};
    c.extra_topk_length = {64, 10, 0};
    cases.push_back(c);
  }
  {
    Case c{"v32 h_q=8 split b=2 topk=2048", v32, 2, 1, 8, 2048, 64, {4096, 2500}, true, {}};
    c.expect_split = true;
    cases.push_back(c);
  }
  {
    Case c{"v32 h_q=1 one partition", v32, 3, 2, 1, 128, 64, {200, 64, 129}, true, {}};
    c.num_sms = 1;
    cases.push_back(c);
  }
  // MODEL1 with an extra cache (page 61), topk_length and extra_topk_length (0 and partial values), sink;
  // request 2 has no used slot in either cache.
  {
    Case c{"model1 h_q=64 extra page 61 + topk_length + sink", model1, 3, 2, 64, 128, 64, {300, 200, 150}, true,
           {128, 37, 0}};
    c.extra_topk = 64;
    c.extra_page = 61;
    c.extra_lens = {100, 80, 70};
    c.extra_topk_length = {64, 10, 0};
    cases.push_back(c);
  }
  // MODEL1, h_q = 128 (cluster path) with an extra cache (page 64) and topk_length, no extra_topk_length.
  {
    Case c{"model1 h_q=128 extra + topk_length", model1, 2, 1, 128, 128, 61, {200, 500}, true, {100, 128}};
    c.extra_topk = 128;
    c.extra_page = 64;
    c.extra_lens = {140, 129};
    cases.push_back(c);
  }
  // Split: b = 2, s_q = 1, topk 2048 over the device's SMs: each request is split and the combine kernel runs.
  {
    Case c{"v32 h_q=128 split b=2 topk=2048", v32, 2, 1, 128, 2048, 64, {4096, 2500}, true, {}};
    c.expect_split = true;
    cases.push_back(c);
  }
  {
    Case c{"v32 h_q=64 split b=2 topk=2048", v32, 2, 1, 64, 2048, 64, {3000, 4096}, false, {}};
    c.expect_split = true;
    cases.push_back(c);
  }
  // One partition: every request in one piece, one after another, no combine.
  {
    Case c{"v32 h_q=64 one partition", v32, 3, 2, 64, 128, 64, {200, 64, 129}, true, {}};
    c.num_sms = 1;
    cases.push_back(c);
  }
  // The same with crossover clusters (h_q = 128) and MODEL1: the request switches inside a partition, where
  // the producer loads each later request's Q (q_free / q_full) while the consumers write the last outputs.
  {
    Case c{"v32 h_q=128 one partition", v32, 3, 2, 128, 128, 64, {200, 64, 129}, true, {}};
    c.num_sms = 1;
    cases.push_back(c);
  }
  {
    Case c{"model1 h_q=128 one partition", model1, 3, 1, 128, 192, 64, {300, 90, 0}, false, {}};
    c.num_sms = 1;
    cases.push_back(c);
  }
  int failed = 0;
  for (const Case& c : cases) failed += run_case(c) ? 0 : 1;
  return failed;
}
