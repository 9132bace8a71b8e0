// Combine launcher (launch.h): the one place the output type and the slice count become template arguments.
#include "kernels/combine/kernel.cuh"
#include "kernels/combine/launch_grid.cuh"
#include "kernels/combine/launch.h"
#include "kernels/combine/params.h"

#include "common/cuda_check.h"

namespace openmla::kernels {

namespace {

template <typename Element, int kSlices>
Status launch_combine_typed(const CombineParams& params, cudaStream_t stream) {
  return combine::launch_combine_grid(combine::combine_kernel<Element, kSlices>, params, kSlices, stream);
}

template <typename Element>
Status launch_combine_sliced(const CombineParams& params, int slices, cudaStream_t stream) {
  return slices == kCombineMaxSlices ? launch_combine_typed<Element, kCombineMaxSlices>(params, stream)
                                     : launch_combine_typed<Element, 1>(params, stream);
}

}  // namespace

Status launch_combine(const CombineParams& params, int slices, cudaStream_t stream) {
  if (params.batch < 1 || params.s_q < 1 || params.h_q < 1 || params.h_kv < 1 || params.q_per_kv < 1 ||
      params.h_q != params.h_kv * params.q_per_kv)
    return Status::internal("combine: inconsistent geometry");
  if ((static_cast<int64_t>(params.s_q) * params.h_q + kCombineWarps - 1) / kCombineWarps > 65535)
    return Status::internal("combine: s_q * h_q too large for the grid's y dimension");
  if (params.partial_o == nullptr || params.partial_lse == nullptr || params.num_splits == nullptr ||
      params.output.out == nullptr || params.output.lse == nullptr)
    return Status::internal("combine: a required pointer is null");
  if (slices != 1 && slices != kCombineMaxSlices) return Status::internal("combine: slices must be 1 or kCombineMaxSlices");
  if (params.split_capacity > 0) return combine::launch_combine_capped(params, slices, stream);
  return params.is_fp16 ? launch_combine_sliced<__half>(params, slices, stream)
                        : launch_combine_sliced<__nv_bfloat16>(params, slices, stream);
}

}  // namespace openmla::kernels
