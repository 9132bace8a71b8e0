// The typed launcher of the dense MHA prefill kernel, included by one instantiation unit per (d_qk, dtype).
#pragma once

#include "common/cuda_check.h"
#include "common/dynamic_smem.h"
#include "common/tensor_map.h"
#include "kernels/mha_prefill/kernel.cuh"
#include "kernels/mha_prefill/launch.h"

namespace openmla::kernels {

template <int kDQK, bool kFp16>
Status launch_mha_prefill_typed(const MhaPrefillParams& p, cudaStream_t stream) {
  using T = mha_prefill::Traits<kDQK, kFp16>;
  CUtensorMap q_map, k_map, v_map;
  // Q, K and V by boxes of a whole tile (128 rows), addressed per sequence (common/tensor_map.h, make_ragged_map).
  OPENMLA_RETURN_IF_ERROR(detail::make_ragged_map({p.q, kDQK, p.h_q, p.q_stride_t, p.q_stride_h, kFp16, T::kBlockM},
                                                  &q_map, "dense MHA prefill q"));
  OPENMLA_RETURN_IF_ERROR(detail::make_ragged_map({p.k, kDQK, p.h_kv, p.k_stride_t, p.k_stride_h, kFp16, T::kBlockN},
                                                  &k_map, "dense MHA prefill k"));
  OPENMLA_RETURN_IF_ERROR(detail::make_ragged_map(
      {p.v, T::kHeadDimV, p.h_kv, p.v_stride_t, p.v_stride_h, kFp16, T::kBlockN}, &v_map, "dense MHA prefill v"));
  // Launches `kernel` on the maps given, asking for `smem_bytes` of dynamic shared memory (the limit is set once per
  // device and kernel: common/dynamic_smem.h).
  auto launch = [&](auto kernel, int smem_bytes, detail::DynamicSmemLimit& limit, const auto&... maps) {
    return detail::launch_with_dynamic_smem(limit, reinterpret_cast<const void*>(kernel), smem_bytes,
                                            "dense MHA prefill: setting the shared-memory size",
                                            "dense MHA prefill kernel launch", [&] {
                                              kernel<<<p.grid, T::kThreads, smem_bytes, stream>>>(p, maps...);
                                              return cudaPeekAtLastError();
                                            });
  };
  static detail::DynamicSmemLimit smem_limit, staged_smem_limit;
  if (!p.staged_out)
    return launch(mha_prefill::mha_prefill_kernel<kDQK, kFp16>, mha_prefill::kSmemBytes<kDQK, kFp16, false>, smem_limit,
                  q_map, k_map, v_map);
  // O through shared memory and TMA stores of 64 rows x 64 columns per warpgroup (rows past a sequence's end fall
  // outside the map and are not written).
  CUtensorMap o_map;
  OPENMLA_RETURN_IF_ERROR(detail::make_ragged_map({p.output.out, T::kHeadDimV, p.h_q, p.output.out_stride_b,
                                                   p.output.out_stride_h, kFp16, T::kRowsPerWarpgroup},
                                                  &o_map, "dense MHA prefill out"));
  return launch(mha_prefill::mha_prefill_staged_kernel<kDQK, kFp16>, mha_prefill::kSmemBytes<kDQK, kFp16, true>,
                staged_smem_limit, q_map, k_map, v_map, o_map);
}

#if defined(OPENMLA_HAS_TRACE)
// Trace builds: this unit's copy of the kernel's trace array (launch.h).
template <int kDQK, bool kFp16>
Status mha_prefill::trace_buffer(detail::TraceBuffer* out) {
  return detail::trace_buffer(mha_prefill::g_trace, out, "dense MHA prefill trace: finding the buffer");
}
#endif

}  // namespace openmla::kernels
