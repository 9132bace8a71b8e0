// The decode schedule's partition record, shared by the GPU scheduler, its host run
// (heuristics/decode_schedule.h), the main decode kernels and the tests. Plain data, host and device.
#pragma once

#include <cstdint>

namespace openmla::kernels {

// One partition (one CTA, or one cluster, per (m-block, kv-head) of the grid walks it). Requests
// [begin_req, end_req] are touched; blocks are 64-token units of work (dense: one page block).
// Layout is fixed: 8 int32 = 32 bytes, the (num_sm_parts, 8) "tile_scheduler_metadata" tensor.
struct DecodeScheduleRecord {
  int32_t begin_req;          // first request touched (inclusive); == batch for an idle partition
  int32_t end_req;            // last request touched (inclusive)
  int32_t begin_block;        // first block of begin_req (inclusive)
  int32_t end_block;          // end block of end_req (exclusive); 0 for an empty request
  int32_t begin_split;        // split ordinal of this partition's chunk of begin_req
  int32_t is_first_req_split; // begin_req is only partially covered here
  int32_t is_last_req_split;  // end_req is only partially covered here
  int32_t pad;
};
static_assert(sizeof(DecodeScheduleRecord) == 32, "schedule record is 8 int32");

// Work model used for balancing (see docs/decode-schedule.md).
inline constexpr int kDecodeBlockTokens = 64;       // one unit of KV work
inline constexpr int kDecodeRequestOverheadBlocks = 5;  // per-request prologue/epilogue cost in blocks

}  // namespace openmla::kernels
