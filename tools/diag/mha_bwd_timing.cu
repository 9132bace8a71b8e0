// openmla_mha_bwd_timing: a quick timing of the dense MHA prefill backward through the C++ API (CUDA events around
// the call, L2 flushed before each, median of the repeats), for the kernel's development loop on a GPU machine; the
// benchmark of record is benchmarks/run.py --suite mha_prefill_bwd (cuDNN beside it). Built only when asked for:
// cmake --build <dir> --target openmla_mha_bwd_timing.
//
// Usage: openmla_mha_bwd_timing [reps]   (rows: the backward suite's shapes, uniform sequence lengths)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "openmla/prefill.h"

namespace {

__global__ void fill_random(__nv_bfloat16* p, size_t n, uint32_t seed, float amp) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    uint32_t x = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    x ^= x >> 15;
    x *= 2246822519u;
    x ^= x >> 13;
    p[i] = __float2bfloat16(amp * (static_cast<float>(x & 0xffffff) / 16777216.0f - 0.5f));
  }
}

struct Row {
  int b, s, h_q, h_kv, d_qk;
  bool causal;
};

void* alloc(size_t bytes) {
  void* p = nullptr;
  if (cudaMalloc(&p, bytes) != cudaSuccess) {
    std::printf("cudaMalloc(%zu) failed\n", bytes);
    std::exit(1);
  }
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 10;
  const Row rows[] = {
      {2, 4096, 128, 128, 192, true},  {2, 4096, 128, 128, 192, false}, {1, 8192, 128, 128, 192, true},
      {2, 4096, 128, 128, 128, true},  {16, 1024, 128, 128, 192, true}, {2, 4096, 16, 16, 192, true},
      {2, 4096, 128, 16, 192, true},
  };
  const size_t flush_bytes = size_t{512} << 20;
  void* flush = alloc(flush_bytes);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  std::printf("%-44s %10s %10s %9s %9s\n", "row", "fwd_us", "bwd_us", "bwd_TF", "det_us");
  for (const Row& r : rows) {
    const int64_t tq = static_cast<int64_t>(r.b) * r.s, tk = tq, dv = 128;
    auto* q = static_cast<__nv_bfloat16*>(alloc(tq * r.h_q * r.d_qk * 2));
    auto* k = static_cast<__nv_bfloat16*>(alloc(tk * r.h_kv * r.d_qk * 2));
    auto* v = static_cast<__nv_bfloat16*>(alloc(tk * r.h_kv * dv * 2));
    auto* o = static_cast<__nv_bfloat16*>(alloc(tq * r.h_q * dv * 2));
    auto* dout = static_cast<__nv_bfloat16*>(alloc(tq * r.h_q * dv * 2));
    auto* dq = static_cast<__nv_bfloat16*>(alloc(tq * r.h_q * r.d_qk * 2));
    auto* dk = static_cast<__nv_bfloat16*>(alloc(tk * r.h_kv * r.d_qk * 2));
    auto* dvv = static_cast<__nv_bfloat16*>(alloc(tk * r.h_kv * dv * 2));
    auto* lse = static_cast<float*>(alloc(tq * r.h_q * 4));
    fill_random<<<1024, 256>>>(q, tq * r.h_q * r.d_qk, 1u, 4.f);
    fill_random<<<1024, 256>>>(k, tk * r.h_kv * r.d_qk, 2u, 4.f);
    fill_random<<<1024, 256>>>(v, tk * r.h_kv * dv, 3u, 2.f);
    fill_random<<<1024, 256>>>(dout, tq * r.h_q * dv, 4u, 2.f);
    std::vector<int32_t> cu(r.b + 1);
    for (int i = 0; i <= r.b; ++i) cu[i] = i * r.s;
    auto* dcu = static_cast<int32_t*>(alloc(cu.size() * 4));
    cudaMemcpy(dcu, cu.data(), cu.size() * 4, cudaMemcpyHostToDevice);
    void* fws = alloc(16);
    using openmla::DType;
    using openmla::make_tensor;
    openmla::MhaPrefillProblem fp{.batch = r.b, .h_q = r.h_q, .h_kv = r.h_kv, .d_qk = r.d_qk, .d_v = dv,
                                  .dtype = DType::kBFloat16, .causal = r.causal, .max_seqlen_qo = r.s};
    openmla::MhaPrefillArgs fa;
    fa.q = make_tensor(q, DType::kBFloat16, {tq, r.h_q, r.d_qk});
    fa.k = make_tensor(k, DType::kBFloat16, {tk, r.h_kv, r.d_qk});
    fa.v = make_tensor(v, DType::kBFloat16, {tk, r.h_kv, dv});
    fa.cu_seqlens_qo = make_tensor(dcu, DType::kInt32, {r.b + 1});
    fa.cu_seqlens_kv = fa.cu_seqlens_qo;
    fa.workspace = make_tensor(fws, DType::kUInt8, {16});
    fa.out = make_tensor(o, DType::kBFloat16, {tq, r.h_q, dv});
    fa.lse = make_tensor(lse, DType::kFloat32, {tq, r.h_q});
    openmla::MhaPrefillBwdProblem bp{.batch = r.b, .total_q = tq, .h_q = r.h_q, .h_kv = r.h_kv, .d_qk = r.d_qk,
                                     .d_v = dv, .dtype = DType::kBFloat16, .causal = r.causal};
    openmla::MhaPrefillBwdWorkspaceSizes ws{};
    openmla::get_mha_prefill_bwd_workspace_size(bp, &ws);
    void* bws = alloc(ws.workspace_bytes);
    openmla::MhaPrefillBwdArgs ba;
    ba.q = fa.q;
    ba.k = fa.k;
    ba.v = fa.v;
    ba.out = fa.out;
    ba.dout = make_tensor(dout, DType::kBFloat16, {tq, r.h_q, dv});
    ba.lse = fa.lse;
    ba.cu_seqlens_qo = fa.cu_seqlens_qo;
    ba.cu_seqlens_kv = fa.cu_seqlens_kv;
    ba.workspace = make_tensor(bws, DType::kUInt8, {static_cast<int64_t>(ws.workspace_bytes)});
    ba.dq = make_tensor(dq, DType::kBFloat16, {tq, r.h_q, r.d_qk});
    ba.dk = make_tensor(dk, DType::kBFloat16, {tk, r.h_kv, r.d_qk});
    ba.dv = make_tensor(dvv, DType::kBFloat16, {tk, r.h_kv, dv});
    auto time = [&](auto&& call) {
      std::vector<float> t;
      for (int i = 0; i < reps + 2; ++i) {
        cudaMemsetAsync(flush, i, flush_bytes);
        cudaEventRecord(e0);
        const openmla::Status st = call();
        cudaEventRecord(e1);
        cudaEventSynchronize(e1);
        if (!st.is_ok()) {
          std::printf("error: %s\n", st.message().c_str());
          std::exit(1);
        }
        float ms = 0.f;
        cudaEventElapsedTime(&ms, e0, e1);
        if (i >= 2) t.push_back(ms * 1000.f);
      }
      std::sort(t.begin(), t.end());
      return t[t.size() / 2];
    };
    const float fwd = time([&] { return openmla::mha_prefill(fp, fa, nullptr); });
    bp.deterministic = false;
    const float bwd = time([&] { return openmla::mha_prefill_bwd(bp, ba, nullptr); });
    bp.deterministic = true;
    const float det = time([&] { return openmla::mha_prefill_bwd(bp, ba, nullptr); });
    const cudaError_t err = cudaDeviceSynchronize();
    if (err != cudaSuccess) {
      std::printf("CUDA error %s\n", cudaGetErrorString(err));
      return 1;
    }
    // Backward FLOPs: 2.5 x the forward's 4 b s^2 h (d_qk + d_v) / 2 (causal halves).
    const double fwd_flops = 2.0 * r.b * static_cast<double>(r.s) * r.s * r.h_q * (r.d_qk + dv) / (r.causal ? 2 : 1);
    char name[64];
    std::snprintf(name, sizeof(name), "b%d s%d h%d/%d d%d %s", r.b, r.s, r.h_q, r.h_kv, r.d_qk,
                  r.causal ? "causal" : "full");
    std::printf("%-44s %10.1f %10.1f %9.1f %9.1f\n", name, fwd, bwd, 2.5 * fwd_flops / (bwd * 1e-6) / 1e12, det);
    for (void* p : {static_cast<void*>(q), static_cast<void*>(k), static_cast<void*>(v), static_cast<void*>(o),
                    static_cast<void*>(dout), static_cast<void*>(dq), static_cast<void*>(dk),
                    static_cast<void*>(dvv), static_cast<void*>(lse), static_cast<void*>(dcu), fws, bws})
      cudaFree(p);
  }
  return 0;
}
