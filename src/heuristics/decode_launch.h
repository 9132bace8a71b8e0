// Launch plans of the decode calls: which compiled variant runs and how it is fed, as pure host functions of the
// problem and the tensors' properties (no CUDA call), unit-tested on the CPU. The API computes the plan once per
// call and writes its choices into the kernel parameters (or hands them to the launcher); the launchers launch
// exactly what the plan says and decide nothing themselves. Each choice names the measurement behind it.
//
// Not a plan choice, but part of what a variant is: the plain sparse kernel turns an idle partition (past the last
// request) into a dry run of its producer that warms the instruction caches (docs/sparse-decode.md, decision
// sparse-v30); the crossover kernel's idle partitions exit.
#pragma once

#include <cstdint>

#include "kernels/decode_scheduler/schedule_record.h"
#include "openmla/decode.h"
#include "openmla/types.h"

namespace openmla::heuristics {

// ---- Combine --------------------------------------------------------------------------------------------------
// Column slices per partial row (grid z of the combine kernel): grids of fewer than kCombineSliceBelowCtas CTAs
// (b * ceil(s_q * h_q / 8)) split each row's 512 columns over kCombineMaxSlices CTAs for more loads in flight;
// larger grids fill the machine with one slice (docs/decode-schedule.md, decision combine-v18).
inline constexpr int64_t kCombineSliceBelowCtas = 256;
// Sparse calls slice below half that (decision combine-v20, H200 same run): b = 4 (h_q = 128, s_q = 2: 128 CTAs, ~7
// chunks per row) took the combine's tail from 5.3 to 4.4 us with one slice, while b = 2 (64 CTAs, 11 chunks) keeps
// four (3.7 against 4.3 us) and dense b = 8 at 4K (128 CTAs, 8 chunks) loses 0.5 us with one.
inline constexpr int64_t kSparseCombineSliceBelowCtas = 128;
int combine_slices(int64_t batch, int64_t s_q, int64_t h_q, int64_t slice_below_ctas = kCombineSliceBelowCtas);

// ---- Dense decode ---------------------------------------------------------------------------------------------
struct DenseDecodeLaunchPlan {
  // Q tiles by TMA (a request switch then costs no thread time) when each CTA's 64 rows are 64 consecutive heads
  // of one query position (q_per_kv a multiple of 64, e.g. h_q = 128 or 64 per kv head) and q's address and
  // strides are whole 16-byte units; otherwise 16-byte cp.async (docs/dense-decode.md, decision dense-v17).
  bool q_tma = false;
  int combine_slices = 1;  // see combine_slices()
};

// `q`: the validated (b, s_q, h_q, d_qk) query tensor of the call.
DenseDecodeLaunchPlan plan_dense_decode_launch(const DenseDecodeProblem& problem, const TensorRef& q);

// ---- Sparse decode --------------------------------------------------------------------------------------------
// Up to this batch (a packed record holds request numbers below 32) the records of a uniform schedule are
// computed on the host and passed in the kernel parameters, so the kernel's head skips the schedule load
// (docs/sparse-decode.md, decision sparse-v20). Its split-slot prefix sums go with them (to the main kernel and the
// combine): such a call never reads the device schedule, so a schedule planned for another call (e.g. with
// topk_length when this call has none) cannot make it write past the split buffers.
inline constexpr int kSparseHostRecordsMaxBatch = kernels::kHostScheduleMaxBatch;

// Crossover pairs (2-CTA clusters that share each block's dequantisation) need an even number of 64-head tiles.
// Crossover also adds a cluster handshake to the head and to every block, so with at most kSparsePlainMaxBlocks
// blocks per partition the plain kernel is faster (H100, h_q = 128, topk 2048, with the L1-allocating gathers of
// decision sparse-v27: b = 2 (3 blocks) -1.5 us plain, b = 4 (5) -1.0 us, b = 8 (9) -1.9 us, b = 16 (18) a tie;
// docs/sparse-decode.md, decisions sparse-v25 and sparse-v29). `partition_blocks`: blocks per partition when the
// schedule is uniform and known on the host (ceil(total work / parts)), else 0.
inline constexpr int64_t kSparsePlainMaxBlocks = 12;
bool sparse_use_crossover(int num_head_blocks, int64_t partition_blocks);

struct SparseDecodeLaunchPlan {
  bool crossover = false;  // see sparse_use_crossover()
  // > 0: every request has this many blocks and the batch is small: `uniform_records` holds every partition's
  // record, packed (kernels::pack_partition_record), from the scheduler's own partition walk run on the host
  // (heuristics::walk_decode_schedule), byte-identical to what plan_decode writes. 0: the kernel reads the schedule.
  int uniform_blocks = 0;
  uint64_t uniform_records[kMaxDecodeSmParts] = {};
  // With uniform_blocks > 0: the schedule's num_splits (batch + 1 exclusive prefix sums), from the same walk.
  int32_t uniform_num_splits[kSparseHostRecordsMaxBatch + 1] = {};
  int combine_slices = 1;  // see combine_slices()
};

// `num_sm_parts`: the schedule's partition count; `has_topk_length` / `has_extra_topk_length`: whether the call
// passes per-request lengths (then the work per request is only known on the device). A batch-invariant problem gets
// no host records and the large-batch variant choice, whatever its batch.
SparseDecodeLaunchPlan plan_sparse_decode_launch(const SparseDecodeProblem& problem, int num_sm_parts,
                                                 bool has_topk_length, bool has_extra_topk_length);

}  // namespace openmla::heuristics
