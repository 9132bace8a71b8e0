// The batch-invariant decode scheduler (docs/decode-schedule.md, "Batch invariance"): the default scheduler's shape
// (kernel.cuh: one CTA, the total in pass 1, thread 0 walking staged requests in pass 2) with the ChunkWalk pass
// (partition_walk.h) instead of PartitionWalk. A kernel of its own, compiled in its own unit (launch_invariant.cu), so
// the default scheduler's machine code is the one it always was. The pass cannot fail: its last partition takes
// whatever is left.
#pragma once

#include <cstdint>

#include "kernels/decode_scheduler/launch.h"
#include "kernels/decode_scheduler/partition_walk.h"
#include "kernels/decode_scheduler/scheduler_common.cuh"

namespace openmla::kernels::decode_scheduler {

__global__ void __launch_bounds__(kDecodeSchedulerThreads, 1)
    decode_scheduler_invariant_kernel(DecodeSchedulerParams p) {
  __shared__ int32_t staged[kDecodeSchedulerChunk];  // signed block counts of one chunk of requests
  __shared__ int64_t warp_sums[kDecodeSchedulerThreads / 32];

  for (int64_t i = threadIdx.x; i < p.merge_counter_count; i += kDecodeSchedulerThreads) p.merge_counters[i] = 0;

  // ---- Pass 1: total work, the overhead counted once per chunk --------------------------------------------
  int64_t local = 0;
  for (int i = threadIdx.x; i < p.batch; i += kDecodeSchedulerThreads) {
    const int32_t n = request_blocks_signed(p, i);
    local += ChunkWalk::request_work(n < 0 ? -n : n, p.chunk_blocks);
  }
  const int64_t total = block_sum(local, warp_sums);

  // ---- Pass 2: each request cut into chunks of its own, dealt whole to the partitions -----------------------
  ChunkWalk walk;  // meaningful in thread 0 only
  if (threadIdx.x == 0) walk.begin(p.batch, p.num_sm_parts, p.chunk_blocks, total, p.records, p.num_splits);
  for (int base = 0; base < p.batch; base += kDecodeSchedulerChunk) {
    const int count = min(kDecodeSchedulerChunk, p.batch - base);
    __syncthreads();  // the previous chunk has been walked
    for (int i = threadIdx.x; i < count; i += kDecodeSchedulerThreads) staged[i] = request_blocks_signed(p, base + i);
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int i = 0; i < count; ++i) {
        const int32_t n = staged[i];
        walk.add_request(base + i, n < 0 ? -n : n, n < 0);
      }
    }
  }
  if (threadIdx.x == 0) walk.finish();
}

}  // namespace openmla::kernels::decode_scheduler
