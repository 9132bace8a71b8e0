// Parameters of the sparse prefill kernel that reads the paged FP8 cache itself (bf16 compute: the producer
// dequantises the gathered tokens into the bf16 tiles the consumers already read). Plain data, built by
// api/sparse_prefill_fp8.cpp. Design note: docs/sparse-prefill.md, "Sparse prefill from the FP8 cache".
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/sparse_prefill/params.h"
#include "openmla/status.h"

namespace openmla::kernels {

struct SparsePrefillFp8Params {
  // Everything but the kv fields, as the bf16 kernel takes it: base.kv is null, base.s_kv is the cache's slot count
  // (num_blocks * page_size; an index outside [0, s_kv) is invalid and never read), base.d_qk picks the layout
  // (576: V3.2, 656 B/token; 512: MODEL1, 584 B/token; common/fp8_cache_layout.h).
  SparsePrefillParams base;
  const uint8_t* cache;  // page p starts at cache + p * page_stride
  int64_t page_stride;   // bytes, a multiple of 16
  int page_size;         // tokens per page, any value >= 1; slot = page * page_size + row
};

// Launches the kernel of the layout base.d_qk names on `stream` (grid base.grid, 384 threads).
Status launch_sparse_prefill_fp8(const SparsePrefillFp8Params& params, cudaStream_t stream);

}  // namespace openmla::kernels
