#include "decode_schedule_oracle.h"

#include <algorithm>
#include <cstdlib>
#include <utility>

#include "kernels/decode_scheduler/partition_walk.h"

namespace openmla::oracle {

using kernels::DecodeScheduleRecord;
using kernels::kDecodeRequestOverheadBlocks;

// The partition-major form of the greedy pass (the GPU walks it request-major; both must agree), written apart
// from partition_walk.h on purpose, so that one misreading of the rule cannot make both sides agree.
namespace {

heuristics::DecodeScheduleHost walk_partitions(const std::vector<int32_t>& blocks, const std::vector<bool>& empty,
                                               int num_sm_parts, int64_t payload) {
  constexpr int64_t kOverhead = kDecodeRequestOverheadBlocks;
  const int32_t batch = static_cast<int32_t>(blocks.size());
  heuristics::DecodeScheduleHost out;
  out.records.assign(num_sm_parts, DecodeScheduleRecord{});
  out.num_splits.assign(batch + 1, 0);
  const auto is_empty = [&](int32_t r) { return !empty.empty() && empty[r]; };

  int32_t req = 0;    // cursor: current request
  int64_t block = 0;  // first block of `req` not yet assigned
  int32_t split = 0;  // split ordinal of the next chunk of `req`
  int32_t prefix = 0;
  for (int p = 0; p < num_sm_parts; ++p) {
    DecodeScheduleRecord& rec = out.records[p];
    if (req >= batch) {  // idle partition: an inclusive [begin, end] loop over it is empty
      rec = DecodeScheduleRecord{batch, batch - 1, 0, 0, 0, 0, 0, 0};
      continue;
    }
    rec.begin_req = req;
    rec.begin_block = static_cast<int32_t>(block);
    rec.begin_split = split;
    const bool first_partial = block > 0;
    bool last_partial = false;
    int64_t budget = payload;
    while (req < batch) {
      const int64_t remaining = blocks[req] - block;
      if (budget >= remaining + kOverhead) {  // the rest of `req` fits: finish it here
        budget -= remaining + kOverhead;
        prefix += split + 1;
        out.num_splits[req + 1] = prefix;
        rec.end_req = req;
        rec.end_block = is_empty(req) ? 0 : blocks[req];
        last_partial = false;
        ++req;
        block = 0;
        split = 0;
      } else if (budget - kOverhead > 0) {  // take what fits and end the partition mid-request
        block += budget - kOverhead;
        rec.end_req = req;
        rec.end_block = static_cast<int32_t>(block);
        last_partial = true;
        ++split;
        break;
      } else {
        break;
      }
    }
    if (rec.begin_req == rec.end_req) {
      rec.is_first_req_split = rec.is_last_req_split = (first_partial || last_partial) ? 1 : 0;
    } else {
      rec.is_first_req_split = first_partial ? 1 : 0;
      rec.is_last_req_split = last_partial ? 1 : 0;
    }
    rec.pad = 0;
  }

  if (req < batch) {  // cannot happen with the computed payload; report it instead of half a schedule
    out.all_assigned = false;
    for (auto& rec : out.records) rec = DecodeScheduleRecord{batch, batch - 1, 0, 0, 0, 0, 0, 0};
    std::fill(out.num_splits.begin(), out.num_splits.end(), 0);
    out.num_splits[batch] = heuristics::kDecodeScheduleFailed;
  }
  return out;
}

}  // namespace

heuristics::DecodeScheduleHost build_decode_schedule(const std::vector<int32_t>& blocks, const std::vector<bool>& empty,
                                                     int num_sm_parts, int64_t payload_override) {
  if (payload_override > 0) return walk_partitions(blocks, empty, num_sm_parts, payload_override);
  // The payload as docs/decode-schedule.md states it: ceil(total / parts) + overhead, total = sum(n_i + overhead);
  // with 2 * batch <= parts, the smallest payload from max(ceil(total / parts), overhead + the floor of blocks) up
  // that assigns every request, if one below the default does.
  int64_t total = 0;
  for (int32_t n : blocks) total += n + kDecodeRequestOverheadBlocks;
  const int64_t lowest_balanced = (total + num_sm_parts - 1) / num_sm_parts;
  const int64_t fallback = lowest_balanced + kDecodeRequestOverheadBlocks;
  if (2 * static_cast<int64_t>(blocks.size()) <= num_sm_parts) {
    const int64_t floor = kDecodeRequestOverheadBlocks + kernels::kTightPayloadMinBlocks;
    for (int64_t payload = std::max(lowest_balanced, floor); payload < fallback; ++payload) {
      heuristics::DecodeScheduleHost s = walk_partitions(blocks, empty, num_sm_parts, payload);
      if (s.all_assigned) return s;
    }
  }
  return walk_partitions(blocks, empty, num_sm_parts, fallback);
}

heuristics::DecodeScheduleHost build_dense_decode_schedule(const std::vector<int32_t>& cache_seqlens,
                                                           int num_sm_parts, int32_t max_seqlen) {
  // Written here from docs/decode-schedule.md, not with the production helpers: the length as the kernel sees it
  // (negative -> 0, above the block table's capacity -> the capacity), ceil(L / 64) blocks, at least one.
  std::vector<int32_t> blocks(cache_seqlens.size());
  std::vector<bool> empty(cache_seqlens.size());
  for (size_t i = 0; i < cache_seqlens.size(); ++i) {
    int64_t len = std::max<int64_t>(cache_seqlens[i], 0);
    if (max_seqlen > 0) len = std::min<int64_t>(len, max_seqlen);
    blocks[i] = static_cast<int32_t>(std::max<int64_t>((len + 63) / 64, 1));
    empty[i] = len == 0;
  }
  return build_decode_schedule(blocks, empty, num_sm_parts);
}

heuristics::DecodeScheduleHost build_sparse_decode_schedule(int64_t batch, int64_t topk,
                                                            const std::vector<int32_t>& topk_length, int64_t extra_topk,
                                                            const std::vector<int32_t>& extra_topk_length,
                                                            int num_sm_parts) {
  std::vector<int32_t> blocks(batch);
  for (int64_t i = 0; i < batch; ++i) {
    blocks[i] = heuristics::sparse_request_blocks(topk, topk_length.empty() ? nullptr : &topk_length[i], extra_topk,
                                                  extra_topk_length.empty() ? nullptr : &extra_topk_length[i]);
  }
  return build_decode_schedule(blocks, {}, num_sm_parts);
}

heuristics::DecodeScheduleHost build_invariant_schedule(const std::vector<int32_t>& blocks,
                                                        const std::vector<bool>& empty, int num_sm_parts,
                                                        int32_t chunk_blocks, bool alternate) {
  constexpr int64_t kOverhead = kDecodeRequestOverheadBlocks;
  const int32_t batch = static_cast<int32_t>(blocks.size());
  // The walk order: the requests sorted by (blocks descending, index), then taken from the front and the back of that
  // list in turn (up to 1024 requests; request order above).
  std::vector<int32_t> walk(batch);
  for (int32_t r = 0; r < batch; ++r) walk[r] = r;
  if (alternate && batch <= 1024) {
    std::vector<std::pair<int64_t, int32_t>> sorted;
    for (int32_t r = 0; r < batch; ++r) sorted.push_back({-static_cast<int64_t>(blocks[r]), r});
    std::sort(sorted.begin(), sorted.end());
    size_t front = 0, back = sorted.size();
    walk.clear();
    while (front < back) {
      walk.push_back(sorted[front++].second);
      if (front < back) walk.push_back(sorted[--back].second);
    }
  }
  struct Chunk {
    int32_t req, ordinal, begin, end;  // blocks [begin, end) of request req
    bool split;                        // the request has more than one chunk
  };
  std::vector<Chunk> chunks;
  heuristics::DecodeScheduleHost out;
  out.num_splits.assign(batch + 1, 0);
  for (int32_t r : walk) {
    const int32_t count = (blocks[r] + chunk_blocks - 1) / chunk_blocks;
    for (int32_t c = 0; c < count; ++c)
      chunks.push_back({r, c, c * chunk_blocks, std::min(blocks[r], (c + 1) * chunk_blocks), count > 1});
  }
  for (int32_t r = 0; r < batch; ++r)
    out.num_splits[r + 1] = out.num_splits[r] + (blocks[r] + chunk_blocks - 1) / chunk_blocks;
  if (alternate) {
    out.walk_next.assign(batch, -1);
    for (size_t k = 1; k < walk.size(); ++k) out.walk_next[walk[k - 1]] = walk[k];
  }
  const auto cost = [&](const Chunk& c) { return static_cast<int64_t>(c.end - c.begin) + kOverhead; };
  int64_t total = 0, max_cost = 0;
  for (const Chunk& c : chunks) {
    total += cost(c);
    max_cost = std::max(max_cost, cost(c));
  }
  // Partitions the greedy packing at `load` needs (a partition takes chunks while its load stays <= load), stopping
  // once past the partition count.
  const auto needed = [&](int64_t load) {
    int64_t parts = 0, used = 0;
    for (const Chunk& c : chunks) {
      if (parts == 0 || used + cost(c) > load) {
        if (++parts > num_sm_parts) return parts;
        used = 0;
      }
      used += cost(c);
    }
    return parts;
  };
  // The smallest load that fits, by binary search between the lower bound max(M, ceil(T / parts)) and
  // ceil(T / parts) + M, which always fits (M the largest chunk cost, T the total).
  const int64_t share = (total + num_sm_parts - 1) / num_sm_parts;
  int64_t lo = std::max(max_cost, share), hi = share + max_cost;
  if (needed(hi) > num_sm_parts) std::abort();  // the upper bound is a theorem; the oracle checks it
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (needed(mid) <= num_sm_parts)
      hi = mid;
    else
      lo = mid + 1;
  }
  const int64_t load = lo;

  out.records.assign(num_sm_parts, DecodeScheduleRecord{batch, batch - 1, 0, 0, 0, 0, 0, 0});
  size_t next = 0;
  for (int p = 0; p < num_sm_parts && next < chunks.size(); ++p) {
    const size_t first = next;
    int64_t used = cost(chunks[next++]);
    const bool last_part = p == num_sm_parts - 1;
    while (next < chunks.size() && (last_part || used + cost(chunks[next]) <= load)) used += cost(chunks[next++]);
    const Chunk& a = chunks[first];
    const Chunk& z = chunks[next - 1];
    DecodeScheduleRecord& rec = out.records[p];
    rec.begin_req = a.req;
    rec.end_req = z.req;
    rec.begin_block = a.begin;
    rec.end_block = !empty.empty() && empty[z.req] ? 0 : z.end;
    rec.begin_split = a.ordinal;
    rec.is_first_req_split = a.split ? 1 : 0;
    rec.is_last_req_split = z.split ? 1 : 0;
    rec.pad = chunk_blocks | (alternate ? kernels::kRecordWalkListBit : 0);  // the plan wrote its successor list
  }
  return out;
}

}  // namespace openmla::oracle
