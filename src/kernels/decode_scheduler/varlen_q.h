// Per-request query lengths (docs/dense-decode.md and docs/sparse-decode.md, "Per-request query lengths"): the small
// kernel plan_decode runs before the scheduler. It turns (b,) query lengths into the lengths the scheduler and the
// kernels read, on the GPU (no host synchronisation, graph-capturable):
//   dense:  out[r] = cache_seqlens[r] when request r has a query row (clamp(seqused_q[r], 0, s_q) > 0), else 0 (the
//           request is empty: the scheduler gives it no block, the main kernel writes its empty rows);
//   sparse: one entry per query token t = r * s_q + i (the call decodes b * s_q requests of one token each):
//           out[t] = topk_length[r] (or topk) when i < clamp(seqused_q[r], 0, s_q), else 0; with an extra cache,
//           out[tokens + t] likewise from extra_topk_length (or extra_topk).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "openmla/status.h"

namespace openmla::kernels {

struct VarlenQExpandParams {
  int batch = 0;                              // b requests
  int s_q = 0;                                // the largest query length (rows per request)
  bool sparse = false;
  const int32_t* seqused_q = nullptr;         // (b,)
  const int32_t* cache_seqlens = nullptr;     // dense: (b,)
  int topk = 0;                               // sparse
  const int32_t* topk_length = nullptr;       // sparse, may be null (then topk)
  int extra_topk = 0;                         // sparse: 0 = no extra cache
  const int32_t* extra_topk_length = nullptr; // sparse, may be null (then extra_topk)
  int32_t* out = nullptr;                     // dense: (b,); sparse: (b * s_q,) or (2 * b * s_q,) with an extra cache
};

// One plain launch on `stream` (no PDL: the scheduler after it reads every value).
Status launch_varlen_q_expand(const VarlenQExpandParams& params, cudaStream_t stream);

}  // namespace openmla::kernels
