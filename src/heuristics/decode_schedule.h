// Decode scheduling heuristics: pure host functions, unit-tested on the CPU.
//
//   - how many SM partitions a decode problem is split over (num_sm_parts),
//   - how much work (64-token blocks) each request costs,
//   - the CPU twin of the GPU scheduler (kernels/decode_scheduler): the same greedy partition, written
//     independently in its "walk the partitions" form, producing byte-identical records and num_splits.
//
// The algorithm and the record layout are described in docs/decode-schedule.md.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/decode_scheduler/schedule_record.h"
#include "openmla/decode.h"

namespace openmla::heuristics {

// Dense: one CTA per (m-block of 64 packed rows, kv head, partition); the grid should cover about one CTA
// per SM, so partitions = SMs / h_kv / m_blocks (integer division, at least 1, at most kMaxDecodeSmParts
// because the combine kernel and the split buffers are sized for that many chunks per request).
int dense_num_sm_parts(int64_t s_q, int64_t h_q, int64_t h_kv, int num_sms);

// Sparse: one CTA per (64-head block, query position, partition).
int sparse_num_sm_parts(int64_t s_q, int64_t h_q, int num_sms);

// Picks the dense or sparse formula from problem.sparse. `num_sms` must be > 0 (the caller resolves
// problem.num_sms == 0 to the device's count).
int decode_num_sm_parts(const DecodeProblem& problem, int num_sms);

// Merge counters (DecodeSchedule::merge_counters) a problem needs: one per (request, query tile of the main
// kernel). Dense: batch * h_kv * ceil(s_q * (h_q / h_kv) / 64); sparse: batch * s_q * ceil(h_q / 64).
int64_t decode_merge_counter_count(const DecodeProblem& problem);

// Work of one dense request of `seqlen` cached tokens, in 64-token blocks: max(ceil(L / 64), 1). An empty
// request (L <= 0; negative lengths are treated as 0) still costs one block; it gets an empty range.
int32_t dense_request_blocks(int32_t seqlen);
// Dense requests with L <= 0 are "empty": their record end_block is 0.
inline bool dense_request_empty(int32_t seqlen) { return seqlen <= 0; }

// Work of one sparse request, in 64-slot blocks. t = topk_length if given (clamped to [0, topk]) else topk,
// raised to 1 so the main loop is never empty. With an extra cache (extra_topk > 0) the main part is rounded
// up to whole blocks and the extra slots follow: roundup(t, 64) + e, e = extra_topk_length if given
// (clamped to [0, extra_topk]) else extra_topk. Sparse requests are never "empty" (end_block = blocks).
int32_t sparse_request_blocks(int64_t topk, const int32_t* topk_length, int64_t extra_topk,
                              const int32_t* extra_topk_length);

// Sparse decode: do the head tiles run as crossover pairs (2-CTA clusters that share each block's dequantisation)?
// They need an even number of 64-head tiles. Crossover also adds a cluster handshake to the head and to every block,
// so with at most kSparsePlainMaxBlocks blocks per partition the plain kernel is faster (H100, h_q = 128, topk 2048,
// since the L1-allocating gathers of sparse v27: b = 2 (3 blocks) -1.5 us plain, b = 4 (5) -1.0 us, b = 8 (9)
// -1.9 us, b = 16 (18) a tie; perf-notes sparse v25, v29). `partition_blocks`: blocks per partition when the
// schedule is uniform and known on the host (ceil(total work / parts)), else 0.
inline constexpr int64_t kSparsePlainMaxBlocks = 12;
bool sparse_use_crossover(int num_head_blocks, int64_t partition_blocks);

// Result of the CPU twin.
struct DecodeScheduleHost {
  std::vector<kernels::DecodeScheduleRecord> records;  // (num_sm_parts,)
  std::vector<int32_t> num_splits;                     // (batch + 1,)
  bool all_assigned = true;  // false only if the greedy pass ran out of partitions (must never happen)
};

// Total balancing work sum(n_i + overhead) and the per-partition payload ceil(total / parts) + overhead.
int64_t decode_total_work(const std::vector<int32_t>& blocks);
int64_t decode_payload(int64_t total_work, int num_sm_parts);

// The greedy pass over per-request block counts. `empty[i]` marks requests whose record end_block is 0
// (may be empty: no request is empty). `payload_override` > 0 replaces the computed payload: the sparse host path
// passes the payload it already computed for the crossover choice; tests use it to drive the "not every request
// assigned" guard, which then produces the failure encoding documented
// in docs/decode-schedule.md (every record idle, num_splits = 0 ... 0, -1).
DecodeScheduleHost build_decode_schedule(const std::vector<int32_t>& blocks, const std::vector<bool>& empty,
                                         int num_sm_parts, int64_t payload_override = 0);

// Convenience wrappers computing the block counts exactly as the GPU scheduler does.
DecodeScheduleHost build_dense_decode_schedule(const std::vector<int32_t>& cache_seqlens, int num_sm_parts);
// `topk_length` / `extra_topk_length` may be empty (not given); otherwise one entry per request.
DecodeScheduleHost build_sparse_decode_schedule(int64_t batch, int64_t topk, const std::vector<int32_t>& topk_length,
                                                int64_t extra_topk, const std::vector<int32_t>& extra_topk_length,
                                                int num_sm_parts);

// Value of num_splits[batch] after a failed pass (see build_decode_schedule).
inline constexpr int32_t kDecodeScheduleFailed = -1;

}  // namespace openmla::heuristics
