// Launcher internals of the dense MHA prefill kernel: one explicit instantiation per (d_qk, dtype) variant
// (instantiations/*.cu), dispatched by launch_mha_prefill (launch.cu).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include "kernels/mha_prefill/params.h"
#include "kernels/mha_prefill/params_fp8.h"
#include "openmla/status.h"
#if defined(OPENMLA_HAS_TRACE)
#include <cstddef>

#include "common/trace_symbols.cuh"
#endif

namespace openmla::kernels {

template <int kDQK, bool kFp16>
Status launch_mha_prefill_typed(const MhaPrefillParams& p, cudaStream_t stream);
// The FP8 (e4m3) variants (instantiations/d*_e4m3.cu; launch_fp8_impl.cuh): key blocks of 128 or 192 keys.
template <int kDQK, int kBlockN>
Status launch_mha_prefill_fp8_typed(const MhaPrefillFp8Params& p, cudaStream_t stream);

#if defined(OPENMLA_HAS_TRACE)
// Trace builds only (CMake -DOPENMLA_TRACE=ON; api/trace.h): copies the trace of the last launch (config.h, struct
// Trace; format common/trace_format.h; variant code: d_qk | fp16 << 16 | staged O << 17) to host[0,
// Trace::Format::kValues), synchronising the device first, or zeroes the trace of every variant when `clear` is set.
Status mha_prefill_trace(unsigned long long* host, size_t count, bool clear);
namespace mha_prefill {
// The (d_qk, dtype) unit's trace array (kernel.cuh).
template <int kDQK, bool kFp16>
Status trace_buffer(detail::TraceBuffer* out);
}  // namespace mha_prefill
#endif

}  // namespace openmla::kernels
