// Decode scheduling heuristics: pure host functions, unit-tested on the CPU.
//
//   - how many SM partitions a decode problem is split over (num_sm_parts),
//   - how much work (64-token blocks) each request costs, and the balanced payload of a partition,
//   - the host run of the GPU scheduler's own greedy pass (kernels/decode_scheduler/partition_walk.h), for
//     schedules the host knows in advance (sparse decode's uniform records, src/heuristics/decode_launch.h).
//     The tests check it against an independently written oracle (tests/cpp/decode_schedule_oracle.h).
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

// The family's formula. `num_sms` must be > 0 (the caller resolves problem.num_sms == 0 to the device's count).
int decode_num_sm_parts(const DenseDecodeProblem& problem, int num_sms);
int decode_num_sm_parts(const SparseDecodeProblem& problem, int num_sms);

// Merge counters (DecodeSchedule::merge_counters) a problem needs: one per (request, query tile of the main
// kernel). Dense: batch * h_kv * ceil(s_q * (h_q / h_kv) / 64); sparse: batch * s_q * ceil(h_q / 64).
int64_t decode_merge_counter_count(const DenseDecodeProblem& problem);
int64_t decode_merge_counter_count(const SparseDecodeProblem& problem);

// Work of one dense request of `seqlen` cached tokens, in 64-token blocks: max(ceil(L / 64), 1) with L the length
// clamped as the kernel clamps it, to [0, max_seqlen] (the block table's capacity; max_seqlen <= 0: no upper
// limit). An empty request (L = 0) still costs one block; it gets an empty range. The GPU scheduler runs the same
// code (kernels::dense_request_blocks_signed).
int32_t dense_request_blocks(int32_t seqlen, int32_t max_seqlen = 0);
// Dense requests whose clamped length is 0 are "empty": their record end_block is 0.
bool dense_request_empty(int32_t seqlen, int32_t max_seqlen = 0);

// Work of one sparse request, in 64-slot blocks. t = topk_length if given (clamped to [0, topk]) else topk,
// raised to 1 so the main loop is never empty. With an extra cache (extra_topk > 0) the main part is rounded
// up to whole blocks and the extra slots follow: roundup(t, 64) + e, e = extra_topk_length if given
// (clamped to [0, extra_topk]) else extra_topk. Sparse requests are never "empty" (end_block = blocks). The GPU
// scheduler and the sparse kernel run the same code (kernels::sparse_request_blocks_of).
int32_t sparse_request_blocks(int64_t topk, const int32_t* topk_length, int64_t extra_topk,
                              const int32_t* extra_topk_length);

// Total balancing work sum(n_i + overhead) and the per-partition payload ceil(total / parts) + overhead.
int64_t decode_total_work(const std::vector<int32_t>& blocks);
int64_t decode_payload(int64_t total_work, int num_sm_parts);
// The payload the GPU scheduler walks these block counts with: decode_payload, or for a small batch
// (kernels::tight_payload_applies) the smallest candidate below it whose walk fits (kernels/decode_scheduler/
// partition_walk.h; docs/decode-schedule.md, decision schedule-v2).
int64_t decode_schedule_payload(const std::vector<int32_t>& blocks, int num_sm_parts);

// A schedule computed on the host: what the GPU scheduler writes into DecodeSchedule.
struct DecodeScheduleHost {
  std::vector<kernels::DecodeScheduleRecord> records;  // (num_sm_parts,)
  std::vector<int32_t> num_splits;                     // (batch + 1,)
  bool all_assigned = true;  // false only if the greedy pass ran out of partitions (must never happen)
  // Batch-invariant dense schedules with merge counters: the successor list the GPU scheduler writes after the merge
  // counters (the next request in walk order, -1 after the last; partition_walk.h, kInvariantOrderMaxBatch). Empty
  // otherwise.
  std::vector<int32_t> walk_next;
};

// Value of num_splits[batch] after a failed pass: every record idle, num_splits = 0 ... 0, -1
// (docs/decode-schedule.md).
inline constexpr int32_t kDecodeScheduleFailed = -1;

// The GPU scheduler's greedy pass (PartitionWalk) over per-request block counts, run on the host: the same
// records and num_splits, byte for byte, as the kernel writes for these counts. `empty[i]` marks requests whose
// record end_block is 0 (may be empty: no request is empty). `payload` > 0 is the per-partition budget
// (decode_schedule_payload of the counts in production; tests pass smaller ones to drive the failure encoding).
DecodeScheduleHost walk_decode_schedule(const std::vector<int32_t>& blocks, const std::vector<bool>& empty,
                                        int num_sm_parts, int64_t payload);

// ---- Batch-invariant schedules (docs/decode-schedule.md, "Batch invariance") ----------------------------------
// Chunk size in 64-token blocks of a batch-invariant problem, 0 for a default one (kDecodeInvariantChunkTokens / 64;
// the same for every call shape, so a request's bits do not depend on the batch either).
int32_t decode_chunk_blocks(const DenseDecodeProblem& problem);
int32_t decode_chunk_blocks(const SparseDecodeProblem& problem);

// Split slots (partial rows / (s_q * h_q)) a problem's call needs: batch + num_sm_parts (default: each partition adds
// at most one chunk), or batch * max_chunks for a batch-invariant problem (max_chunks: chunks of the longest request
// the problem allows: dense max_blocks_per_seq blocks, which must then be > 0; sparse topk then extra_topk slots).
int64_t decode_split_slots(const DenseDecodeProblem& problem, int num_sm_parts);
int64_t decode_split_slots(const SparseDecodeProblem& problem, int num_sm_parts);

// The walk order of a batch-invariant schedule (position -> request): alternating (longest, shortest, second longest,
// ...; ties by request index; kernels::alternating_position) where `alternate` and the batch is at most
// kernels::kInvariantOrderMaxBatch, request order otherwise.
std::vector<int32_t> invariant_walk_order(const std::vector<int32_t>& blocks, bool alternate);

// The maximum partition load of the batch-invariant pass's optimal contiguous cut (kernels::ChunkCount): the smallest
// candidate load whose greedy packing of the chunk sequence (in walk order) fits `num_sm_parts` partitions, as the
// GPU scheduler picks it.
int64_t invariant_schedule_load(const std::vector<int32_t>& blocks, int num_sm_parts, int32_t chunk_blocks,
                                bool alternate = false);

// The batch-invariant pass (ChunkWalk) over per-request block counts, run on the host: the records and num_splits
// the GPU scheduler writes for these counts with chunks of `chunk_blocks` blocks. `alternate`: the walk order and
// successor list of a dense schedule with merge counters (decision schedule-v5; DecodeScheduleHost::walk_next).
DecodeScheduleHost walk_invariant_schedule(const std::vector<int32_t>& blocks, const std::vector<bool>& empty,
                                           int num_sm_parts, int32_t chunk_blocks, bool alternate = false);

// One int32 per merge counter (decode_merge_counter_count), and for a batch-invariant dense problem the walk order's
// successor list after them (batch more): what DecodeWorkspaceSizes::merge_counter_ints asks for.
int64_t decode_merge_counter_ints(const DenseDecodeProblem& problem);
int64_t decode_merge_counter_ints(const SparseDecodeProblem& problem);

}  // namespace openmla::heuristics
