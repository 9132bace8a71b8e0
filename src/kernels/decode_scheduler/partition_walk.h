// The greedy partition pass of the decode scheduler in its request-major form: the GPU kernel feeds it
// one request at a time (its block counts arrive in shared-memory chunks), so it is written as a small
// state machine. It is host+device code: the host runs this exact logic where it knows a schedule in advance
// (heuristics::walk_decode_schedule), and the tests check it against an independently written partition-major
// oracle (tests/cpp/decode_schedule_oracle.h).
//
// Greedy rule (docs/decode-schedule.md): a partition starts with budget = payload. For the current
// request with `rem` blocks left: if budget >= rem + overhead, finish the request here; else if
// budget - overhead > 0, take budget - overhead blocks, close the partition and continue the request in
// the next one; else close the partition without touching the request.
#pragma once

#include <algorithm>
#include <cstdint>

#include "kernels/decode_scheduler/schedule_record.h"

namespace openmla::kernels {

struct PartitionWalk {
  // Configuration.
  int32_t batch;
  int32_t num_parts;
  int64_t payload;
  DecodeScheduleRecord* records;  // (num_parts,)
  int32_t* num_splits;            // (batch + 1,); num_splits[0] is written by begin()
  // State.
  int32_t part;          // partition being filled
  int64_t budget;        // what is left of its payload
  bool open;             // `part` has a begin recorded
  bool last_partial;     // its end request stops mid-way
  int32_t prefix;        // running split-slot prefix sum
  DecodeScheduleRecord cur;

  OPENMLA_HOST_DEVICE void begin(int32_t batch_, int32_t num_parts_, int64_t payload_, DecodeScheduleRecord* records_,
                                 int32_t* num_splits_) {
    batch = batch_;
    num_parts = num_parts_;
    payload = payload_;
    records = records_;
    num_splits = num_splits_;
    part = 0;
    budget = 0;
    open = false;
    last_partial = false;
    prefix = 0;
    num_splits[0] = 0;
  }

  // The split flags of a finished record (begin/end filled; `last_partial`: its end request stops mid-way).
  OPENMLA_HOST_DEVICE static void set_split_flags(DecodeScheduleRecord& rec, bool last_partial) {
    const bool first_partial = rec.begin_block > 0;
    if (rec.begin_req == rec.end_req) {
      rec.is_first_req_split = rec.is_last_req_split = (first_partial || last_partial) ? 1 : 0;
    } else {
      rec.is_first_req_split = first_partial ? 1 : 0;
      rec.is_last_req_split = last_partial ? 1 : 0;
    }
    rec.pad = 0;
  }

  OPENMLA_HOST_DEVICE void close_partition() {
    set_split_flags(cur, last_partial);
    records[part] = cur;
    ++part;
    open = false;
  }

  // Assigns request `req` (`blocks` >= 1 units of work; `empty`: its finished range ends at block 0).
  // Returns false if the partitions ran out first (the caller then writes the failure encoding).
  OPENMLA_HOST_DEVICE bool add_request(int32_t req, int32_t blocks, bool empty) {
    constexpr int64_t kOverhead = kDecodeRequestOverheadBlocks;
    int64_t block = 0;
    int32_t split = 0;
    while (true) {
      if (!open) {
        if (part >= num_parts) return false;
        cur.begin_req = req;
        cur.begin_block = static_cast<int32_t>(block);
        cur.begin_split = split;
        budget = payload;
        open = true;
      }
      const int64_t remaining = blocks - block;
      if (budget >= remaining + kOverhead) {
        budget -= remaining + kOverhead;
        prefix += split + 1;
        num_splits[req + 1] = prefix;
        cur.end_req = req;
        cur.end_block = empty ? 0 : blocks;
        last_partial = false;
        return true;  // the partition stays open for the next request
      }
      if (budget - kOverhead > 0) {
        block += budget - kOverhead;
        cur.end_req = req;
        cur.end_block = static_cast<int32_t>(block);
        last_partial = true;
        ++split;
      }
      // Either way this partition is full: a request is never left without an end in `cur`, because a
      // fresh partition always has budget = payload > overhead and so takes at least one block.
      close_partition();
    }
  }

