// Launcher internals of the sparse prefill kernel: one explicit instantiation per head dimension
// (instantiations/*.cu), dispatched by launch_sparse_prefill (launch.cu).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include "kernels/sparse_prefill/params.h"
#include "openmla/status.h"

namespace openmla::kernels {

template <int kDQK>
Status launch_sparse_prefill_typed(const SparsePrefillParams& p, cudaStream_t stream);

#if defined(OPENMLA_TRACE) || defined(OPENMLA_SPARSE_TRACE)
template <int kDQK>
Status sparse_prefill_trace_typed(unsigned long long* host, size_t count, bool clear);
// Trace builds: copies (or clears) the clock64 trace of the last launch with head dimension d_qk.
Status sparse_prefill_trace(int d_qk, unsigned long long* host, size_t count, bool clear);
#endif

namespace sparse_prefill {
Status make_q_tensor_map(const SparsePrefillParams& p, CUtensorMap* map);
}  // namespace sparse_prefill

}  // namespace openmla::kernels
