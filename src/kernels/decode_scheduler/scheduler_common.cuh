// Device helpers of both decode scheduler kernels (kernel.cuh: the default pass; invariant_kernel.cuh: the
// batch-invariant one): a request's block count and the CTA-wide sum of the total work.
#pragma once

#include <cstdint>

#include "kernels/decode_scheduler/launch.h"
#include "kernels/decode_scheduler/partition_walk.h"

namespace openmla::kernels::decode_scheduler {

// Signed block count (dense_request_blocks_signed / sparse_request_blocks_of, schedule_record.h): -n marks an empty
// request (dense, clamped length 0), whose finished range ends at block 0.
__device__ __forceinline__ int32_t request_blocks_signed(const DecodeSchedulerParams& p, int i) {
  if (!p.sparse) return dense_request_blocks_signed(p.cache_seqlens[i], p.max_seqlen);
  return sparse_request_blocks_of(p.topk, p.topk_length != nullptr ? p.topk_length + i : nullptr, p.extra_topk,
                                  p.extra_topk_length != nullptr ? p.extra_topk_length + i : nullptr);
}

__device__ __forceinline__ int64_t block_sum(int64_t v, int64_t* warp_sums) {
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
#pragma unroll
  for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  int64_t total = 0;
#pragma unroll
  for (int w = 0; w < kDecodeSchedulerThreads / 32; ++w) total += warp_sums[w];
  return total;
}

}  // namespace openmla::kernels::decode_scheduler
