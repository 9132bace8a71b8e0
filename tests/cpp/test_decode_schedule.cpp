// Decode schedule: the partition-count heuristics, per-request work sizes, the test oracle of the GPU scheduler
// (decode_schedule_oracle.h: exact records on hand-derived cases, invariants on adversarial length lists), the
// production host run of the GPU's own request-major walk (heuristics::walk_decode_schedule) against the oracle,
// and the GPU kernel against the oracle (skipped without a Hopper GPU).
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "decode_schedule_oracle.h"
#include "heuristics/decode_launch.h"
#include "heuristics/decode_schedule.h"
#include "kernels/decode_scheduler/launch.h"
#include "kernels/decode_scheduler/partition_walk.h"
#include "openmla/capability.h"
#include "openmla/decode.h"

namespace openmla {
namespace {

using heuristics::DecodeScheduleHost;
using kernels::DecodeScheduleRecord;
using kernels::kDecodeRequestOverheadBlocks;

constexpr int32_t kInt32Max = 2147483647;

DecodeScheduleRecord rec(int32_t br, int32_t er, int32_t bb, int32_t eb, int32_t bs, int32_t f, int32_t l) {
  return DecodeScheduleRecord{br, er, bb, eb, bs, f, l, 0};
}

std::string to_string(const DecodeScheduleRecord& r) {
  return "{" + std::to_string(r.begin_req) + "," + std::to_string(r.end_req) + "," + std::to_string(r.begin_block) +
         "," + std::to_string(r.end_block) + "," + std::to_string(r.begin_split) + "," +
         std::to_string(r.is_first_req_split) + "," + std::to_string(r.is_last_req_split) + "," +
         std::to_string(r.pad) + "}";
}

void expect_records(const std::vector<DecodeScheduleRecord>& got, const std::vector<DecodeScheduleRecord>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_EQ(0, std::memcmp(&got[i], &want[i], sizeof(DecodeScheduleRecord)))
        << "partition " << i << ": got " << to_string(got[i]) << ", want " << to_string(want[i]);
}

// ---- Heuristics ------------------------------------------------------------------------------------------

TEST(DecodeScheduleHeuristics, DenseNumSmParts) {
  // docs/decode-schedule.md section 1: 132 SMs, h_q = 128, h_kv = 1.
  EXPECT_EQ(heuristics::dense_num_sm_parts(1, 128, 1, 132), 66);
  EXPECT_EQ(heuristics::dense_num_sm_parts(2, 128, 1, 132), 33);
  EXPECT_EQ(heuristics::dense_num_sm_parts(1, 16, 1, 132), 132);
  EXPECT_EQ(heuristics::dense_num_sm_parts(4, 128, 1, 132), 16);   // 8 m-blocks
  EXPECT_EQ(heuristics::dense_num_sm_parts(1, 64, 8, 132), 16);    // 8 rows per kv head: 1 m-block, 132 / 8
  EXPECT_EQ(heuristics::dense_num_sm_parts(2, 126, 2, 132), 33);   // 126 rows per kv head -> 2 m-blocks
  EXPECT_EQ(heuristics::dense_num_sm_parts(1, 16, 1, 400), kMaxDecodeSmParts);  // capped for the combine
  EXPECT_EQ(heuristics::dense_num_sm_parts(64, 128, 8, 132), 1);   // never below 1
}

TEST(DecodeScheduleHeuristics, SparseNumSmParts) {
  EXPECT_EQ(heuristics::sparse_num_sm_parts(2, 128, 132), 33);
  EXPECT_EQ(heuristics::sparse_num_sm_parts(1, 64, 132), 132);
  EXPECT_EQ(heuristics::sparse_num_sm_parts(1, 128, 132), 66);
  EXPECT_EQ(heuristics::sparse_num_sm_parts(300, 128, 132), 1);
  EXPECT_EQ(heuristics::decode_num_sm_parts(SparseDecodeProblem{.batch = 4, .s_q = 2, .h_q = 128}, 132), 33);
  EXPECT_EQ(heuristics::decode_num_sm_parts(DenseDecodeProblem{.batch = 4, .s_q = 1, .h_q = 128}, 132), 66);
  EXPECT_EQ(heuristics::decode_num_sm_parts(DenseDecodeProblem{.batch = 4, .s_q = 1, .h_q = 64, .h_kv = 8}, 132), 16);
}

TEST(DecodeScheduleHeuristics, DenseRequestBlocks) {
  EXPECT_EQ(heuristics::dense_request_blocks(0), 1);
  EXPECT_EQ(heuristics::dense_request_blocks(-5), 1);
  EXPECT_EQ(heuristics::dense_request_blocks(1), 1);
  EXPECT_EQ(heuristics::dense_request_blocks(64), 1);
  EXPECT_EQ(heuristics::dense_request_blocks(65), 2);
  EXPECT_EQ(heuristics::dense_request_blocks(4096), 64);
  EXPECT_EQ(heuristics::dense_request_blocks(kInt32Max), 33554432);
  EXPECT_TRUE(heuristics::dense_request_empty(0));
  EXPECT_FALSE(heuristics::dense_request_empty(1));
}

// The scheduler clamps what the kernel clamps: a length beyond the block table's capacity (max_blocks_per_seq * 64)
// costs what the capacity does; a negative one what 0 does.
TEST(DecodeScheduleHeuristics, DenseRequestBlocksClampToTheBlockTable) {
  constexpr int32_t kCapacity = 128 * 64;  // 128 block-table columns
  EXPECT_EQ(heuristics::dense_request_blocks(kInt32Max, kCapacity), 128);
  EXPECT_EQ(heuristics::dense_request_blocks(kCapacity + 1, kCapacity), 128);
  EXPECT_EQ(heuristics::dense_request_blocks(kCapacity, kCapacity), 128);
  EXPECT_EQ(heuristics::dense_request_blocks(100, kCapacity), 2);
  EXPECT_EQ(heuristics::dense_request_blocks(-2147483647 - 1, kCapacity), 1);
  EXPECT_TRUE(heuristics::dense_request_empty(-5, kCapacity));
  EXPECT_FALSE(heuristics::dense_request_empty(kInt32Max, kCapacity));
  EXPECT_EQ(heuristics::dense_request_blocks(kInt32Max, 0), 33554432);  // capacity not given: the raw length
  EXPECT_EQ(kernels::dense_request_blocks_signed(0, kCapacity), -1);
  EXPECT_EQ(kernels::dense_request_blocks_signed(kInt32Max, kCapacity), 128);
}

TEST(DecodeScheduleHeuristics, SparseRequestBlocks) {
  const int32_t zero = 0, one = 1, len100 = 100, huge = 100000, neg = -7, e70 = 70;
  EXPECT_EQ(heuristics::sparse_request_blocks(2048, nullptr, 0, nullptr), 32);
  EXPECT_EQ(heuristics::sparse_request_blocks(2048, &zero, 0, nullptr), 1);    // raised to one slot
  EXPECT_EQ(heuristics::sparse_request_blocks(2048, &neg, 0, nullptr), 1);
  EXPECT_EQ(heuristics::sparse_request_blocks(2048, &len100, 0, nullptr), 2);
  EXPECT_EQ(heuristics::sparse_request_blocks(2048, &huge, 0, nullptr), 32);   // clamped to topk
  // Extra cache: main part rounded to whole blocks, then the extra slots.
  EXPECT_EQ(heuristics::sparse_request_blocks(2048, &zero, 512, nullptr), 1 + 8);
  EXPECT_EQ(heuristics::sparse_request_blocks(2048, &len100, 512, &e70), 2 + 2);
  EXPECT_EQ(heuristics::sparse_request_blocks(2048, &one, 512, &zero), 1);
  EXPECT_EQ(heuristics::sparse_request_blocks(2048, nullptr, 512, &huge), 32 + 8);
}

// Crossover pairs need an even tile count and more than kSparsePlainMaxBlocks blocks per partition
// (docs/sparse-decode.md, decisions sparse-v25, sparse-v29). The benchmark's rows on 132 SMs: h_q = 128,
// s_q = 2, topk 2048 -> 33 partitions of b = 2 -> 3, b = 4 -> 5, b = 8 -> 8 blocks (plain), b = 16 -> 16 (crossover)
// (the tight payload of small batches; ceil(b * (32 + 5) / 33) = 3 / 5 / 9 / 18 without it).
TEST(DecodeScheduleHeuristics, SparseCrossoverChoice) {
  const auto partition_blocks = [](int64_t b) {
    return heuristics::decode_schedule_payload(std::vector<int32_t>(b, 32), 33) - kernels::kDecodeRequestOverheadBlocks;
  };
  EXPECT_EQ(partition_blocks(2), 3);
  EXPECT_EQ(partition_blocks(4), 5);
  EXPECT_EQ(partition_blocks(8), 8);   // the tight payload of small batches (decision schedule-v2)
  EXPECT_EQ(partition_blocks(16), 16);
  EXPECT_FALSE(heuristics::sparse_use_crossover(2, partition_blocks(2)));
  EXPECT_FALSE(heuristics::sparse_use_crossover(2, partition_blocks(4)));
  EXPECT_FALSE(heuristics::sparse_use_crossover(2, partition_blocks(8)));
  EXPECT_TRUE(heuristics::sparse_use_crossover(2, partition_blocks(16)));
  EXPECT_TRUE(heuristics::sparse_use_crossover(2, 0));   // not uniform: the block count is not known on the host
  EXPECT_TRUE(heuristics::sparse_use_crossover(4, heuristics::kSparsePlainMaxBlocks + 1));
  EXPECT_FALSE(heuristics::sparse_use_crossover(2, 1));
  EXPECT_FALSE(heuristics::sparse_use_crossover(1, 0));  // one tile (h_q <= 64): never
  EXPECT_FALSE(heuristics::sparse_use_crossover(3, 100));  // odd tile count: never
}

// ---- The oracle on hand-derived cases -------------------------------------------------------------------

// docs/decode-schedule.md worked example: 8 partitions, seqlens [4096, 0, 100, 8192] -> blocks [64, 1, 2, 128],
// total 215, payload ceil(215 / 8) + 5 = 32, i.e. 27 blocks of a long request per partition.
// The worked example walks the default payload, 32; as a small batch (2 * 4 <= 8 partitions) the scheduler takes 31
// there (TightPayloadOfTheWorkedExample below).
TEST(DecodeScheduleOracle, WorkedExample) {
  const DecodeScheduleHost s = oracle::build_decode_schedule({64, 1, 2, 128}, {false, true, false, false}, 8, 32);
  EXPECT_TRUE(s.all_assigned);
  EXPECT_EQ(heuristics::decode_payload(heuristics::decode_total_work({64, 1, 2, 128}), 8), 32);
  expect_records(s.records, {
                                rec(0, 0, 0, 27, 0, 1, 1),
                                rec(0, 0, 27, 54, 1, 1, 1),
                                rec(0, 2, 54, 2, 2, 1, 0),  // finishes 0, empty 1 (end 0), whole 2
                                rec(3, 3, 0, 27, 0, 1, 1),
                                rec(3, 3, 27, 54, 1, 1, 1),
                                rec(3, 3, 54, 81, 2, 1, 1),
                                rec(3, 3, 81, 108, 3, 1, 1),
                                rec(3, 3, 108, 128, 4, 1, 1),  // begin == end: flags are the OR
                            });
  EXPECT_EQ(s.num_splits, (std::vector<int32_t>{0, 3, 4, 5, 10}));
}

// Small batches (2 * batch <= parts) take the smallest payload below the default whose walk still fits (decision
// schedule-v2). The worked example: candidates 27 .. 31 (ceil(215 / 8) = 27); 27-30 leave request 3 unassigned, 31
// fits: chunks of 26 blocks, the same split counts, the largest partition 26 blocks instead of 27.
TEST(DecodeScheduleOracle, TightPayloadOfTheWorkedExample) {
  EXPECT_EQ(heuristics::decode_schedule_payload({64, 1, 2, 128}, 8), 31);
  const DecodeScheduleHost s = oracle::build_dense_decode_schedule({4096, 0, 100, 8192}, 8);
  EXPECT_TRUE(s.all_assigned);
  expect_records(s.records, {
                                rec(0, 0, 0, 26, 0, 1, 1),
                                rec(0, 0, 26, 52, 1, 1, 1),
                                rec(0, 2, 52, 2, 2, 1, 0),  // the last 12 blocks of 0, empty 1, whole 2
                                rec(3, 3, 0, 26, 0, 1, 1),
                                rec(3, 3, 26, 52, 1, 1, 1),
                                rec(3, 3, 52, 78, 2, 1, 1),
                                rec(3, 3, 78, 104, 3, 1, 1),
                                rec(3, 3, 104, 128, 4, 1, 1),
                            });
  EXPECT_EQ(s.num_splits, (std::vector<int32_t>{0, 3, 4, 5, 10}));
}

// The rows the rule was made for (H100: 66 partitions at h_q = 128, s_q = 1; 33 at s_q = 2 or sparse h_q = 128, s_q = 2).
TEST(DecodeScheduleHeuristics, TightPayloadOfSmallUniformBatches) {
  const auto payload = [](int b, int32_t blocks, int parts) {
    return heuristics::decode_schedule_payload(std::vector<int32_t>(b, blocks), parts);
  };
  EXPECT_EQ(payload(32, 64, 66), 37);   // dense b = 32, 4K: 32 + 32 blocks per request instead of 34 + 30
  EXPECT_EQ(payload(8, 64, 66), 13);    // dense b = 8, 4K: 8 blocks per partition instead of 9
  EXPECT_EQ(payload(4, 2048, 66), 130); // dense b = 4, 128K: the default already fits tightest
  EXPECT_EQ(payload(16, 32, 33), 21);   // sparse b = 16, topk 2048: 16 blocks instead of 18
  EXPECT_EQ(payload(8, 32, 33), 13);    // sparse b = 8: 8 instead of 9
  EXPECT_EQ(payload(4, 32, 33), 10);    // sparse b = 4: 5 (4 would fit, but not above the floor of 5 blocks)
  // Partitions of at most kTightPayloadMinBlocks (the overhead, 5) blocks stay as they were: the split partials and
  // the combine then cost more than the blocks saved (partition_walk.h).
  EXPECT_EQ(payload(2, 32, 33), 8);     // sparse b = 2: 3 blocks (2 would fit)
  EXPECT_EQ(payload(1, 64, 66), 7);     // dense b = 1, 4K: 2 blocks (1 would fit)
  EXPECT_EQ(payload(17, 32, 33), heuristics::decode_payload(17 * 37, 33));  // 2 * 17 > 33: the default
  EXPECT_EQ(payload(128, 64, 132), heuristics::decode_payload(128 * 69, 132));  // h_q = 16 rows keep the default
}

TEST(DecodeScheduleOracle, SmallRequestsShareOnePartitionAndIdleTail) {
  // blocks [1, 2, 1], total 19, 4 parts: payload ceil(19/4) + 5 = 10.
  // p0: req 0 (6) -> budget 4 < 7: stop. p1: req 1 (7) -> 3: stop. p2: req 2 (6). p3 idle.
  const DecodeScheduleHost s = oracle::build_dense_decode_schedule({10, 100, 0}, 4);
  expect_records(s.records, {
                                rec(0, 0, 0, 1, 0, 0, 0),
                                rec(1, 1, 0, 2, 0, 0, 0),
                                rec(2, 2, 0, 0, 0, 0, 0),  // empty request: end_block 0
                                rec(3, 2, 0, 0, 0, 0, 0),  // idle: begin_req = batch, end_req = batch - 1
                            });
  EXPECT_EQ(s.num_splits, (std::vector<int32_t>{0, 1, 2, 3}));
}

TEST(DecodeScheduleOracle, OnePartitionTakesEverything) {
  const DecodeScheduleHost s = oracle::build_dense_decode_schedule({64, 65, 1000}, 1);
  expect_records(s.records, {rec(0, 2, 0, 16, 0, 0, 0)});
  EXPECT_EQ(s.num_splits, (std::vector<int32_t>{0, 1, 2, 3}));
}

TEST(DecodeScheduleOracle, MidRequestStartAndEndFlags) {
  // blocks [10, 10], 2 parts: total 30, payload 20. p0: req 0 whole (15) -> budget 5: stop before req 1?
  // 5 - 5 = 0: yes, stop. p1: req 1 whole. Then with 3 parts: payload 15: p0 req 0 (15) exactly.
  DecodeScheduleHost s = oracle::build_dense_decode_schedule({640, 640}, 2);
  expect_records(s.records, {rec(0, 0, 0, 10, 0, 0, 0), rec(1, 1, 0, 10, 0, 0, 0)});
  // blocks [20, 20], 3 parts: total 50, payload 22. p0: req 0 takes 17 (split). p1: rest of req 0 (3+5=8)
  // then 14 left: req 1 takes 9 (split). p2: rest of req 1 (11 + 5 = 16).
  s = oracle::build_dense_decode_schedule({1280, 1280}, 3);
  expect_records(s.records, {rec(0, 0, 0, 17, 0, 1, 1), rec(0, 1, 17, 9, 1, 1, 1), rec(1, 1, 9, 20, 1, 1, 1)});
  EXPECT_EQ(s.num_splits, (std::vector<int32_t>{0, 2, 4}));
}

TEST(DecodeScheduleOracle, FailureEncoding) {
  // A payload that cannot hold one block (override) must be reported, not half-written.
  const DecodeScheduleHost s = oracle::build_decode_schedule({3, 4}, {}, 2, /*payload_override=*/5);
  EXPECT_FALSE(s.all_assigned);
  expect_records(s.records, {rec(2, 1, 0, 0, 0, 0, 0), rec(2, 1, 0, 0, 0, 0, 0)});
  EXPECT_EQ(s.num_splits, (std::vector<int32_t>{0, 0, heuristics::kDecodeScheduleFailed}));
  // Progress but not enough partitions.
  const DecodeScheduleHost t = oracle::build_decode_schedule({30, 30}, {}, 2, /*payload_override=*/10);
  EXPECT_FALSE(t.all_assigned);
  EXPECT_EQ(t.num_splits.back(), heuristics::kDecodeScheduleFailed);
}

// ---- Invariants on adversarial lists -----------------------------------------------------------------------

// Checks everything the main kernel and the combine rely on. `blocks` / `empty` as given to the pass.
void check_invariants(const DecodeScheduleHost& s, const std::vector<int32_t>& blocks, const std::vector<bool>& empty,
                      int parts) {
  const int32_t batch = static_cast<int32_t>(blocks.size());
  ASSERT_TRUE(s.all_assigned);
  ASSERT_EQ(static_cast<int>(s.records.size()), parts);
  ASSERT_EQ(static_cast<int32_t>(s.num_splits.size()), batch + 1);
  ASSERT_EQ(s.num_splits[0], 0);
  for (int32_t i = 0; i < batch; ++i) {
    ASSERT_GE(s.num_splits[i + 1] - s.num_splits[i], 1) << "request " << i;
    if (blocks[i] == 1) ASSERT_EQ(s.num_splits[i + 1] - s.num_splits[i], 1) << "one-block request " << i << " split";
  }
  ASSERT_LE(s.num_splits[batch], batch + parts);

  const int64_t payload = heuristics::decode_schedule_payload(blocks, parts);
  const auto end_of = [&](int32_t r) { return (!empty.empty() && empty[r]) ? 0 : blocks[r]; };
  std::vector<int64_t> next_block(batch, 0);
  std::vector<int32_t> next_split(batch, 0);
  int32_t expect_req = 0;  // requests are covered in order
  bool idle_seen = false;
  for (int p = 0; p < parts; ++p) {
    const DecodeScheduleRecord& r = s.records[p];
    ASSERT_EQ(r.pad, 0);
    if (r.begin_req == batch) {
      idle_seen = true;
      const DecodeScheduleRecord idle = kernels::PartitionWalk::idle_record(batch);
      ASSERT_EQ(0, std::memcmp(&r, &idle, sizeof(r))) << "partition " << p;
      continue;
    }
    ASSERT_FALSE(idle_seen) << "busy partition " << p << " after an idle one";
    ASSERT_LE(r.begin_req, r.end_req);
    ASSERT_LT(r.end_req, batch);
    int64_t load = 0;
    bool first_partial = false, last_partial = false;
    for (int32_t q = r.begin_req; q <= r.end_req; ++q) {
      // The end of a chunk strictly before end_req is the request's end.
      const int64_t begin = q == r.begin_req ? r.begin_block : 0;
      const int64_t end = q == r.end_req ? r.end_block : end_of(q);
      const int32_t ordinal = q == r.begin_req ? r.begin_split : 0;
      ASSERT_EQ(q, expect_req) << "partition " << p << ": requests must be covered in order";
      ASSERT_EQ(begin, next_block[q]) << "partition " << p << " request " << q;
      ASSERT_EQ(ordinal, next_split[q]) << "partition " << p << " request " << q;
      const bool finished = end == end_of(q);
      if (!finished) {
        ASSERT_EQ(q, r.end_req) << "only the end request may stop mid-way";
        ASSERT_GT(end, begin) << "a split chunk takes at least one block";
      }
      if (q == r.begin_req) first_partial = begin > 0;
      if (q == r.end_req) last_partial = !finished;
      load += (finished ? blocks[q] - begin : end - begin) + kDecodeRequestOverheadBlocks;
      next_block[q] = end;
      ++next_split[q];
      expect_req = finished ? q + 1 : q;
    }
    ASSERT_LE(load, payload) << "partition " << p << " over its payload";
    if (r.begin_req == r.end_req) {
      ASSERT_EQ(r.is_first_req_split, (first_partial || last_partial) ? 1 : 0) << "partition " << p;
      ASSERT_EQ(r.is_last_req_split, r.is_first_req_split) << "partition " << p;
    } else {
      ASSERT_EQ(r.is_first_req_split, first_partial ? 1 : 0) << "partition " << p;
      ASSERT_EQ(r.is_last_req_split, last_partial ? 1 : 0) << "partition " << p;
    }
  }
  ASSERT_EQ(expect_req, batch) << "not every request covered";
  for (int32_t q = 0; q < batch; ++q) {
    ASSERT_EQ(next_block[q], end_of(q)) << "request " << q;
    ASSERT_EQ(next_split[q], s.num_splits[q + 1] - s.num_splits[q]) << "request " << q;
  }
}

// The GPU kernel's request-major walk (partition_walk.h) as production runs it on the host.
DecodeScheduleHost run_walk(const std::vector<int32_t>& blocks, const std::vector<bool>& empty, int parts,
                            int64_t payload_override = 0) {
  const int64_t payload = payload_override > 0
                              ? payload_override
                              : heuristics::decode_schedule_payload(blocks, parts);
  return heuristics::walk_decode_schedule(blocks, empty, parts, payload);
}

void expect_same_bytes(const DecodeScheduleHost& a, const DecodeScheduleHost& b, const std::string& what) {
  ASSERT_EQ(a.records.size(), b.records.size()) << what;
  ASSERT_EQ(a.num_splits.size(), b.num_splits.size()) << what;
  for (size_t i = 0; i < a.records.size(); ++i)
    ASSERT_EQ(0, std::memcmp(&a.records[i], &b.records[i], sizeof(DecodeScheduleRecord)))
        << what << ": partition " << i << ": " << to_string(a.records[i]) << " vs " << to_string(b.records[i]);
  ASSERT_EQ(a.num_splits, b.num_splits) << what;
  ASSERT_EQ(a.walk_next, b.walk_next) << what;
}

// Per-request work of dense cache_seqlens, from the heuristics' per-request rules (tested on their own
// above): the inputs of the oracle's greedy pass and of the GPU walk.
struct DenseWork {
  std::vector<int32_t> blocks;
  std::vector<bool> empty;
};

DenseWork dense_work(const std::vector<int32_t>& seqlens) {
  DenseWork w;
  for (int32_t L : seqlens) {
    w.blocks.push_back(heuristics::dense_request_blocks(L));
    w.empty.push_back(heuristics::dense_request_empty(L));
  }
  return w;
}

struct SeqlenCase {
  std::string name;
  std::vector<int32_t> seqlens;
};

std::vector<SeqlenCase> adversarial_cases() {
  std::vector<SeqlenCase> cases;
  cases.push_back({"all_zero", std::vector<int32_t>(64, 0)});
  cases.push_back({"b1_zero", {0}});
  cases.push_back({"b1_small", {5}});
  cases.push_back({"b1_long", {32768}});
  cases.push_back({"one_huge", {kInt32Max}});
  cases.push_back({"one_huge_among_small", {1, 0, kInt32Max - 63, 64, 65, 0}});
  cases.push_back({"exact_multiples", {64, 128, 192, 4096, 8192}});
  cases.push_back({"worked_example", {4096, 0, 100, 8192}});
  cases.push_back({"negative_as_zero", {-1, 100, -2147483647 - 1, 300}});
  std::mt19937 rng(1234);
  std::vector<int32_t> many(500);
  for (auto& v : many) v = static_cast<int32_t>(rng() % 2000);
  cases.push_back({"b500_gt_sms", many});
  std::vector<int32_t> uniform(128, 8192);
  cases.push_back({"b128_uniform_8k", uniform});
  std::vector<int32_t> random(1000);
  for (auto& v : random) {
    const uint32_t kind = rng() % 10;
    v = kind == 0 ? 0 : kind == 1 ? static_cast<int32_t>(rng() % 64) + 1 : static_cast<int32_t>(rng() % 70000);
  }
  cases.push_back({"b1000_random", random});
  std::vector<int32_t> chunky(9000);  // crosses the GPU kernel's 4096-request staging chunks
  for (auto& v : chunky) v = static_cast<int32_t>(rng() % 300);
  cases.push_back({"b9000_chunks", chunky});
  return cases;
}

const int kPartCounts[] = {1, 2, 7, 33, 66, 132, 160};

TEST(DecodeScheduleOracle, InvariantsOnAdversarialLists) {
  for (const auto& c : adversarial_cases()) {
    const auto [blocks, empty] = dense_work(c.seqlens);
    for (int parts : kPartCounts) {
      SCOPED_TRACE(c.name + " parts=" + std::to_string(parts));
      const DecodeScheduleHost s = oracle::build_dense_decode_schedule(c.seqlens, parts);
      check_invariants(s, blocks, empty, parts);
    }
  }
}

TEST(DecodeScheduleOracle, SparseInvariants) {
  std::mt19937 rng(99);
  std::vector<int32_t> len(300), extra_len(300);
  for (auto& v : len) v = static_cast<int32_t>(rng() % 2200) - 50;  // some negative, some > topk
  for (auto& v : extra_len) v = static_cast<int32_t>(rng() % 600);
  for (int parts : kPartCounts) {
    SCOPED_TRACE("parts=" + std::to_string(parts));
    const DecodeScheduleHost a = oracle::build_sparse_decode_schedule(300, 2048, {}, 0, {}, parts);
    check_invariants(a, std::vector<int32_t>(300, 32), {}, parts);
    const DecodeScheduleHost b = oracle::build_sparse_decode_schedule(300, 2048, len, 512, extra_len, parts);
    std::vector<int32_t> blocks;
    for (int i = 0; i < 300; ++i) blocks.push_back(heuristics::sparse_request_blocks(2048, &len[i], 512, &extra_len[i]));
    check_invariants(b, blocks, {}, parts);
  }
}

// The GPU kernel's walk (request-major), run on the host as production does, must give the oracle's
// (partition-major) bytes.
TEST(DecodeScheduleWalk, MatchesOracleOnAdversarialLists) {
  for (const auto& c : adversarial_cases()) {
    const auto [blocks, empty] = dense_work(c.seqlens);
    for (int parts : kPartCounts) {
      expect_same_bytes(run_walk(blocks, empty, parts), oracle::build_dense_decode_schedule(c.seqlens, parts),
                        c.name + " parts=" + std::to_string(parts));
    }
  }
}

// With the block table's capacity the walk (the GPU scheduler's code) gives the oracle's bytes for the lengths the
// oracle clamps on its own, on the adversarial lists (2^31 - 1, INT_MIN, ...) and every capacity.
TEST(DecodeScheduleWalk, ClampedLengthsMatchTheOracle) {
  for (const auto& c : adversarial_cases()) {
    for (const int32_t capacity : {64, 4096, 8192, 128 * 1024}) {
      DenseWork w;
      for (int32_t L : c.seqlens) {
        w.blocks.push_back(heuristics::dense_request_blocks(L, capacity));
        w.empty.push_back(heuristics::dense_request_empty(L, capacity));
      }
      for (int parts : {1, 33, 66, 160}) {
        expect_same_bytes(run_walk(w.blocks, w.empty, parts),
                          oracle::build_dense_decode_schedule(c.seqlens, parts, capacity),
                          c.name + " capacity=" + std::to_string(capacity) + " parts=" + std::to_string(parts));
      }
    }
  }
}

// b = 128 x 8K with one length of 2^31 - 1 (a block table of 128 columns): the schedule is byte for byte the one of
// the valid step (the garbage length counts as the capacity, 8192), so the step costs what the valid step does.
// Without the capacity the payload grew to cover 2^25 blocks for that request and every other request queued behind
// it (the 29x slower step on an H100).
TEST(DecodeScheduleWalk, OneGarbageLengthCostsWhatAValidOneDoes) {
  constexpr int kParts = 66;  // h_q = 128, s_q = 1 on 132 SMs
  constexpr int32_t kCapacity = 128 * 64;
  std::vector<int32_t> valid(128, 8192), garbage = valid;
  garbage[37] = kInt32Max;
  auto schedule = [&](const std::vector<int32_t>& lens, int32_t capacity) {
    DenseWork w;
    for (int32_t L : lens) {
      w.blocks.push_back(heuristics::dense_request_blocks(L, capacity));
      w.empty.push_back(heuristics::dense_request_empty(L, capacity));
    }
    const int64_t payload = heuristics::decode_schedule_payload(w.blocks, kParts);
    return std::pair{heuristics::walk_decode_schedule(w.blocks, w.empty, kParts, payload), payload};
  };
  const auto [valid_sched, valid_payload] = schedule(valid, kCapacity);
  const auto [clamped_sched, clamped_payload] = schedule(garbage, kCapacity);
  EXPECT_EQ(clamped_payload, valid_payload);
  expect_same_bytes(clamped_sched, valid_sched, "garbage length vs valid");
  const auto [raw_sched, raw_payload] = schedule(garbage, 0);  // what a plan without the capacity does
  EXPECT_GT(raw_payload, 100 * valid_payload);
}

TEST(DecodeScheduleWalk, MatchesOracleOnFailure) {
  expect_same_bytes(run_walk({3, 4}, {}, 2, 5), oracle::build_decode_schedule({3, 4}, {}, 2, 5), "payload 5");
  expect_same_bytes(run_walk({30, 30}, {}, 2, 10), oracle::build_decode_schedule({30, 30}, {}, 2, 10),
                    "payload 10");
}

// ---- GPU scheduler vs the oracle ----------------------------------------------------------------------------

class DecodeScheduleGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    const Capability cap = query_capability(Feature::kDenseDecode);
    if (!cap.supported) GTEST_SKIP() << "GPU scheduler test skipped: " << cap.reason;
  }

