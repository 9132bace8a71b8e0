// Decode scheduler kernel: one CTA of kDecodeSchedulerThreads threads.
//
//   1. Every thread sizes a strided share of the requests (64-token blocks, see request_blocks) and the
//      CTA sums n_i + overhead into the total work (int64: b * 2^25 blocks would overflow int32).
//   2. Requests are staged kDecodeSchedulerChunk at a time in shared memory; thread 0 runs the greedy
//      pass (PartitionWalk, request-major) over each chunk while the others wait at the barrier. The
//      pass is inherently sequential but touches each request and partition O(1) times, a few µs for
//      thousands of requests.
//   3. Thread 0 closes the last partition and marks the rest idle.
//
// Small batches (2 * batch <= parts) take the smallest payload below that one whose walk still fits, if any
// (partition_walk.h, tight_payload_applies; docs/decode-schedule.md, decision schedule-v2): each candidate is
// counted by one thread (PartitionCount) before the walk.
//
// Failure guard: with payload = ceil(total / parts) + overhead every request is always assigned (each
// partition consumes at least payload - overhead work; a smaller payload is taken only where it was counted to
// fit). Should the walk ever run out of partitions, the kernel does not leave a half-written schedule: every record becomes idle (begin_req = batch, so
// the main kernel does nothing) and num_splits becomes 0, ..., 0, -1 (no request is combined;
// num_splits[batch] == -1 is the device-visible flag, which tests read back).
#pragma once

#include <cstdint>

#include "kernels/decode_scheduler/launch.h"
#include "kernels/decode_scheduler/partition_walk.h"
#include "kernels/decode_scheduler/scheduler_common.cuh"

namespace openmla::kernels::decode_scheduler {

__global__ void __launch_bounds__(kDecodeSchedulerThreads, 1) decode_scheduler_kernel(DecodeSchedulerParams p) {
  static_assert(kDecodeSchedulerThreads % 32 == 0, "whole warps");
  __shared__ int32_t staged[kDecodeSchedulerChunk];  // signed block counts of one chunk of requests
  __shared__ int64_t warp_sums[kDecodeSchedulerThreads / 32];
  __shared__ bool failed;

  // The merge counters start every call at zero (docs/dense-decode.md, "Split requests").
  for (int64_t i = threadIdx.x; i < p.merge_counter_count; i += kDecodeSchedulerThreads) p.merge_counters[i] = 0;

  // ---- Pass 1: total work ----------------------------------------------------------------------------
  int64_t local = 0;
  for (int i = threadIdx.x; i < p.batch; i += kDecodeSchedulerThreads) {
    const int32_t n = request_blocks_signed(p, i);
    local += (n < 0 ? -n : n) + kDecodeRequestOverheadBlocks;
  }
  const int64_t total = block_sum(local, warp_sums);
  const int64_t default_payload = (total + p.num_sm_parts - 1) / p.num_sm_parts + kDecodeRequestOverheadBlocks;
  int64_t payload = p.payload_override > 0 ? p.payload_override : default_payload;

  // ---- Small batches: the smallest payload that still fits (partition_walk.h, decision schedule-v2) --------------
  // 2 * batch <= parts <= kMaxDecodeSmParts: every request fits one staging chunk. Thread c counts candidate c.
  if (p.payload_override <= 0 && tight_payload_applies(p.batch, p.num_sm_parts)) {
    static_assert(2 * kDecodeSchedulerChunk >= 160, "a small batch (2 * batch <= parts <= 160) is staged at once");
    static_assert(kTightPayloadCandidates <= kDecodeSchedulerThreads, "one thread per candidate");
    __shared__ bool fits[kTightPayloadCandidates];
    for (int i = threadIdx.x; i < p.batch; i += kDecodeSchedulerThreads) staged[i] = request_blocks_signed(p, i);
    __syncthreads();
    if (threadIdx.x < kTightPayloadCandidates) {
      const int64_t candidate = tight_payload_candidate(default_payload, threadIdx.x);
      bool ok = false;
      if (candidate > 0) {
        PartitionCount count(candidate);
        for (int i = 0; i < p.batch; ++i) count.add(staged[i] < 0 ? -staged[i] : staged[i]);
        ok = count.fits(p.num_sm_parts);
      }
      fits[threadIdx.x] = ok;
    }
    __syncthreads();
    for (int c = kTightPayloadCandidates - 1; c >= 0; --c)
      if (fits[c]) payload = tight_payload_candidate(default_payload, c);
  }

  // ---- Pass 2: greedy walk, chunk by chunk ---------------------------------------------------------------
  PartitionWalk walk;  // meaningful in thread 0 only
  if (threadIdx.x == 0) {
    walk.begin(p.batch, p.num_sm_parts, payload, p.records, p.num_splits);
    failed = false;
  }
  for (int base = 0; base < p.batch; base += kDecodeSchedulerChunk) {
    const int count = min(kDecodeSchedulerChunk, p.batch - base);
    __syncthreads();  // the previous chunk has been walked (and `failed` initialised)
    if (failed) break;  // uniform: every thread reads it after the same barrier
    for (int i = threadIdx.x; i < count; i += kDecodeSchedulerThreads) staged[i] = request_blocks_signed(p, base + i);
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int i = 0; i < count; ++i) {
        const int32_t n = staged[i];
        if (!walk.add_request(base + i, n < 0 ? -n : n, n < 0)) {
          failed = true;
          break;
        }
      }
    }
  }

  // ---- Epilogue --------------------------------------------------------------------------------------------
  if (threadIdx.x != 0) return;
  if (!failed) {
    walk.finish();
    return;
  }
  for (int part = 0; part < p.num_sm_parts; ++part) p.records[part] = PartitionWalk::idle_record(p.batch);
  for (int i = 0; i < p.batch; ++i) p.num_splits[i] = 0;
  p.num_splits[p.batch] = -1;
}

}  // namespace openmla::kernels::decode_scheduler
