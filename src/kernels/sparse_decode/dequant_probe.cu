// Test hook of the sparse-decode dequantisation (see dequant_probe.h).
#include "kernels/sparse_decode/dequant_probe.h"
#include "kernels/sparse_decode/kernel.cuh"

#include "common/cuda_check.h"

namespace openmla::kernels {

namespace {

__global__ void fp8_dequant_probe_kernel(const uint8_t* bytes, const float* scales, uint16_t* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const uint4 raw = *reinterpret_cast<const uint4*>(bytes + static_cast<int64_t>(i) * 16);
  uint4 lo, hi;
  sparse_decode::dequant16(raw, sparse_decode::make_scale_mul(scales[i]), lo, hi);
  *reinterpret_cast<uint4*>(out + static_cast<int64_t>(i) * 16) = lo;
  *reinterpret_cast<uint4*>(out + static_cast<int64_t>(i) * 16 + 8) = hi;
}

}  // namespace

Status run_fp8_dequant_probe(const uint8_t* bytes, const float* scales, uint16_t* out, int n) {
  if (n <= 0) return Status::ok();
  fp8_dequant_probe_kernel<<<(n + 127) / 128, 128>>>(bytes, scales, out, n);
  OPENMLA_RETURN_IF_ERROR(detail::last_cuda_error("fp8 dequant probe launch"));
  OPENMLA_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize(), "fp8 dequant probe");
  return Status::ok();
}

}  // namespace openmla::kernels
