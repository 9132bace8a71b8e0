// The launcher of one compiled variant of the sparse decode main kernel (launch.h). Included only by the
// instantiation units (instantiations/*.cu), one variant each, so the variants compile in parallel.
#pragma once

#include "common/cuda_check.h"
#include "common/dynamic_smem.h"
#include "kernels/sparse_decode/kernel.cuh"
#include "kernels/sparse_decode/launch.h"
#include "kernels/sparse_decode/params.h"

namespace openmla::kernels::sparse_decode {

// One kernel of a variant (the default or the batch-invariant one), with its own shared-memory limit record.
template <Layout L, bool kCrossover, typename Kernel>
Status launch_kernel(Kernel kernel, detail::DynamicSmemLimit& smem_limit, const SparseDecodeParams& p,
                     cudaStream_t stream) {
  using Smem = SharedStorage<L>;
  constexpr int smem_bytes = static_cast<int>(sizeof(Smem)) + 1024;  // + slack to align to 1024
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(p.num_head_blocks, p.s_q, p.num_sm_parts);
  config.blockDim = dim3(Common::kThreads);
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  cudaLaunchAttribute attrs[1];
  attrs[0].id = cudaLaunchAttributeClusterDimension;
  attrs[0].val.clusterDim.x = kCrossover ? 2 : 1;
  attrs[0].val.clusterDim.y = 1;
  attrs[0].val.clusterDim.z = 1;
  config.attrs = attrs;
  config.numAttrs = 1;
  return detail::launch_with_dynamic_smem(smem_limit, reinterpret_cast<const void*>(kernel), smem_bytes,
                                          "sparse decode: setting the shared-memory size",
                                          "sparse decode kernel launch",
                                          [&] {
                                            const cudaError_t err = cudaLaunchKernelEx(&config, kernel, p);
                                            return err != cudaSuccess ? err : cudaPeekAtLastError();
                                          });
}

template <Layout L, bool kCrossover>
Status launch_variant(const SparseDecodeParams& p, cudaStream_t stream) {
  static detail::DynamicSmemLimit smem_limit;  // set once per device (common/dynamic_smem.h)
  return launch_kernel<L, kCrossover>(sparse_decode_kernel<L, kCrossover>, smem_limit, p, stream);
}

template <Layout L, bool kCrossover>
Status launch_invariant_variant(const SparseDecodeParams& p, cudaStream_t stream) {
  static detail::DynamicSmemLimit smem_limit;
  return launch_kernel<L, kCrossover>(sparse_decode_invariant_kernel<L, kCrossover>, smem_limit, p, stream);
}

#if defined(OPENMLA_HAS_TRACE)
template <Layout L, bool kCrossover>
Status trace_buffer(detail::TraceBuffer* out) {
  return detail::trace_buffer(g_trace, out, "sparse decode trace: finding the buffer");
}
#endif

}  // namespace openmla::kernels::sparse_decode
