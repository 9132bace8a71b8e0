// The launcher of one compiled variant of the FP8 dense decode kernel (launch.h). Included only by the
// instantiation units (instantiations/*.cu).
#pragma once

#include "common/cuda_check.h"
#include "common/dynamic_smem.h"
#include "kernels/dense_decode/fp8/kernel.cuh"
#include "kernels/dense_decode/fp8/launch.h"

namespace openmla::kernels::dense_decode_fp8 {

template <bool kQFp8, bool kEarlyQK>
Status launch_variant(const DenseDecodeFp8Params& p, cudaStream_t stream) {
  static detail::DynamicSmemLimit smem_limit;  // set once per device (common/dynamic_smem.h)
  constexpr int smem_bytes = static_cast<int>(sizeof(SharedStorage)) + 1024;  // + slack to align to 1024
  const auto kernel = dense_decode_fp8_kernel<kQFp8, kEarlyQK>;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(p.num_m_blocks, 1, p.num_sm_parts);
  config.blockDim = dim3(Cfg::kThreads);
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  return detail::launch_with_dynamic_smem(smem_limit, reinterpret_cast<const void*>(kernel), smem_bytes,
                                          "FP8 dense decode: setting the shared-memory size",
                                          "FP8 dense decode kernel launch", [&] {
                                            const cudaError_t err = cudaLaunchKernelEx(&config, kernel, p);
                                            return err != cudaSuccess ? err : cudaPeekAtLastError();
                                          });
}

}  // namespace openmla::kernels::dense_decode_fp8
