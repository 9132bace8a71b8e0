// Owning device allocation for the openmla_sanitize cases: cudaMalloc'ed to the exact size a view needs (so an
// out-of-bounds access is a memcheck error), freed on scope exit; ptr is null when the allocation failed.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace openmla_sanitize {

struct DeviceBuffer {
  void* ptr = nullptr;
  explicit DeviceBuffer(size_t bytes) {
    if (cudaMalloc(&ptr, bytes == 0 ? 16 : bytes) != cudaSuccess) ptr = nullptr;
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

}  // namespace openmla_sanitize
