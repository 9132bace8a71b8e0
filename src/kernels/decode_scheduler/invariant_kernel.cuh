// The batch-invariant decode scheduler (docs/decode-schedule.md, "Batch invariance"): the default scheduler's shape
// (kernel.cuh: one CTA, the total in pass 1, thread 0 walking staged requests) with the ChunkWalk pass
// (partition_walk.h) instead of PartitionWalk. A kernel of its own, compiled in its own unit (launch_invariant.cu), so
// the default scheduler's machine code is the one it always was. The pass cannot fail: its last partition takes
// whatever is left.
//
//   1. Every thread sizes a strided share of the requests; the CTA sums the total work (the overhead once per chunk).
//   2. The optimal cut's load: thread j counts candidate load ceil(total / parts) + j over every request (ChunkCount,
//      O(1) per request), the requests staged kDecodeSchedulerChunk at a time in shared memory; the smallest
//      candidate that fits is the load (invariant_cut_candidates <= kDecodeSchedulerThreads: the launcher checks).
//   3. Thread 0 walks the requests with that load (ChunkWalk), from the same staging (restaged only when the batch
//      needs more than one round), then turns the chunk counts into num_splits' prefix sums (request order).
//
// Dense schedules with merge counters walk the requests in alternating order (partition_walk.h, decision
// schedule-v5): up to kInvariantOrderMaxBatch requests (staged at once) every thread ranks a strided share of them
// against all the others (blocks descending, ties by index: O(b^2 / threads) comparisons), the ranks give the walk
// order in shared memory, passes 2 and 3 read the requests in that order, and the successor list goes after the
// merge counters. Larger batches walk in request order (successor req + 1, written all the same).
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
  __shared__ bool fits[kDecodeSchedulerThreads];
  __shared__ int32_t walk_order[kDecodeSchedulerChunk];  // position -> request, where `alternate`
  static_assert(kInvariantOrderMaxBatch <= kDecodeSchedulerChunk, "an ordered batch is staged at once");
  const bool ordered = !p.sparse && p.merge_counters != nullptr;  // the successor list is written
  const bool alternate = ordered && p.batch <= kInvariantOrderMaxBatch;

  for (int64_t i = threadIdx.x; i < p.merge_counter_count; i += kDecodeSchedulerThreads) p.merge_counters[i] = 0;

  // ---- Pass 1: total work, the overhead counted once per chunk --------------------------------------------
  int64_t local = 0;
  for (int i = threadIdx.x; i < p.batch; i += kDecodeSchedulerThreads) {
    const int32_t n = request_blocks_signed(p, i);
    local += ChunkWalk::request_work(n < 0 ? -n : n, p.chunk_blocks);
  }
  const int64_t total = block_sum(local, warp_sums);

  // ---- Pass 2: the optimal cut's load, one candidate per thread -------------------------------------------
  const int candidates = invariant_cut_candidates(p.chunk_blocks);
  const bool counting = static_cast<int>(threadIdx.x) < candidates;
  ChunkCount count(invariant_cut_candidate(total, p.num_sm_parts, static_cast<int32_t>(threadIdx.x)), p.chunk_blocks);
  for (int base = 0; base < p.batch; base += kDecodeSchedulerChunk) {
    const int n_staged = min(kDecodeSchedulerChunk, p.batch - base);
    __syncthreads();  // the previous round has been counted
    for (int i = threadIdx.x; i < n_staged; i += kDecodeSchedulerThreads) staged[i] = request_blocks_signed(p, base + i);
    __syncthreads();
    if (alternate) {  // (one round: base = 0) the rank of each request, its position in the walk
      for (int i = threadIdx.x; i < n_staged; i += kDecodeSchedulerThreads) {
        const int32_t n = staged[i] < 0 ? -staged[i] : staged[i];
        int32_t rank = 0;
        for (int j = 0; j < n_staged; ++j) {
          const int32_t m = staged[j] < 0 ? -staged[j] : staged[j];
          rank += (m > n || (m == n && j < i)) ? 1 : 0;
        }
        walk_order[alternating_position(rank, p.batch)] = i;
      }
      __syncthreads();
    }
    if (counting) {
      for (int i = 0; i < n_staged; ++i) {
        const int32_t n = staged[alternate ? walk_order[i] : i];
        count.add(n < 0 ? -n : n);
      }
    }
  }
  fits[threadIdx.x] = counting && count.fits(p.num_sm_parts);
  __syncthreads();

  // ---- Pass 3: each request cut into chunks of its own, dealt whole to the partitions -----------------------
  ChunkWalk walk;  // meaningful in thread 0 only
  if (threadIdx.x == 0) {
    int32_t pick = candidates - 1;  // always fits (partition_walk.h)
    for (int32_t j = candidates - 1; j >= 0; --j)
      if (fits[j]) pick = j;
    walk.begin(p.batch, p.num_sm_parts, p.chunk_blocks, invariant_cut_candidate(total, p.num_sm_parts, pick),
               p.records, p.num_splits, ordered);
  }
  const bool staged_once = p.batch <= kDecodeSchedulerChunk;  // pass 2's staging still holds every request
  for (int base = 0; base < p.batch; base += kDecodeSchedulerChunk) {
    const int n_staged = min(kDecodeSchedulerChunk, p.batch - base);
    if (!staged_once) {
      __syncthreads();  // the previous round has been walked
      for (int i = threadIdx.x; i < n_staged; i += kDecodeSchedulerThreads)
        staged[i] = request_blocks_signed(p, base + i);
      __syncthreads();
    }
    if (threadIdx.x == 0) {
      for (int i = 0; i < n_staged; ++i) {
        const int req = alternate ? walk_order[i] : i;
        const int32_t n = staged[req];
        walk.add_request(base + req, n < 0 ? -n : n, n < 0);
      }
    }
  }
  if (threadIdx.x == 0) {
    walk.finish();
    ChunkWalk::split_counts_to_prefix(p.num_splits, p.batch);
  }
  if (ordered) {  // the successor list, after the merge counters
    int32_t* const next = p.merge_counters + p.merge_counter_count;
    for (int k = threadIdx.x; k < p.batch; k += kDecodeSchedulerThreads) {
      const int req = alternate ? walk_order[k] : k;
      next[req] = k + 1 < p.batch ? (alternate ? walk_order[k + 1] : k + 1) : -1;
    }
  }
}

}  // namespace openmla::kernels::decode_scheduler
