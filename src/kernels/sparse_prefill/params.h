// Parameters of the sparse top-k MLA prefill kernel. Plain data, built by api/sparse_prefill.cpp.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/output_view.h"
#include "openmla/status.h"

namespace openmla::kernels {

struct SparsePrefillParams {
  int s_q;             // query tokens
  int s_kv;            // rows of kv; an index outside [0, s_kv) is invalid
  int h_q;             // query heads (any >= 1; tiles of 64, heads past h_q are zero rows whose outputs are dropped)
  int d_qk;            // 576 or 512
  int topk;            // index slots per token (any >= 1)
  int num_head_tiles;  // ceil(h_q / 64)
  int64_t num_tiles;   // s_q * num_head_tiles: tile = token * num_head_tiles + head_tile
  float scale_log2;    // softmax scale * log2(e) (> 0)

  const void* q;  // (s_q, h_q, d_qk) bf16; loaded by TMA (map built by the launcher)
  int64_t q_stride_s, q_stride_h;
  const void* kv;  // (s_kv, 1, d_qk) bf16, rows 16-byte aligned
  int64_t kv_stride_s;
  const int32_t* indices;  // (s_q, 1, topk) int32, last dim contiguous
  int64_t indices_stride_s;
  const int32_t* topk_length;  // (s_q,) int32, may be null: slots [0, clamp(topk_length[t], 0, topk)) are used
  const float* attn_sink;      // (h_q,) float32, may be null; natural-log units, +-inf allowed

  // out: (s_q, h_q, 512) bf16, last dim contiguous, 16-byte aligned rows; lse: (s_q, h_q) float32. Indexed with the
  // query token as the view's `req` and query position 0 (out_stride_s = lse_stride_s = 0).
  OutputView output;
  float* max_logits;  // (s_q, h_q) float32
  int64_t max_logits_stride_s, max_logits_stride_h;

  int grid;  // persistent CTAs (<= num_tiles); CTA c takes tiles c, c + grid, ...
};

// Launches the kernel on `stream` (grid params.grid, 384 threads). Builds Q's tensor map.
Status launch_sparse_prefill(const SparsePrefillParams& params, cudaStream_t stream);

}  // namespace openmla::kernels
