#include "kernels/decode_scheduler/kernel.cuh"
#include "kernels/decode_scheduler/launch.h"

#include "common/cuda_check.h"
#include "openmla/decode.h"

namespace openmla::kernels {

Status launch_decode_scheduler(const DecodeSchedulerParams& params, cudaStream_t stream) {
  if (params.batch < 1) return Status::internal("decode scheduler: batch must be >= 1");
  if (params.num_sm_parts < 1 || params.num_sm_parts > kMaxDecodeSmParts)
    return Status::internal("decode scheduler: num_sm_parts out of range");
  if (params.records == nullptr || params.num_splits == nullptr)
    return Status::internal("decode scheduler: output pointers are null");
  if (!params.sparse && params.cache_seqlens == nullptr)
    return Status::internal("decode scheduler: dense schedule without cache_seqlens");
  if (params.sparse && params.topk <= 0) return Status::internal("decode scheduler: sparse schedule with topk <= 0");

  if (params.chunk_blocks > 0) return decode_scheduler::launch_invariant_scheduler(params, stream);
  // A plain launch (no PDL attribute): the main kernel that follows reads every record, so it must not
  // start before this grid has finished and its writes are visible.
  decode_scheduler::decode_scheduler_kernel<<<1, kDecodeSchedulerThreads, 0, stream>>>(params);
  return detail::last_cuda_error("decode scheduler launch");
}

}  // namespace openmla::kernels
