// Host launchers of the FP8 KV-cache codec kernels: the only place a runtime layout / slot dtype becomes a
// template argument. Four kernels per direction at most (2 layouts x 2 slot types for append).
#include "kernels/kv_cache/kernel.cuh"
#include "kernels/kv_cache/launch.h"

#include "common/cuda_check.h"

namespace openmla::kernels::kv_cache {

namespace {

// One warp per token: ceil(tokens / warps per block) blocks. tokens <= INT32_MAX keeps this below 2^28.
dim3 grid_for(int64_t tokens) { return dim3(static_cast<unsigned>((tokens + kWarpsPerBlock - 1) / kWarpsPerBlock)); }

}  // namespace

Status launch_quantize(const QuantizeParams& params, Fp8Layout layout, cudaStream_t stream) {
  const int64_t tokens = params.num_blocks * params.page_size;
  if (tokens == 0) return Status::ok();
  if (layout == Fp8Layout::kV32)
    quantize_kernel<Fp8Layout::kV32><<<grid_for(tokens), kThreadsPerBlock, 0, stream>>>(params);
  else
    quantize_kernel<Fp8Layout::kModel1><<<grid_for(tokens), kThreadsPerBlock, 0, stream>>>(params);
  return detail::last_cuda_error("quantize_kv_cache: kernel launch");
}

Status launch_dequantize(const DequantizeParams& params, Fp8Layout layout, cudaStream_t stream) {
  const int64_t tokens = params.num_blocks * params.page_size;
  if (tokens == 0) return Status::ok();
  if (layout == Fp8Layout::kV32)
    dequantize_kernel<Fp8Layout::kV32><<<grid_for(tokens), kThreadsPerBlock, 0, stream>>>(params);
  else
    dequantize_kernel<Fp8Layout::kModel1><<<grid_for(tokens), kThreadsPerBlock, 0, stream>>>(params);
  return detail::last_cuda_error("dequantize_kv_cache: kernel launch");
}

Status launch_append(const AppendParams& params, Fp8Layout layout, cudaStream_t stream) {
  if (params.num_new == 0 || params.num_blocks * params.page_size == 0) return Status::ok();
  const dim3 grid = grid_for(params.num_new);
  if (layout == Fp8Layout::kV32) {
    if (params.slots_are_int64)
      append_kernel<Fp8Layout::kV32, int64_t><<<grid, kThreadsPerBlock, 0, stream>>>(params);
    else
      append_kernel<Fp8Layout::kV32, int32_t><<<grid, kThreadsPerBlock, 0, stream>>>(params);
  } else {
    if (params.slots_are_int64)
      append_kernel<Fp8Layout::kModel1, int64_t><<<grid, kThreadsPerBlock, 0, stream>>>(params);
    else
      append_kernel<Fp8Layout::kModel1, int32_t><<<grid, kThreadsPerBlock, 0, stream>>>(params);
  }
  return detail::last_cuda_error("append_kv_cache: kernel launch");
}

}  // namespace openmla::kernels::kv_cache
