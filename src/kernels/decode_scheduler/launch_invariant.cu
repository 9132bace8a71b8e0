// The batch-invariant scheduler's launcher (launch.h): its own unit, so launch.cu's machine code stays the default
// scheduler's alone.
#include "common/cuda_check.h"
#include "kernels/decode_scheduler/invariant_kernel.cuh"
#include "kernels/decode_scheduler/launch.h"

namespace openmla::kernels::decode_scheduler {

// (Called by launch_decode_scheduler after its checks, with params.chunk_blocks > 0.)
Status launch_invariant_scheduler(const DecodeSchedulerParams& params, cudaStream_t stream) {
  // One thread per candidate load of the optimal cut (invariant_kernel.cuh, pass 2).
  if (invariant_cut_candidates(params.chunk_blocks) > kDecodeSchedulerThreads)
    return Status::internal("decode scheduler (batch-invariant): chunk_blocks too large for the cut's candidates");
  decode_scheduler_invariant_kernel<<<1, kDecodeSchedulerThreads, 0, stream>>>(params);
  return detail::last_cuda_error("decode scheduler (batch-invariant) launch");
}

}  // namespace openmla::kernels::decode_scheduler
