// Host launcher of the sparse FP8 MLA decode main kernel: layout / crossover dispatch, clusters, smem.
#include "kernels/sparse_decode/kernel.cuh"
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
  const size_t steps = sizeof(sparse_decode::g_sparse_trace) / sizeof(unsigned long long);
  const size_t timeline = sizeof(sparse_decode::g_sparse_timeline) / sizeof(unsigned long long);
  if (count < steps + timeline) return Status::invalid_argument("argument 'count': the trace holds more values");
  OPENMLA_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize(), "sparse decode trace: synchronising");
  OPENMLA_CUDA_RETURN_IF_ERROR(cudaMemcpyFromSymbol(host, sparse_decode::g_sparse_trace, steps * sizeof(unsigned long long)),
                               "sparse decode trace: copying");
  const size_t switches = sizeof(sparse_decode::g_sparse_switch) / sizeof(unsigned long long);
  if (count < steps + timeline + switches) return Status::invalid_argument("argument 'count': the trace holds more values");
  OPENMLA_CUDA_RETURN_IF_ERROR(
      cudaMemcpyFromSymbol(host + steps, sparse_decode::g_sparse_timeline, timeline * sizeof(unsigned long long)),
      "sparse decode trace: copying the timeline");
  OPENMLA_CUDA_RETURN_IF_ERROR(cudaMemcpyFromSymbol(host + steps + timeline, sparse_decode::g_sparse_switch,
                                                    switches * sizeof(unsigned long long)),
                               "sparse decode trace: copying the request switches");
  return Status::ok();
}
// Clears the per-CTA timeline (CTAs that exit early stamp only some events).
Status clear_sparse_decode_timeline() {
  void* timeline = nullptr;
  OPENMLA_CUDA_RETURN_IF_ERROR(cudaGetSymbolAddress(&timeline, sparse_decode::g_sparse_timeline),
                               "sparse decode trace: locating the timeline");
  OPENMLA_CUDA_RETURN_IF_ERROR(cudaMemset(timeline, 0, sizeof(sparse_decode::g_sparse_timeline)),
                               "sparse decode trace: clearing the timeline");
  return Status::ok();
}
#endif

}  // namespace openmla::kernels
