// The typed launcher of the sparse prefill kernel, included by one instantiation unit per head dimension.
#pragma once

#include "common/cuda_check.h"
#include "common/dynamic_smem.h"
#if defined(OPENMLA_HAS_TRACE)
#include "common/trace_symbols.cuh"
#endif
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
// Trace builds: the clock64 trace of the last launch of this instantiation (kernel.cuh, struct Trace), cleared first
// when `clear` is set.
template <int kDQK>
Status sparse_prefill_trace_typed(unsigned long long* host, size_t count, bool clear) {
  using sparse_prefill::g_sparse_prefill_trace;
  if (clear) return detail::clear_symbol(g_sparse_prefill_trace, "sparse prefill trace: clearing");
  if (count < detail::symbol_values(g_sparse_prefill_trace))
    return Status::invalid_argument("argument 'count': the trace holds more values");
  OPENMLA_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize(), "sparse prefill trace: synchronising");
  return detail::copy_symbol(host, 0, g_sparse_prefill_trace, "sparse prefill trace: copying");
}
#endif

}  // namespace openmla::kernels
