// merge_attn_states dispatch (launch.h): the one place the two element types become template arguments. The typed
// launchers live in instantiations/*.cu (one unit per input type); this unit does not include the kernel.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/merge_states/launch.h"

namespace openmla::kernels::merge_states {

template <typename In, typename Out>
Status launch_merge_states_typed(const MergeStatesParams& p, cudaStream_t stream);

namespace {

template <typename In>
Status launch_for_input(const MergeStatesParams& p, Element out, cudaStream_t stream) {
  switch (out) {
    case Element::kBFloat16: return launch_merge_states_typed<In, __nv_bfloat16>(p, stream);
    case Element::kFloat16: return launch_merge_states_typed<In, __half>(p, stream);
    case Element::kFloat32: return launch_merge_states_typed<In, float>(p, stream);
  }
  return Status::internal("merge_attn_states: unknown output element type");
}

}  // namespace

Status launch_merge_states(const MergeStatesParams& p, Element in, Element out, cudaStream_t stream) {
  if (p.rows < 1 || p.num_partials < 1 || p.heads < 1 || p.d_v < kChunkElems || p.d_v % kChunkElems != 0)
    return Status::internal("merge_attn_states: inconsistent geometry");
  if ((p.rows + kWarpsPerCta - 1) / kWarpsPerCta > 2147483647)
    return Status::internal("merge_attn_states: too many rows for the grid's x dimension");
  if (p.outs == nullptr || p.lses == nullptr || p.out == nullptr)
    return Status::internal("merge_attn_states: a required pointer is null");
  switch (in) {
    case Element::kBFloat16: return launch_for_input<__nv_bfloat16>(p, out, stream);
    case Element::kFloat16: return launch_for_input<__half>(p, out, stream);
    case Element::kFloat32: return launch_for_input<float>(p, out, stream);
  }
  return Status::internal("merge_attn_states: unknown input element type");
}

}  // namespace openmla::kernels::merge_states
