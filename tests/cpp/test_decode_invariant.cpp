// Batch-invariant decode schedules (docs/decode-schedule.md, "Batch invariance"): the production pass
// (kernels::ChunkWalk, run on the host by heuristics::walk_invariant_schedule) against the independently written
// partition-major oracle, byte for byte; the property itself: a request's partition (its chunk boundaries, split count,
// split slots in ordinal order, merge path) is the same in every batch that contains it; the kernels' reading of the
// records (each chunk one work item); the workspace and launch-plan rules of the mode; and the default mode's plans
// left as they were. The GPU scheduler against the oracle is in test_decode_schedule.cpp (DecodeScheduleGpu).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "decode_schedule_oracle.h"
#include "heuristics/decode_launch.h"
#include "heuristics/decode_schedule.h"
#include "kernels/combine/params.h"
#include "kernels/decode_scheduler/partition_walk.h"
#include "openmla/decode.h"

namespace openmla {
namespace {

using heuristics::DecodeScheduleHost;
using kernels::DecodeScheduleRecord;

constexpr int32_t kChunk = static_cast<int32_t>(kDecodeInvariantChunkTokens / 64);  // blocks
const int kPartCounts[] = {1, 2, 7, 33, 66, 132, 160};

std::string to_string(const DecodeScheduleRecord& r) {
  return "{" + std::to_string(r.begin_req) + "," + std::to_string(r.end_req) + "," + std::to_string(r.begin_block) +
         "," + std::to_string(r.end_block) + "," + std::to_string(r.begin_split) + "," +
         std::to_string(r.is_first_req_split) + "," + std::to_string(r.is_last_req_split) + "," +
         std::to_string(r.pad) + "}";
}

void expect_same_bytes(const DecodeScheduleHost& a, const DecodeScheduleHost& b, const std::string& what) {
  ASSERT_EQ(a.records.size(), b.records.size()) << what;
  for (size_t i = 0; i < a.records.size(); ++i)
    ASSERT_EQ(0, std::memcmp(&a.records[i], &b.records[i], sizeof(DecodeScheduleRecord)))
        << what << ": partition " << i << ": " << to_string(a.records[i]) << " vs " << to_string(b.records[i]);
  ASSERT_EQ(a.num_splits, b.num_splits) << what;
  ASSERT_EQ(a.walk_next, b.walk_next) << what;
}

std::vector<int32_t> random_blocks(std::mt19937& rng, int n, int32_t max_blocks) {
  std::vector<int32_t> v(n);
  for (auto& x : v) {
    const uint32_t kind = rng() % 8;
    x = kind == 0 ? 1 : kind == 1 ? static_cast<int32_t>(rng() % 4) + 1 : static_cast<int32_t>(rng() % max_blocks) + 1;
  }
  return v;
}

std::vector<std::vector<int32_t>> adversarial_lists() {
  std::mt19937 rng(77);
  std::vector<std::vector<int32_t>> lists = {
      {1},
      {kChunk},
      {kChunk + 1},
      {2 * kChunk},
      {512},
      {1 << 24},  // one huge request: 2^18 chunks
      {1, 1, 1, 1},
      {kChunk, 2 * kChunk, 3 * kChunk, 1, kChunk - 1, kChunk + 1},
      std::vector<int32_t>(128, 512),
      std::vector<int32_t>(128, 64),
      std::vector<int32_t>(1000, 3),
  };
  // The optimal cut's corner cases (66 partitions at h_q = 128 on 132 SMs): every chunk alike; exactly as many
  // chunks as partitions, one more, one fewer; one huge request among many tiny ones (first, last); a request of one
  // block between requests of many chunks.
  lists.push_back(std::vector<int32_t>(66, kChunk));
  lists.push_back(std::vector<int32_t>(67, kChunk));
  lists.push_back(std::vector<int32_t>(65, kChunk));
  lists.push_back(std::vector<int32_t>(33, 2 * kChunk));
  lists.push_back(std::vector<int32_t>(200, 7));
  {
    std::vector<int32_t> v(300, 1);
    v[0] = 100 * kChunk + 3;
    lists.push_back(v);
    std::reverse(v.begin(), v.end());
    lists.push_back(v);
  }
  lists.push_back({9 * kChunk, 1, 9 * kChunk, 1, 9 * kChunk - 1, kChunk + 1});
  lists.push_back(random_blocks(rng, 128, 1024));
  lists.push_back(random_blocks(rng, 500, 300));
  lists.push_back(random_blocks(rng, 9000, 200));  // crosses the GPU kernel's 4096-request staging
  return lists;
}

// ---- The production pass against the oracle ----------------------------------------------------------------------

TEST(DecodeInvariantWalk, MatchesOracle) {
  for (const auto& blocks : adversarial_lists()) {
    std::vector<bool> empty(blocks.size(), false);
    if (blocks.size() > 3) empty[1] = empty[blocks.size() - 1] = true;  // empty requests end their range at 0
    for (int parts : kPartCounts) {
      for (int32_t chunk : {1, 2, 7, kChunk}) {
        for (const bool alternate : {false, true}) {
          const std::string what = "b=" + std::to_string(blocks.size()) + " parts=" + std::to_string(parts) +
                                    " chunk=" + std::to_string(chunk) + " alternate=" + std::to_string(alternate);
          expect_same_bytes(heuristics::walk_invariant_schedule(blocks, empty, parts, chunk, alternate),
                            oracle::build_invariant_schedule(blocks, empty, parts, chunk, alternate), what);
        }
      }
    }
  }
}

TEST(DecodeInvariantWalk, AlternatingOrder) {
  EXPECT_EQ(heuristics::invariant_walk_order({5, 1, 9, 1, 9}, true), (std::vector<int32_t>{2, 3, 4, 1, 0}));
  EXPECT_EQ(heuristics::invariant_walk_order({5, 1, 9, 1, 9}, false), (std::vector<int32_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(heuristics::invariant_walk_order({3, 3, 3, 3}, true), (std::vector<int32_t>{0, 3, 1, 2}));
  EXPECT_EQ(heuristics::invariant_walk_order({7}, true), (std::vector<int32_t>{0}));
  const DecodeScheduleHost s = heuristics::walk_invariant_schedule({5, 1, 9, 1, 9}, {}, 2, kChunk, true);
  EXPECT_EQ(s.walk_next, (std::vector<int32_t>{-1, 0, 3, 4, 1}));
  EXPECT_EQ(s.num_splits, (std::vector<int32_t>{0, 1, 2, 3, 4, 5})) << "split slots stay in request order";
  std::vector<int32_t> big(kernels::kInvariantOrderMaxBatch + 1, 1);
  big[5] = 100;
  const std::vector<int32_t> order = heuristics::invariant_walk_order(big, true);
  for (int32_t i = 0; i < static_cast<int32_t>(big.size()); ++i) ASSERT_EQ(order[i], i) << "request order above the limit";
}

// Zero-length requests (dense, clamped length 0: one block of work, a range ending at block 0) anywhere, all of them.
TEST(DecodeInvariantWalk, EmptyRequestsMatchTheOracle) {
  const std::vector<std::vector<int32_t>> lists = {
      std::vector<int32_t>(64, 1), {1, 3 * kChunk, 1, 1, kChunk + 2, 1}, std::vector<int32_t>(500, 1)};
  for (const auto& blocks : lists) {
    for (const bool all : {false, true}) {
      std::vector<bool> empty(blocks.size(), all);
      for (size_t i = 0; i < blocks.size(); ++i) empty[i] = all || blocks[i] == 1;
      for (int parts : kPartCounts) {
        const std::string what = "b=" + std::to_string(blocks.size()) + " parts=" + std::to_string(parts);
        const DecodeScheduleHost s = heuristics::walk_invariant_schedule(blocks, empty, parts, kChunk, all);
        expect_same_bytes(s, oracle::build_invariant_schedule(blocks, empty, parts, kChunk, all), what);
        for (size_t p = 0; p < s.records.size(); ++p)
          if (s.records[p].begin_req < static_cast<int32_t>(blocks.size()) && empty[s.records[p].end_req])
            EXPECT_EQ(s.records[p].end_block, 0) << what << ": partition " << p;
      }
    }
  }
}

// ---- The kernels' reading of an invariant schedule -----------------------------------------------------------------
// What the main kernels run: per record, the items (request, first block, end block, split slot), walked as
// dense_decode's kernel.cuh and sparse_decode's request_work / cursor walk them (the range of each request from the
// record, cut at multiples of the chunk size; the split slot = the request's first slot + first block / chunk).
struct Item {
  int32_t req, begin, end, slot;
  int part;
};

std::vector<Item> kernel_items(const DecodeScheduleHost& s, const std::vector<int32_t>& blocks, int32_t chunk) {
  std::vector<Item> items;
  const int32_t batch = static_cast<int32_t>(blocks.size());
  for (size_t p = 0; p < s.records.size(); ++p) {
    const DecodeScheduleRecord& rec = s.records[p];
    if (rec.begin_req >= batch) continue;
    EXPECT_EQ(rec.pad & ~kernels::kRecordWalkListBit, chunk) << "an invariant record names its chunk size";
    EXPECT_EQ((rec.pad & kernels::kRecordWalkListBit) != 0, !s.walk_next.empty()) << "the record flags the walk order";
    int32_t req = rec.begin_req, begin = rec.begin_block;
    while (true) {
      const int32_t range_end = kernels::chunk_end_block(rec, req, blocks[req]);
      const int32_t end = kernels::invariant_chunk_end(begin, range_end, chunk);
      items.push_back({req, begin, end, s.num_splits[req] + begin / chunk, static_cast<int>(p)});
      if (end < range_end) {
        begin = end;
      } else if (req == rec.end_req) {
        break;
      } else {  // the next request in walk order (request order without a successor list)
        req = (rec.pad & kernels::kRecordWalkListBit) == 0 ? req + 1 : s.walk_next[req];  // as the kernel reads it
        EXPECT_GE(req, 0) << "partition " << p << " runs past the walk's last request";
        if (req < 0) break;
        begin = 0;
      }
    }
  }
  return items;
}

// What the batch does to one request: its chunk count (and so its merge path: 1 none, 2 the dense kernel's in-kernel
// merge, more the combine kernel, whose order is the slot order) and its chunks in slot order, as (first block, end
// block, slot - first slot). Everything that decides the arithmetic of its output.
using RequestView = std::tuple<int32_t, std::vector<std::tuple<int32_t, int32_t, int32_t>>>;

RequestView request_view(const DecodeScheduleHost& s, const std::vector<Item>& items, int32_t req) {
  std::map<int32_t, std::tuple<int32_t, int32_t, int32_t>> by_slot;
  const int32_t first = s.num_splits[req];
  for (const Item& it : items)
    if (it.req == req) {
      EXPECT_EQ(by_slot.count(it.slot), 0u) << "request " << req << ": slot " << it.slot << " written twice";
      by_slot[it.slot] = {it.begin, it.end, it.slot - first};
    }
  std::vector<std::tuple<int32_t, int32_t, int32_t>> chunks;
  for (const auto& [slot, c] : by_slot) chunks.push_back(c);
  return {s.num_splits[req + 1] - first, chunks};
}

// The rule itself, from the request's own blocks: ceil(n / C) chunks [cC, min((c + 1) C, n)).
RequestView expected_view(int32_t blocks, int32_t chunk) {
  const int32_t count = (blocks + chunk - 1) / chunk;
  std::vector<std::tuple<int32_t, int32_t, int32_t>> chunks;
  for (int32_t c = 0; c < count; ++c) chunks.emplace_back(c * chunk, std::min(blocks, (c + 1) * chunk), c);
  return {count, chunks};
}

TEST(DecodeInvariantWalk, EveryChunkIsOneItemAndEveryBlockIsCoveredOnce) {
  for (const auto& blocks : adversarial_lists()) {
    if (blocks.size() > 1000) continue;
    for (int parts : kPartCounts)
    for (const bool alternate : {false, true}) {
      const DecodeScheduleHost s = heuristics::walk_invariant_schedule(blocks, {}, parts, kChunk, alternate);
      const std::vector<Item> items = kernel_items(s, blocks, kChunk);
      for (int32_t r = 0; r < static_cast<int32_t>(blocks.size()); ++r)
        ASSERT_EQ(request_view(s, items, r), expected_view(blocks[r], kChunk))
            << "request " << r << " of b=" << blocks.size() << ", parts=" << parts;
      ASSERT_LE(s.num_splits.back(), heuristics::decode_split_slots(
                                         DenseDecodeProblem{.batch = static_cast<int64_t>(blocks.size()), .h_q = 1,
                                                            .max_blocks_per_seq = *std::max_element(blocks.begin(),
                                                                                                    blocks.end()),
                                                            .batch_invariant = true},
                                         parts))
          << "the split slots fit the invariant workspace";
    }
  }
}

// The property: a request decoded inside random batches (other sizes, other lengths, at other positions) gets the
// same partition as decoded alone.
TEST(DecodeInvariantWalk, ARequestsPartitionDoesNotDependOnTheBatch) {
  std::mt19937 rng(2024);
  const std::vector<int32_t> probes = {1, 2, kChunk - 1, kChunk, kChunk + 1, 3 * kChunk - 5, 512, 1000, 4097};
  for (int parts : {33, 66, 132}) {
    for (int32_t probe : probes) {
      const DecodeScheduleHost alone = heuristics::walk_invariant_schedule({probe}, {}, parts, kChunk, true);
      const RequestView want = request_view(alone, kernel_items(alone, {probe}, kChunk), 0);
      ASSERT_EQ(want, expected_view(probe, kChunk));
      for (int trial = 0; trial < 40; ++trial) {
        const int b = 1 + static_cast<int>(rng() % 200);
        std::vector<int32_t> blocks = random_blocks(rng, b, trial % 2 ? 64 : 1024);
        const int at = static_cast<int>(rng() % b);
        blocks[at] = probe;
        for (const bool alternate : {false, true}) {
          const DecodeScheduleHost s = heuristics::walk_invariant_schedule(blocks, {}, parts, kChunk, alternate);
          ASSERT_EQ(request_view(s, kernel_items(s, blocks, kChunk), at), want)
              << "probe " << probe << " at " << at << " of b=" << b << ", parts=" << parts
              << " alternate=" << alternate;
        }
      }
    }
  }
}

// Partitions a greedy packing of the chunk sequence at `load` needs (written here a third time, chunk by chunk).
int64_t greedy_parts(const std::vector<int32_t>& blocks, int32_t chunk, int64_t load,
                     const std::vector<int32_t>& order) {
  int64_t parts = 0, used = 0;
  for (int32_t i : order) {
    const int32_t n = blocks[i];
    for (int32_t b0 = 0; b0 < n; b0 += chunk) {
      const int64_t cost = std::min(n - b0, chunk) + kernels::kDecodeRequestOverheadBlocks;
      if (cost > load) return INT64_MAX;
      if (parts == 0 || used + cost > load) {
        ++parts;
        used = 0;
      }
      used += cost;
    }
  }
  return parts;
}

// The cut is optimal: its heaviest partition holds the load the pass chose, and no contiguous cut of the chunk
// sequence into the same partitions has a lighter heaviest one (the greedy packing, optimal for a given load, needs
// more partitions one block below it).
TEST(DecodeInvariantWalk, TheCutIsOptimal) {
  std::mt19937 rng(5);
  std::vector<std::vector<int32_t>> lists = adversarial_lists();
  for (int trial = 0; trial < 30; ++trial) lists.push_back(random_blocks(rng, 1 + static_cast<int>(rng() % 300), 600));
  for (const auto& blocks : lists) {
    if (blocks.size() > 1000) continue;
    for (int parts : kPartCounts)
    for (const bool alternate : {false, true}) {
      const std::string what = "b=" + std::to_string(blocks.size()) + " parts=" + std::to_string(parts) +
                               " alternate=" + std::to_string(alternate);
      const DecodeScheduleHost s = heuristics::walk_invariant_schedule(blocks, {}, parts, kChunk, alternate);
      std::vector<int64_t> load(parts, 0);
      for (const Item& it : kernel_items(s, blocks, kChunk))
        load[it.part] += it.end - it.begin + kernels::kDecodeRequestOverheadBlocks;
      const int64_t chosen = heuristics::invariant_schedule_load(blocks, parts, kChunk, alternate);
      const std::vector<int32_t> order = heuristics::invariant_walk_order(blocks, alternate);
      const int64_t heaviest = *std::max_element(load.begin(), load.end());
      EXPECT_LE(heaviest, chosen) << what;
      EXPECT_LE(greedy_parts(blocks, kChunk, chosen, order), parts) << what;
      EXPECT_GT(greedy_parts(blocks, kChunk, chosen - 1, order), parts) << what << ": a lighter cut exists";
      EXPECT_EQ(heaviest, chosen) << what;
    }
  }
}

// The default pass, for contrast: the same request gets other split points in other batches (what the mode fixes).
TEST(DecodeInvariantWalk, TheDefaultPassDependsOnTheBatch) {
  const std::vector<int32_t> alone = {512}, batch = {100, 512, 300};
  const auto a = heuristics::walk_decode_schedule(alone, {}, 66, heuristics::decode_schedule_payload(alone, 66));
  const auto b = heuristics::walk_decode_schedule(batch, {}, 66, heuristics::decode_schedule_payload(batch, 66));
  EXPECT_NE(a.num_splits[1] - a.num_splits[0], b.num_splits[2] - b.num_splits[1]);
}

TEST(DecodeInvariantWalk, BalancesUniformBatchesLikeTheDefault) {
  // b = 128 requests of 2 chunks (8K tokens) over 66 partitions: no partition holds more than 4 chunks.
  const DecodeScheduleHost s = heuristics::walk_invariant_schedule(std::vector<int32_t>(128, 2 * kChunk), {}, 66, kChunk);
  const std::vector<Item> items = kernel_items(s, std::vector<int32_t>(128, 2 * kChunk), kChunk);
  std::vector<int> per_part(66, 0);
  for (const Item& it : items) ++per_part[it.part];
  for (int p = 0; p < 66; ++p) EXPECT_LE(per_part[p], 4) << "partition " << p;
  EXPECT_EQ(static_cast<int>(items.size()), 256);
}

// ---- Problem rules -------------------------------------------------------------------------------------------------

TEST(DecodeInvariantProblem, ChunkSizeAndSplitSlots) {
  DenseDecodeProblem d{.batch = 128, .s_q = 2, .h_q = 128, .max_blocks_per_seq = 512};
  EXPECT_EQ(heuristics::decode_chunk_blocks(d), 0);
  EXPECT_EQ(heuristics::decode_split_slots(d, 33), 128 + 33);  // the default mode's slots, unchanged
  d.batch_invariant = true;
  EXPECT_EQ(heuristics::decode_chunk_blocks(d), kChunk);
  EXPECT_EQ(kChunk % 1, 0);
  EXPECT_EQ(kDecodeInvariantChunkTokens % 64, 0);
  EXPECT_EQ(heuristics::decode_split_slots(d, 33), 128 * ((512 + kChunk - 1) / kChunk));
  SparseDecodeProblem s{.batch = 64, .s_q = 2, .h_q = 128, .topk = 2048};
  EXPECT_EQ(heuristics::decode_chunk_blocks(s), 0);
  EXPECT_EQ(heuristics::decode_split_slots(s, 33), 64 + 33);
  s.batch_invariant = true;
  EXPECT_EQ(heuristics::decode_split_slots(s, 33), 64 * ((32 + kChunk - 1) / kChunk));
  s.topk = 16384;
  EXPECT_EQ(heuristics::decode_split_slots(s, 33), 64 * ((256 + kChunk - 1) / kChunk));
}

TEST(DecodeInvariantProblem, WorkspaceSizes) {
  DenseDecodeProblem d{.batch = 8, .s_q = 1, .h_q = 128, .num_sms = 132, .max_blocks_per_seq = 1000};
  DecodeWorkspaceSizes plain, inv;
  ASSERT_TRUE(get_decode_workspace_sizes(d, &plain).is_ok());
  EXPECT_EQ(plain.partial_rows, (8 + 66) * 128);
  d.batch_invariant = true;
  ASSERT_TRUE(get_decode_workspace_sizes(d, &inv).is_ok());
  EXPECT_EQ(inv.num_sm_parts, plain.num_sm_parts);
  EXPECT_EQ(inv.partial_rows, 8 * ((1000 + kChunk - 1) / kChunk) * 128);
  EXPECT_EQ(inv.merge_counter_ints, plain.merge_counter_ints + 8) << "the walk order's successor list after the counters";
  d.max_blocks_per_seq = 0;
  const Status st = get_decode_workspace_sizes(d, &inv);
  EXPECT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("max_blocks_per_seq"), std::string::npos) << st.message();
  DecodeProblem compat{.batch = 8, .s_q = 1, .h_q = 128, .num_sms = 132, .max_blocks_per_seq = 1000,
                       .batch_invariant = true};
  EXPECT_TRUE(compat.as_dense().batch_invariant);
  EXPECT_TRUE(compat.as_sparse().batch_invariant);
}

TEST(DecodeInvariantProblem, SparseLaunchPlanDoesNotFollowTheBatch) {
  SparseDecodeProblem p{.batch = 2, .s_q = 2, .h_q = 128, .topk = 2048, .num_sms = 132};
  const auto plain = heuristics::plan_sparse_decode_launch(p, 33, false, false);
  EXPECT_GT(plain.uniform_blocks, 0);  // the default small-batch plan: host records, plain kernel
  EXPECT_FALSE(plain.crossover);
  p.batch_invariant = true;
  for (int64_t b : {1, 2, 8, 16, 64, 128}) {
    p.batch = b;
    const auto inv = heuristics::plan_sparse_decode_launch(p, 33, false, false);
    EXPECT_EQ(inv.uniform_blocks, 0) << "b=" << b;
    EXPECT_TRUE(inv.crossover) << "b=" << b;
  }
  p.h_q = 64;
  EXPECT_FALSE(heuristics::plan_sparse_decode_launch(p, 66, false, false).crossover);
}

}  // namespace
}  // namespace openmla