  // Runs the GPU scheduler; `lengths` are cache_seqlens (dense) or topk_length (sparse).
  DecodeScheduleHost run_gpu(const std::vector<int32_t>& lengths, int parts, bool sparse, int topk,
                             const std::vector<int32_t>& topk_len, int extra_topk,
                             const std::vector<int32_t>& extra_len, int64_t payload_override = 0,
                             int32_t max_seqlen = 0, int32_t chunk_blocks = 0, bool walk_order = false) {
    const int batch = static_cast<int>(sparse ? (topk_len.empty() ? lengths.size() : topk_len.size()) : lengths.size());
    auto upload = [](const std::vector<int32_t>& v) -> int32_t* {
      if (v.empty()) return nullptr;
      int32_t* d = nullptr;
      EXPECT_EQ(cudaMalloc(&d, v.size() * sizeof(int32_t)), cudaSuccess);
      EXPECT_EQ(cudaMemcpy(d, v.data(), v.size() * sizeof(int32_t), cudaMemcpyHostToDevice), cudaSuccess);
      return d;
    };
    int32_t* d_seqlens = sparse ? nullptr : upload(lengths);
    int32_t* d_topk_len = sparse ? upload(topk_len) : nullptr;
    int32_t* d_extra_len = sparse ? upload(extra_len) : nullptr;
    kernels::DecodeScheduleRecord* d_records = nullptr;
    int32_t* d_splits = nullptr;
    EXPECT_EQ(cudaMalloc(&d_records, parts * sizeof(kernels::DecodeScheduleRecord)), cudaSuccess);
    EXPECT_EQ(cudaMalloc(&d_splits, (batch + 1) * sizeof(int32_t)), cudaSuccess);
    // Poison the outputs so an unwritten field shows up.
    EXPECT_EQ(cudaMemset(d_records, 0x5a, parts * sizeof(kernels::DecodeScheduleRecord)), cudaSuccess);
    EXPECT_EQ(cudaMemset(d_splits, 0x5a, (batch + 1) * sizeof(int32_t)), cudaSuccess);
    // walk_order: merge counters of no counter, so that a batch-invariant dense pass writes its successor list at
    // their start (DecodeScheduleHost::walk_next).
    int32_t* d_next = nullptr;
    if (walk_order) {
      EXPECT_EQ(cudaMalloc(&d_next, batch * sizeof(int32_t)), cudaSuccess);
      EXPECT_EQ(cudaMemset(d_next, 0x5a, batch * sizeof(int32_t)), cudaSuccess);
    }
    const kernels::DecodeSchedulerParams params{
        .batch = batch,
        .num_sm_parts = parts,
        .sparse = sparse,
        .chunk_blocks = chunk_blocks,
        .cache_seqlens = d_seqlens,
        .max_seqlen = max_seqlen,
        .topk = topk,
        .topk_length = d_topk_len,
        .extra_topk = extra_topk,
        .extra_topk_length = d_extra_len,
        .records = d_records,
        .num_splits = d_splits,
        .merge_counters = d_next,
        .merge_counter_count = 0,
        .payload_override = payload_override,
    };
#if defined(OPENMLA_HAS_DENSE_DECODE)
    const Status st = kernels::launch_decode_scheduler(params, nullptr);
#else
    (void)params;  // no decode kernels in this build: SetUp skipped every test of the fixture
    const Status st = Status::unsupported("no decode kernels in this build");
#endif
    EXPECT_TRUE(st.is_ok()) << st.message();
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    DecodeScheduleHost out;
    out.records.resize(parts);
    out.num_splits.resize(batch + 1);
    EXPECT_EQ(cudaMemcpy(out.records.data(), d_records, parts * sizeof(kernels::DecodeScheduleRecord),
                         cudaMemcpyDeviceToHost),
              cudaSuccess);
    EXPECT_EQ(cudaMemcpy(out.num_splits.data(), d_splits, (batch + 1) * sizeof(int32_t), cudaMemcpyDeviceToHost),
              cudaSuccess);
    if (walk_order) {
      out.walk_next.resize(batch);
      EXPECT_EQ(cudaMemcpy(out.walk_next.data(), d_next, batch * sizeof(int32_t), cudaMemcpyDeviceToHost), cudaSuccess);
    }
    for (void* p : {static_cast<void*>(d_seqlens), static_cast<void*>(d_topk_len), static_cast<void*>(d_extra_len),
                    static_cast<void*>(d_records), static_cast<void*>(d_splits), static_cast<void*>(d_next)})
      if (p) cudaFree(p);
    return out;
  }
};

