// OpenMLA: dense MLA decode over an FP8 e4m3 paged cache with per-tensor scales (the FP8 dense cache engines keep
// next to a BF16 model: vLLM's kv_cache_dtype "fp8" with FlashMLA).
//
// The cache holds each token's 576-dim latent (512 NoPE + 64 RoPE) as e4m3 values x / descale_k; V is the first
// 512 dims of the same latent, so one scale serves K and V. q is bf16, or e4m3 values q / descale_q. The output is
// bf16 and the lse the natural log of the sum of exp(softmax_scale * q . k) over the dequantised values, as
// dense_decode() computes them (docs/dense-decode.md, "FP8 cache": what is rounded where).
//
// Schedule and workspace are dense decode's: get_decode_workspace_sizes() and plan_decode() take the same
// DenseDecodeProblem, with cache_format = KVCacheFormat::kFp8E4M3, h_kv = 1 and any page_block_size >= 1.
#pragma once

#include <cuda_runtime.h>

#include "openmla/decode.h"

namespace openmla {

struct DenseDecodeFp8Args {
  TensorRef q;              // (b, s_q, h_q, 576) bf16 or float8_e4m3; last dim contiguous, byte strides % 16 == 0
  TensorRef k_cache;        // (num_blocks, page_block_size, 1, 576) float8_e4m3 (uint8 / int8 byte views accepted);
                            // last dim contiguous, row and page strides multiples of 16 bytes, rows >= 576 bytes apart
  TensorRef block_table;    // (b, max_blocks_per_seq) int32, as DenseDecodeArgs::block_table (an entry outside
                            // [0, num_blocks) reads zeros, never another address)
  TensorRef cache_seqlens;  // (b,) int32, contiguous; 0 allowed
  // Dequantisation scales (vLLM's FlashMLA fork's descale_q / descale_k): a float32 CUDA tensor of one element
  // (shape (1,) or a 0-d scalar), read on the device (no host synchronisation, graph-capturable), or, when undefined,
  // the host value below. descale_q applies to an e4m3 q (and multiplies a bf16 q too, if given).
  TensorRef descale_q;
  TensorRef descale_k;
  float descale_q_value = 1.f;  // used when descale_q is undefined; finite and > 0
  float descale_k_value = 1.f;  // used when descale_k is undefined; finite and > 0
  float softmax_scale = 0.f;    // 0: 576 ** -0.5
  DecodeSchedule schedule;      // from plan_decode() with the same problem and cache_seqlens (merge_counters are
                                // accepted and left zero: this kernel writes every split chunk's partial)
  DecodeSplitBuffers split;     // workspace
  TensorRef out;                // (b, s_q, h_q, 512) bf16; last dim contiguous, strides % 8 == 0
  TensorRef lse;                // (b, h_q, s_q) float32, any strides
};

// problem.cache_format must be KVCacheFormat::kFp8E4M3, problem.h_kv 1, problem.d_qk 576, problem.d_v 512; any
// page_block_size >= 1 (max_blocks_per_seq * page_block_size must fit in int32), any h_q, any s_q, causal or not.
// Every check runs before the first CUDA call.
Status dense_decode_fp8(const DenseDecodeProblem& problem, const DenseDecodeFp8Args& args, cudaStream_t stream);

}  // namespace openmla
