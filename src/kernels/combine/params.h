// Parameters of the split-KV combine kernel, shared by dense and sparse decode. Plain data.
//
// Partial rows (written by the main kernel) are indexed per split slot, kv-head-major:
//   row = kv_head * (s_q * q_per_kv) + s_idx * q_per_kv + head_in_group,   head = kv_head * q_per_kv + head_in_group
//   partial_o[(slot * s_q * h_q + row) * 512 + col]   fp32, already normalised by the chunk's own row sum
//   partial_lse[slot * s_q * h_q + row]               fp32, base 2; -inf for a chunk with no visible key
// With h_kv == 1 this is the position-major (s_q, h_q) packing of the sparse path.
// Request i owns slots [num_splits[i], num_splits[i+1]); requests with fewer than 2 slots are skipped
// (the main kernel wrote their final out/lse).
#pragma once

#include <cstdint>

#include "common/output_view.h"
#include "kernels/decode_scheduler/schedule_record.h"

namespace openmla::kernels {

struct CombineParams {
  int batch;
  int s_q;
  int h_q;
  int h_kv;
  int q_per_kv;  // h_q / h_kv
  bool is_fp16;  // out element type: fp16 if true, else bf16

  const float* partial_o;    // (slots, s_q * h_q, 512) fp32, written by the main kernel (PDL predecessor)
  const float* partial_lse;  // (slots, s_q * h_q) fp32, base 2
  const int32_t* num_splits; // (b + 1,) from the scheduler
  // True for a schedule known on the host (sparse decode at small batch, kHostScheduleMaxBatch): its prefix sums
  // (batch + 1 values), used instead of num_splits, so such a call never reads the device schedule.
  bool use_host_num_splits;
  int32_t host_num_splits[kHostScheduleMaxBatch + 1];
  const float* attn_sink;    // (h_q,) natural-log units, may be null (no sink)
  int merged_in_kernel;      // requests with at most this many chunks were finished by the main kernel (1: none)
  // Batch-invariant calls only (read by combine_capped_kernel; 0 otherwise): the split slots the partial buffers hold.
  // A request whose slots pass it (a schedule planned with other lengths than the call's) is skipped: the main kernel
  // wrote final rows for it instead of partials (a default schedule never has more than batch + num_sm_parts slots,
  // which the buffers always hold). It sits in the padding before `output`: the struct's size and every other
  // field's offset are the default kernel's as before (its SASS and resource usage unchanged).
  int split_capacity;

  // out: (b, s_q, h_q, 512) in q's dtype, last dim contiguous, other strides multiples of 4 elements
  // (8-byte stores); lse: logical (b, h_q, s_q) float32, natural log.
  OutputView output;
};

// The first split slot of request `req` (combine_split_base(p, req + 1) - combine_split_base(p, req) chunks).
OPENMLA_HOST_DEVICE int32_t combine_split_base(const CombineParams& p, int req) {
  return p.use_host_num_splits ? p.host_num_splits[req] : p.num_splits[req];
}

// Split requests of exactly this many chunks are merged inside the dense main kernel when the schedule has merge
// counters (the last chunk to finish merges the other's partial); the combine kernel then skips them.
inline constexpr int kMaxMergeChunks = 2;

inline constexpr int kCombineWarps = 8;  // rows per CTA: one warp per (request, query row, column slice)
inline constexpr int kCombineHeadDim = 512;
// Each row's columns are split over 1 or kCombineMaxSlices CTAs (grid z): the launch plan's choice
// (heuristics::combine_slices: small grids take more slices for more loads in flight).
inline constexpr int kCombineMaxSlices = 4;

}  // namespace openmla::kernels
