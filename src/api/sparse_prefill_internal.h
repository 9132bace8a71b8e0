// Internal entry point of api/sparse_prefill.cpp, exposed for the C++ tests: every argument check of
// sparse_prefill() without launching anything (no CUDA call at all).
#pragma once

#include "kernels/sparse_prefill/params.h"
#include "openmla/prefill.h"

namespace openmla::detail {

// On success fills *params (when not null) with the kernel parameters; params->grid is min(tiles, num_sms)
// (1 when num_sms == 0: the launcher resolves the device's SM count).
Status validate_sparse_prefill(const SparsePrefillArgs& args, kernels::SparsePrefillParams* params);

}  // namespace openmla::detail

#include "kernels/sparse_prefill/fp8_params.h"

namespace openmla::detail {

// Every argument check of sparse_prefill_fp8() (api/sparse_prefill_fp8.cpp) without a CUDA call; fills *params
// likewise (params->base.grid = min(tiles, num_sms), 1 when num_sms == 0).
Status validate_sparse_prefill_fp8(const SparsePrefillFp8Args& args, kernels::SparsePrefillFp8Params* params);

}  // namespace openmla::detail
