// Parameters of the dense MHA prefill backward kernels. Plain data, built by api/mha_prefill_bwd.cpp.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/varlen.h"
#include "openmla/status.h"

namespace openmla::kernels {

struct MhaPrefillBwdParams {
  varlen::VarlenBatch seqs;  // as the forward's (common/varlen.h): clamped in the kernels
  int h_q;
  int h_kv;
  int heads_per_kv;
  int d_qk;          // 192 or 128 (d_v is 128)
  bool fp16;
  bool causal;
  bool deterministic;
  float scale;       // softmax scale (> 0)
  float scale_log2;  // scale * log2(e)

  // TMA-loaded operands (element strides, multiples of 8): q, k, v, dout.
  const void* q;
  int64_t q_stride_t, q_stride_h;
  const void* k;
  int64_t k_stride_t, k_stride_h;
  const void* v;
  int64_t v_stride_t, v_stride_h;
  const void* dout;
  int64_t dout_stride_t, dout_stride_h;
  // Read by the preprocess: out (total_q, h_q, 128) and lse (total_q, h_q) float32, any strides.
  const void* out;
  int64_t out_stride_t, out_stride_h;
  const float* lse;
  int64_t lse_stride_t, lse_stride_h;
  // Written: dq (total_q, h_q, d_qk) by the conversion; dk, dv (total_k, h_kv, d) by the main kernel's epilogue.
  void* dq;
  int64_t dq_stride_t, dq_stride_h;
  void* dk;
  int64_t dk_stride_t, dk_stride_h;
  void* dv;
  int64_t dv_stride_t, dv_stride_h;

  // Workspace (config.h for the layouts): the tile counter, the deterministic order's counters (h_q x pad_blocks
  // ints), the base-2 lse and D (h_q x pad_blocks x 64 floats each), the dq accumulator (h_q x pad_blocks x kQKTiles
  // x 4096 floats).
  int pad_blocks;
  int* tile_counter;
  int* dq_order;
  float* lse2;
  float* dsum;
  float* dq_accum;

  int grid;               // persistent CTAs of the main kernel
  bool key_block_major;   // a sequence's tiles key block by key block across the kv heads (else kv head by kv head)
};

// Launches the preprocess, the main kernel and the dq conversion on `stream` (the workspace already reset).
Status launch_mha_prefill_bwd(const MhaPrefillBwdParams& params, cudaStream_t stream);

}  // namespace openmla::kernels
