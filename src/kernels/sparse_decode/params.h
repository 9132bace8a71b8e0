// Parameters of the sparse FP8 MLA decode main kernel. Plain data, built by api/sparse_decode.cpp.
#pragma once

#include <cstdint>

#include "common/output_view.h"
#include "kernels/decode_scheduler/schedule_record.h"
#include "openmla/decode.h"

namespace openmla::kernels {

// One FP8 paged cache and the index rows that select from it (the main cache, or the extra cache).
struct SparseCacheView {
  const uint8_t* data;   // page p starts at data + p * page_stride
  int64_t page_stride;   // bytes, multiple of 16
  int page_size;         // tokens per page (any value >= 1)
  int64_t capacity;      // num_pages * page_size: indices outside [0, capacity) are skipped
  const int32_t* indices;           // (b, s_q, topk) int32, last dim contiguous
  int64_t idx_stride_b, idx_stride_s;  // in elements
  int topk;                         // slots per index row
  const int32_t* topk_length;       // (b,) per request, may be null (then topk); clamped to [0, topk]
};

struct SparseDecodeParams {
  int batch;
  int s_q;
  int h_q;
  int num_head_blocks;  // ceil(h_q / 64): grid.x
  int num_sm_parts;     // records in `schedule`: grid.z
  bool is_model1;       // cache layout: MODEL1 (d_qk 512, 584 B/token) or V3.2 (d_qk 576, 656 B/token)
  bool crossover;       // head blocks paired in 2-CTA clusters that share the dequantisation (launch plan)
  float softmax_scale;
  float scale_log2;     // softmax_scale * log2(e)

  // q: (b, s_q, h_q, d_qk) bf16, last dim contiguous; strides in elements.
  const void* q;
  int64_t q_stride_b, q_stride_s, q_stride_h;

  SparseCacheView main;
  bool has_extra;
  // Batch-invariant schedules (docs/decode-schedule.md, "Batch invariance"; read only by sparse_decode_invariant_kernel):
  // > 0, the schedule's chunk size in blocks, and every role walks each record's range of a request chunk by chunk (a
  // chunk is a work item of its own: its own Q generation, epilogue and split slot, ordinal = first block /
  // chunk_blocks); 0: the default schedule. Never with host records (uniform_blocks == 0). It and split_capacity sit
  // in alignment padding: the struct's size and the other fields' offsets are the default kernel's as before.
  int chunk_blocks;
  SparseCacheView extra;  // attended after the main selection, under the same softmax

  const float* attn_sink;  // (h_q,) natural-log units, may be null

  // out: (b, s_q, h_q, 512) bf16; lse: logical (b, h_q, s_q) float32.
  OutputView output;

  // Split-KV partials (combine layout, h_kv = 1): row = slot * s_q * h_q + s_idx * h_q + head.
  float* partial_o;
  float* partial_lse;

  const DecodeScheduleRecord* schedule;  // (num_sm_parts,)
  const int32_t* num_splits;             // (b + 1,)
  // > 0 when every request has this many blocks (no topk_length / extra_topk_length) and the batch is small:
  // the launch plan (heuristics::plan_sparse_decode_launch) then runs the scheduler's partition walk on the host
  // and passes every partition's record packed (pack_partition_record) in uniform_records, so the kernel's head
  // reads its record from the parameters instead of a cold load of `schedule` (docs/sparse-decode.md, decision
  // sparse-v20). 0: read `schedule`.
  int uniform_blocks;
  // Batch-invariant schedules: the split slots the partial buffers hold; a request whose slots would pass it writes
  // final rows instead (read only with chunk_blocks > 0).
  int split_capacity;
  uint64_t uniform_records[kMaxDecodeSmParts];
  // With uniform_blocks > 0: the split-slot prefix sums of the same host walk (batch + 1 values), used instead of
  // num_splits (sparse_split_base).
  int32_t uniform_num_splits[kHostScheduleMaxBatch + 1];
};

// The first split slot of request `req`: where its chunks' partials start. With host records, from the host prefix
// sums of the same walk, never from the device schedule: the two may come from different plans (a schedule planned
// with topk_length used by a call without one), and mixing them wrote partial rows past the split buffers.
OPENMLA_HOST_DEVICE int32_t sparse_split_base(const SparseDecodeParams& p, int req) {
  return p.uniform_blocks > 0 ? p.uniform_num_splits[req] : p.num_splits[req];
}

}  // namespace openmla::kernels