// Batch-invariant schedules (docs/decode-schedule.md, "Batch invariance"): the GPU's ChunkWalk against the
// partition-major oracle of decode_schedule_oracle.h.
TEST_F(DecodeScheduleGpu, InvariantMatchesOracle) {
  const int32_t chunk = static_cast<int32_t>(kDecodeInvariantChunkTokens / 64);
  for (const auto& c : adversarial_cases()) {
    const DenseWork w = dense_work(c.seqlens);
    for (int parts : kPartCounts) {
      expect_same_bytes(run_gpu(c.seqlens, parts, false, 0, {}, 0, {}, 0, 0, chunk),
                        oracle::build_invariant_schedule(w.blocks, w.empty, parts, chunk), c.name + " dense invariant");
      // With merge counters: the alternating walk order and its successor list (decision schedule-v5).
      expect_same_bytes(run_gpu(c.seqlens, parts, false, 0, {}, 0, {}, 0, 0, chunk, true),
                        oracle::build_invariant_schedule(w.blocks, w.empty, parts, chunk, true),
                        c.name + " dense invariant, walk order");
    }
  }
  // The optimal cut's corner cases: as many chunks as partitions, one more, one fewer; one huge request among tiny
  // ones; every request empty.
  std::vector<std::vector<int32_t>> corner = {std::vector<int32_t>(66, 4096), std::vector<int32_t>(67, 4096),
                                              std::vector<int32_t>(65, 4096), std::vector<int32_t>(40, 0)};
  std::vector<int32_t> huge(300, 1);
  huge[150] = 4096 * 100 + 7;
  corner.push_back(huge);
  for (const auto& seqlens : corner) {
    const DenseWork w = dense_work(seqlens);
    for (int parts : kPartCounts)
      for (const bool order : {false, true})
        expect_same_bytes(run_gpu(seqlens, parts, false, 0, {}, 0, {}, 0, 0, chunk, order),
                          oracle::build_invariant_schedule(w.blocks, w.empty, parts, chunk, order),
                          "corner b=" + std::to_string(seqlens.size()) + " dense invariant, order " +
                              std::to_string(order));
  }
  std::vector<int32_t> topk_len(300);
  for (size_t i = 0; i < topk_len.size(); ++i) topk_len[i] = static_cast<int32_t>((i * 977) % 20000);
  std::vector<int32_t> blocks;
  for (int32_t t : topk_len) blocks.push_back(heuristics::sparse_request_blocks(16384, &t, 0, nullptr));
  for (int parts : kPartCounts)
    expect_same_bytes(run_gpu({}, parts, true, 16384, topk_len, 0, {}, 0, 0, chunk),
                      oracle::build_invariant_schedule(blocks, {}, parts, chunk), "sparse invariant");
}

