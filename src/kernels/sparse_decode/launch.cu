// Host launcher of the sparse FP8 MLA decode main kernel: layout / crossover dispatch, clusters, smem.
#include "kernels/sparse_decode/kernel.cuh"
#if defined(OPENMLA_SPARSE_TRACE)
#include "common/trace_symbols.cuh"
#endif
#include "kernels/sparse_decode/params.h"

#include "api/validate.h"

namespace openmla::kernels {

namespace {

template <sparse_decode::Layout L, bool kCrossover>
Status launch_typed(const SparseDecodeParams& p, cudaStream_t stream) {
  using Smem = sparse_decode::SharedStorage<L>;
  auto kernel = sparse_decode::sparse_decode_kernel<L, kCrossover>;
  const int smem_bytes = static_cast<int>(sizeof(Smem)) + 1024;  // + slack to align to 1024
  OPENMLA_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes),
                               "sparse decode: setting the shared-memory size");
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(p.num_head_blocks, p.s_q, p.num_sm_parts);
  config.blockDim = dim3(sparse_decode::Common::kThreads);
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  cudaLaunchAttribute attrs[1];
  attrs[0].id = cudaLaunchAttributeClusterDimension;
  attrs[0].val.clusterDim.x = kCrossover ? 2 : 1;
  attrs[0].val.clusterDim.y = 1;
  attrs[0].val.clusterDim.z = 1;
  config.attrs = attrs;
  config.numAttrs = 1;
  OPENMLA_CUDA_RETURN_IF_ERROR(cudaLaunchKernelEx(&config, kernel, p), "sparse decode kernel launch");
  return detail::last_cuda_error("sparse decode kernel launch");
}

}  // namespace

Status launch_sparse_decode(const SparseDecodeParams& p, cudaStream_t stream) {
  using sparse_decode::Layout;
  if (p.is_model1)
    return p.crossover ? launch_typed<Layout::kModel1, true>(p, stream) : launch_typed<Layout::kModel1, false>(p, stream);
  return p.crossover ? launch_typed<Layout::kV32, true>(p, stream) : launch_typed<Layout::kV32, false>(p, stream);
}

#if defined(OPENMLA_SPARSE_TRACE)
// Copies the trace of the last sparse-decode launch (kernel.cuh, struct Trace) to `host`: the clock64 block
// trace, then the %globaltimer per-CTA timeline, then the request-switch stamps.
Status copy_sparse_decode_trace(unsigned long long* host, size_t count) {
  using namespace sparse_decode;
  const size_t steps = detail::symbol_values(g_sparse_trace), timeline = detail::symbol_values(g_sparse_timeline);
  if (count < steps + timeline + detail::symbol_values(g_sparse_switch))
    return Status::invalid_argument("argument 'count': the trace holds more values");
  OPENMLA_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize(), "sparse decode trace: synchronising");
  OPENMLA_RETURN_IF_ERROR(detail::copy_symbol(host, 0, g_sparse_trace, "sparse decode trace: copying"));
  OPENMLA_RETURN_IF_ERROR(detail::copy_symbol(host, steps, g_sparse_timeline, "sparse decode trace: copying the timeline"));
  return detail::copy_symbol(host, steps + timeline, g_sparse_switch, "sparse decode trace: copying the switches");
}
// Clears the per-CTA timeline (CTAs that exit early stamp only some events).
Status clear_sparse_decode_timeline() {
  return detail::clear_symbol(sparse_decode::g_sparse_timeline, "sparse decode trace: clearing the timeline");
}
#endif

}  // namespace openmla::kernels
