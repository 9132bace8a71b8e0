// OpenMLA: KV-cache formats and the FP8 KV-cache codec (quantise, dequantise, append).
//
// Formats (see docs/kv-cache-formats.md):
//   kFp8V32    d_qk = 576: 656 bytes per token, token-interleaved records
//              [512 x e4m3 NoPE | 4 x fp32 scales (one per 128 dims) | 64 x bf16 RoPE]
//   kFp8Model1 d_qk = 512: 584 bytes per token, block-structured pages
//              data section B x [448 x e4m3 NoPE | 64 x bf16 RoPE] (576 B per token), then
//              scale section B x [7 x UE8M0 scale (one per 64 dims) | 1 pad byte] (8 B per token)
// Scales are powers of two: s = 2^ceil(log2(max(amax / 448, 1e-4))).
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "openmla/status.h"
#include "openmla/types.h"

namespace openmla {

enum class KVCacheFormat : int {
  kBFloat16 = 0,    // plain bf16 rows of d_qk values (dense decode)
  kFloat16 = 1,     // plain fp16 rows of d_qk values (dense decode)
  kFp8V32 = 2,      // DeepSeek-V3.2 layout, d_qk = 576, 656 B/token
  kFp8Model1 = 3,   // MODEL1 layout, d_qk = 512, 584 B/token
  kFp8E4M3 = 4,     // plain e4m3 rows of d_qk values with one per-tensor scale (dense decode: dense_decode_fp8.h)
};

const char* kv_cache_format_name(KVCacheFormat format);

// Bytes one token occupies in a page of `format` (656 / 584 for the FP8 formats, 2*d_qk otherwise).
int64_t kv_cache_bytes_per_token(KVCacheFormat format, int64_t head_dim);
// Head dimension (d_qk) an FP8 format stores: 576 (V3.2) or 512 (MODEL1); 0 for the plain formats.
int64_t kv_cache_fp8_head_dim(KVCacheFormat format);

// Quantise a paged BF16 cache into an FP8 cache, page by page.
//   src: (num_blocks, page_size, 1, d_qk) bfloat16, CUDA. Last dim contiguous; other strides free but
//        multiples of 8 elements (16 bytes).
//   dst: (num_blocks, page_size, 1, bytes_per_token) uint8 / int8 / float8_e4m3, CUDA, same device.
//        stride(1) == bytes_per_token, stride(3) == 1, page stride stride(0) a multiple of 16 bytes
//        and >= page_size * bytes_per_token. Any page size >= 1.
// Bit-identical to the CPU codec (reference/include/openmla_ref/fp8_codec.h).
Status quantize_kv_cache(const TensorRef& src, const TensorRef& dst, KVCacheFormat format, cudaStream_t stream);

// Dequantise an FP8 cache back into a paged BF16 cache. Shapes and rules as quantize_kv_cache, roles
// swapped. Exact: every dequantised value is representable in bf16.
Status dequantize_kv_cache(const TensorRef& src, const TensorRef& dst, KVCacheFormat format,
                           cudaStream_t stream);

// Write new tokens into a paged FP8 cache.
//   new_kv: (n, d_qk) or (n, 1, d_qk) bfloat16, CUDA; last dim contiguous, row stride a multiple of 8.
//   slots:  (n,) int32 or int64, CUDA, contiguous: slot = page * page_size + offset_in_page; a
//           negative slot skips that token (padding rows). Slots must be < num_blocks * page_size.
//   cache:  (num_blocks, page_size, 1, bytes_per_token) as `dst` of quantize_kv_cache.
// Tokens are quantised exactly as quantize_kv_cache would. n == 0 is a no-op.
Status append_kv_cache(const TensorRef& new_kv, const TensorRef& slots, const TensorRef& cache,
                       KVCacheFormat format, cudaStream_t stream);

}  // namespace openmla
