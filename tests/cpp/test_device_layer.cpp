// The host-callable parts of the kernels' shared device layer (docs/architecture.md, "Device layer"): the output
// view every decode params struct embeds (common/output_view.h) and the reading of a schedule partition record
// (kernels/decode_scheduler/partition_walk.h, chunk_*), checked against the records of the scheduler's own walk.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "common/output_view.h"
#include "heuristics/decode_schedule.h"
#include "kernels/combine/params.h"
#include "kernels/decode_scheduler/partition_walk.h"
#include "kernels/dense_decode/params.h"
#include "kernels/sparse_decode/params.h"
#include "openmla/decode.h"

namespace openmla {
namespace {

using kernels::DecodeScheduleRecord;
using kernels::OutputView;

// ---- Output view -------------------------------------------------------------------------------------------

TEST(DeviceLayerOutputView, Offsets) {
  // out (b, s_q, h_q, 512) and lse stored (b, s_q, h_q) but viewed (b, h_q, s_q), with strides past int32.
  const int64_t big = int64_t{1} << 33;
  const OutputView v{.out = nullptr, .out_stride_b = big, .out_stride_s = 3 * 512, .out_stride_h = 512,
                     .lse = nullptr, .lse_stride_b = big + 6, .lse_stride_h = 1, .lse_stride_s = 3};
  EXPECT_EQ(v.out_offset(0, 0, 0), 0);
  EXPECT_EQ(v.out_offset(2, 1, 2), 2 * big + 3 * 512 + 2 * 512);
  EXPECT_EQ(v.lse_offset(0, 0, 0), 0);
  EXPECT_EQ(v.lse_offset(1, 1, 2), (big + 6) + 2 * 1 + 1 * 3);  // (req, s_idx, head): head along lse_stride_h
  EXPECT_EQ(v.lse_offset(3, 0, 5), 3 * (big + 6) + 5);
}

// The view took the place of eight fields that were in this order in each params struct; the kernels' machine code
// was checked to be unchanged with exactly this layout (docs/architecture.md, "Device layer"). A field inserted next
// to it moves the constant-bank offsets every kernel reads its parameters from.
TEST(DeviceLayerOutputView, ParamsLayout) {
  EXPECT_EQ(sizeof(OutputView), 64u);
  EXPECT_EQ(offsetof(kernels::DenseDecodeParams, output), offsetof(kernels::DenseDecodeParams, cache_seqlens) + 8);
  EXPECT_EQ(offsetof(kernels::DenseDecodeParams, partial_o), offsetof(kernels::DenseDecodeParams, output) + 64);
  EXPECT_EQ(offsetof(kernels::SparseDecodeParams, output), offsetof(kernels::SparseDecodeParams, attn_sink) + 8);
  EXPECT_EQ(offsetof(kernels::SparseDecodeParams, partial_o), offsetof(kernels::SparseDecodeParams, output) + 64);
  // The combine's params end with the view, after the host prefix sums of the small-batch sparse path.
  EXPECT_EQ(offsetof(kernels::CombineParams, output), sizeof(kernels::CombineParams) - sizeof(OutputView));
}

// ---- Reading a partition record -----------------------------------------------------------------------------

// Walks every record of a schedule with the chunk_* functions and checks that the chunks of each request tile its
// blocks [0, blocks) in order, with ordinals 0, 1, ... matching num_splits, and that chunk_is_split holds exactly
// for the chunks of requests with more than one chunk. `kernel_blocks[i]` is what a kernel passes for request i (0
// for a dense request with L <= 0, whose record ends at block 0).
void check_chunks(const heuristics::DecodeScheduleHost& s, const std::vector<int32_t>& kernel_blocks,
                  const std::string& what) {
  const int32_t batch = static_cast<int32_t>(kernel_blocks.size());
  ASSERT_TRUE(s.all_assigned) << what;
  std::vector<int32_t> next_block(batch, 0), chunks(batch, 0);
  std::vector<std::vector<bool>> split_flags(batch);
  for (size_t part = 0; part < s.records.size(); ++part) {
    const DecodeScheduleRecord& r = s.records[part];
    if (r.begin_req >= batch) continue;  // idle
    for (int32_t q = r.begin_req; q <= r.end_req; ++q) {
      const int32_t begin = kernels::chunk_begin_block(r, q);
      const int32_t end = kernels::chunk_end_block(r, q, kernel_blocks[q]);
      ASSERT_EQ(begin, next_block[q]) << what << ": partition " << part << " request " << q;
      ASSERT_EQ(kernels::chunk_ordinal(r, q), chunks[q]) << what << ": partition " << part << " request " << q;
      if (kernel_blocks[q] > 0) ASSERT_GT(end, begin) << what << ": partition " << part << " request " << q;
      ASSERT_LE(end, kernel_blocks[q]) << what << ": partition " << part << " request " << q;
      next_block[q] = end;
      ++chunks[q];
      split_flags[q].push_back(kernels::chunk_is_split(r, q));
    }
  }
  for (int32_t q = 0; q < batch; ++q) {
    ASSERT_EQ(next_block[q], kernel_blocks[q]) << what << ": request " << q << " not covered";
    ASSERT_EQ(chunks[q], s.num_splits[q + 1] - s.num_splits[q]) << what << ": request " << q;
    for (bool split : split_flags[q]) ASSERT_EQ(split, chunks[q] > 1) << what << ": request " << q;
  }
}

TEST(DeviceLayerPartitionChunks, TileEveryRequest) {
  std::mt19937 rng(20261125);
  for (int trial = 0; trial < 300; ++trial) {
    const int batch = 1 + static_cast<int>(rng() % 48);
    const int parts = 1 + static_cast<int>(rng() % kMaxDecodeSmParts);
    std::vector<int32_t> blocks(batch);
    for (auto& n : blocks) n = 1 + static_cast<int32_t>(rng() % (trial % 3 == 0 ? 4 : 400));
    const int64_t payload = heuristics::decode_schedule_payload(blocks, parts);
    const auto s = heuristics::walk_decode_schedule(blocks, {}, parts, payload);
    check_chunks(s, blocks, "trial " + std::to_string(trial));
  }
}

TEST(DeviceLayerPartitionChunks, EmptyDenseRequests) {
  // Dense requests with L <= 0 count one block of work but have no block: their record ends at block 0, and the
  // kernel passes 0 blocks.
  const std::vector<int32_t> work = {3, 1, 70, 1, 1, 9};
  const std::vector<bool> empty = {false, true, false, true, true, false};
  std::vector<int32_t> kernel_blocks(work.size());
  for (size_t i = 0; i < work.size(); ++i) kernel_blocks[i] = empty[i] ? 0 : work[i];
  for (int parts : {1, 2, 3, 5, 8}) {
    const int64_t payload = heuristics::decode_schedule_payload(work, parts);
    check_chunks(heuristics::walk_decode_schedule(work, empty, parts, payload), kernel_blocks,
                 "parts " + std::to_string(parts));
  }
}

TEST(DeviceLayerPartitionChunks, EndClampedToTheRequest) {
  // A record that claims more blocks than the kernel sees for the request (lengths changed after planning) never
  // takes the kernel past the request's last block.
  const DecodeScheduleRecord r{2, 4, 5, 40, 1, 1, 1, 0};
  EXPECT_EQ(kernels::chunk_begin_block(r, 2), 5);
  EXPECT_EQ(kernels::chunk_begin_block(r, 3), 0);
  EXPECT_EQ(kernels::chunk_end_block(r, 2, 12), 12);  // not the end request: all of it
  EXPECT_EQ(kernels::chunk_end_block(r, 4, 12), 12);  // the end request: min(40, 12)
  EXPECT_EQ(kernels::chunk_end_block(r, 4, 50), 40);
  EXPECT_EQ(kernels::chunk_ordinal(r, 2), 1);
  EXPECT_EQ(kernels::chunk_ordinal(r, 3), 0);
  EXPECT_TRUE(kernels::chunk_is_split(r, 2));
  EXPECT_FALSE(kernels::chunk_is_split(r, 3));
  EXPECT_TRUE(kernels::chunk_is_split(r, 4));
}

}  // namespace
}  // namespace openmla
