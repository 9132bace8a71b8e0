// The combine kernels' launch (launch.cu: the default kernel; launch_invariant.cu: the capped one of batch-invariant
// calls): one grid shape and the programmatic dependent launch, whichever kernel.
#pragma once

#include "common/cuda_check.h"
#include "kernels/combine/kernel.cuh"
#include "kernels/combine/params.h"

namespace openmla::kernels::combine {

template <typename Kernel>
Status launch_combine_grid(Kernel kernel, const CombineParams& params, int slices, cudaStream_t stream) {
  const int rows = params.s_q * params.h_q;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(params.batch), static_cast<unsigned>((rows + kCombineWarps - 1) / kCombineWarps),
                        static_cast<unsigned>(slices));
  config.blockDim = dim3(kCombineWarps * 32, 1, 1);
  config.dynamicSmemBytes = 0;
  config.stream = stream;
  // Programmatic dependent launch: combine CTAs may become resident while the main kernel's last CTAs
  // run; the kernel's griddepcontrol.wait restores full ordering before any partial is read.
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = 1;
  OPENMLA_CUDA_RETURN_IF_ERROR(cudaLaunchKernelEx(&config, kernel, params), "combine kernel launch");
  return Status::ok();
}

// Batch-invariant calls (params.split_capacity > 0): launch_invariant.cu.
Status launch_combine_capped(const CombineParams& params, int slices, cudaStream_t stream);

}  // namespace openmla::kernels::combine