  // Closes the last partition and marks the remaining ones idle.
  OPENMLA_HOST_DEVICE void finish() {
    if (open) close_partition();
    for (; part < num_parts; ++part) records[part] = idle_record(batch);
  }

  OPENMLA_HOST_DEVICE static DecodeScheduleRecord idle_record(int32_t batch) {
    // begin_req == batch tells the kernel to return; end_req = batch - 1 keeps an inclusive
    // [begin, end] loop empty for a kernel that does not test begin first.
    return DecodeScheduleRecord{batch, batch - 1, 0, 0, 0, 0, 0, 0};
  }
};

// ---- The payload of small batches (docs/decode-schedule.md, decision schedule-v2) ----------------------------------
// The default payload, ceil(total / parts) + overhead, leaves up to `overhead` blocks of slack in every partition.
// With many requests per partition that slack is what lets request borders fall anywhere; with few requests it only
// lengthens the critical path: sparse b = 8 (32 blocks each) over 33 partitions gets payload 14, 9 blocks per CTA,
// where 13 (8 blocks, every request in 4 chunks) still fits. So when 2 * batch <= parts (every request spans
// two partitions or more on average) the scheduler takes the smallest payload in
// [max(ceil(total / parts), overhead + kTightPayloadMinBlocks), default) whose walk assigns every request (at most
// kTightPayloadCandidates values, each counted by one thread), and the default when none does.
inline constexpr int kTightPayloadCandidates = kDecodeRequestOverheadBlocks;  // default - ceil(total / parts)
// Only where a partition keeps more blocks than the model's per-request overhead: below that the split partials and
// the combine cost more than the blocks saved (measured: sparse b = 2, 2 blocks per CTA instead of 3, +0.9 us; dense
// b = 1 at 4K, 1 instead of 2, +9 us; sparse b = 4, 4 instead of 5, no gain).
inline constexpr int kTightPayloadMinBlocks = kDecodeRequestOverheadBlocks;

OPENMLA_HOST_DEVICE bool tight_payload_applies(int64_t batch, int32_t num_parts) { return 2 * batch <= num_parts; }

// Candidate c (0 .. kTightPayloadCandidates - 1) of a walk whose default payload is `default_payload`, or 0 where it
// lies below the floor. Candidates grow with c; the last one is default_payload - 1.
OPENMLA_HOST_DEVICE int64_t tight_payload_candidate(int64_t default_payload, int c) {
  const int64_t value = default_payload - kTightPayloadCandidates + c;
  return value >= kDecodeRequestOverheadBlocks + kTightPayloadMinBlocks ? value : 0;
}

// How many partitions PartitionWalk fills with `payload` (its add_request rule, counting only): feed every request's
// block count in order, then fits(num_parts).
struct PartitionCount {
  int64_t payload;
  int64_t used = 0;    // partitions opened so far
  int64_t budget = 0;  // what is left of the open one
  bool open = false;

  OPENMLA_HOST_DEVICE explicit PartitionCount(int64_t payload_) : payload(payload_) {}

  OPENMLA_HOST_DEVICE void add(int64_t blocks) {
    constexpr int64_t kOverhead = kDecodeRequestOverheadBlocks;
    int64_t remaining = blocks;
    if (open) {
      if (budget >= remaining + kOverhead) {
        budget -= remaining + kOverhead;
        return;
      }
      if (budget - kOverhead > 0) remaining -= budget - kOverhead;
      open = false;
    }
    // Fresh partitions take payload - overhead blocks each until the rest fits in one.
    if (remaining + kOverhead > payload) {
      const int64_t step = payload - kOverhead;  // > 0: payload > overhead
      const int64_t full = (remaining + kOverhead - payload + step - 1) / step;
      used += full;
      remaining -= full * step;
    }
    ++used;
    budget = payload - remaining - kOverhead;
    open = true;
  }

