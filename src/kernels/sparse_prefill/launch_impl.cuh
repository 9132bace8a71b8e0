// The typed launcher of the sparse prefill kernel, included by one instantiation unit per head dimension.
#pragma once

#include "common/cuda_check.h"
#include "common/dynamic_smem.h"
#include "kernels/sparse_prefill/kernel.cuh"
#include "kernels/sparse_prefill/launch.h"

namespace openmla::kernels {

template <int kDQK>
Status launch_sparse_prefill_typed(const SparsePrefillParams& p, cudaStream_t stream) {
  using Smem = sparse_prefill::SharedStorage<kDQK>;
  CUtensorMap q_map;
  OPENMLA_RETURN_IF_ERROR(sparse_prefill::make_q_tensor_map(p, &q_map));
  auto kernel = sparse_prefill::sparse_prefill_kernel<kDQK>;
  constexpr int smem_bytes = static_cast<int>(sizeof(Smem)) + 1024;  // + slack to align to 1024
  static detail::DynamicSmemLimit smem_limit;  // set once per device (common/dynamic_smem.h)
  return detail::launch_with_dynamic_smem(smem_limit, reinterpret_cast<const void*>(kernel), smem_bytes,
                                          "sparse prefill: setting the shared-memory size",
                                          "sparse prefill kernel launch", [&] {
                                            kernel<<<p.grid, sparse_prefill::Traits<kDQK>::kThreads, smem_bytes,
                                                     stream>>>(p, q_map);
                                            return cudaPeekAtLastError();
                                          });
}

#if defined(OPENMLA_HAS_TRACE)
// Trace builds: this unit's copy of the kernel's trace array (launch.h).
template <int kDQK>
Status sparse_prefill::trace_buffer(detail::TraceBuffer* out) {
  return detail::trace_buffer(sparse_prefill::g_trace, out, "sparse prefill trace: finding the buffer");
}
#endif

}  // namespace openmla::kernels
