// Trace builds only (CMake -DOPENMLA_SPARSE_TRACE=ON): host helpers that read and clear the __device__ arrays
// the kernels stamp their timelines into (tools/trace_*_decode.py read them through the Python module).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "api/validate.h"
#include "openmla/status.h"

namespace openmla::detail {

// Number of 64-bit values of a __device__ array of unsigned long long.
template <typename Symbol>
constexpr size_t symbol_values(const Symbol& symbol) {
  return sizeof(symbol) / sizeof(unsigned long long);
}

// Copies `symbol` to host[offset, offset + its size); the caller checked the room and synchronised.
template <typename Symbol>
Status copy_symbol(unsigned long long* host, size_t offset, const Symbol& symbol, const char* what) {
  OPENMLA_CUDA_RETURN_IF_ERROR(cudaMemcpyFromSymbol(host + offset, symbol, sizeof(symbol)), what);
  return Status::ok();
}

// Zeroes `symbol` (entries a CTA never stamps then read as 0).
template <typename Symbol>
Status clear_symbol(const Symbol& symbol, const char* what) {
  void* address = nullptr;
  OPENMLA_CUDA_RETURN_IF_ERROR(cudaGetSymbolAddress(&address, symbol), what);
  OPENMLA_CUDA_RETURN_IF_ERROR(cudaMemset(address, 0, sizeof(symbol)), what);
  return Status::ok();
}

}  // namespace openmla::detail
