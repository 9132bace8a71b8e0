// The typed launcher of the sparse prefill kernel, included by one instantiation unit per head dimension.
#pragma once

#include "common/cuda_check.h"
#include "kernels/sparse_prefill/kernel.cuh"
#include "kernels/sparse_prefill/launch.h"

namespace openmla::kernels {

template <int kDQK>
Status launch_sparse_prefill_typed(const SparsePrefillParams& p, cudaStream_t stream) {
  using Smem = sparse_prefill::SharedStorage<kDQK>;
  CUtensorMap q_map;
  OPENMLA_RETURN_IF_ERROR(sparse_prefill::make_q_tensor_map(p, &q_map));
  auto kernel = sparse_prefill::sparse_prefill_kernel<kDQK>;
  const int smem_bytes = static_cast<int>(sizeof(Smem)) + 1024;  // + slack to align to 1024
  OPENMLA_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes),
                               "sparse prefill: setting the shared-memory size");
  kernel<<<p.grid, sparse_prefill::Traits<kDQK>::kThreads, smem_bytes, stream>>>(p, q_map);
  return detail::last_cuda_error("sparse prefill kernel launch");
}

}  // namespace openmla::kernels
