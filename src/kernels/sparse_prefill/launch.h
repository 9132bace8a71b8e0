// Launcher internals of the sparse prefill kernel: one explicit instantiation per head dimension
// (instantiations/*.cu), dispatched by launch_sparse_prefill (launch.cu).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include "kernels/sparse_prefill/params.h"
#include "openmla/status.h"
#if defined(OPENMLA_HAS_TRACE)
#include <cstddef>

#include "common/trace_symbols.cuh"
#endif

namespace openmla::kernels {

template <int kDQK>
Status launch_sparse_prefill_typed(const SparsePrefillParams& p, cudaStream_t stream);

#if defined(OPENMLA_HAS_TRACE)
// Trace builds only (CMake -DOPENMLA_TRACE=ON; api/trace.h): copies the trace of the last launch (config.h, struct
// Trace; format common/trace_format.h; variant code: d_qk) to host[0, Trace::Format::kValues), synchronising the device
// first, or zeroes the trace of every variant when `clear` is set.
Status sparse_prefill_trace(unsigned long long* host, size_t count, bool clear);
namespace sparse_prefill {
// The head dimension's unit's trace array (kernel.cuh).
template <int kDQK>
Status trace_buffer(detail::TraceBuffer* out);
}  // namespace sparse_prefill
#endif

namespace sparse_prefill {
Status make_q_tensor_map(const SparsePrefillParams& p, CUtensorMap* map);
}  // namespace sparse_prefill

}  // namespace openmla::kernels
