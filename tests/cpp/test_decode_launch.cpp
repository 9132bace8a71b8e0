// Launch plans of the decode calls (heuristics/decode_launch.h): which variant runs and how it is fed, as pure
// functions of the problem and the tensors' properties, on the CPU. The sparse plan's host-computed records are
// checked byte for byte against the scheduler oracle (decode_schedule_oracle.h), packed as the kernel receives them.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "decode_schedule_oracle.h"
#include "heuristics/decode_launch.h"
#include "heuristics/decode_schedule.h"
#include "kernels/combine/params.h"
#include "kernels/decode_scheduler/partition_walk.h"
#include "openmla/decode.h"

namespace openmla {
namespace {

using kernels::kDecodeRequestOverheadBlocks;

void* aligned_ptr() { return reinterpret_cast<void*>(uintptr_t{0x10000000}); }

// ---- Combine -----------------------------------------------------------------------------------------------------

TEST(DecodeLaunchPlan, CombineSlicesOnlyForSmallGrids) {
  // CTAs = b * ceil(s_q * h_q / 8): b = 2, s_q = 2, h_q = 128 -> 64 CTAs -> sliced.
  EXPECT_EQ(heuristics::combine_slices(2, 2, 128), kernels::kCombineMaxSlices);
  EXPECT_EQ(heuristics::combine_slices(7, 2, 128), kernels::kCombineMaxSlices);  // 224 CTAs
  EXPECT_EQ(heuristics::combine_slices(8, 2, 128), 1);                           // 256 CTAs: the limit
  EXPECT_EQ(heuristics::combine_slices(128, 1, 128), 1);
  EXPECT_EQ(heuristics::combine_slices(255, 1, 8), kernels::kCombineMaxSlices);  // one CTA per request
  EXPECT_EQ(heuristics::combine_slices(256, 1, 8), 1);
  EXPECT_EQ(heuristics::combine_slices(1, 1, 9), kernels::kCombineMaxSlices);  // a partial CTA counts
}

// ---- Dense decode ------------------------------------------------------------------------------------------------

// A dense plan for problem `p` and a contiguous (b, s_q, h_q, 576) bf16 q at `data`, strides overridable.
heuristics::DenseDecodeLaunchPlan dense_plan(const DenseDecodeProblem& p, void* data = aligned_ptr(),
                                             int64_t stride_b = -1, int64_t stride_s = -1, int64_t stride_h = -1) {
  TensorRef q = make_tensor(data, DType::kBFloat16, {p.batch, p.s_q, p.h_q, 576});
  if (stride_b >= 0) q.stride[0] = stride_b;
  if (stride_s >= 0) q.stride[1] = stride_s;
  if (stride_h >= 0) q.stride[2] = stride_h;
  return heuristics::plan_dense_decode_launch(p, q);
}

TEST(DecodeLaunchPlan, DenseQByTmaWhenTilesAreWholeHeadRuns) {
  // q_per_kv a multiple of 64: each CTA's 64 rows are 64 consecutive heads of one position.
  EXPECT_TRUE(dense_plan({.batch = 4, .s_q = 1, .h_q = 128}).q_tma);
  EXPECT_TRUE(dense_plan({.batch = 4, .s_q = 2, .h_q = 128}).q_tma);
  EXPECT_TRUE(dense_plan({.batch = 4, .s_q = 2, .h_q = 128, .h_kv = 2}).q_tma);  // 64 per kv head
  EXPECT_TRUE(dense_plan({.batch = 4, .s_q = 1, .h_q = 64}).q_tma);
  // Rows of one tile span positions (or kv heads are narrower than a tile): cp.async.
  EXPECT_FALSE(dense_plan({.batch = 4, .s_q = 2, .h_q = 16}).q_tma);
  EXPECT_FALSE(dense_plan({.batch = 4, .s_q = 1, .h_q = 96}).q_tma);
  EXPECT_FALSE(dense_plan({.batch = 4, .s_q = 1, .h_q = 128, .h_kv = 4}).q_tma);  // 32 per kv head
}

TEST(DecodeLaunchPlan, DenseQByTmaNeedsSixteenByteUnits) {
  const DenseDecodeProblem p{.batch = 4, .s_q = 2, .h_q = 128};
  EXPECT_FALSE(dense_plan(p, static_cast<char*>(aligned_ptr()) + 8).q_tma);            // address
  EXPECT_FALSE(dense_plan(p, aligned_ptr(), -1, -1, 580).q_tma);                       // head stride: 1160 bytes
  EXPECT_FALSE(dense_plan(p, aligned_ptr(), -1, 128 * 576 + 4).q_tma);                 // position stride
  EXPECT_FALSE(dense_plan(p, aligned_ptr(), 2 * 128 * 576 + 4).q_tma);                 // request stride
  EXPECT_TRUE(dense_plan(p, aligned_ptr(), 4 * 128 * 576, 2 * 128 * 576, 576).q_tma);  // padded, whole units
  // A size-1 dimension is never stepped: its stride (free in PyTorch) does not matter.
  EXPECT_TRUE(dense_plan({.batch = 1, .s_q = 2, .h_q = 128}, aligned_ptr(), 3).q_tma);
  EXPECT_TRUE(dense_plan({.batch = 4, .s_q = 1, .h_q = 128}, aligned_ptr(), -1, 1).q_tma);
  EXPECT_FALSE(dense_plan({.batch = 4, .s_q = 1, .h_q = 128}, aligned_ptr(), 128 * 576 + 4, 1).q_tma);
}

TEST(DecodeLaunchPlan, DenseCombineSlices) {
  EXPECT_EQ(dense_plan({.batch = 2, .s_q = 2, .h_q = 128}).combine_slices, kernels::kCombineMaxSlices);
  EXPECT_EQ(dense_plan({.batch = 128, .s_q = 1, .h_q = 128}).combine_slices, 1);
}

// ---- Sparse decode -----------------------------------------------------------------------------------------------

// Crossover pairs need an even tile count and, when the schedule is known on the host, more than
// kSparsePlainMaxBlocks blocks per partition (docs/sparse-decode.md, decisions sparse-v25, sparse-v29).
TEST(DecodeLaunchPlan, SparseCrossoverOnTheBenchmarkRows) {
  // 132 SMs, h_q = 128, s_q = 2, topk 2048: 33 partitions of ceil(b * (32 + 5) / 33) blocks.
  const auto plan = [](int64_t b, int64_t h_q = 128) {
    return heuristics::plan_sparse_decode_launch(SparseDecodeProblem{.batch = b, .s_q = 2, .h_q = h_q, .topk = 2048},
                                                 heuristics::sparse_num_sm_parts(2, h_q, 132), false, false);
  };
  EXPECT_FALSE(plan(2).crossover);        // 3 blocks per partition
  EXPECT_FALSE(plan(4).crossover);        // 5
  EXPECT_FALSE(plan(8).crossover);        // 9
  EXPECT_TRUE(plan(16).crossover);        // 18
  EXPECT_TRUE(plan(64).crossover);        // not known on the host (batch above the host-records limit)
  EXPECT_FALSE(plan(64, 64).crossover);   // one tile: never
  EXPECT_FALSE(plan(64, 192).crossover);  // three tiles: never
  EXPECT_TRUE(plan(64, 256).crossover);
  // Per-request lengths: the work is only known on the device, so the crossover kernel (even tiles).
  const heuristics::SparseDecodeLaunchPlan lengths = heuristics::plan_sparse_decode_launch(
      SparseDecodeProblem{.batch = 2, .s_q = 2, .h_q = 128, .topk = 2048}, 33, true, false);
  EXPECT_TRUE(lengths.crossover);
  EXPECT_EQ(lengths.uniform_blocks, 0);
}

TEST(DecodeLaunchPlan, SparseHostRecordsOnlyForUniformSmallBatches) {
  const SparseDecodeProblem p{.batch = 2, .s_q = 2, .h_q = 128, .topk = 2048};
  EXPECT_EQ(heuristics::plan_sparse_decode_launch(p, 33, false, false).uniform_blocks, 32);
  EXPECT_EQ(heuristics::plan_sparse_decode_launch(p, 33, true, false).uniform_blocks, 0);
  SparseDecodeProblem extra = p;
  extra.extra_topk = 512;
  extra.extra_page_block_size = 64;
  EXPECT_EQ(heuristics::plan_sparse_decode_launch(extra, 33, false, false).uniform_blocks, 32 + 8);
  EXPECT_EQ(heuristics::plan_sparse_decode_launch(extra, 33, false, true).uniform_blocks, 0);
  SparseDecodeProblem big = p;
  big.batch = heuristics::kSparseHostRecordsMaxBatch;
  EXPECT_GT(heuristics::plan_sparse_decode_launch(big, 33, false, false).uniform_blocks, 0);
  big.batch += 1;
  EXPECT_EQ(heuristics::plan_sparse_decode_launch(big, 33, false, false).uniform_blocks, 0);
  EXPECT_EQ(heuristics::plan_sparse_decode_launch(p, 33, false, false).combine_slices, kernels::kCombineMaxSlices);
}

// Sparse calls slice their combine below 128 CTAs, dense ones below 256 (decision combine-v20): h_q = 128, s_q = 2 is
// 32 CTAs per request, so sparse b = 2 and 3 take four slices and b = 4 one; dense b = 8 at s_q = 1 (128 CTAs) four.
TEST(DecodeLaunchPlan, SparseCombineSlicesBelowHalfTheDenseGrid) {
  for (int64_t b : {1, 2, 3, 4, 7, 8}) {
    const SparseDecodeProblem p{.batch = b, .s_q = 2, .h_q = 128, .topk = 2048};
    EXPECT_EQ(heuristics::plan_sparse_decode_launch(p, 33, false, false).combine_slices,
              b < 4 ? kernels::kCombineMaxSlices : 1)
        << "b = " << b;
  }
  EXPECT_EQ(heuristics::combine_slices(8, 1, 128), kernels::kCombineMaxSlices);  // the dense rule: 128 < 256
  EXPECT_EQ(heuristics::combine_slices(4, 2, 128, heuristics::kSparseCombineSliceBelowCtas), 1);
}

// Records that do not fit the 64-bit packing (a block number of 2^22 or more) send the kernel back to the schedule;
// the crossover choice still uses the uniform payload.
TEST(DecodeLaunchPlan, SparseRecordsThatDoNotPackAreNotPassed) {
  const SparseDecodeProblem p{.batch = 2, .s_q = 2, .h_q = 128, .topk = 2147483647};
  const heuristics::SparseDecodeLaunchPlan plan = heuristics::plan_sparse_decode_launch(p, 33, false, false);
  EXPECT_EQ(plan.uniform_blocks, 0);
  EXPECT_TRUE(plan.crossover);
}

// The launch decision as the API made it before the plan existed (crossover from the uniform payload; records from
// the partition-major pass, now the oracle), against the plan: the same variant and the same parameter bytes.
struct OldDecision {
  bool crossover = false;
  int uniform_blocks = 0;
  std::vector<uint64_t> records = std::vector<uint64_t>(kMaxDecodeSmParts, 0);
};

OldDecision old_decision(const SparseDecodeProblem& p, int parts, bool has_topk_length, bool has_extra_topk_length) {
  OldDecision d;
  int64_t payload = 0;
  if (p.batch <= 16 && !has_topk_length && (p.extra_topk == 0 || !has_extra_topk_length)) {
    d.uniform_blocks = heuristics::sparse_request_blocks(p.topk, nullptr, p.extra_topk, nullptr);
    // The scheduler's payload (decision schedule-v2: the tight one of a small batch); the records come from the
    // oracle's own choice of it below, so the two must agree.
    payload = heuristics::decode_schedule_payload(std::vector<int32_t>(p.batch, d.uniform_blocks), parts);
  }
  const int head_blocks = static_cast<int>((p.h_q + 63) / 64);
  const int64_t partition_blocks = d.uniform_blocks > 0 ? payload - kDecodeRequestOverheadBlocks : 0;
  d.crossover = head_blocks % 2 == 0 && !(partition_blocks > 0 && partition_blocks <= 12);
  if (d.uniform_blocks > 0) {
    const heuristics::DecodeScheduleHost host = oracle::build_decode_schedule(
        std::vector<int32_t>(p.batch, d.uniform_blocks), std::vector<bool>(p.batch, false), parts);
    if (!host.all_assigned) d.uniform_blocks = 0;
    for (int part = 0; d.uniform_blocks > 0 && part < parts; ++part)
      if (!kernels::pack_partition_record(host.records[part], d.records[part])) d.uniform_blocks = 0;
  }
  return d;
}

TEST(DecodeLaunchPlan, SparsePlanMatchesTheEarlierDecisionBitForBit) {
  int cases = 0, with_records = 0;
  for (int64_t batch : {1, 2, 3, 5, 8, 13, 16, 17, 64}) {
    for (int64_t h_q : {16, 64, 128, 256}) {
      for (int64_t topk : {1, 63, 64, 100, 2048, 16384, 2147483647}) {
        for (int64_t extra_topk : {0, 70, 512}) {
          for (int parts : {1, 2, 5, 22, 33, 66, 132, 160}) {
            for (int lengths = 0; lengths < 4; ++lengths) {
              const bool has_topk_length = lengths & 1, has_extra_topk_length = (lengths & 2) && extra_topk > 0;
              const SparseDecodeProblem p{.batch = batch,
                                          .s_q = 2,
                                          .h_q = h_q,
                                          .topk = topk,
                                          .extra_topk = extra_topk,
                                          .extra_page_block_size = extra_topk ? 64 : 0};
              const OldDecision want = old_decision(p, parts, has_topk_length, has_extra_topk_length);
              const heuristics::SparseDecodeLaunchPlan got =
                  heuristics::plan_sparse_decode_launch(p, parts, has_topk_length, has_extra_topk_length);
              const std::string what = "b " + std::to_string(batch) + " h_q " + std::to_string(h_q) + " topk " +
                                       std::to_string(topk) + " extra " + std::to_string(extra_topk) + " parts " +
                                       std::to_string(parts) + " lengths " + std::to_string(lengths);
              ASSERT_EQ(got.crossover, want.crossover) << what;
              ASSERT_EQ(got.uniform_blocks, want.uniform_blocks) << what;
              for (int part = 0; part < kMaxDecodeSmParts; ++part)
                ASSERT_EQ(got.uniform_records[part], want.records[part]) << what << " part " << part;
              ++cases;
              with_records += got.uniform_blocks > 0;
            }
          }
        }
      }
    }
  }
  EXPECT_GT(with_records, 1000) << "of " << cases;
}

}  // namespace
}  // namespace openmla
