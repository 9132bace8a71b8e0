// The lengths of a decode call with per-request query lengths (varlen_q.h).
#include "kernels/decode_scheduler/varlen_q.h"

#include "common/cuda_check.h"

namespace openmla::kernels {

namespace {

constexpr int kVarlenExpandThreads = 256;

__global__ void __launch_bounds__(kVarlenExpandThreads) varlen_q_expand_kernel(const VarlenQExpandParams p) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kVarlenExpandThreads + threadIdx.x;
  if (!p.sparse) {
    if (t >= p.batch) return;
    const int q_len = min(max(p.seqused_q[t], 0), p.s_q);
    p.out[t] = q_len > 0 ? p.cache_seqlens[t] : 0;
    return;
  }
  const int64_t tokens = static_cast<int64_t>(p.batch) * p.s_q;
  if (t >= tokens) return;
  const int r = static_cast<int>(t / p.s_q), i = static_cast<int>(t % p.s_q);
  const bool has_row = i < min(max(p.seqused_q[r], 0), p.s_q);
  p.out[t] = has_row ? (p.topk_length != nullptr ? p.topk_length[r] : p.topk) : 0;
  if (p.extra_topk > 0)
    p.out[tokens + t] = has_row ? (p.extra_topk_length != nullptr ? p.extra_topk_length[r] : p.extra_topk) : 0;
}

}  // namespace

Status launch_varlen_q_expand(const VarlenQExpandParams& params, cudaStream_t stream) {
  if (params.batch < 1 || params.s_q < 1 || params.seqused_q == nullptr || params.out == nullptr)
    return Status::internal("per-request query lengths: bad expand parameters");
  if (!params.sparse && params.cache_seqlens == nullptr)
    return Status::internal("per-request query lengths: dense expand without cache_seqlens");
  const int64_t n = params.sparse ? static_cast<int64_t>(params.batch) * params.s_q : params.batch;
  const unsigned blocks = static_cast<unsigned>((n + kVarlenExpandThreads - 1) / kVarlenExpandThreads);
  varlen_q_expand_kernel<<<blocks, kVarlenExpandThreads, 0, stream>>>(params);
  return detail::last_cuda_error("per-request query lengths: expand launch");
}

}  // namespace openmla::kernels
