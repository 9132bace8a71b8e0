// Host launcher of the decode scheduler: one small CTA that turns per-request lengths (device memory)
// into the partition records and split-slot prefix sums. No host synchronisation, no allocation, so it
// can be captured in a CUDA graph and replayed after the lengths change.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/decode_scheduler/schedule_record.h"
#include "openmla/status.h"

namespace openmla::kernels {

struct DecodeSchedulerParams {
  int batch;         // b >= 1
  int num_sm_parts;  // 1 .. kMaxDecodeSmParts; records written
  bool sparse;       // false: blocks from cache_seqlens; true: from topk / topk_length / extra
  // > 0: the batch-invariant pass (ChunkWalk) with chunks of this many blocks, run by its own kernel
  // (invariant_kernel.cuh); 0: the default greedy pass. In the padding after `sparse`: the default kernel's parameter
  // layout and size are unchanged.
  int32_t chunk_blocks;

  const int32_t* cache_seqlens;  // (b,) dense only; negative lengths count as 0
  int32_t max_seqlen;            // dense: lengths above it count as it (the block table's capacity); 0: no limit
  int topk;                            // sparse: slots per query (> 0)
  const int32_t* topk_length;          // (b,) sparse, may be null (then topk)
  int extra_topk;                      // sparse: 0 = no extra cache
  const int32_t* extra_topk_length;    // (b,) sparse with extra cache, may be null (then extra_topk)

  DecodeScheduleRecord* records;  // (num_sm_parts,) output
  int32_t* num_splits;            // (b + 1,) output; num_splits[b] == -1 flags a failed pass
  int32_t* merge_counters;        // (merge_counter_count,) zeroed, may be null
  int64_t merge_counter_count;

  // Testing only: > 0 replaces the balanced payload (drives the failure guard). 0 in production.
  int64_t payload_override;
};

// Launches the scheduler (grid 1 x 1, kDecodeSchedulerThreads threads) on `stream`: the default kernel, or with
// params.chunk_blocks > 0 the batch-invariant one (launch_invariant.cu).
Status launch_decode_scheduler(const DecodeSchedulerParams& params, cudaStream_t stream);
namespace decode_scheduler {
Status launch_invariant_scheduler(const DecodeSchedulerParams& params, cudaStream_t stream);
}  // namespace decode_scheduler

inline constexpr int kDecodeSchedulerThreads = 256;
// Requests staged in shared memory per round of the greedy pass (16 KiB of block counts).
inline constexpr int kDecodeSchedulerChunk = 4096;

}  // namespace openmla::kernels
