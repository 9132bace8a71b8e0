// Host launcher of the merge_attn_states kernel. Arguments arrive validated (src/api/merge_states.cpp); the launcher
// turns the two element types into the compiled variant and launches on the caller's stream (no sync, no
// allocation). It decides nothing else.
#pragma once

#include <cuda_runtime.h>

#include "kernels/merge_states/config.h"
#include "kernels/merge_states/params.h"
#include "openmla/status.h"

namespace openmla::kernels::merge_states {

// Grid ceil(rows / kWarpsPerCta) x 1 x 1, kThreadsPerCta threads; a plain launch (no PDL, no cluster).
Status launch_merge_states(const MergeStatesParams& params, Element in, Element out, cudaStream_t stream);

}  // namespace openmla::kernels::merge_states
