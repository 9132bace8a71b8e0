// Launcher internals of the dense MHA prefill backward: one explicit instantiation per (d_qk, dtype) variant
// (instantiations/*.cu), dispatched by launch_mha_prefill_bwd (launch.cu).
#pragma once

#include <cuda_runtime.h>

#include "kernels/mha_prefill_bwd/params.h"
#include "openmla/status.h"

namespace openmla::kernels {

template <int kDQK, bool kFp16>
Status launch_mha_prefill_bwd_typed(const MhaPrefillBwdParams& p, cudaStream_t stream);

}  // namespace openmla::kernels