  OPENMLA_HOST_DEVICE bool fits(int32_t num_parts) const { return used <= num_parts; }
};

// The batch-invariant pass (docs/decode-schedule.md, "Batch invariance"), request-major like PartitionWalk. Request i
// of n_i blocks is cut into ceil(n_i / C) chunks of C = `chunk_blocks` blocks (the last one shorter), a cut that
// depends on n_i alone; a chunk costs its blocks + overhead. The chunk sequence (request order) is cut into at most
// `parts` contiguous runs, one per partition, with the smallest maximum load a contiguous cut can have: `load` is the
// smallest value at which the greedy packing (a partition takes chunks while its load stays <= load) needs at most
// `parts` partitions (ChunkCount below; the optimum of a contiguous cut, since the greedy count never grows with the
// load), and the walk is that greedy packing, so no partition exceeds it; partitions past the last run are idle.
// Every chunk is always assigned: the last partition never closes (with the optimal load it never has to). A partition
// may hold several chunks of one request: the kernels walk its range chunk by chunk (chunk_begin .. next multiple of
// C).
//
// Where the optimal load lies: with T the total work and M the largest chunk cost (<= C + overhead), it is at least
// max(M, ceil(T / parts)) and at most ceil(T / parts) + M (there every closed partition holds more than T / parts, so
// `parts` of them cannot all close). So it is one of the invariant_cut_candidates(C) = C + overhead + 1 values
// ceil(T / parts) + j, j = 0 .. C + overhead; the GPU scheduler counts each on a thread of its own and takes the
// smallest that fits, the host run tests them in turn.
//
// Records: begin/end request and block as in the default walk; begin_split = begin_block / C (the ordinal of the
// partition's first chunk); is_first_req_split / is_last_req_split = the begin / end request has more than one chunk
// (the same flag when they are one request); pad = C, so an invariant schedule names its chunk size.
// num_splits[i + 1] - num_splits[i] = the chunk count of request i.

// a / b for a >= 0, b > 0: the 32-bit division where both fit (the device's 64-bit division is a long routine).
OPENMLA_HOST_DEVICE int64_t invariant_div(int64_t a, int64_t b) {
  if (((a | b) >> 31) == 0) return static_cast<int64_t>(static_cast<uint32_t>(a) / static_cast<uint32_t>(b));
  return a / b;
}

// Candidate loads of the optimal cut: ceil(total / parts) + j for j below this count.
OPENMLA_HOST_DEVICE int32_t invariant_cut_candidates(int32_t chunk_blocks) {
  return chunk_blocks + kDecodeRequestOverheadBlocks + 1;
}
OPENMLA_HOST_DEVICE int64_t invariant_cut_candidate(int64_t total_work, int32_t num_parts, int32_t j) {
  return (total_work + num_parts - 1) / num_parts + j;
}

// How many partitions the greedy packing of the chunk sequence at `load` fills (counting only, O(1) per request):
// feed every request's block count in order, then fits(num_parts). A load below some chunk's cost never fits.
struct ChunkCount {
  int64_t load;
  int32_t chunk_blocks;
  int64_t used_parts = 0;  // partitions opened so far
  int64_t used = 0;        // load of the open one
  bool open = false;
  bool valid = true;       // no chunk costs more than `load`

  OPENMLA_HOST_DEVICE ChunkCount(int64_t load_, int32_t chunk_blocks_) : load(load_), chunk_blocks(chunk_blocks_) {}

  OPENMLA_HOST_DEVICE void add(int32_t blocks) {
    constexpr int64_t kOverhead = kDecodeRequestOverheadBlocks;
    const int64_t full_cost = static_cast<int64_t>(chunk_blocks) + kOverhead;
    const int64_t full = (static_cast<int64_t>(blocks) + chunk_blocks - 1) / chunk_blocks - 1;  // chunks before the last
    const int64_t last_cost = blocks - full * chunk_blocks + kOverhead;
    if (last_cost > load || (full > 0 && full_cost > load)) {
      valid = false;
      return;
    }
    int64_t rest = full;
    if (rest > 0 && open) {  // the open partition takes the full chunks that fit
      const int64_t fit = invariant_div(load - used, full_cost);
      const int64_t take = fit < rest ? fit : rest;
      used += take * full_cost;
      rest -= take;
    }
    if (rest > 0) {  // fresh partitions of load / full_cost full chunks each, the last one open
      const int64_t per_part = invariant_div(load, full_cost);
      const int64_t fresh = invariant_div(rest + per_part - 1, per_part);
      used_parts += fresh;
      used = (rest - (fresh - 1) * per_part) * full_cost;
      open = true;
    }
    if (open && used + last_cost <= load) {
      used += last_cost;
    } else {
      ++used_parts;
      used = last_cost;
      open = true;
    }
  }

