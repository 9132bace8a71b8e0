// The decode schedule's partition record, shared by the GPU scheduler, its host run
// (heuristics/decode_schedule.h), the main decode kernels and the tests. Plain data, host and device.
#pragma once

#include <cstdint>

// Host and device code shared by the scheduler kernel, its host run and the tests.
#if defined(__CUDACC__)
#define OPENMLA_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define OPENMLA_HOST_DEVICE inline
#endif

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

// Up to this batch a schedule known on the host (sparse decode without per-request lengths) is passed to the
// kernels in their parameters, records and split-slot prefix sums both (docs/sparse-decode.md, decision sparse-v20),
// so such a call never reads the device schedule. Packed records hold request numbers below 32.
inline constexpr int kHostScheduleMaxBatch = 16;

// ---- The work of one request, in blocks: what the scheduler budgets and what the main kernels run -----------------
// One definition for the GPU scheduler, its host run and the launch plans, so the budget is never computed from
// another value than the kernel clamps (a garbage length then costs what a valid one does).

// Dense: the length clamped to [0, max_seqlen] as the kernel clamps it (max_seqlen = the block table's capacity,
// max_blocks_per_seq * page size; <= 0: no upper limit, the plan was not told the capacity), in 64-token blocks. An empty
// request (clamped length 0) still costs one block and is returned negated (-1): its record end_block is 0.
OPENMLA_HOST_DEVICE int32_t dense_request_blocks_signed(int32_t seqlen, int32_t max_seqlen) {
  int64_t len = seqlen < 0 ? 0 : seqlen;
  if (max_seqlen > 0 && len > max_seqlen) len = max_seqlen;
  if (len == 0) return -1;
  return static_cast<int32_t>((len + kDecodeBlockTokens - 1) / kDecodeBlockTokens);
}

// Sparse: t = *topk_length clamped to [0, topk] (topk when null), raised to 1 so the main loop is never empty; with
// an extra cache (extra_topk > 0) the main part is rounded up to whole blocks and the extra slots follow,
// e = *extra_topk_length clamped to [0, extra_topk] (extra_topk when null). Never empty.
OPENMLA_HOST_DEVICE int32_t sparse_request_blocks_of(int64_t topk, const int32_t* topk_length, int64_t extra_topk,
                                                     const int32_t* extra_topk_length) {
  constexpr int64_t kBlock = kDecodeBlockTokens;
  int64_t t = topk;
  if (topk_length != nullptr) {
    const int64_t v = *topk_length;
    t = v < 0 ? 0 : (v > topk ? topk : v);
  }
  if (t < 1) t = 1;
  if (extra_topk > 0) {
    int64_t extra = extra_topk;
    if (extra_topk_length != nullptr) {
      const int64_t v = *extra_topk_length;
      extra = v < 0 ? 0 : (v > extra_topk ? extra_topk : v);
    }
    t = (t + kBlock - 1) / kBlock * kBlock + extra;
  }
  return static_cast<int32_t>((t + kBlock - 1) / kBlock);
}

}  // namespace openmla::kernels
