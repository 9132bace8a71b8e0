// The typed launcher of the FP8-cache sparse prefill kernel, included by one instantiation unit per cache layout.
#pragma once

#include "common/cuda_check.h"
#include "common/dynamic_smem.h"
#include "kernels/sparse_prefill/fp8_kernel.cuh"
#include "kernels/sparse_prefill/launch.h"

namespace openmla::kernels {

template <int kDQK, bool kStaged>
Status launch_sparse_prefill_fp8_typed(const SparsePrefillFp8Params& p, cudaStream_t stream) {
  using Smem = sparse_prefill::SharedStorage<kDQK>;
  CUtensorMap q_map;
  OPENMLA_RETURN_IF_ERROR(sparse_prefill::make_q_tensor_map(p.base, &q_map));
  auto kernel = sparse_prefill::sparse_prefill_fp8_kernel<kDQK, kStaged>;
  constexpr int smem_bytes = static_cast<int>(sizeof(Smem)) + 1024;  // + slack to align to 1024
  static detail::DynamicSmemLimit smem_limit;  // set once per device (common/dynamic_smem.h)
  return detail::launch_with_dynamic_smem(smem_limit, reinterpret_cast<const void*>(kernel), smem_bytes,
                                          "sparse prefill (FP8 cache): setting the shared-memory size",
                                          "sparse prefill (FP8 cache) kernel launch", [&] {
                                            kernel<<<p.base.grid, sparse_prefill::Traits<kDQK>::kThreads, smem_bytes,
                                                     stream>>>(p, q_map);
                                            return cudaPeekAtLastError();
                                          });
}

}  // namespace openmla::kernels
