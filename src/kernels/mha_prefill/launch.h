// Launcher internals of the dense MHA prefill kernel: one explicit instantiation per (d_qk, dtype) variant
// (instantiations/*.cu), dispatched by launch_mha_prefill (launch.cu).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include "kernels/mha_prefill/params.h"
#include "openmla/status.h"

namespace openmla::kernels {

template <int kDQK, bool kFp16>
Status launch_mha_prefill_typed(const MhaPrefillParams& p, cudaStream_t stream);

namespace mha_prefill {

// The TMA map of one packed (rows, heads, cols) operand, addressed per sequence (docs/mha-prefill.md, "Loads"):
// rows past a sequence's end are outside the map and load as zeros. Box: 64 columns x 1 head x 128 rows.
// `stride_t` / `stride_h`: element strides of the token and head dimensions (multiples of 8, < 2^33).
struct RaggedOperand {
  const void* base;
  int64_t cols;
  int64_t heads;
  int64_t stride_t;
  int64_t stride_h;
  bool fp16;
};
Status make_ragged_map(const RaggedOperand& op, CUtensorMap* map, const char* what);

}  // namespace mha_prefill

}  // namespace openmla::kernels