TEST_F(DecodeScheduleGpu, DenseMatchesOracle) {
  for (const auto& c : adversarial_cases()) {
    for (int parts : kPartCounts) {
      expect_same_bytes(run_gpu(c.seqlens, parts, false, 0, {}, 0, {}),
                        oracle::build_dense_decode_schedule(c.seqlens, parts),
                        c.name + " parts=" + std::to_string(parts));
    }
  }
}

TEST_F(DecodeScheduleGpu, DenseClampsToTheBlockTableLikeTheOracle) {
  for (const auto& c : adversarial_cases()) {
    for (const int32_t capacity : {64, 8192}) {
      for (int parts : {1, 66, 160}) {
        expect_same_bytes(run_gpu(c.seqlens, parts, false, 0, {}, 0, {}, 0, capacity),
                          oracle::build_dense_decode_schedule(c.seqlens, parts, capacity),
                          c.name + " capacity=" + std::to_string(capacity) + " parts=" + std::to_string(parts));
      }
    }
  }
}

TEST_F(DecodeScheduleGpu, SparseMatchesOracle) {
  std::mt19937 rng(7);
  std::vector<int32_t> len(700), extra_len(700);
  for (auto& v : len) v = static_cast<int32_t>(rng() % 2200) - 50;
  for (auto& v : extra_len) v = static_cast<int32_t>(rng() % 600) - 10;
  for (int parts : {1, 33, 66, 160}) {
    const std::string tag = " parts=" + std::to_string(parts);
    // topk only (no lengths: batch from a dummy length list of the right size).
    expect_same_bytes(run_gpu(std::vector<int32_t>(700, 0), parts, true, 2048, {}, 0, {}),
                      oracle::build_sparse_decode_schedule(700, 2048, {}, 0, {}, parts), "topk" + tag);
    expect_same_bytes(run_gpu({}, parts, true, 2048, len, 0, {}),
                      oracle::build_sparse_decode_schedule(700, 2048, len, 0, {}, parts), "topk_length" + tag);
    expect_same_bytes(run_gpu({}, parts, true, 512, len, 512, extra_len),
                      oracle::build_sparse_decode_schedule(700, 512, len, 512, extra_len, parts), "extra" + tag);
  }
}

