// Internal entry point of api/merge_states.cpp, exposed for the C++ tests: every argument check of
// merge_attn_states() without launching anything (no CUDA call at all).
#pragma once

#include "kernels/merge_states/config.h"
#include "kernels/merge_states/params.h"
#include "openmla/merge.h"

namespace openmla::detail {

// What a valid call launches: the params (rows == 0: nothing) and the two element types.
struct MergeStatesLaunch {
  kernels::merge_states::MergeStatesParams params{};
  kernels::merge_states::Element in = kernels::merge_states::Element::kBFloat16;
  kernels::merge_states::Element out = kernels::merge_states::Element::kBFloat16;
};

// On success fills *launch (when not null).
Status validate_merge_states(const MergeStatesArgs& args, MergeStatesLaunch* launch);

}  // namespace openmla::detail
