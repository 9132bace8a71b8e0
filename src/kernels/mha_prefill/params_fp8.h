// Parameters of the FP8 (e4m3) dense MHA prefill forward kernel (kernel_fp8.cuh). Plain data, built by
// api/mha_prefill.cpp. The bf16 kernel's parameters (their q, k, v point at e4m3 data, strides in elements = bytes)
// plus the descales and the output type; a struct of its own, so that the bf16 kernels' parameter layout is untouched.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/mha_prefill/params.h"
#include "openmla/status.h"

namespace openmla::kernels {

struct MhaPrefillFp8Params {
  MhaPrefillParams base;  // base.fp16 and base.staged_out are unused (false)
  bool out_fp16;          // out in fp16 (else bf16)
  int block_n;            // keys per block: 128 or 192, a kernel each (heuristics::mha_prefill_fp8_block_n)
  // Descales of the e4m3 inputs (the true value is e4m3 x descale), per (sequence, kv head): element
  // [b * stride_b + g * stride_h] (strides 0 for a scalar); null: 1.
  const float* q_descale;
  int64_t q_descale_stride_b, q_descale_stride_h;
  const float* k_descale;
  int64_t k_descale_stride_b, k_descale_stride_h;
  const float* v_descale;
  int64_t v_descale_stride_b, v_descale_stride_h;
};

// Launches the FP8 kernel of params.block_n on `stream` (grid params.base.grid, 384 threads). Builds the Q, K and V
// tensor maps.
Status launch_mha_prefill_fp8(const MhaPrefillFp8Params& params, cudaStream_t stream);

}  // namespace openmla::kernels
