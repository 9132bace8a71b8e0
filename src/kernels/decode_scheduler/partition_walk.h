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
