// Parameters of the dense MHA prefill forward kernel. Plain data, built by api/mha_prefill.cpp.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/output_view.h"
#include "common/varlen.h"
#include "openmla/status.h"

namespace openmla::kernels {

struct MhaPrefillParams {
  // The batch (common/varlen.h): batch sequences, cu_seqlens_q = the call's cu_seqlens_qo, cu_seqlens_k =
  // cu_seqlens_kv ((batch + 1,) int32, clamped to [0, total_q] / [0, total_k] in the kernel); total_q rows of q, out,
  // lse and total_k rows of k, v (each <= 2^30).
  varlen::VarlenBatch seqs;
  int h_q;           // query heads
  int h_kv;          // key/value heads (h_q % h_kv == 0)
  int heads_per_kv;  // h_q / h_kv: head h reads kv head h / heads_per_kv
  int d_qk;          // 192 or 128 (d_v is 128)
  bool fp16;         // fp16 operands (else bf16)
  bool causal;       // bottom-right aligned
  float scale_log2;  // softmax scale * log2(e) (> 0)

  // Loaded by TMA (the launcher builds the maps): element strides, multiples of 8, of the token and head dimensions.
  const void* q;  // (total_q, h_q, d_qk)
  int64_t q_stride_t, q_stride_h;
  const void* k;  // (total_k, h_kv, d_qk); never read when total_k == 0 (then it may point anywhere valid)
  int64_t k_stride_t, k_stride_h;
  const void* v;  // (total_k, h_kv, 128)
  int64_t v_stride_t, v_stride_h;

  // out: (total_q, h_q, 128), last dim contiguous, 16-byte aligned rows; lse: (total_q, h_q) float32, any strides.
  // Indexed with the packed token as the view's `req` and query position 0 (out_stride_s = lse_stride_s = 0).
  OutputView output;

  // Tile scheduling (heuristics/mha_prefill_launch.h): CTA c starts with tile c; the next one is
  // atomicAdd(tile_counter, 1) + grid when `dynamic_tiles` (the counter is zeroed before the launch), else +grid.
  int grid;
  bool dynamic_tiles;
  int* tile_counter;  // workspace, may be null when !dynamic_tiles
  bool staged_out;    // O through shared memory and TMA stores (the staged kernel) rather than from the registers
};

// Launches the kernel on `stream` (grid params.grid, 384 threads). Builds the Q, K and V tensor maps.
Status launch_mha_prefill(const MhaPrefillParams& params, cudaStream_t stream);

}  // namespace openmla::kernels
