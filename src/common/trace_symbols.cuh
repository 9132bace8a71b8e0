// Trace builds only (CMake -DOPENMLA_TRACE=ON): host helpers that read and clear the __device__ arrays the kernels
// stamp their timelines into (openmla/testing.h; tools/trace_*_decode.py read them through the Python module).
// Every compilation unit that instantiates a kernel has its own copy of these arrays (whole-program compilation),
// so a unit hands out the address of its copies (trace_buffer) and the readers copy from the unit that launched.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "common/cuda_check.h"
#include "openmla/status.h"

namespace openmla::detail {

// One __device__ array of unsigned long long stamps: its device address and size.
struct TraceBuffer {
  void* address = nullptr;
  size_t bytes = 0;
  size_t values() const { return bytes / sizeof(unsigned long long); }
};

// The calling unit's copy of `symbol`.
template <typename Symbol>
Status trace_buffer(const Symbol& symbol, TraceBuffer* out, const char* what) {
  OPENMLA_CUDA_RETURN_IF_ERROR(cudaGetSymbolAddress(&out->address, symbol), what);
  out->bytes = sizeof(symbol);
  return Status::ok();
}

// Copies `buffer` to host[offset, offset + its values); the caller checked the room and synchronised.
inline Status copy_trace_buffer(unsigned long long* host, size_t offset, const TraceBuffer& buffer, const char* what) {
  OPENMLA_CUDA_RETURN_IF_ERROR(cudaMemcpy(host + offset, buffer.address, buffer.bytes, cudaMemcpyDeviceToHost), what);
  return Status::ok();
}

// Zeroes `buffer` (entries a CTA never stamps then read as 0).
inline Status clear_trace_buffer(const TraceBuffer& buffer, const char* what) {
  OPENMLA_CUDA_RETURN_IF_ERROR(cudaMemset(buffer.address, 0, buffer.bytes), what);
  return Status::ok();
}

}  // namespace openmla::detail
