// The typed launcher of the FP8 dense MHA prefill kernel (kernel_fp8.cuh), included by one instantiation unit per d_qk
// (which instantiates both key-block widths, 128 and 192).
#pragma once

#include "common/cuda_check.h"
#include "common/dynamic_smem.h"
#include "common/tensor_map.h"
#include "kernels/mha_prefill/kernel_fp8.cuh"
#include "kernels/mha_prefill/params_fp8.h"

namespace openmla::kernels {

template <int kDQK, int kBlockN>
Status launch_mha_prefill_fp8_typed(const MhaPrefillFp8Params& p, cudaStream_t stream);

template <int kDQK, int kBlockN>
Status launch_mha_prefill_fp8_typed(const MhaPrefillFp8Params& p, cudaStream_t stream) {
  using T = mha_prefill::fp8::Traits<kDQK, kBlockN>;
  const MhaPrefillParams& b = p.base;
  CUtensorMap q_map, k_map, v_map;
  // 1-byte elements, boxes of 128 columns x 128 rows (Q) or kBlockN rows (K, V) (common/tensor_map.h,
  // RaggedOperand::e4m3).
  detail::RaggedOperand q_op{b.q, kDQK, b.h_q, b.q_stride_t, b.q_stride_h, false, T::kBlockM};
  q_op.e4m3 = true;
  detail::RaggedOperand k_op{b.k, kDQK, b.h_kv, b.k_stride_t, b.k_stride_h, false, T::kBlockN};
  k_op.e4m3 = true;
  detail::RaggedOperand v_op{b.v, T::kHeadDimV, b.h_kv, b.v_stride_t, b.v_stride_h, false, T::kBlockN};
  v_op.e4m3 = true;
  OPENMLA_RETURN_IF_ERROR(detail::make_ragged_map(q_op, &q_map, "dense MHA prefill (FP8) q"));
  OPENMLA_RETURN_IF_ERROR(detail::make_ragged_map(k_op, &k_map, "dense MHA prefill (FP8) k"));
  OPENMLA_RETURN_IF_ERROR(detail::make_ragged_map(v_op, &v_map, "dense MHA prefill (FP8) v"));
  static detail::DynamicSmemLimit smem_limit;
  const auto kernel = mha_prefill::fp8::mha_prefill_e4m3_kernel<kDQK, kBlockN>;
  constexpr int smem_bytes = mha_prefill::fp8::kSmemBytes<kDQK, kBlockN>;
  return detail::launch_with_dynamic_smem(smem_limit, reinterpret_cast<const void*>(kernel), smem_bytes,
                                          "dense MHA prefill (FP8): setting the shared-memory size",
                                          "dense MHA prefill (FP8) kernel launch", [&] {
                                            kernel<<<b.grid, T::kThreads, smem_bytes, stream>>>(p, q_map, k_map,
                                                                                                 v_map);
                                            return cudaPeekAtLastError();
                                          });
}

}  // namespace openmla::kernels
