// merge_attn_states with float16 partial outputs (outs), for each output type.
#include "kernels/merge_states/launch_impl.cuh"

namespace openmla::kernels::merge_states {
template Status launch_merge_states_typed<__half, __nv_bfloat16>(const MergeStatesParams&, cudaStream_t);
template Status launch_merge_states_typed<__half, __half>(const MergeStatesParams&, cudaStream_t);
template Status launch_merge_states_typed<__half, float>(const MergeStatesParams&, cudaStream_t);
}  // namespace openmla::kernels::merge_states
