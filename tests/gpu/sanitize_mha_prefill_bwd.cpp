// Sanitizer cases of the dense MHA prefill backward (run by openmla_sanitize under compute-sanitizer memcheck,
// racecheck, synccheck, and as a plain correctness check): small calls through the public C++ API covering both head
// dimensions and both dtypes, MHA and GQA, causal and not, s_q != s_k, empty sequences, rows past the last sequence
// poisoned with NaN, dq / dk / dv poisoned with NaN before the call (every row inside a sequence must be written,
// rows past the last one must be 0), both dq orders (deterministic twice: bitwise equal). The forward's out and lse
// come from the library's forward; the gradients are compared with the CPU reference backward (double), relative
// to the largest reference value of each tensor.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
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
  const char* name;
  int d_qk;
  bool fp16;
  int h_q, h_kv;
  bool causal;
  std::vector<int> s_q, s_k;
  int pad_q, pad_k;
  int num_sms;
};

using openmla_sanitize::next;
using openmla_sanitize::uniform;

bool run_case(const Case& c) {
  const int d_v = 128, batch = static_cast<int>(c.s_q.size());
  const uint16_t nan16 = c.fp16 ? 0x7e00 : 0x7fc0;
  std::vector<int32_t> cu_q{0}, cu_k{0};
  for (int b = 0; b < batch; ++b) {
    cu_q.push_back(cu_q.back() + c.s_q[b]);
    cu_k.push_back(cu_k.back() + c.s_k[b]);
  }
  const int64_t total_q = cu_q.back() + c.pad_q, total_k = cu_k.back() + c.pad_k;
  uint32_t state = 777u + static_cast<uint32_t>(c.d_qk * 7 + c.h_q * 131 + total_q * 3 + total_k);
  auto to16 = [&](float x) { return c.fp16 ? openmla::ref::float_to_fp16(x) : openmla::ref::float_to_bf16(x); };
  auto from16 = [&](uint16_t x) { return c.fp16 ? openmla::ref::fp16_to_float(x) : openmla::ref::bf16_to_float(x); };
  auto fill = [&](std::vector<uint16_t>& buf, int64_t rows, int64_t valid_rows, int64_t row_elems, float amp) {
    buf.resize(static_cast<size_t>(rows * row_elems));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t e = 0; e < row_elems; ++e)
        buf[r * row_elems + e] = r < valid_rows ? to16(amp * uniform(state)) : nan16;
  };
  std::vector<uint16_t> q, k, v, dout;
  fill(q, total_q, cu_q.back(), c.h_q * c.d_qk, 4.f);
  fill(k, total_k, cu_k.back(), c.h_kv * c.d_qk, 4.f);
  fill(v, total_k, cu_k.back(), c.h_kv * d_v, 2.f);
  fill(dout, total_q, cu_q.back(), c.h_q * d_v, 2.f);
  const size_t q_elems = q.size(), k_elems = k.size(), v_elems = v.size(), o_elems = dout.size();
  const size_t lse_elems = static_cast<size_t>(total_q) * c.h_q;

  const DType dt = c.fp16 ? DType::kFloat16 : DType::kBFloat16;
  openmla::MhaPrefillBwdProblem bp{.batch = batch,
                                   .total_q = total_q,
                                   .h_q = c.h_q,
                                   .h_kv = c.h_kv,
                                   .d_qk = c.d_qk,
                                   .d_v = d_v,
                                   .dtype = dt,
                                   .causal = c.causal,
                                   .deterministic = false,
                                   .num_sms = c.num_sms};
  openmla::MhaPrefillBwdWorkspaceSizes ws{};
  if (!openmla::get_mha_prefill_bwd_workspace_size(bp, &ws).is_ok()) return false;

  DeviceBuffer dq_(q_elems * 2), dk_(k_elems * 2), dv_(v_elems * 2), ddo(o_elems * 2), dcq(cu_q.size() * 4),
      dck(cu_k.size() * 4), dfws(16), dout_(o_elems * 2), dlse(lse_elems * 4), dws(ws.workspace_bytes),
      gq(q_elems * 2), gk(k_elems * 2), gv(v_elems * 2);
  for (const DeviceBuffer* b : {&dq_, &dk_, &dv_, &ddo, &dcq, &dck, &dfws, &dout_, &dlse, &dws, &gq, &gk, &gv})
    if (b->ptr == nullptr) return false;
  cudaMemcpy(dq_.ptr, q.data(), q_elems * 2, cudaMemcpyHostToDevice);
  if (k_elems) cudaMemcpy(dk_.ptr, k.data(), k_elems * 2, cudaMemcpyHostToDevice);
  if (v_elems) cudaMemcpy(dv_.ptr, v.data(), v_elems * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(ddo.ptr, dout.data(), o_elems * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(dcq.ptr, cu_q.data(), cu_q.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(dck.ptr, cu_k.data(), cu_k.size() * 4, cudaMemcpyHostToDevice);
  cudaMemset(dout_.ptr, 0xff, o_elems * 2);
  cudaMemset(dlse.ptr, 0xff, lse_elems * 4);
  const float scale = 0.09f;

  // The forward (out, lse) by the library.
  openmla::MhaPrefillProblem fp{.batch = batch, .h_q = c.h_q, .h_kv = c.h_kv, .d_qk = c.d_qk, .d_v = d_v,
                                .dtype = dt, .causal = c.causal, .max_seqlen_qo = 0, .num_sms = 0};
  openmla::MhaPrefillArgs fa;
  fa.q = make_tensor(dq_.ptr, dt, {total_q, c.h_q, c.d_qk});
  fa.k = make_tensor(dk_.ptr, dt, {total_k, c.h_kv, c.d_qk});
  fa.v = make_tensor(dv_.ptr, dt, {total_k, c.h_kv, d_v});
  fa.cu_seqlens_qo = make_tensor(dcq.ptr, DType::kInt32, {batch + 1});
  fa.cu_seqlens_kv = make_tensor(dck.ptr, DType::kInt32, {batch + 1});
  fa.softmax_scale = scale;
  fa.workspace = make_tensor(dfws.ptr, DType::kUInt8, {16});
  fa.out = make_tensor(dout_.ptr, dt, {total_q, c.h_q, d_v});
  fa.lse = make_tensor(dlse.ptr, DType::kFloat32, {total_q, c.h_q}, {1, total_q});
  openmla::Status st = openmla::mha_prefill(fp, fa, nullptr);
  if (!st.is_ok()) {
    std::printf("  mha_prefill: %s\n", st.message().c_str());
    return false;
  }

  openmla::MhaPrefillBwdArgs ba;
  ba.q = fa.q;
  ba.k = fa.k;
  ba.v = fa.v;
  ba.out = fa.out;
  ba.dout = make_tensor(ddo.ptr, dt, {total_q, c.h_q, d_v});
  ba.lse = fa.lse;
  ba.cu_seqlens_qo = fa.cu_seqlens_qo;
  ba.cu_seqlens_kv = fa.cu_seqlens_kv;
  ba.softmax_scale = scale;
  ba.workspace = make_tensor(dws.ptr, DType::kUInt8, {static_cast<int64_t>(ws.workspace_bytes)});
  ba.dq = make_tensor(gq.ptr, dt, {total_q, c.h_q, c.d_qk});
  ba.dk = make_tensor(gk.ptr, dt, {total_k, c.h_kv, c.d_qk});
  ba.dv = make_tensor(gv.ptr, dt, {total_k, c.h_kv, d_v});

  // Three calls: non-deterministic, then deterministic twice (bitwise equal).
  std::vector<uint16_t> got[3][3];
  for (int run = 0; run < 3; ++run) {
    bp.deterministic = run > 0;
    cudaMemset(gq.ptr, 0xff, q_elems * 2);
    if (k_elems) cudaMemset(gk.ptr, 0xff, k_elems * 2);
    if (v_elems) cudaMemset(gv.ptr, 0xff, v_elems * 2);
    cudaMemset(dws.ptr, 0x5a, ws.workspace_bytes);  // garbage: the call resets what it uses
    st = openmla::mha_prefill_bwd(bp, ba, nullptr);
    if (!st.is_ok()) {
      std::printf("  mha_prefill_bwd: %s\n", st.message().c_str());
      return false;
    }
    const cudaError_t err = cudaDeviceSynchronize();
    if (err != cudaSuccess) {
      std::printf("  mha_prefill_bwd: %s\n", cudaGetErrorString(err));
      return false;
    }
    got[run][0].resize(q_elems);
    got[run][1].resize(k_elems);
    got[run][2].resize(v_elems);
    cudaMemcpy(got[run][0].data(), gq.ptr, q_elems * 2, cudaMemcpyDeviceToHost);
    if (k_elems) cudaMemcpy(got[run][1].data(), gk.ptr, k_elems * 2, cudaMemcpyDeviceToHost);
    if (v_elems) cudaMemcpy(got[run][2].data(), gv.ptr, v_elems * 2, cudaMemcpyDeviceToHost);
  }
  bool ok = true;
  for (int t = 0; t < 3; ++t)
    if (got[1][t] != got[2][t]) {
      std::printf("  deterministic=true: %s differs between two runs\n", t == 0 ? "dq" : t == 1 ? "dk" : "dv");
      ok = false;
    }

  // The reference, on the 16-bit inputs.
  openmla::ref::MhaArgs r;
  r.batch = batch;
  r.h_q = c.h_q;
  r.h_kv = c.h_kv;
  r.d_qk = c.d_qk;
  r.d_v = d_v;
  r.cu_seqlens_q = cu_q.data();
  r.cu_seqlens_k = cu_k.data();
  const auto et = c.fp16 ? openmla::ref::ElemType::kFloat16 : openmla::ref::ElemType::kBFloat16;
  r.q = {q.data(), et, {c.h_q * c.d_qk, c.d_qk, 1, 0}};
  r.k = {k.data(), et, {c.h_kv * c.d_qk, c.d_qk, 1, 0}};
  r.v = {v.data(), et, {c.h_kv * d_v, d_v, 1, 0}};
  r.softmax_scale = scale;
  r.causal = c.causal;
  const openmla::ref::RealView rdo{dout.data(), et, {c.h_q * d_v, d_v, 1, 0}};
  std::vector<double> rq(q_elems, 0.0), rk(k_elems, 0.0), rv(v_elems, 0.0);
  openmla::ref::mha_backward(r, rdo, rq.data(), rk.data(), rv.data());

  const char* names[3] = {"dq", "dk", "dv"};
  const std::vector<double>* refs[3] = {&rq, &rk, &rv};
  const int64_t valid_rows[3] = {cu_q.back(), cu_k.back(), cu_k.back()};
  const int64_t row_elems[3] = {c.h_q * c.d_qk, c.h_kv * c.d_qk, c.h_kv * d_v};
  for (int run = 0; run < 2; ++run) {
    for (int t = 0; t < 3; ++t) {
      const std::vector<double>& ref = *refs[t];
      double ref_max = 0.0;
      for (int64_t i = 0; i < valid_rows[t] * row_elems[t]; ++i) ref_max = std::max(ref_max, std::fabs(ref[i]));
      double err_max = 0.0;
      int64_t unwritten = 0, overwritten = 0, nonfinite = 0;
      for (size_t i = 0; i < got[run][t].size(); ++i) {
        const int64_t row = static_cast<int64_t>(i) / row_elems[t];
        if (row >= valid_rows[t]) {  // past the last sequence: 0
          if (got[run][t][i] != 0) ++overwritten;
          continue;
        }
        if (got[run][t][i] == 0xffff) ++unwritten;
        const float g = from16(got[run][t][i]);
        if (!std::isfinite(g)) {
          ++nonfinite;
          continue;
        }
        err_max = std::max(err_max, std::fabs(g - ref[i]));
      }
      const double rel = ref_max > 0 ? err_max / ref_max : err_max;
      std::printf("    %s %s: max |err| %.3g, max |ref| %.3g (rel %.3g)%s\n", run == 0 ? "atomic" : "determ", names[t],
                  err_max, ref_max, rel, (unwritten || overwritten || nonfinite) ? " <- PROBLEM" : "");
      if (unwritten || overwritten || nonfinite || rel > 2e-2) {
        std::printf("    %s: %lld unwritten, %lld not 0 past the sequences, %lld non-finite, rel error %.3g\n",
                    names[t], static_cast<long long>(unwritten), static_cast<long long>(overwritten),
                    static_cast<long long>(nonfinite), rel);
        ok = false;
      }
    }
  }
  return ok;
}

}  // namespace

int run_mha_prefill_bwd_sanitize_cases() {
  const Case cases[] = {
      {"one sequence, causal, MHA", 192, false, 2, 2, true, {130}, {130}, 0, 0, 0},
      {"varlen causal GQA 2, persistent loop", 192, false, 4, 2, true, {1, 130, 0, 257}, {5, 300, 7, 257}, 3, 2, 2},
      {"non-causal fp16 d128, s_k % 128 != 0", 128, true, 2, 2, false, {200}, {129}, 0, 0, 3},
      {"causal s_q > s_k: rows without keys; no keys at all", 192, false, 2, 1, true, {100, 64}, {30, 0}, 1, 0, 1},
      {"chunked prefill, GQA 4, fp16", 192, true, 4, 1, true, {65}, {513}, 0, 5, 4},
      {"d128 bf16 causal varlen", 128, false, 3, 3, true, {33, 1, 140}, {33, 1, 140}, 0, 0, 0},
  };
  int failed = 0;
  for (const Case& c : cases) {
    std::printf("  case '%s'\n", c.name);
    if (!run_case(c)) {
      ++failed;
      std::printf("  FAILED: dense MHA prefill backward case '%s' (d_qk %d, %s, h_q %d, h_kv %d, causal %d, sms %d)\n",
                  c.name, c.d_qk, c.fp16 ? "fp16" : "bf16", c.h_q, c.h_kv, c.causal, c.num_sms);
    }
  }
  return failed;
}