  OPENMLA_HOST_DEVICE bool fits(int32_t num_parts) const { return valid && used_parts <= num_parts; }
};

// Record pad bit of a batch-invariant record whose schedule was planned in walk order (decision schedule-v5): its
// requests follow the successor list after the merge counters. Without it the range is walked in request order (a
// plan without merge counters: the tensor style's get_mla_metadata, whose calls bring zeroed counters of their own).
inline constexpr int32_t kRecordWalkListBit = 1 << 30;

struct ChunkWalk {
  // Configuration.
  int32_t batch;
  int32_t num_parts;
  int32_t chunk_blocks;
  bool listed;                    // the successor list is written (record pad | kRecordWalkListBit)
  int64_t load;                   // the cut's maximum partition load (ChunkCount's smallest fitting candidate)
  DecodeScheduleRecord* records;  // (num_parts,)
  int32_t* num_splits;            // (batch + 1,)
  // State.
  int32_t part;        // partition being filled
  int64_t used;        // work in `part`
  bool open;
  bool first_split;    // the open partition's begin request has more than one chunk
  bool end_split;      // its end request has more than one chunk
  DecodeScheduleRecord cur;

  // Chunks of a request of `blocks` >= 1 blocks.
  OPENMLA_HOST_DEVICE static int32_t chunks_of(int32_t blocks, int32_t chunk_blocks) {
    return static_cast<int32_t>((static_cast<int64_t>(blocks) + chunk_blocks - 1) / chunk_blocks);
  }
  // The pass's total work: sum over requests of blocks + overhead * chunks.
  OPENMLA_HOST_DEVICE static int64_t request_work(int32_t blocks, int32_t chunk_blocks) {
    return static_cast<int64_t>(blocks) + static_cast<int64_t>(kDecodeRequestOverheadBlocks) * chunks_of(blocks, chunk_blocks);
  }

  OPENMLA_HOST_DEVICE void begin(int32_t batch_, int32_t num_parts_, int32_t chunk_blocks_, int64_t load_,
                                 DecodeScheduleRecord* records_, int32_t* num_splits_, bool listed_ = false) {
    batch = batch_;
    listed = listed_;
    num_parts = num_parts_;
    chunk_blocks = chunk_blocks_;
    load = load_;
    records = records_;
    num_splits = num_splits_;
    part = 0;
    used = 0;
    open = false;
    first_split = end_split = false;
    num_splits[0] = 0;
  }

  OPENMLA_HOST_DEVICE void close_partition() {
    cur.is_first_req_split = first_split ? 1 : 0;  // (one request: first_split == end_split)
    cur.is_last_req_split = end_split ? 1 : 0;
    cur.pad = chunk_blocks | (listed ? kRecordWalkListBit : 0);
    records[part] = cur;
    ++part;
    open = false;
  }

  // Assigns request `req` (`blocks` >= 1; `empty`: its range ends at block 0). Never runs out of partitions. Each turn
  // of the loop fills one partition's share of the request: O(partitions touched) per request.
  OPENMLA_HOST_DEVICE void add_request(int32_t req, int32_t blocks, bool empty) {
    constexpr int64_t kOverhead = kDecodeRequestOverheadBlocks;
    const int64_t chunks = chunks_of(blocks, chunk_blocks);
    const bool split = chunks > 1;
    const int64_t full_cost = static_cast<int64_t>(chunk_blocks) + kOverhead;
    const int64_t last_cost = blocks - (chunks - 1) * chunk_blocks + kOverhead;
    int64_t c = 0;  // chunks of the request assigned so far
    while (c < chunks) {
      const int64_t cost = c < chunks - 1 ? full_cost : last_cost;
      if (open && part < num_parts - 1 && used + cost > load) close_partition();
      if (!open) {
        cur.begin_req = req;
        cur.begin_block = static_cast<int32_t>(c * chunk_blocks);
        cur.begin_split = static_cast<int32_t>(c);
        first_split = split;
        used = 0;
        open = true;
      }
      used += cost;  // a partition takes at least one chunk (no chunk costs more than the load)
      ++c;
      if (part == num_parts - 1) {  // the last partition takes the rest
        if (c < chunks) used += (blocks - c * chunk_blocks) + kOverhead * (chunks - c);
        c = chunks;
      } else {
        if (c < chunks - 1) {  // the full chunks that fit
          const int64_t fit = used < load ? invariant_div(load - used, full_cost) : 0;
          const int64_t take = fit < chunks - 1 - c ? fit : chunks - 1 - c;
          used += take * full_cost;
          c += take;
        }
        if (c == chunks - 1 && used + last_cost <= load) {
          used += last_cost;
          c = chunks;
        }
      }
      cur.end_req = req;
      const int64_t end = c * chunk_blocks < blocks ? c * chunk_blocks : blocks;
      cur.end_block = empty ? 0 : static_cast<int32_t>(end);
      end_split = split;
    }
    num_splits[req + 1] = static_cast<int32_t>(chunks);  // a count; split_counts_to_prefix makes the prefix sums
  }

