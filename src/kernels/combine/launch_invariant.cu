// The capped combine of batch-invariant calls (launch_grid.cuh): its own unit, so launch.cu's machine code stays the
// default kernel's alone.
#include "kernels/combine/launch_grid.cuh"

namespace openmla::kernels::combine {

Status launch_combine_capped(const CombineParams& params, int slices, cudaStream_t stream) {
  if (params.is_fp16)
    return slices == kCombineMaxSlices
               ? launch_combine_grid(combine_capped_kernel<__half, kCombineMaxSlices>, params, slices, stream)
               : launch_combine_grid(combine_capped_kernel<__half, 1>, params, slices, stream);
  return slices == kCombineMaxSlices
             ? launch_combine_grid(combine_capped_kernel<__nv_bfloat16, kCombineMaxSlices>, params, slices, stream)
             : launch_combine_grid(combine_capped_kernel<__nv_bfloat16, 1>, params, slices, stream);
}

}  // namespace openmla::kernels::combine
