// Test oracle of the decode scheduler: the greedy partition pass written independently of the production code, in
// its partition-major form ("walk the partitions"), where the GPU scheduler and its host run
// (heuristics::walk_decode_schedule, both on kernels/decode_scheduler/partition_walk.h) walk it request-major.
// The tests require byte-identical records and num_splits from all three. Test-only: production never calls it.
#pragma once

#include <cstdint>
#include <vector>

#include "heuristics/decode_schedule.h"

namespace openmla::oracle {

// The greedy pass over per-request block counts (docs/decode-schedule.md). `empty[i]` marks requests whose record
// end_block is 0 (may be empty: no request is empty). `payload_override` > 0 replaces the computed payload (tests
// drive the "not every request assigned" guard with it, which then produces the failure encoding: every record
// idle, num_splits = 0 ... 0, -1).
heuristics::DecodeScheduleHost build_decode_schedule(const std::vector<int32_t>& blocks, const std::vector<bool>& empty,
                                                     int num_sm_parts, int64_t payload_override = 0);

// The block counts computed as the GPU scheduler must compute them (written independently here), then the pass.
// `max_seqlen` > 0: the block table's capacity, to which the kernel clamps every length.
heuristics::DecodeScheduleHost build_dense_decode_schedule(const std::vector<int32_t>& cache_seqlens, int num_sm_parts,
                                                           int32_t max_seqlen = 0);
// `topk_length` / `extra_topk_length` may be empty (not given); otherwise one entry per request.
heuristics::DecodeScheduleHost build_sparse_decode_schedule(int64_t batch, int64_t topk,
                                                            const std::vector<int32_t>& topk_length, int64_t extra_topk,
                                                            const std::vector<int32_t>& extra_topk_length,
                                                            int num_sm_parts);

// The batch-invariant pass (docs/decode-schedule.md, "Batch invariance"), partition-major: every request cut into
// ceil(n / chunk_blocks) chunks first (a chunk costs its blocks + overhead), the smallest maximum load of a contiguous
// cut of that sequence found by a binary search on the load (the greedy packing's partition count at each load), then
// each partition takes chunks while its load stays within it, the last partition the rest. `alternate`: the chunk
// sequence of the requests in alternating order (longest, shortest, second longest, ...; up to 1024 requests) and its
// successor list (decision schedule-v5). Written apart from kernels::ChunkWalk (request-major, one candidate load
// per thread).
heuristics::DecodeScheduleHost build_invariant_schedule(const std::vector<int32_t>& blocks,
                                                        const std::vector<bool>& empty, int num_sm_parts,
                                                        int32_t chunk_blocks, bool alternate = false);

}  // namespace openmla::oracle
