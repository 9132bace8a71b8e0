// Host launcher of the dense MLA decode kernel over an FP8 e4m3 cache (kernel.cuh). Arguments arrive validated
// (api/dense_decode_fp8.cpp); the launcher picks the q-dtype variant, sets the shared-memory size and launches on the
// caller's stream (no sync, no allocation). The combine kernel is launched separately (kernels/combine).
#pragma once

#include <cuda_runtime.h>

#include "kernels/dense_decode/fp8/params.h"
#include "openmla/status.h"

namespace openmla::kernels {

// Grid (num_m_blocks, 1, num_sm_parts), 384 threads. q_fp8: q holds e4m3 values (else bf16).
Status launch_dense_decode_fp8(const DenseDecodeFp8Params& params, bool q_fp8, cudaStream_t stream);

namespace dense_decode_fp8 {
// One compiled variant each: instantiations/q_{bf16,fp8}[_early_qk].cu (launch_variant.cuh); params.early_qk picks
// the _early_qk kernels (decision dense-fp8-v4).
template <bool kQFp8, bool kEarlyQK>
Status launch_variant(const DenseDecodeFp8Params& params, cudaStream_t stream);
}  // namespace dense_decode_fp8

}  // namespace openmla::kernels