// Small batches (2 * batch <= parts): the GPU's candidate count picks the tight payload the oracle picks by walking
// (decision schedule-v2); the cases include rows where a smaller payload than the default fits and rows where the
// floor keeps the default.
TEST_F(DecodeScheduleGpu, SmallBatchesTakeTheOraclesPayload) {
  int tight = 0;
  for (int b : {1, 2, 4, 8, 16, 32, 33}) {
    for (int parts : {8, 33, 66, 160}) {
      for (int32_t len : {100, 4096, 4100, 65536}) {
        const std::vector<int32_t> seqlens(b, len);
        const DenseWork w = dense_work(seqlens);
        const std::string tag = "b=" + std::to_string(b) + " len=" + std::to_string(len) + " parts=" + std::to_string(parts);
        expect_same_bytes(run_gpu(seqlens, parts, false, 0, {}, 0, {}), oracle::build_dense_decode_schedule(seqlens, parts),
                          "dense " + tag);
        if (heuristics::decode_schedule_payload(w.blocks, parts) <
            heuristics::decode_payload(heuristics::decode_total_work(w.blocks), parts))
          ++tight;
      }
      expect_same_bytes(run_gpu(std::vector<int32_t>(b, 0), parts, true, 2048, {}, 0, {}),
                        oracle::build_sparse_decode_schedule(b, 2048, {}, 0, {}, parts),
                        "sparse b=" + std::to_string(b) + " parts=" + std::to_string(parts));
    }
  }
  EXPECT_GT(tight, 10) << "the cases must exercise the tight payload";
  const std::vector<int32_t> worked = {4096, 0, 100, 8192};
  expect_same_bytes(run_gpu(worked, 8, false, 0, {}, 0, {}), oracle::build_dense_decode_schedule(worked, 8), "worked");
}

