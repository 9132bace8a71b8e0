// Internal entry points of api/mha_prefill.cpp, exposed for the C++ tests.
#pragma once

#include "kernels/mha_prefill/params.h"
#include "openmla/prefill.h"

namespace openmla::detail {

// Every argument check of mha_prefill() without launching anything (no CUDA call at all). On success fills *params
// (when not null) with the kernel parameters; params->grid is planned for problem.num_sms SMs (1 when num_sms == 0:
// the public entry plans again with the device's count) and is 0 when there is nothing to launch (no query row).
Status validate_mha_prefill(const MhaPrefillProblem& problem, const MhaPrefillArgs& args,
                            kernels::MhaPrefillParams* params);

}  // namespace openmla::detail
