// Sanitizer cases of the dense MHA prefill forward (run by openmla_sanitize under compute-sanitizer memcheck,
// racecheck, synccheck): small calls through the public C++ API covering both head dimensions and both dtypes, MHA and
// GQA, causal and not, s_q < s_k (chunked prefill) and s_q > s_k (rows without keys), empty sequences, tiles that
// straddle a sequence end and the tensor end, a grid smaller than the tile count (the persistent loop and the
// dynamic tile counter), q/k/v as views of one packed qkv tensor, rows past the last sequence poisoned with NaN, and
// cumulative lengths out of order and out of range (memory safety only); and the FP8 forward (float8_e4m3fn q, k, v,
// per-(sequence, kv head) descales: its producer warp transposes V in shared memory, which racecheck follows), each
// case with both of its key blocks (128 and 192 keys, decision fp8-d5; the 192-key kernel's V^T stages share a tail
// tile, column halves apart).
// Buffers are cudaMalloc'ed to the exact size of the views, so an out-of-bounds access is a memcheck error; results of
// the rows inside sequences are compared with the CPU reference, and rows past the last sequence must stay unwritten.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <vector>

#include "device_buffer.h"
#include "heuristics/mha_prefill_launch.h"
#include "sanitize_random.h"
#include "openmla/prefill.h"
#include "openmla_ref/attention.h"
#include "openmla_ref/numeric.h"

namespace {

using openmla::DType;
using openmla::make_tensor;

using openmla_sanitize::DeviceBuffer;

struct Case {
  const char* name;
  int d_qk;
  bool fp16;
  int h_q, h_kv;
  bool causal;
  std::vector<int> s_q, s_k;  // per sequence
  int pad_q, pad_k;           // rows past the last sequence (NaN)
  bool packed;                // q, k, v views of one (total, h, 2 d_qk + d_v) tensor (needs s_q == s_k, h_q == h_kv)
  int num_sms;
};

using openmla_sanitize::next;
using openmla_sanitize::uniform;

bool close(float got, double want, double abs_tol, double rel_tol) {
  if (std::isinf(want) || std::isnan(want)) return std::isinf(got) == std::isinf(want) && (got > 0) == (want > 0);
  const double err = std::fabs(got - want);
  return err <= abs_tol || err <= rel_tol * std::fabs(want);
}

bool run_case(const Case& c, openmla::MhaPrefillEpilogue epilogue) {
  const int d_v = 128, batch = static_cast<int>(c.s_q.size());
  const uint16_t nan16 = c.fp16 ? 0x7e00 : 0x7fc0;
  std::vector<int32_t> cu_q{0}, cu_k{0};
  for (int b = 0; b < batch; ++b) {
    cu_q.push_back(cu_q.back() + c.s_q[b]);
    cu_k.push_back(cu_k.back() + c.s_k[b]);
  }
  const int64_t total_q = cu_q.back() + c.pad_q, total_k = cu_k.back() + c.pad_k;
  uint32_t state = 12345u + static_cast<uint32_t>(c.d_qk * 7 + c.h_q * 131 + total_q * 3 + total_k);
  auto to16 = [&](float x) { return c.fp16 ? openmla::ref::float_to_fp16(x) : openmla::ref::float_to_bf16(x); };
  auto from16 = [&](uint16_t x) { return c.fp16 ? openmla::ref::fp16_to_float(x) : openmla::ref::bf16_to_float(x); };

  // Host copies in the device layout: separate tensors, or one packed (total, h, 2 d_qk + d_v) tensor.
  const int64_t packed_cols = 2 * c.d_qk + d_v;
  const int64_t q_row = c.packed ? c.h_q * packed_cols : c.h_q * c.d_qk, q_head = c.packed ? packed_cols : c.d_qk;
  const int64_t k_row = c.packed ? c.h_kv * packed_cols : c.h_kv * c.d_qk, k_head = c.packed ? packed_cols : c.d_qk;
  const int64_t v_row = c.packed ? c.h_kv * packed_cols : c.h_kv * d_v, v_head = c.packed ? packed_cols : d_v;
  std::vector<uint16_t> qkv, q, k, v;
  auto fill = [&](std::vector<uint16_t>& buf, int64_t rows, int64_t valid_rows, int64_t row_elems) {
    buf.resize(static_cast<size_t>(rows * row_elems));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t e = 0; e < row_elems; ++e) buf[r * row_elems + e] = r < valid_rows ? to16(uniform(state)) : nan16;
  };
  if (c.packed) {
    fill(qkv, total_q, cu_q.back(), q_row);
  } else {
    fill(q, total_q, cu_q.back(), q_row);
    fill(k, total_k, cu_k.back(), k_row);
    fill(v, total_k, cu_k.back(), v_row);
  }
  const uint16_t* hq = c.packed ? qkv.data() : q.data();
  const uint16_t* hk = c.packed ? qkv.data() + c.d_qk : k.data();
  const uint16_t* hv = c.packed ? qkv.data() + 2 * c.d_qk : v.data();

