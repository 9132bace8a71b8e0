// Sanitizer cases of the sparse prefill kernel (run by openmla_sanitize under compute-sanitizer memcheck, racecheck,
// synccheck): small calls through the public C++ API for both head dimensions, h_q 128 / 64 / 16 / 100, odd topk,
// per-token topk_length, the sink, garbage indices (INT_MIN, -1, s_kv, INT_MAX), tokens without a valid slot, and a
// grid smaller than the tile count (the persistent loop crosses tiles). Buffers are cudaMalloc'ed to the exact size
// of the views, so an out-of-bounds access is a memcheck error; results are compared with the CPU reference.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <vector>

#include "device_buffer.h"
#include "sanitize_random.h"
#include "openmla/prefill.h"
#include "openmla_ref/attention.h"
#include "openmla_ref/numeric.h"

namespace {

using openmla::DType;
using openmla::make_tensor;

using openmla_sanitize::DeviceBuffer;

struct Case {
  int d_qk, h_q, s_q, s_kv, topk;
  bool lengths, sink;
  int num_sms;  // persistent CTAs
};

using openmla_sanitize::next;
using openmla_sanitize::uniform;

bool close(float got, double want, double abs_tol, double rel_tol) {
  if (std::isinf(want) || std::isnan(want)) return std::isinf(got) == std::isinf(want) && (got > 0) == (want > 0);
  const double err = std::fabs(got - want);
  return err <= abs_tol || err <= rel_tol * std::fabs(want);
}

bool run_case(const Case& c) {
  const int d_v = 512;
  uint32_t state = 777u + static_cast<uint32_t>(c.s_q * 131 + c.topk * 7 + c.h_q + c.d_qk);
  std::vector<uint16_t> q(static_cast<size_t>(c.s_q) * c.h_q * c.d_qk), kv(static_cast<size_t>(c.s_kv) * c.d_qk);
  for (auto& v : q) v = openmla::ref::float_to_bf16(uniform(state) * 2.f);
  for (auto& v : kv) v = openmla::ref::float_to_bf16(uniform(state));
  std::vector<int32_t> idx(static_cast<size_t>(c.s_q) * c.topk), lengths(c.s_q);
  const int32_t garbage[] = {std::numeric_limits<int32_t>::min(), -1, c.s_kv, std::numeric_limits<int32_t>::max()};
  for (int t = 0; t < c.s_q; ++t) {
    const bool none_valid = t % 5 == 3;
    for (int j = 0; j < c.topk; ++j) {
      const uint32_t r = next(state);
      idx[static_cast<size_t>(t) * c.topk + j] =
          none_valid || r % 7 == 0 ? garbage[r % 4] : static_cast<int32_t>(r % static_cast<uint32_t>(c.s_kv));
    }
    lengths[t] = t % 4 == 0 ? c.topk + 5 : static_cast<int32_t>(next(state) % static_cast<uint32_t>(c.topk + 1));
  }
  std::vector<float> sink(c.h_q);
  for (int h = 0; h < c.h_q; ++h) sink[h] = h % 7 == 1 ? INFINITY : h % 7 == 2 ? -INFINITY : uniform(state) * 4.f;

  const size_t out_elems = static_cast<size_t>(c.s_q) * c.h_q * d_v, stat_elems = static_cast<size_t>(c.s_q) * c.h_q;
  DeviceBuffer dq(q.size() * 2), dkv(kv.size() * 2), didx(idx.size() * 4), dlen(lengths.size() * 4),
      dsink(sink.size() * 4), dout(out_elems * 2), dmax(stat_elems * 4), dlse(stat_elems * 4);
  if (!dq.ptr || !dkv.ptr || !didx.ptr || !dlen.ptr || !dsink.ptr || !dout.ptr || !dmax.ptr || !dlse.ptr) return false;
  cudaMemcpy(dq.ptr, q.data(), q.size() * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(dkv.ptr, kv.data(), kv.size() * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(didx.ptr, idx.data(), idx.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(dlen.ptr, lengths.data(), lengths.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(dsink.ptr, sink.data(), sink.size() * 4, cudaMemcpyHostToDevice);
  cudaMemset(dout.ptr, 0xff, out_elems * 2);  // NaN: every element must be written
  cudaMemset(dmax.ptr, 0xff, stat_elems * 4);
  cudaMemset(dlse.ptr, 0xff, stat_elems * 4);

  openmla::SparsePrefillArgs a;
  a.q = make_tensor(dq.ptr, DType::kBFloat16, {c.s_q, c.h_q, c.d_qk});
  a.kv = make_tensor(dkv.ptr, DType::kBFloat16, {c.s_kv, 1, c.d_qk});
  a.indices = make_tensor(didx.ptr, DType::kInt32, {c.s_q, 1, c.topk});
  if (c.lengths) a.topk_length = make_tensor(dlen.ptr, DType::kInt32, {c.s_q});
  if (c.sink) a.attn_sink = make_tensor(dsink.ptr, DType::kFloat32, {c.h_q});
  a.softmax_scale = 0.11f;
  a.out = make_tensor(dout.ptr, DType::kBFloat16, {c.s_q, c.h_q, d_v});
  a.max_logits = make_tensor(dmax.ptr, DType::kFloat32, {c.s_q, c.h_q});
  a.lse = make_tensor(dlse.ptr, DType::kFloat32, {c.s_q, c.h_q});
  a.num_sms = c.num_sms;
  const openmla::Status st = openmla::sparse_prefill(a, nullptr);
  if (!st.is_ok()) {
    std::printf("  sparse_prefill: %s\n", st.message().c_str());
    return false;
  }
  if (cudaDeviceSynchronize() != cudaSuccess) return false;
  std::vector<uint16_t> out(out_elems);
  std::vector<float> mx(stat_elems), lse(stat_elems);
  cudaMemcpy(out.data(), dout.ptr, out_elems * 2, cudaMemcpyDeviceToHost);
  cudaMemcpy(mx.data(), dmax.ptr, stat_elems * 4, cudaMemcpyDeviceToHost);
  cudaMemcpy(lse.data(), dlse.ptr, stat_elems * 4, cudaMemcpyDeviceToHost);

  openmla::ref::SparsePrefillArgs r;
  r.s_q = c.s_q;
  r.s_kv = c.s_kv;
  r.h_q = c.h_q;
  r.d_qk = c.d_qk;
  r.d_v = d_v;
  r.topk = c.topk;
  r.q = {q.data(), openmla::ref::ElemType::kBFloat16, {static_cast<int64_t>(c.h_q) * c.d_qk, c.d_qk, 1, 0}};
  r.kv = {kv.data(), openmla::ref::ElemType::kBFloat16, {c.d_qk, c.d_qk, 1, 0}};
  r.indices = {idx.data(), {c.topk, c.topk, 1}};
  r.topk_length = c.lengths ? lengths.data() : nullptr;
  r.attn_sink = c.sink ? sink.data() : nullptr;
  r.softmax_scale = 0.11f;
  std::vector<double> ref_out(out_elems), ref_mx(stat_elems), ref_lse(stat_elems);
  openmla::ref::sparse_prefill(r, ref_out.data(), ref_mx.data(), ref_lse.data());
  int bad = 0;
  for (size_t i = 0; i < out_elems && bad < 5; ++i) {
    const float got = openmla::ref::bf16_to_float(out[i]);
    if (!close(got, ref_out[i], 1e-3, 2.01 / 128)) {
      std::printf("  out[%zu] = %g, reference %g\n", i, got, ref_out[i]);
      ++bad;
    }
  }
  for (size_t i = 0; i < stat_elems && bad < 5; ++i) {
    if (!close(mx[i], ref_mx[i], 1e-6, 8.01 / 65536) || !close(lse[i], ref_lse[i], 1e-6, 8.01 / 65536)) {
      std::printf("  row %zu: max_logits %g (reference %g), lse %g (reference %g)\n", i, mx[i], ref_mx[i], lse[i],
                  ref_lse[i]);
      ++bad;
    }
  }
  return bad == 0;
}

}  // namespace

int run_sparse_prefill_sanitize_cases() {
  const Case cases[] = {
      {576, 128, 3, 300, 130, true, true, 2},   // both head tiles, partial last block, the persistent loop
      {576, 64, 5, 97, 64, false, false, 3},
      {512, 128, 2, 200, 257, true, true, 1},   // one CTA walks every tile
      {512, 16, 4, 150, 70, false, true, 4},    // heads past h_q in the tile
      {576, 100, 2, 64, 1, true, false, 8},     // topk 1, grid larger than the tile count
  };
  int failed = 0;
  for (const Case& c : cases) {
    if (!run_case(c)) {
      ++failed;
      std::printf("  FAILED: sparse prefill d_qk %d h_q %d s_q %d s_kv %d topk %d lengths %d sink %d sms %d\n", c.d_qk,
                  c.h_q, c.s_q, c.s_kv, c.topk, c.lengths, c.sink, c.num_sms);
    }
  }
  return failed;
}