  OPENMLA_HOST_DEVICE void finish() {
    if (open) close_partition();
    for (; part < num_parts; ++part) records[part] = PartitionWalk::idle_record(batch);
  }

  // add_request writes each request's chunk count to num_splits[req + 1] (requests may come in any order); this turns
  // them into the exclusive prefix sums in request order, once every request has been added.
  OPENMLA_HOST_DEVICE static void split_counts_to_prefix(int32_t* num_splits, int32_t batch) {
    int32_t sum = 0;
    for (int32_t i = 1; i <= batch; ++i) {
      sum += num_splits[i];
      num_splits[i] = sum;
    }
  }
};

// ---- The walk order of batch-invariant dense schedules (docs/decode-schedule.md, decision schedule-v5) ---------------
// Dense invariant schedules with merge counters walk the requests in alternating order: longest, shortest, second
// longest, second shortest, ... (by blocks, ties by request index), so that no partition has to hold two long requests'
// chunks where short ones could fill it. The walk order only moves a request's chunks between partitions: its chunk
// boundaries, split slots (num_splits stays a prefix sum in request order) and merge order are those of request order,
// so its bits are too. A record names its run's first and last request (begin_req, end_req: request ids, not
// positions); the kernel goes from a request to the next by the successor list the scheduler writes after the merge
// counters (merge_counters[merge_counter_count + req]: the next request in walk order, -1 after the last). Batches
// above kInvariantOrderMaxBatch (what the scheduler stages at once) walk in request order, successor req + 1.
inline constexpr int32_t kInvariantOrderMaxBatch = 1024;

// Position in the walk of the request of rank `rank` (0: the most blocks) among `batch`.
OPENMLA_HOST_DEVICE int32_t alternating_position(int32_t rank, int32_t batch) {
  return rank < (batch + 1) / 2 ? 2 * rank : 2 * (batch - 1 - rank) + 1;
}

// The reading of a partition record, the inverse of the walk above: what record `rec` says about request `req`
// (rec.begin_req <= req <= rec.end_req) of `blocks` blocks. The partition computes blocks [chunk_begin_block,
// chunk_end_block) of it (a request strictly inside the record is covered whole; only the first can start late and
// only the last can stop early; the end is clamped to `blocks`); chunk_is_split: that range is a chunk of a split
// request, which writes a partial for the merge; chunk_ordinal: the chunk's split ordinal, its partial's slot is
// num_splits[req] + ordinal. The sparse kernel reads its records with these and the tests check them against their
// own reading of the walk's records (tests/cpp/test_device_layer.cpp). The dense kernel keeps the same expressions
// inline: through these functions ptxas emitted its request prologue with two compare operands swapped
// (docs/architecture.md, "Device layer"). One scalar function each: a struct of them compiled differently too.
OPENMLA_HOST_DEVICE int32_t chunk_begin_block(const DecodeScheduleRecord& rec, int32_t req) {
  return req == rec.begin_req ? rec.begin_block : 0;
}
OPENMLA_HOST_DEVICE int32_t chunk_end_block(const DecodeScheduleRecord& rec, int32_t req, int32_t blocks) {
#if defined(__CUDA_ARCH__)
  return req == rec.end_req ? min(rec.end_block, blocks) : blocks;  // the device min (a ternary compiles differently)
#else
  return req == rec.end_req ? std::min(rec.end_block, blocks) : blocks;
#endif
}
OPENMLA_HOST_DEVICE bool chunk_is_split(const DecodeScheduleRecord& rec, int32_t req) {
  return (req == rec.begin_req && rec.is_first_req_split) || (req == rec.end_req && rec.is_last_req_split);
}
OPENMLA_HOST_DEVICE int32_t chunk_ordinal(const DecodeScheduleRecord& rec, int32_t req) {
  return req == rec.begin_req ? rec.begin_split : 0;
}

// Batch-invariant schedules (ChunkWalk; record pad = chunk_blocks > 0): a partition's range of a request is walked
// chunk by chunk. The chunk that starts at block `begin` (a multiple of chunk_blocks) ends at the next multiple or at
// `range_end` (chunk_end_block of the request), whichever comes first; its split ordinal is begin / chunk_blocks.
OPENMLA_HOST_DEVICE int32_t invariant_chunk_end(int32_t begin, int32_t range_end, int32_t chunk_blocks) {
  const int64_t next = (static_cast<int64_t>(begin) / chunk_blocks + 1) * chunk_blocks;
  return next < range_end ? static_cast<int32_t>(next) : range_end;
}

#if defined(__CUDACC__)
// Makes the record's request and block range warp-uniform (every lane read the same record; lane 0's copy is
// broadcast), so that ptxas can prove the loops over it uniform: wgmma under a branch it cannot prove uniform is
// serialised (ptxas C7520). Dense decode calls it right after reading its record; sparse decode spells it out (through
// the function its trace build compiled differently).
__device__ __forceinline__ void broadcast_record_range(DecodeScheduleRecord& rec) {
  rec.begin_req = __shfl_sync(0xffffffff, rec.begin_req, 0);
  rec.end_req = __shfl_sync(0xffffffff, rec.end_req, 0);
  rec.begin_block = __shfl_sync(0xffffffff, rec.begin_block, 0);
  rec.end_block = __shfl_sync(0xffffffff, rec.end_block, 0);
}
#endif

// A partition record packed into 64 bits, for records the host computes and passes in kernel parameters (the
// sparse kernel at small batch: docs/sparse-decode.md, decision sparse-v20): begin_req and end_req 5 bits each,
// begin_split 8 bits, the two split flags, begin_block and end_block 22 bits each. pack_partition_record returns
// false (and leaves `out` alone) for a record that does not fit; unpack restores it exactly (pad = 0).
OPENMLA_HOST_DEVICE bool pack_partition_record(const DecodeScheduleRecord& r, uint64_t& out) {
  constexpr int64_t kBlockLimit = int64_t{1} << 22;
  if (r.begin_req < 0 || r.begin_req > 31 || r.end_req < -1 || r.end_req > 30 || r.begin_split < 0 ||
      r.begin_split > 255 || r.begin_block < 0 || r.begin_block >= kBlockLimit || r.end_block < 0 ||
      r.end_block >= kBlockLimit || (r.is_first_req_split != 0 && r.is_first_req_split != 1) ||
      (r.is_last_req_split != 0 && r.is_last_req_split != 1))
    return false;
  out = static_cast<uint64_t>(r.begin_req) | static_cast<uint64_t>(r.end_req + 1) << 5 |
        static_cast<uint64_t>(r.begin_split) << 10 | static_cast<uint64_t>(r.is_first_req_split) << 18 |
        static_cast<uint64_t>(r.is_last_req_split) << 19 | static_cast<uint64_t>(r.begin_block) << 20 |
        static_cast<uint64_t>(r.end_block) << 42;
  return true;
}
OPENMLA_HOST_DEVICE DecodeScheduleRecord unpack_partition_record(uint64_t v) {
  DecodeScheduleRecord r{};
  r.begin_req = static_cast<int32_t>(v & 31u);
  r.end_req = static_cast<int32_t>((v >> 5) & 31u) - 1;
  r.begin_split = static_cast<int32_t>((v >> 10) & 255u);
  r.is_first_req_split = static_cast<int32_t>((v >> 18) & 1u);
  r.is_last_req_split = static_cast<int32_t>((v >> 19) & 1u);
  r.begin_block = static_cast<int32_t>((v >> 20) & ((1u << 22) - 1));
  r.end_block = static_cast<int32_t>((v >> 42) & ((1u << 22) - 1));
  r.pad = 0;
  return r;
}

}  // namespace openmla::kernels
