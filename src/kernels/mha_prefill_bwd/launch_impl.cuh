// The typed launcher of the dense MHA prefill backward, included by one instantiation unit per (d_qk, dtype).
#pragma once

#include "common/cuda_check.h"
#include "common/dynamic_smem.h"
#include "common/tensor_map.h"
#include "kernels/mha_prefill_bwd/kernel.cuh"
#include "kernels/mha_prefill_bwd/launch.h"

namespace openmla::kernels {

template <int kDQK, bool kFp16>
Status launch_mha_prefill_bwd_typed(const MhaPrefillBwdParams& p, cudaStream_t stream) {
  using T = mha_prefill_bwd::Traits<kDQK, kFp16>;
  constexpr int kThreadsAux = 256;
  const int64_t rows = static_cast<int64_t>(p.seqs.total_q) * p.h_q;
  // 1. D and the base-2 lse (one warp per row and head).
  if (rows > 0) {
    const int64_t blocks = (rows * 32 + kThreadsAux - 1) / kThreadsAux;
    mha_prefill_bwd::mha_bwd_preprocess_kernel<kFp16><<<static_cast<unsigned>(blocks), kThreadsAux, 0, stream>>>(p);
    OPENMLA_CUDA_RETURN_IF_ERROR(cudaPeekAtLastError(), "dense MHA prefill backward: preprocess launch");
  }
  // 2. The main kernel: Q and dO by 64-row boxes, K and V by 128-row boxes (common/tensor_map.h, make_ragged_map).
  if (p.grid > 0) {
    CUtensorMap q_map, k_map, v_map, do_map;
    OPENMLA_RETURN_IF_ERROR(detail::make_ragged_map(
        {p.q, kDQK, p.h_q, p.q_stride_t, p.q_stride_h, kFp16, T::kBlockM}, &q_map, "dense MHA prefill backward q"));
    OPENMLA_RETURN_IF_ERROR(detail::make_ragged_map(
        {p.k, kDQK, p.h_kv, p.k_stride_t, p.k_stride_h, kFp16, T::kBlockN}, &k_map, "dense MHA prefill backward k"));
    OPENMLA_RETURN_IF_ERROR(detail::make_ragged_map({p.v, T::kHeadDimV, p.h_kv, p.v_stride_t, p.v_stride_h, kFp16,
                                                     T::kBlockN},
                                                    &v_map, "dense MHA prefill backward v"));
    OPENMLA_RETURN_IF_ERROR(detail::make_ragged_map({p.dout, T::kHeadDimV, p.h_q, p.dout_stride_t, p.dout_stride_h,
                                                     kFp16, T::kBlockM},
                                                    &do_map, "dense MHA prefill backward dout"));
    static detail::DynamicSmemLimit smem_limit;
    constexpr int kSmem = mha_prefill_bwd::kSmemBytes<kDQK, kFp16>;
    const auto kernel = mha_prefill_bwd::mha_bwd_kernel<kDQK, kFp16>;
    OPENMLA_RETURN_IF_ERROR(detail::launch_with_dynamic_smem(
        smem_limit, reinterpret_cast<const void*>(kernel), kSmem,
        "dense MHA prefill backward: setting the shared-memory size", "dense MHA prefill backward kernel launch", [&] {
          kernel<<<p.grid, T::kThreads, kSmem, stream>>>(p, q_map, k_map, v_map, do_map);
          return cudaPeekAtLastError();
        }));
  }
  // dk and dv of key rows past the last sequence: 0 (a small grid striding over the tail, usually empty).
  if (p.seqs.total_k > 0) {
    mha_prefill_bwd::mha_bwd_zero_key_tail_kernel<kDQK><<<64, kThreadsAux, 0, stream>>>(p);
    OPENMLA_CUDA_RETURN_IF_ERROR(cudaPeekAtLastError(), "dense MHA prefill backward: key tail launch");
  }
  // 3. dq = scale * the accumulator (one thread per row, head and 8 columns); rows in no sequence get 0.
  if (rows > 0) {
    const int64_t threads = rows * (kDQK / 8);
    const int64_t blocks = (threads + kThreadsAux - 1) / kThreadsAux;
    mha_prefill_bwd::mha_bwd_dq_convert_kernel<kDQK, kFp16>
        <<<static_cast<unsigned>(blocks), kThreadsAux, 0, stream>>>(p);
    OPENMLA_CUDA_RETURN_IF_ERROR(cudaPeekAtLastError(), "dense MHA prefill backward: dq conversion launch");
  }
  return Status::ok();
}

}  // namespace openmla::kernels
