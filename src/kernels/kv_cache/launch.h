// Host launchers of the FP8 KV-cache codec kernels. Arguments arrive validated (src/api/kv_cache.cpp); these
// functions only build the grid and launch on the caller's stream (no sync, no allocation).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/kv_cache/config.h"
#include "openmla/status.h"

namespace openmla::kernels::kv_cache {

// Paged BF16 cache -> paged FP8 cache, every token of every page.
struct QuantizeParams {
  const void* src = nullptr;    // (num_blocks, page_size, 1, d_qk) bf16; 16-byte aligned; last dim contiguous
  int64_t src_page_stride = 0;  // elements between pages, a multiple of 8
  int64_t src_row_stride = 0;   // elements between tokens of a page, a multiple of 8
  void* dst = nullptr;          // FP8 cache bytes; 16-byte aligned
  int64_t dst_page_stride = 0;  // bytes between pages, a multiple of 16, >= page_size * bytes_per_token
  int64_t num_blocks = 0;
  int64_t page_size = 0;  // tokens per page, >= 1; num_blocks * page_size <= INT32_MAX
};

// Paged FP8 cache -> paged BF16 cache.
struct DequantizeParams {
  const void* src = nullptr;    // FP8 cache bytes; 16-byte aligned
  int64_t src_page_stride = 0;  // bytes, a multiple of 16
  void* dst = nullptr;          // (num_blocks, page_size, 1, d_qk) bf16; 16-byte aligned
  int64_t dst_page_stride = 0;  // elements, a multiple of 8
  int64_t dst_row_stride = 0;   // elements, a multiple of 8
  int64_t num_blocks = 0;
  int64_t page_size = 0;
};

// New tokens -> their slots of a paged FP8 cache.
struct AppendParams {
  const void* new_kv = nullptr;   // (num_new, d_qk) bf16 rows; 16-byte aligned
  int64_t new_kv_row_stride = 0;  // elements, a multiple of 8
  const void* slots = nullptr;    // (num_new,) int32 or int64, contiguous; < 0 or >= num_blocks*page_size: skipped
  bool slots_are_int64 = false;
  int64_t num_new = 0;            // <= INT32_MAX
  void* cache = nullptr;          // FP8 cache bytes; 16-byte aligned
  int64_t cache_page_stride = 0;  // bytes, a multiple of 16
  int64_t num_blocks = 0;
  int64_t page_size = 0;
};

Status launch_quantize(const QuantizeParams& params, Fp8Layout layout, cudaStream_t stream);
Status launch_dequantize(const DequantizeParams& params, Fp8Layout layout, cudaStream_t stream);
Status launch_append(const AppendParams& params, Fp8Layout layout, cudaStream_t stream);

}  // namespace openmla::kernels::kv_cache
