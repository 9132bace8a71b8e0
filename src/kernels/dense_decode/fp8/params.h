// Parameters of the dense MLA decode kernel over an FP8 e4m3 paged cache with a per-tensor scale. Plain data, built by
// api/dense_decode_fp8.cpp. Design note: docs/dense-decode.md, "FP8 cache".
#pragma once

#include <cstdint>

#include "common/output_view.h"
#include "kernels/decode_scheduler/schedule_record.h"

namespace openmla::kernels {

struct DenseDecodeFp8Params {
  // Geometry (one latent KV head). Rows of a request are packed position-major: row = s_idx * h_q + head,
  // rows = s_q * h_q, tiled into m-blocks of 64 rows (grid.x), as in the BF16 dense kernel.
  int batch;
  int s_q;
  int h_q;
  int rows;          // s_q * h_q
  int num_m_blocks;  // ceil(rows / 64)
  int num_sm_parts;  // records in `schedule`: grid.z
  bool causal;       // bottom-right; false when s_q == 1
  float softmax_scale;
  float scale_log2;  // softmax_scale * log2(e); the kernel multiplies it by descale_q * descale_k

  // Per-tensor dequantisation scales: a device float32 scalar each, or null, then the host value below (1 when not
  // given). The cache holds k / descale_k in e4m3 (V is the first 512 dims of the same latent, one scale for both).
  const float* descale_q;
  const float* descale_k;
  float descale_q_value;
  float descale_k_value;

  // q: (b, s_q, h_q, 576) bf16 or e4m3 (the kernel variant), last dim contiguous; strides in elements.
  const void* q;
  int64_t q_stride_b, q_stride_s, q_stride_h;
  // k_cache: (num_pages, page_size, 1, 576) e4m3 bytes; page and row strides in bytes (multiples of 16).
  const uint8_t* k_cache;
  int64_t page_stride;
  int64_t row_stride;
  int page_size;      // any value >= 1
  int64_t num_pages;  // a block-table entry outside [0, num_pages) reads zeros, never another address
  // block_table: (b, max_blocks_per_seq) int32; entries past ceil(L / page_size) are never read.
  const int32_t* block_table;
  int64_t block_table_stride;
  int max_blocks_per_seq;
  const int32_t* cache_seqlens;  // (b,), clamped to [0, max_blocks_per_seq * page_size]

  // out: (b, s_q, h_q, 512) bf16; lse: logical (b, h_q, s_q) float32.
  OutputView output;
  // Split-KV partials of the combine (h_kv = 1): row = slot * s_q * h_q + s_idx * h_q + head; lse base 2.
  float* partial_o;
  float* partial_lse;

  const DecodeScheduleRecord* schedule;  // (num_sm_parts,)
  const int32_t* num_splits;             // (b + 1,)

  // True: WG1 holds a block's P V_R until WG0's next Q K^T is done; false: issued as soon as P is ready. The launch
  // plan's choice (detail::dense_fp8_hold_pv_r; docs/dense-decode.md, decision dense-fp8-v2).
  bool hold_pv_r = false;
  // True: the token loads skip L1 (ld.global.nc.L1::no_allocate) instead of allocating with evict_last; the data is
  // read once per CTA and L1 shares its SRAM with the shared memory the consumers' wgmma read (decision dense-fp8-v3:
  // an A/B, off by default; detail::DenseDecodeFp8Options).
  bool k_l1_no_allocate = false;
  // True: the _early_qk kernels, where WG0 issues the next block's Q K^T right behind its P V_L (decision
  // dense-fp8-v4: an A/B, off by default; detail::DenseDecodeFp8Options). Host-side only (picks the kernel).
  bool early_qk = false;
};

}  // namespace openmla::kernels