  const size_t out_elems = static_cast<size_t>(total_q) * c.h_q * d_v, lse_elems = static_cast<size_t>(total_q) * c.h_q;
  DeviceBuffer dqkv(qkv.size() * 2), dq(q.size() * 2), dk(k.size() * 2), dv(v.size() * 2), dcq(cu_q.size() * 4),
      dck(cu_k.size() * 4), dws(16), dout(out_elems * 2), dlse(lse_elems * 4);
  if (!dqkv.ptr || !dq.ptr || !dk.ptr || !dv.ptr || !dcq.ptr || !dck.ptr || !dws.ptr || !dout.ptr || !dlse.ptr)
    return false;
  if (c.packed) {
    cudaMemcpy(dqkv.ptr, qkv.data(), qkv.size() * 2, cudaMemcpyHostToDevice);
  } else {
    cudaMemcpy(dq.ptr, q.data(), q.size() * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(dk.ptr, k.data(), k.size() * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(dv.ptr, v.data(), v.size() * 2, cudaMemcpyHostToDevice);
  }
  cudaMemcpy(dcq.ptr, cu_q.data(), cu_q.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(dck.ptr, cu_k.data(), cu_k.size() * 4, cudaMemcpyHostToDevice);
  cudaMemset(dws.ptr, 0x5a, 16);              // garbage: the call resets what it uses
  cudaMemset(dout.ptr, 0xff, out_elems * 2);  // NaN: every row inside a sequence must be written
  cudaMemset(dlse.ptr, 0xff, lse_elems * 4);

  const DType dt = c.fp16 ? DType::kFloat16 : DType::kBFloat16;
  auto* base = static_cast<uint16_t*>(dqkv.ptr);
  openmla::MhaPrefillProblem pr{.batch = batch,
                                .h_q = c.h_q,
                                .h_kv = c.h_kv,
                                .d_qk = c.d_qk,
                                .d_v = d_v,
                                .dtype = dt,
                                .causal = c.causal,
                                .max_seqlen_qo = 0,
                                .num_sms = c.num_sms,
                                .epilogue = epilogue};
  openmla::MhaPrefillArgs a;
  a.q = make_tensor(c.packed ? static_cast<void*>(base) : dq.ptr, dt, {total_q, c.h_q, c.d_qk}, {q_row, q_head, 1});
  a.k = make_tensor(c.packed ? static_cast<void*>(base + c.d_qk) : dk.ptr, dt, {total_k, c.h_kv, c.d_qk},
                    {k_row, k_head, 1});
  a.v = make_tensor(c.packed ? static_cast<void*>(base + 2 * c.d_qk) : dv.ptr, dt, {total_k, c.h_kv, d_v},
                    {v_row, v_head, 1});
  a.cu_seqlens_qo = make_tensor(dcq.ptr, DType::kInt32, {batch + 1});
  a.cu_seqlens_kv = make_tensor(dck.ptr, DType::kInt32, {batch + 1});
  a.softmax_scale = 0.09f;
  a.workspace = make_tensor(dws.ptr, DType::kUInt8, {16});
  a.out = make_tensor(dout.ptr, dt, {total_q, c.h_q, d_v});
  a.lse = make_tensor(dlse.ptr, DType::kFloat32, {total_q, c.h_q}, {1, total_q});  // flash_mla's transposed lse
  const openmla::Status st = openmla::mha_prefill(pr, a, nullptr);
  if (!st.is_ok()) {
    std::printf("  mha_prefill: %s\n", st.message().c_str());
    return false;
  }
  if (cudaDeviceSynchronize() != cudaSuccess) return false;
  std::vector<uint16_t> out(out_elems);
  std::vector<float> lse(lse_elems);
  cudaMemcpy(out.data(), dout.ptr, out_elems * 2, cudaMemcpyDeviceToHost);
  cudaMemcpy(lse.data(), dlse.ptr, lse_elems * 4, cudaMemcpyDeviceToHost);

  openmla::ref::MhaArgs r;
  r.batch = batch;
  r.h_q = c.h_q;
  r.h_kv = c.h_kv;
  r.d_qk = c.d_qk;
  r.d_v = d_v;
  r.cu_seqlens_q = cu_q.data();
  r.cu_seqlens_k = cu_k.data();
  const auto et = c.fp16 ? openmla::ref::ElemType::kFloat16 : openmla::ref::ElemType::kBFloat16;
  r.q = {hq, et, {q_row, q_head, 1, 0}};
  r.k = {hk, et, {k_row, k_head, 1, 0}};
  r.v = {hv, et, {v_row, v_head, 1, 0}};
  r.softmax_scale = 0.09f;
  r.causal = c.causal;
  std::vector<double> ref_out(out_elems, 0.0), ref_lse(lse_elems, 0.0);
  openmla::ref::mha_forward(r, ref_out.data(), ref_lse.data());
  int bad = 0;
  const int64_t rows = cu_q.back();
  for (int64_t t = 0; t < total_q && bad < 5; ++t) {
    for (int h = 0; h < c.h_q && bad < 5; ++h) {
      const float got_lse = lse[static_cast<size_t>(h) * total_q + t];
      if (t >= rows) {  // past the last sequence: never written
        const uint16_t o0 = out[(static_cast<size_t>(t) * c.h_q + h) * d_v];
        if (!std::isnan(got_lse) || o0 != 0xffff) {
          std::printf("  row %lld head %d past the last sequence was written\n", static_cast<long long>(t), h);
          ++bad;
        }
        continue;
      }
      if (!close(got_lse, ref_lse[static_cast<size_t>(t) * c.h_q + h], 1e-5, 8.01 / 65536)) {
        std::printf("  lse[%lld, %d] = %g, reference %g\n", static_cast<long long>(t), h, got_lse,
                    ref_lse[static_cast<size_t>(t) * c.h_q + h]);
        ++bad;
      }
      for (int e = 0; e < d_v && bad < 5; ++e) {
        const size_t i = (static_cast<size_t>(t) * c.h_q + h) * d_v + e;
        if (!close(from16(out[i]), ref_out[i], 2e-3, 3.01 / 128)) {
          std::printf("  out[%lld, %d, %d] = %g, reference %g\n", static_cast<long long>(t), h, e, from16(out[i]),
                      ref_out[i]);
          ++bad;
        }
      }
    }
  }
  return bad == 0;
}

// Cumulative lengths out of order, negative and past the tensors (a caller error): the kernel clamps them
// (include/openmla/prefill.h), so the call must touch no memory outside the views. Only memory safety is checked
// here (memcheck); the values follow the clamping rule, which tests/cpp/test_mha_prefill_api.cpp checks on the host.
bool run_garbage_lengths_case() {
  const int total_q = 300, total_k = 200, h = 2, d_qk = 192, d_v = 128;
  const std::vector<int32_t> cu_q = {0, 50, 30, 5000, -7, 290, 2147483647};
  const std::vector<int32_t> cu_k = {-100, 120, 110, 100000, 60, 199, -2147483647 - 1};
  const int batch = static_cast<int>(cu_q.size()) - 1;
  DeviceBuffer dq(static_cast<size_t>(total_q) * h * d_qk * 2), dk(static_cast<size_t>(total_k) * h * d_qk * 2),
      dv(static_cast<size_t>(total_k) * h * d_v * 2), dcq(cu_q.size() * 4), dck(cu_k.size() * 4), dws(16),
      dout(static_cast<size_t>(total_q) * h * d_v * 2), dlse(static_cast<size_t>(total_q) * h * 4);
  if (!dq.ptr || !dk.ptr || !dv.ptr || !dcq.ptr || !dck.ptr || !dws.ptr || !dout.ptr || !dlse.ptr) return false;
  cudaMemset(dq.ptr, 0, static_cast<size_t>(total_q) * h * d_qk * 2);
  cudaMemset(dk.ptr, 0, static_cast<size_t>(total_k) * h * d_qk * 2);
  cudaMemset(dv.ptr, 0, static_cast<size_t>(total_k) * h * d_v * 2);
  cudaMemcpy(dcq.ptr, cu_q.data(), cu_q.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(dck.ptr, cu_k.data(), cu_k.size() * 4, cudaMemcpyHostToDevice);
  openmla::MhaPrefillProblem pr{.batch = batch, .h_q = h, .h_kv = h, .d_qk = d_qk, .d_v = d_v,
                                .dtype = DType::kBFloat16, .causal = true, .max_seqlen_qo = 0, .num_sms = 3};
  openmla::MhaPrefillArgs a;
  a.q = make_tensor(dq.ptr, DType::kBFloat16, {total_q, h, d_qk});
  a.k = make_tensor(dk.ptr, DType::kBFloat16, {total_k, h, d_qk});
  a.v = make_tensor(dv.ptr, DType::kBFloat16, {total_k, h, d_v});
  a.cu_seqlens_qo = make_tensor(dcq.ptr, DType::kInt32, {batch + 1});
  a.cu_seqlens_kv = make_tensor(dck.ptr, DType::kInt32, {batch + 1});
  a.workspace = make_tensor(dws.ptr, DType::kUInt8, {16});
  a.out = make_tensor(dout.ptr, DType::kBFloat16, {total_q, h, d_v});
  a.lse = make_tensor(dlse.ptr, DType::kFloat32, {total_q, h});
  const openmla::Status st = openmla::mha_prefill(pr, a, nullptr);
  if (!st.is_ok()) {
    std::printf("  mha_prefill: %s\n", st.message().c_str());
    return false;
  }
  return cudaDeviceSynchronize() == cudaSuccess;
}

// ---- FP8 (float8_e4m3fn q, k, v with per-(sequence, kv head) descales) --------------------------------------
// An e4m3 byte as a float (finite bytes only: sign, 4-bit exponent (bias 7), 3-bit mantissa; exponent 0 subnormal).
float e4m3_to_float(uint8_t b) {
  const int sign = b >> 7, e = (b >> 3) & 15, m = b & 7;
  const float mag = e == 0 ? std::ldexp(static_cast<float>(m), -9) : std::ldexp(1.f + m / 8.f, e - 7);
  return sign ? -mag : mag;
}

struct Fp8Case {
  const char* name;
  int d_qk;
  bool out_fp16;
  int h_q, h_kv;
  bool causal;
  std::vector<int> s_q, s_k;
  int pad_q, pad_k;  // rows past the last sequence (NaN bytes 0x7f)
  int num_sms;
};

// A call of the FP8 forward on exact-size buffers: random e4m3 bytes of magnitude 2^-3 .. 2^2 (every 17th a subnormal
// or zero), descales (batch, h_kv) that differ per sequence and kv head (v's as a transposed view), NaN rows past
// the last sequence; compared with the CPU reference on the dequantised values within the FP8 error (P is rounded to
// e4m3: ~6 % of sum p |v|), rows past the last sequence unwritten.
bool run_fp8_case(const Fp8Case& c) {
  const int d_v = 128, batch = static_cast<int>(c.s_q.size());
  std::vector<int32_t> cu_q{0}, cu_k{0};
  for (int b = 0; b < batch; ++b) {
    cu_q.push_back(cu_q.back() + c.s_q[b]);
    cu_k.push_back(cu_k.back() + c.s_k[b]);
  }
  const int64_t total_q = cu_q.back() + c.pad_q, total_k = cu_k.back() + c.pad_k;
  uint32_t state = 777u + static_cast<uint32_t>(c.d_qk * 5 + c.h_q * 17 + total_q + total_k * 3);
  auto random_e4m3 = [&](int64_t i) -> uint8_t {
    const uint32_t r = next(state);
    if (i % 17 == 0) return static_cast<uint8_t>(r & 0x87);      // zero or a subnormal
    const uint32_t e = 4 + (r >> 8) % 6;                         // 2^-3 .. 2^2
    return static_cast<uint8_t>(((r >> 16) & 1) << 7 | e << 3 | (r & 7));
  };
  auto fill = [&](std::vector<uint8_t>& buf, int64_t rows, int64_t valid_rows, int64_t row_elems) {
    buf.resize(static_cast<size_t>(rows * row_elems));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t e = 0; e < row_elems; ++e)
        buf[r * row_elems + e] = r < valid_rows ? random_e4m3(r * row_elems + e) : uint8_t{0x7f};
  };
  std::vector<uint8_t> q, k, v;
  fill(q, total_q, cu_q.back(), int64_t{c.h_q} * c.d_qk);
  fill(k, total_k, cu_k.back(), int64_t{c.h_kv} * c.d_qk);
  fill(v, total_k, cu_k.back(), int64_t{c.h_kv} * d_v);
  // Descales: q and k (batch, h_kv) row-major; v stored (h_kv, batch) and passed as its transposed view.
  std::vector<float> qd(batch * c.h_kv), kd(batch * c.h_kv), vd(batch * c.h_kv);
  for (int b = 0; b < batch; ++b)
    for (int g = 0; g < c.h_kv; ++g) {
      qd[b * c.h_kv + g] = 0.25f + 0.05f * b + 0.1f * g;
      kd[b * c.h_kv + g] = 0.5f - 0.03f * b + 0.07f * g;
      vd[g * batch + b] = 0.75f + 0.1f * b - 0.05f * g;
    }
  const size_t out_elems = static_cast<size_t>(total_q) * c.h_q * d_v, lse_elems = static_cast<size_t>(total_q) * c.h_q;
  DeviceBuffer dq(q.size()), dk(k.size()), dv(v.size()), dcq(cu_q.size() * 4), dck(cu_k.size() * 4), dws(16),
      dout(out_elems * 2), dlse(lse_elems * 4), dqd(qd.size() * 4), dkd(kd.size() * 4), dvd(vd.size() * 4);
  if (!dq.ptr || !dk.ptr || !dv.ptr || !dcq.ptr || !dck.ptr || !dws.ptr || !dout.ptr || !dlse.ptr || !dqd.ptr ||
      !dkd.ptr || !dvd.ptr)
    return false;
  cudaMemcpy(dq.ptr, q.data(), q.size(), cudaMemcpyHostToDevice);
  cudaMemcpy(dk.ptr, k.data(), k.size(), cudaMemcpyHostToDevice);
  cudaMemcpy(dv.ptr, v.data(), v.size(), cudaMemcpyHostToDevice);
  cudaMemcpy(dqd.ptr, qd.data(), qd.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(dkd.ptr, kd.data(), kd.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(dvd.ptr, vd.data(), vd.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(dcq.ptr, cu_q.data(), cu_q.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(dck.ptr, cu_k.data(), cu_k.size() * 4, cudaMemcpyHostToDevice);
  cudaMemset(dws.ptr, 0x5a, 16);
  cudaMemset(dout.ptr, 0xff, out_elems * 2);
  cudaMemset(dlse.ptr, 0xff, lse_elems * 4);

  const DType ot = c.out_fp16 ? DType::kFloat16 : DType::kBFloat16;
  openmla::MhaPrefillProblem pr{.batch = batch,
                                .h_q = c.h_q,
                                .h_kv = c.h_kv,
                                .d_qk = c.d_qk,
                                .d_v = d_v,
                                .dtype = DType::kFloat8E4M3,
                                .causal = c.causal,
                                .max_seqlen_qo = 0,
                                .num_sms = c.num_sms};
  openmla::MhaPrefillArgs a;
  a.q = make_tensor(dq.ptr, DType::kFloat8E4M3, {total_q, c.h_q, c.d_qk});
  a.k = make_tensor(dk.ptr, DType::kFloat8E4M3, {total_k, c.h_kv, c.d_qk});
  a.v = make_tensor(dv.ptr, DType::kFloat8E4M3, {total_k, c.h_kv, d_v});
  a.cu_seqlens_qo = make_tensor(dcq.ptr, DType::kInt32, {batch + 1});
  a.cu_seqlens_kv = make_tensor(dck.ptr, DType::kInt32, {batch + 1});
  a.softmax_scale = 0.09f;
  a.workspace = make_tensor(dws.ptr, DType::kUInt8, {16});
  a.out = make_tensor(dout.ptr, ot, {total_q, c.h_q, d_v});
  a.lse = make_tensor(dlse.ptr, DType::kFloat32, {total_q, c.h_q}, {1, total_q});
  a.q_descale = make_tensor(dqd.ptr, DType::kFloat32, {batch, c.h_kv});
  a.k_descale = make_tensor(dkd.ptr, DType::kFloat32, {batch, c.h_kv});
  a.v_descale = make_tensor(dvd.ptr, DType::kFloat32, {batch, c.h_kv}, {1, batch});
  const openmla::Status st = openmla::mha_prefill(pr, a, nullptr);
  if (!st.is_ok()) {
    std::printf("  mha_prefill (FP8): %s\n", st.message().c_str());
    return false;
  }
  if (cudaDeviceSynchronize() != cudaSuccess) return false;
  std::vector<uint16_t> out(out_elems);
  std::vector<float> lse(lse_elems);
  cudaMemcpy(out.data(), dout.ptr, out_elems * 2, cudaMemcpyDeviceToHost);
  cudaMemcpy(lse.data(), dlse.ptr, lse_elems * 4, cudaMemcpyDeviceToHost);

  // The reference on the dequantised values (fp32 views).
  auto dequant = [&](const std::vector<uint8_t>& x8, const std::vector<int32_t>& cu, int64_t rows, int heads, int d,
                     auto descale) {
    std::vector<float> x(x8.size(), 0.f);
    for (int b = 0; b < batch; ++b)
      for (int64_t r = cu[b]; r < cu[b + 1]; ++r)
        for (int h = 0; h < heads; ++h)
          for (int e = 0; e < d; ++e) {
            const size_t i = (static_cast<size_t>(r) * heads + h) * d + e;
            x[i] = e4m3_to_float(x8[i]) * descale(b, h / (heads / c.h_kv));
          }
    (void)rows;
    return x;
  };
  const auto fq = dequant(q, cu_q, total_q, c.h_q, c.d_qk, [&](int b, int g) { return qd[b * c.h_kv + g]; });
  const auto fk = dequant(k, cu_k, total_k, c.h_kv, c.d_qk, [&](int b, int g) { return kd[b * c.h_kv + g]; });
  const auto fv = dequant(v, cu_k, total_k, c.h_kv, d_v, [&](int b, int g) { return vd[g * batch + b]; });
  openmla::ref::MhaArgs r;
  r.batch = batch;
  r.h_q = c.h_q;
  r.h_kv = c.h_kv;
  r.d_qk = c.d_qk;
  r.d_v = d_v;
  r.cu_seqlens_q = cu_q.data();
  r.cu_seqlens_k = cu_k.data();
  const auto f32 = openmla::ref::ElemType::kFloat32;
  r.q = {fq.data(), f32, {int64_t{c.h_q} * c.d_qk, c.d_qk, 1, 0}};
  r.k = {fk.data(), f32, {int64_t{c.h_kv} * c.d_qk, c.d_qk, 1, 0}};
  r.v = {fv.data(), f32, {int64_t{c.h_kv} * d_v, d_v, 1, 0}};
  r.softmax_scale = 0.09f;
  r.causal = c.causal;
  std::vector<double> ref_out(out_elems, 0.0), ref_lse(lse_elems, 0.0);
  openmla::ref::mha_forward(r, ref_out.data(), ref_lse.data());
  auto from16 = [&](uint16_t x) {
    return c.out_fp16 ? openmla::ref::fp16_to_float(x) : openmla::ref::bf16_to_float(x);
  };
  int bad = 0;
  const int64_t rows = cu_q.back();
  for (int64_t t = 0; t < total_q && bad < 5; ++t) {
    for (int h = 0; h < c.h_q && bad < 5; ++h) {
      const float got_lse = lse[static_cast<size_t>(h) * total_q + t];
      if (t >= rows) {
        const uint16_t o0 = out[(static_cast<size_t>(t) * c.h_q + h) * d_v];
        if (!std::isnan(got_lse) || o0 != 0xffff) {
          std::printf("  row %lld head %d past the last sequence was written\n", static_cast<long long>(t), h);
          ++bad;
        }
        continue;
      }
      // lse: the FP8 tensor path's summation (~2^-12 of sum |q k| scale, here < 1e-2); out: P's e4m3 rounding
      // (2^-4 of sum p |v|, |v| < 4).
      if (!close(got_lse, ref_lse[static_cast<size_t>(t) * c.h_q + h], 2e-2, 1e-3)) {
        std::printf("  lse[%lld, %d] = %g, reference %g\n", static_cast<long long>(t), h, got_lse,
                    ref_lse[static_cast<size_t>(t) * c.h_q + h]);
        ++bad;
      }
      for (int e = 0; e < d_v && bad < 5; ++e) {
        const size_t i = (static_cast<size_t>(t) * c.h_q + h) * d_v + e;
        if (!close(from16(out[i]), ref_out[i], 0.15, 0.1)) {
          std::printf("  out[%lld, %d, %d] = %g, reference %g\n", static_cast<long long>(t), h, e, from16(out[i]),
                      ref_out[i]);
          ++bad;
        }
      }
    }
  }
  return bad == 0;
}

}  // namespace

int run_mha_prefill_sanitize_cases() {
  const Case cases[] = {
      {"varlen causal GQA, persistent loop",
       192,
       false,
       4,
       2,
       true,
       {1, 130, 0, 257},
       {5, 300, 7, 257},
       3,
       2,
       false,
       2},
      {"non-causal fp16 d128, s_k % 128 != 0", 128, true, 2, 2, false, {200}, {129}, 0, 0, false, 3},
      {"causal s_q > s_k: rows without keys; no keys at all",
       192,
       false,
       2,
       1,
       true,
       {100, 64},
       {30, 0},
       1,
       0,
       false,
       1},
      {"chunked prefill, GQA 4, fp16", 192, true, 4, 1, true, {65}, {513}, 0, 5, false, 4},
      {"packed qkv, NaN rows past the end", 192, false, 2, 2, true, {70, 129}, {70, 129}, 9, 9, true, 5},
      {"packed qkv d128, one CTA", 128, false, 3, 3, false, {33, 1, 140}, {33, 1, 140}, 0, 0, true, 1},
  };
  int failed = 0;
  if (!run_garbage_lengths_case()) {
    ++failed;
    std::printf("  FAILED: dense MHA prefill with out-of-order and out-of-range cu_seqlens\n");
  }
  // Each case through both kernels: O from the registers and O staged through shared memory (TMA stores).
  for (const Case& c : cases) {
    for (const auto epilogue : {openmla::MhaPrefillEpilogue::kRegisters, openmla::MhaPrefillEpilogue::kStaged}) {
      if (!run_case(c, epilogue)) {
        ++failed;
        std::printf("  FAILED: dense MHA prefill case '%s' (d_qk %d, %s, h_q %d, h_kv %d, causal %d, sms %d, %s)\n",
                    c.name, c.d_qk, c.fp16 ? "fp16" : "bf16", c.h_q, c.h_kv, c.causal, c.num_sms,
                    epilogue == openmla::MhaPrefillEpilogue::kStaged ? "staged O" : "O from the registers");
      }
    }
  }
  const Fp8Case fp8_cases[] = {
      {"FP8 varlen causal GQA, persistent loop", 192, false, 4, 2, true, {1, 130, 0, 257}, {5, 300, 7, 257}, 3, 2, 2},
      {"FP8 d128 non-causal, fp16 out, s_q > s_k", 128, true, 2, 2, false, {200, 64}, {129, 0}, 1, 0, 3},
      // Several 192-key blocks per tile (both V^T stages and the shared tail in use, stages reused), partial last
      // blocks, the causal diagonal across a block edge with s_q < s_k.
      {"FP8 causal, 192-key block edges, persistent loop", 192, false, 2, 1, true, {200, 1, 64}, {577, 385, 193}, 2, 5,
       2},
  };
  for (const int block_n : {128, 192}) {
    openmla::heuristics::set_mha_prefill_fp8_block_n(block_n);
    for (const Fp8Case& c : fp8_cases) {
      if (!run_fp8_case(c)) {
        ++failed;
        std::printf("  FAILED: dense MHA prefill FP8 case '%s' (d_qk %d, h_q %d, h_kv %d, causal %d, sms %d, "
                    "key block %d)\n",
                    c.name, c.d_qk, c.h_q, c.h_kv, c.causal, c.num_sms, block_n);
      }
    }
  }
  openmla::heuristics::set_mha_prefill_fp8_block_n(0);  // back to the environment's value or the default
  return failed;
}
