// Small FP8 dense-decode cases for compute-sanitizer (see sanitize_main.cpp for the contract): the whole public call
// sequence — workspace query, plan_decode, dense_decode_fp8 (main kernel + PDL combine) — on tiny problems with empty
// requests, partial pages, split and unsplit requests, several requests per partition, causal and not, pages of 64 and
// 7 tokens, q bf16 and e4m3, scales as device tensors and host values. Cache rows past each length and the spare pages
// hold e4m3 NaN, unused block-table entries hold garbage; the results are checked against a host reference.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "api/dense_decode_fp8_internal.h"
#include "device_buffer.h"
#include "openmla/dense_decode_fp8.h"
#include "sanitize_random.h"

namespace {

using openmla::DType;
using openmla::Status;
using openmla_sanitize::DeviceBuffer;

constexpr int kD = 576, kDv = 512;

float e4m3_value(uint8_t b) {
  const int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
  const float mag = e == 0 ? std::ldexp(static_cast<float>(m) / 8.f, -6) : std::ldexp(1.f + m / 8.f, e - 7);
  return s ? -mag : mag;
}
// A random finite e4m3 code of magnitude in [2^-3, 2^1) (never the NaN codes 0x7F / 0xFF).
uint8_t random_e4m3(uint32_t& st) {
  const uint32_t r = openmla_sanitize::next(st);
  const uint32_t e = 4 + r % 4, m = (r >> 4) & 7, s = (r >> 8) & 1;
  return static_cast<uint8_t>(s << 7 | e << 3 | m);
}
uint16_t bf16_bits(float v) { return static_cast<__nv_bfloat16_raw>(__float2bfloat16_rn(v)).x; }
float bf16_value(uint16_t bits) {
  __nv_bfloat16_raw raw;
  raw.x = bits;
  return __bfloat162float(__nv_bfloat16(raw));
}

struct Case {
  const char* name;
  int b, s_q, h_q, page;
  bool causal, q_fp8, scale_tensors;
  int num_sms;  // 0: the device's (requests split); 1: one partition
  openmla::detail::DenseDecodeFp8Options options = {};  // the kernel variants of the benchmark's A/Bs
};

template <typename T>
bool upload(DeviceBuffer& d, const std::vector<T>& v) {
  return d.ptr != nullptr && cudaMemcpy(d.ptr, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice) == cudaSuccess;
}

int run_case(const Case& c) {
  uint32_t st = 12345u + static_cast<uint32_t>(c.b * 31 + c.h_q * 7 + c.page);
  const std::vector<int> lens_all = {130, 0, 64, 5, 300, 1, 71};
  std::vector<int32_t> lens(lens_all.begin(), lens_all.begin() + c.b);
  int max_pages = 1, total_pages = 2;  // two spare pages
  for (int L : lens) {
    const int n = (L + c.page - 1) / c.page;
    max_pages = std::max(max_pages, n);
    total_pages += n;
  }
  const float dq = 0.03f, dk = 0.0625f * 1.3f;
  // Cache: NaN everywhere, then the used rows.
  std::vector<uint8_t> cache(static_cast<size_t>(total_pages) * c.page * kD, 0x7F);
  std::vector<int32_t> table(static_cast<size_t>(c.b) * max_pages, 2147480000);
  int next_page = total_pages - 1;  // pages handed out from the end: page ids differ from positions
  for (int i = 0; i < c.b; ++i) {
    const int n = (lens[i] + c.page - 1) / c.page;
    for (int j = 0; j < n; ++j) {
      const int pg = next_page--;
      table[static_cast<size_t>(i) * max_pages + j] = pg;
      for (int r = 0; r < c.page && j * c.page + r < lens[i]; ++r)
        for (int d = 0; d < kD; ++d) cache[(static_cast<size_t>(pg) * c.page + r) * kD + d] = random_e4m3(st);
    }
  }
  const size_t q_elems = static_cast<size_t>(c.b) * c.s_q * c.h_q * kD;
  std::vector<uint8_t> q8(q_elems);
  std::vector<uint16_t> q16(q_elems);
  std::vector<float> qv(q_elems);
  for (size_t i = 0; i < q_elems; ++i) {
    if (c.q_fp8) {
      q8[i] = random_e4m3(st);
      qv[i] = e4m3_value(q8[i]) * dq;
    } else {
      q16[i] = bf16_bits(openmla_sanitize::uniform(st) * 0.5f);
      qv[i] = bf16_value(q16[i]);
    }
  }

  openmla::DenseDecodeProblem p;
  p.batch = c.b;
  p.s_q = c.s_q;
  p.h_q = c.h_q;
  p.h_kv = 1;
  p.page_block_size = c.page;
  p.cache_format = openmla::KVCacheFormat::kFp8E4M3;
  p.causal = c.causal;
  p.num_sms = c.num_sms;
  p.max_blocks_per_seq = max_pages;
  openmla::DecodeWorkspaceSizes sizes;
  Status s = openmla::get_decode_workspace_sizes(p, &sizes);
  if (!s.is_ok()) {
    std::printf("  %s: workspace sizes: %s\n", c.name, s.message().c_str());
    return 1;
  }
  const size_t out_elems = static_cast<size_t>(c.b) * c.s_q * c.h_q * kDv;
  const size_t lse_elems = static_cast<size_t>(c.b) * c.s_q * c.h_q;
  DeviceBuffer d_q(c.q_fp8 ? q8.size() : q16.size() * 2), d_cache(cache.size()), d_table(table.size() * 4),
      d_lens(lens.size() * 4), d_meta(sizes.metadata_ints * 4), d_splits(sizes.num_splits_ints * 4),
      d_po(sizes.partial_o_bytes), d_pl(sizes.partial_lse_bytes), d_out(out_elems * 2), d_lse(lse_elems * 4),
      d_dq(4), d_dk(4);
  bool ok = c.q_fp8 ? upload(d_q, q8) : upload(d_q, q16);
  ok = ok && upload(d_cache, cache) && upload(d_table, table) && upload(d_lens, lens) &&
       upload(d_dq, std::vector<float>{dq}) && upload(d_dk, std::vector<float>{dk});
  ok = ok && d_meta.ptr && d_splits.ptr && d_po.ptr && d_pl.ptr && d_out.ptr && d_lse.ptr &&
       cudaMemset(d_out.ptr, 0xFF, out_elems * 2) == cudaSuccess && cudaMemset(d_lse.ptr, 0xFF, lse_elems * 4) == cudaSuccess;
  if (!ok) {
    std::printf("  %s: allocation / upload failed\n", c.name);
    return 1;
  }
  openmla::DecodeSchedule sched;
  sched.metadata = openmla::make_tensor(d_meta.ptr, DType::kInt32, {sizes.num_sm_parts, 8});
  sched.num_splits = openmla::make_tensor(d_splits.ptr, DType::kInt32, {c.b + 1});
  const openmla::TensorRef lens_t = openmla::make_tensor(d_lens.ptr, DType::kInt32, {c.b});
  s = openmla::plan_decode(p, lens_t, sched, nullptr);
  openmla::DenseDecodeFp8Args a;
  a.q = openmla::make_tensor(d_q.ptr, c.q_fp8 ? DType::kFloat8E4M3 : DType::kBFloat16, {c.b, c.s_q, c.h_q, kD});
  a.k_cache = openmla::make_tensor(d_cache.ptr, DType::kFloat8E4M3, {total_pages, c.page, 1, kD});
  a.block_table = openmla::make_tensor(d_table.ptr, DType::kInt32, {c.b, max_pages});
  a.cache_seqlens = lens_t;
  if (c.scale_tensors) {
    if (c.q_fp8) a.descale_q = openmla::make_tensor(d_dq.ptr, DType::kFloat32, {1});
    a.descale_k = openmla::make_tensor(d_dk.ptr, DType::kFloat32, {1});
  } else {
    if (c.q_fp8) a.descale_q_value = dq;
    a.descale_k_value = dk;
  }
  a.schedule = sched;
  a.split.partial_o = openmla::make_tensor(d_po.ptr, DType::kFloat32, {sizes.partial_rows, kDv});
  a.split.partial_lse = openmla::make_tensor(d_pl.ptr, DType::kFloat32, {sizes.partial_rows});
  a.out = openmla::make_tensor(d_out.ptr, DType::kBFloat16, {c.b, c.s_q, c.h_q, kDv});
  a.lse = openmla::make_tensor(d_lse.ptr, DType::kFloat32, {c.b, c.h_q, c.s_q},
                               {static_cast<int64_t>(c.s_q) * c.h_q, 1, c.h_q});
  if (s.is_ok()) s = openmla::detail::run_dense_decode_fp8(p, a, c.options, nullptr);
  if (!s.is_ok()) {
    std::printf("  %s: %s\n", c.name, s.message().c_str());
    return 1;
  }
  if (cudaDeviceSynchronize() != cudaSuccess) {
    std::printf("  %s: kernel error %s\n", c.name, cudaGetErrorString(cudaGetLastError()));
    return 1;
  }
  std::vector<uint16_t> out(out_elems);
  std::vector<float> lse(lse_elems);
  cudaMemcpy(out.data(), d_out.ptr, out_elems * 2, cudaMemcpyDeviceToHost);
  cudaMemcpy(lse.data(), d_lse.ptr, lse_elems * 4, cudaMemcpyDeviceToHost);

  // Host reference over the dequantised values.
  const float scale = 1.f / std::sqrt(static_cast<float>(kD));
  int bad = 0;
  for (int i = 0; i < c.b; ++i) {
    const int L = lens[i];
    std::vector<float> kv(static_cast<size_t>(L) * kD);
    for (int t = 0; t < L; ++t) {
      const int pg = table[static_cast<size_t>(i) * max_pages + t / c.page];
      for (int d = 0; d < kD; ++d)
        kv[static_cast<size_t>(t) * kD + d] = e4m3_value(cache[(static_cast<size_t>(pg) * c.page + t % c.page) * kD + d]) * dk;
    }
    for (int si = 0; si < c.s_q; ++si) {
      const int border = c.causal ? L - (c.s_q - 1 - si) : L;
      for (int h = 0; h < c.h_q; ++h) {
        const float* qrow = &qv[((static_cast<size_t>(i) * c.s_q + si) * c.h_q + h) * kD];
        std::vector<double> logit(std::max(border, 0));
        double mx = -INFINITY;
        for (int t = 0; t < border; ++t) {
          double acc = 0;
          for (int d = 0; d < kD; ++d) acc += static_cast<double>(qrow[d]) * kv[static_cast<size_t>(t) * kD + d];
          logit[t] = acc * scale;
          mx = std::max(mx, logit[t]);
        }
        double sum = 0;
        for (int t = 0; t < border; ++t) sum += std::exp(logit[t] - mx);
        const double ref_lse = border > 0 ? mx + std::log(sum) : INFINITY;
        const float got_lse = lse[(static_cast<size_t>(i) * c.s_q + si) * c.h_q + h];
        if (!(std::isinf(ref_lse) ? std::isinf(got_lse) && got_lse > 0 : std::fabs(got_lse - ref_lse) < 2e-3)) {
          if (bad++ < 3) std::printf("  %s: lse[%d,%d,%d] = %g, expected %g\n", c.name, i, si, h, got_lse, ref_lse);
        }
        for (int d = 0; d < kDv; ++d) {
          double o = 0;
          for (int t = 0; t < border; ++t) o += std::exp(logit[t] - mx) * kv[static_cast<size_t>(t) * kD + d];
          o = border > 0 ? o / sum : 0.0;
          const float got = bf16_value(out[((static_cast<size_t>(i) * c.s_q + si) * c.h_q + h) * kDv + d]);
          if (!(std::fabs(got - o) <= 2e-2 + 2e-2 * std::fabs(o))) {
            if (bad++ < 3) std::printf("  %s: out[%d,%d,%d,%d] = %g, expected %g\n", c.name, i, si, h, d, got, o);
          }
        }
      }
    }
  }
  if (bad) std::printf("  %s: %d mismatches\n", c.name, bad);
  return bad ? 1 : 0;
}

}  // namespace

int run_dense_decode_fp8_sanitize_cases() {
  const Case cases[] = {
      {"b3 sq2 hq16 p64 causal split", 3, 2, 16, 64, true, false, true, 0},
      {"b4 sq1 hq128 p64 qfp8 split", 4, 1, 128, 64, false, true, true, 0},
      {"b5 sq2 hq40 p7 causal one partition", 5, 2, 40, 7, true, false, false, 1},
      {"b7 sq1 hq16 p64 qfp8 host scales 3 partitions", 7, 1, 16, 64, false, true, false, 3},
      {"b4 sq2 hq64 p64 causal early Q K^T held split", 4, 2, 64, 64, true, false, true, 0,
       {.hold_pv_r = openmla::detail::HoldPvR::kOn, .early_qk = true}},
      {"b5 sq1 hq16 p7 early Q K^T not held, no L1 allocation", 5, 1, 16, 7, false, true, true, 0,
       {.hold_pv_r = openmla::detail::HoldPvR::kOff, .k_l1_no_allocate = true, .early_qk = true}},
  };
  int failed = 0;
  for (const Case& c : cases) failed += run_case(c);
  return failed;
}
