// The typed launcher of the merge_attn_states kernel, instantiated once per input element type in
// instantiations/*.cu (each unit compiles the three output types of its input type).
#pragma once

#include <cuda_runtime.h>

#include "common/cuda_check.h"
#include "kernels/merge_states/kernel.cuh"
#include "kernels/merge_states/launch.h"

namespace openmla::kernels::merge_states {

template <typename In, typename Out>
Status launch_merge_states_typed(const MergeStatesParams& p, cudaStream_t stream) {
  const int64_t ctas = (p.rows + kWarpsPerCta - 1) / kWarpsPerCta;
  merge_states_kernel<In, Out><<<dim3(static_cast<unsigned>(ctas)), dim3(kThreadsPerCta), 0, stream>>>(p);
  return detail::last_cuda_error("merge_attn_states: kernel launch");
}

}  // namespace openmla::kernels::merge_states
