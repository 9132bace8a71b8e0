// Sanitizer cases of sparse prefill from the FP8 cache (openmla_sanitize sparse_prefill_fp8; compute-sanitizer
// memcheck, racecheck, synccheck): small calls of sparse_prefill_fp8 through the public C++ API for both layouts,
// page sizes 64 / 1 / 53 with a padded page stride, h_q 128 / 64 / 16 / 100, odd topk, topk_length, the sink, garbage
// slots (INT_MIN, -1, num_slots, INT_MAX), tokens without a valid slot and a grid smaller than the tile count. The
// cache is encoded by the CPU codec and cudaMalloc'ed to its exact size; results are compared with the CPU reference
// on the CPU codec's dequantisation of the cache.
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
#include "openmla_ref/fp8_codec.h"
#include "openmla_ref/numeric.h"

namespace {

using openmla::DType;
using openmla::make_tensor;
using openmla_sanitize::DeviceBuffer;
using openmla_sanitize::next;
using openmla_sanitize::uniform;

struct Case {
  bool model1;
  int h_q, s_q, num_blocks, page_size, topk;
  int pad;  // bytes between pages (multiple of 16)
  bool lengths, sink;
  int num_sms;
};

bool close(float got, double want, double abs_tol, double rel_tol) {
  if (std::isinf(want) || std::isnan(want)) return std::isinf(got) == std::isinf(want) && (got > 0) == (want > 0);
  const double err = std::fabs(got - want);
  return err <= abs_tol || err <= rel_tol * std::fabs(want);
}

bool run_case(const Case& c) {
  namespace ref = openmla::ref;
  const int d_v = 512;
  const ref::Fp8Layout layout = c.model1 ? ref::Fp8Layout::kModel1 : ref::Fp8Layout::kV32;
  const int d_qk = static_cast<int>(ref::fp8_head_dim(layout));
  const int64_t bpt = ref::fp8_bytes_per_token(layout);
  const int64_t page_stride = (c.page_size * bpt + c.pad + 15) / 16 * 16;
  const int num_slots = c.num_blocks * c.page_size;
  uint32_t state = 4242u + static_cast<uint32_t>(c.s_q * 131 + c.topk * 7 + c.h_q + c.page_size);

  std::vector<uint16_t> q(static_cast<size_t>(c.s_q) * c.h_q * d_qk), kv(static_cast<size_t>(num_slots) * d_qk);
  for (auto& v : q) v = ref::float_to_bf16(uniform(state) * 2.f);
  for (auto& v : kv) v = ref::float_to_bf16(uniform(state));
  // Encode page by page (last page without the padding: the buffer ends exactly at the cache's last byte).
  const size_t cache_bytes = static_cast<size_t>((c.num_blocks - 1) * page_stride + c.page_size * bpt);
  std::vector<uint8_t> cache(cache_bytes, 0xFF);
  for (int b = 0; b < c.num_blocks; ++b)
    ref::fp8_encode_page(layout, kv.data() + static_cast<size_t>(b) * c.page_size * d_qk, d_qk,
                         cache.data() + static_cast<size_t>(b) * page_stride, c.page_size);
  // The reference reads the dequantised rows.
  std::vector<uint16_t> deq(kv.size());
  for (int b = 0; b < c.num_blocks; ++b)
    ref::fp8_decode_page_bf16(layout, cache.data() + static_cast<size_t>(b) * page_stride, c.page_size,
                              deq.data() + static_cast<size_t>(b) * c.page_size * d_qk, d_qk);

  std::vector<int32_t> idx(static_cast<size_t>(c.s_q) * c.topk), lengths(c.s_q);
  const int32_t garbage[] = {std::numeric_limits<int32_t>::min(), -1, num_slots, std::numeric_limits<int32_t>::max()};
  for (int t = 0; t < c.s_q; ++t) {
    const bool none_valid = t % 5 == 3;
    for (int j = 0; j < c.topk; ++j) {
      const uint32_t r = next(state);
      idx[static_cast<size_t>(t) * c.topk + j] =
          none_valid || r % 7 == 0 ? garbage[r % 4] : static_cast<int32_t>(r % static_cast<uint32_t>(num_slots));
    }
    lengths[t] = t % 4 == 0 ? c.topk + 5 : static_cast<int32_t>(next(state) % static_cast<uint32_t>(c.topk + 1));
  }
  std::vector<float> sink(c.h_q);
  for (int h = 0; h < c.h_q; ++h) sink[h] = h % 7 == 1 ? INFINITY : h % 7 == 2 ? -INFINITY : uniform(state) * 4.f;

  const size_t out_elems = static_cast<size_t>(c.s_q) * c.h_q * d_v, stat_elems = static_cast<size_t>(c.s_q) * c.h_q;
  DeviceBuffer dq(q.size() * 2), dcache(cache_bytes), didx(idx.size() * 4), dlen(lengths.size() * 4),
      dsink(sink.size() * 4), dout(out_elems * 2), dmax(stat_elems * 4), dlse(stat_elems * 4);
  if (!dq.ptr || !dcache.ptr || !didx.ptr || !dlen.ptr || !dsink.ptr || !dout.ptr || !dmax.ptr || !dlse.ptr)
    return false;
  cudaMemcpy(dq.ptr, q.data(), q.size() * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(dcache.ptr, cache.data(), cache_bytes, cudaMemcpyHostToDevice);
  cudaMemcpy(didx.ptr, idx.data(), idx.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(dlen.ptr, lengths.data(), lengths.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(dsink.ptr, sink.data(), sink.size() * 4, cudaMemcpyHostToDevice);
  cudaMemset(dout.ptr, 0xff, out_elems * 2);  // NaN: every element must be written
  cudaMemset(dmax.ptr, 0xff, stat_elems * 4);
  cudaMemset(dlse.ptr, 0xff, stat_elems * 4);

  openmla::SparsePrefillFp8Args a;
  a.q = make_tensor(dq.ptr, DType::kBFloat16, {c.s_q, c.h_q, d_qk});
  a.kv_cache = make_tensor(dcache.ptr, DType::kUInt8, {c.num_blocks, c.page_size, 1, bpt},
                           {page_stride, bpt, bpt, 1});
  a.cache_format = c.model1 ? openmla::KVCacheFormat::kFp8Model1 : openmla::KVCacheFormat::kFp8V32;
  a.indices = make_tensor(didx.ptr, DType::kInt32, {c.s_q, 1, c.topk});
  if (c.lengths) a.topk_length = make_tensor(dlen.ptr, DType::kInt32, {c.s_q});
  if (c.sink) a.attn_sink = make_tensor(dsink.ptr, DType::kFloat32, {c.h_q});
  a.softmax_scale = 0.11f;
  a.out = make_tensor(dout.ptr, DType::kBFloat16, {c.s_q, c.h_q, d_v});
  a.max_logits = make_tensor(dmax.ptr, DType::kFloat32, {c.s_q, c.h_q});
  a.lse = make_tensor(dlse.ptr, DType::kFloat32, {c.s_q, c.h_q});
  a.num_sms = c.num_sms;
  const openmla::Status st = openmla::sparse_prefill_fp8(a, nullptr);
  if (!st.is_ok()) {
    std::printf("  sparse_prefill_fp8: %s\n", st.message().c_str());
    return false;
  }
  if (cudaDeviceSynchronize() != cudaSuccess) return false;
  std::vector<uint16_t> out(out_elems);
  std::vector<float> mx(stat_elems), lse(stat_elems);
  cudaMemcpy(out.data(), dout.ptr, out_elems * 2, cudaMemcpyDeviceToHost);
  cudaMemcpy(mx.data(), dmax.ptr, stat_elems * 4, cudaMemcpyDeviceToHost);
  cudaMemcpy(lse.data(), dlse.ptr, stat_elems * 4, cudaMemcpyDeviceToHost);

  ref::SparsePrefillArgs r;
  r.s_q = c.s_q;
  r.s_kv = num_slots;
  r.h_q = c.h_q;
  r.d_qk = d_qk;
  r.d_v = d_v;
  r.topk = c.topk;
  r.q = {q.data(), ref::ElemType::kBFloat16, {static_cast<int64_t>(c.h_q) * d_qk, d_qk, 1, 0}};
  r.kv = {deq.data(), ref::ElemType::kBFloat16, {d_qk, d_qk, 1, 0}};
  r.indices = {idx.data(), {c.topk, c.topk, 1}};
  r.topk_length = c.lengths ? lengths.data() : nullptr;
  r.attn_sink = c.sink ? sink.data() : nullptr;
  r.softmax_scale = 0.11f;
  std::vector<double> ref_out(out_elems), ref_mx(stat_elems), ref_lse(stat_elems);
  ref::sparse_prefill(r, ref_out.data(), ref_mx.data(), ref_lse.data());
  int bad = 0;
  for (size_t i = 0; i < out_elems && bad < 5; ++i) {
    const float got = ref::bf16_to_float(out[i]);
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

int run_sparse_prefill_fp8_sanitize_cases() {
  const Case cases[] = {
      {false, 128, 3, 5, 64, 130, 0, true, true, 2},    // V3.2, both head tiles, partial block, persistent loop
      {false, 64, 4, 300, 1, 64, 32, false, false, 3},  // page size 1, padded pages
      {true, 128, 2, 4, 53, 129, 16, true, true, 1},    // MODEL1, odd page size, one CTA walks every tile
      {true, 16, 4, 3, 64, 70, 0, false, true, 4},      // heads past h_q in the tile
      {false, 100, 2, 1, 64, 1, 0, true, false, 8},     // topk 1, one page, grid larger than the tile count
  };
  int failed = 0;
  for (const Case& c : cases) {
    if (!run_case(c)) {
      ++failed;
      std::printf("  FAILED: sparse prefill fp8 %s h_q %d s_q %d pages %d x %d topk %d pad %d lengths %d sink %d "
                  "sms %d\n",
                  c.model1 ? "model1" : "v32", c.h_q, c.s_q, c.num_blocks, c.page_size, c.topk, c.pad, c.lengths,
                  c.sink, c.num_sms);
    }
  }
  return failed;
}
