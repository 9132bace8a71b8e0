#include "heuristics/decode_launch.h"

#include <cstdint>
#include <vector>

#include "heuristics/decode_schedule.h"
#include "kernels/combine/params.h"
#include "kernels/decode_scheduler/partition_walk.h"
#include "kernels/dense_decode/config.h"
#include "kernels/dense_decode/params.h"

namespace openmla::heuristics {

using kernels::kDecodeRequestOverheadBlocks;

int combine_slices(int64_t batch, int64_t s_q, int64_t h_q, int64_t slice_below_ctas) {
  const int64_t ctas = batch * ((s_q * h_q + kernels::kCombineWarps - 1) / kernels::kCombineWarps);
  return ctas < slice_below_ctas ? kernels::kCombineMaxSlices : 1;
}

DenseDecodeLaunchPlan plan_dense_decode_launch(const DenseDecodeProblem& problem, const TensorRef& q) {
  constexpr int64_t kRows = kernels::dense_decode::Traits::kBlockM;  // rows of one CTA tile
  constexpr int64_t kElemsPer16B = 8;                                // 16-bit elements
  const int64_t q_per_kv = problem.h_q / problem.h_kv;
  const kernels::DenseQMapStrides s =
      kernels::dense_q_map_strides(problem.batch, problem.s_q, problem.h_q, q.stride[0], q.stride[1], q.stride[2]);
  DenseDecodeLaunchPlan plan;
  plan.q_tma = q_per_kv % kRows == 0 && reinterpret_cast<uintptr_t>(q.data) % 16 == 0 && s.head > 0 && s.position > 0 &&
               s.request > 0 && s.head % kElemsPer16B == 0 && s.position % kElemsPer16B == 0 &&
               s.request % kElemsPer16B == 0;
  plan.combine_slices = combine_slices(problem.batch, problem.s_q, problem.h_q);
  return plan;
}

bool sparse_use_crossover(int num_head_blocks, int64_t partition_blocks) {
  const bool few_blocks = partition_blocks > 0 && partition_blocks <= kSparsePlainMaxBlocks;
  return num_head_blocks % 2 == 0 && !few_blocks;
}

SparseDecodeLaunchPlan plan_sparse_decode_launch(const SparseDecodeProblem& problem, int num_sm_parts,
                                                 bool has_topk_length, bool has_extra_topk_length) {
  SparseDecodeLaunchPlan plan;
  const int num_head_blocks = static_cast<int>((problem.h_q + 63) / 64);
  plan.combine_slices = combine_slices(problem.batch, problem.s_q, problem.h_q, kSparseCombineSliceBelowCtas);
  if (problem.batch_invariant) {
    // A batch-invariant schedule lives on the device only (no host records), and the variant must not follow the
    // batch: crossover wherever the head tiles pair, as for large batches (docs/decode-schedule.md, "Batch
    // invariance"; the two variants compute the same tiles, this only keeps one code path per call shape).
    plan.crossover = sparse_use_crossover(num_head_blocks, 0);
    return plan;
  }
  // A uniform schedule (the work per request fixed by topk alone) at small batch is known on the host.
  int64_t uniform_payload = 0;
  if (problem.batch <= kSparseHostRecordsMaxBatch && !has_topk_length && !has_extra_topk_length) {
    plan.uniform_blocks = sparse_request_blocks(problem.topk, nullptr, problem.extra_topk, nullptr);
    uniform_payload = decode_schedule_payload(
        std::vector<int32_t>(static_cast<size_t>(problem.batch), plan.uniform_blocks), num_sm_parts);
  }
  // Blocks per partition of a uniform schedule: payload - overhead (the scheduler's payload, decode_schedule_payload).
  plan.crossover = sparse_use_crossover(num_head_blocks,
                                        plan.uniform_blocks > 0 ? uniform_payload - kDecodeRequestOverheadBlocks : 0);
  if (plan.uniform_blocks == 0) return plan;

  // Every partition's record from the scheduler's own walk, with the payload computed above (the same formula the
  // GPU scheduler uses), packed; a record that does not pack sends the kernel back to the schedule.
  const size_t batch = static_cast<size_t>(problem.batch);
  const DecodeScheduleHost host = walk_decode_schedule(std::vector<int32_t>(batch, plan.uniform_blocks),
                                                       std::vector<bool>(batch, false), num_sm_parts, uniform_payload);
  if (!host.all_assigned) plan.uniform_blocks = 0;
  for (int part = 0; plan.uniform_blocks > 0 && part < num_sm_parts; ++part)
    if (!kernels::pack_partition_record(host.records[part], plan.uniform_records[part])) plan.uniform_blocks = 0;
  for (size_t i = 0; plan.uniform_blocks > 0 && i <= batch; ++i) plan.uniform_num_splits[i] = host.num_splits[i];
  return plan;
}

}  // namespace openmla::heuristics
