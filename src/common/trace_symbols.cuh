// Trace builds only (CMake -DOPENMLA_TRACE=ON): host helpers that read and clear the __device__ arrays the kernels
// stamp their timelines into (openmla/test_hooks.h; tools/trace_*_decode.py read them through the Python module).
// Every compilation unit that instantiates a kernel has its own copy of these arrays (whole-program compilation):
// a reader either runs in the unit that launched (the *_symbol helpers), or the unit hands out the address of its
// copies (trace_buffer) and the reader copies from the unit of the variant that launched last.
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

// Number of 64-bit values of a __device__ array of unsigned long long.
template <typename Symbol>
constexpr size_t symbol_values(const Symbol& symbol) {
  return sizeof(symbol) / sizeof(unsigned long long);
}

// Copies the calling unit's `symbol` to host[offset, offset + its size); the caller checked the room and synchronised.
template <typename Symbol>
Status copy_symbol(unsigned long long* host, size_t offset, const Symbol& symbol, const char* what) {
  OPENMLA_CUDA_RETURN_IF_ERROR(cudaMemcpyFromSymbol(host + offset, symbol, sizeof(symbol)), what);
  return Status::ok();
}

// Zeroes the calling unit's `symbol` (entries a CTA never stamps then read as 0).
template <typename Symbol>
Status clear_symbol(const Symbol& symbol, const char* what) {
  void* address = nullptr;
  OPENMLA_CUDA_RETURN_IF_ERROR(cudaGetSymbolAddress(&address, symbol), what);
  OPENMLA_CUDA_RETURN_IF_ERROR(cudaMemset(address, 0, sizeof(symbol)), what);
  return Status::ok();
}

}  // namespace openmla::detail