TEST_F(DecodeScheduleGpu, FailureIsFlaggedOnDevice) {
  const std::vector<int32_t> seqlens = {300, 4000, 0, 70};
  const auto [blocks, empty] = dense_work(seqlens);
  const DecodeScheduleHost gpu = run_gpu(seqlens, 3, false, 0, {}, 0, {}, /*payload_override=*/8);
  const DecodeScheduleHost cpu = oracle::build_decode_schedule(blocks, empty, 3, 8);
  EXPECT_FALSE(cpu.all_assigned);
  expect_same_bytes(gpu, cpu, "failure");
  EXPECT_EQ(gpu.num_splits.back(), heuristics::kDecodeScheduleFailed);
}

}  // namespace
}  // namespace openmla

namespace openmla {
namespace {

// Uniform lengths at small batch: the records, which the host passes packed in the sparse kernel's parameters,
// survive the packing exactly.
TEST(DecodeScheduleOracle, UniformRecordsPackExactly) {
  for (int32_t batch : {1, 2, 3, 5, 8, 16}) {
    for (int32_t blocks : {1, 2, 3, 5, 32, 33, 100, 256}) {
      for (int parts : {1, 2, 5, 22, 33, 66, 132, 160}) {
        const std::vector<int32_t> n(static_cast<size_t>(batch), blocks);
        const heuristics::DecodeScheduleHost host =
            oracle::build_decode_schedule(n, std::vector<bool>(n.size(), false), parts);
        ASSERT_TRUE(host.all_assigned);
        for (int part = 0; part < parts; ++part) {
          const kernels::DecodeScheduleRecord& want = host.records[part];
          uint64_t packed = 0;
          ASSERT_TRUE(kernels::pack_partition_record(want, packed)) << "batch " << batch << " part " << part;
          const kernels::DecodeScheduleRecord back = kernels::unpack_partition_record(packed);
          EXPECT_EQ(std::memcmp(&back, &want, sizeof(back)), 0) << "batch " << batch << " part " << part;
        }
      }
    }
  }
}

// Records that do not fit the 64-bit packing are refused (the kernel then reads the schedule); the limits pack.
TEST(DecodeScheduleOracle, PackedRecordLimits) {
  const kernels::DecodeScheduleRecord edge{31, 30, (1 << 22) - 1, (1 << 22) - 1, 255, 1, 1, 0};
  uint64_t v = 0;
  ASSERT_TRUE(kernels::pack_partition_record(edge, v));
  const kernels::DecodeScheduleRecord back = kernels::unpack_partition_record(v);
  EXPECT_EQ(std::memcmp(&back, &edge, sizeof(back)), 0);
  const kernels::DecodeScheduleRecord idle = kernels::PartitionWalk::idle_record(16);  // {16, 15, 0, ...}
  ASSERT_TRUE(kernels::pack_partition_record(idle, v));
  EXPECT_EQ(kernels::unpack_partition_record(v).begin_req, 16);
  EXPECT_EQ(kernels::unpack_partition_record(v).end_req, 15);
  for (auto bad : {kernels::DecodeScheduleRecord{32, 0, 0, 1, 0, 0, 0, 0}, kernels::DecodeScheduleRecord{0, 31, 0, 1, 0, 0, 0, 0},
                   kernels::DecodeScheduleRecord{0, 0, 1 << 22, 1, 0, 0, 0, 0}, kernels::DecodeScheduleRecord{0, 0, 0, 1 << 22, 0, 0, 0, 0},
                   kernels::DecodeScheduleRecord{0, 0, 0, 1, 256, 0, 0, 0}, kernels::DecodeScheduleRecord{0, 0, -1, 1, 0, 0, 0, 0},
                   kernels::DecodeScheduleRecord{0, 0, 0, 1, 0, 2, 0, 0}}) {
    uint64_t keep = 7;
    EXPECT_FALSE(kernels::pack_partition_record(bad, keep));
    EXPECT_EQ(keep, 7u);
  }
}

}  // namespace
}  // namespace openmla
