// Trace builds only (CMake -DOPENMLA_TRACE=ON): the host side of the one trace format (common/trace_format.h). Every
// compilation unit that instantiates a kernel has its own copy of the kernel's __device__ trace array (whole-program
// compilation), so each unit hands out the address of its copy (trace_buffer, instantiated in the unit) and the
// family's launcher, which knows the variant that launched last, has read_trace copy that one (or clear them all).
// The one entry above it is api/trace.h; tools/diag/kernel_trace.py parses what it returns.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <string>

#include "common/cuda_check.h"
#include "common/trace_format.h"
#include "openmla/status.h"

namespace openmla::detail {

// One unit's copy of a kernel's __device__ trace array: its device address and size.
struct TraceBuffer {
  void* address = nullptr;
  size_t bytes = 0;
};

// The calling unit's copy of `symbol`.
template <typename Symbol>
Status trace_buffer(const Symbol& symbol, TraceBuffer* out, const char* what) {
  OPENMLA_CUDA_RETURN_IF_ERROR(cudaGetSymbolAddress(&out->address, symbol), what);
  out->bytes = sizeof(symbol);
  return Status::ok();
}

// The trace of format F of one family's kernel: `clear` zeroes every variant's array (`buffers[0, variants)`; stamps
// a CTA never makes then read 0), otherwise the device is synchronised and host[0, F::kValues) receives the header
// and track table (kernel, `variant`), then the array of the variant that launched last (`buffers[last]`).
template <class F>
Status read_trace(trace::Kernel kernel, unsigned long long variant, const TraceBuffer* buffers, int variants, int last,
                  unsigned long long* host, size_t count, bool clear, const char* what) {
  const std::string name(what);
  for (int i = 0; i < variants; ++i)
    if (buffers[i].bytes != F::kDeviceValues * sizeof(unsigned long long))
      return Status::internal(name + ": a variant's array does not have the format's size");
  if (clear) {
    for (int i = 0; i < variants; ++i)
      OPENMLA_CUDA_RETURN_IF_ERROR(cudaMemset(buffers[i].address, 0, buffers[i].bytes), (name + ": clearing").c_str());
    return Status::ok();
  }
  if (count < F::kValues)
    return Status::invalid_argument("argument 'count': the " + name + " holds " + std::to_string(F::kValues) +
                                    " values, not " + std::to_string(count));
  if (last < 0 || last >= variants) return Status::internal(name + ": no such variant");
  F::write_table(host, kernel, variant);
  OPENMLA_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize(), (name + ": synchronising").c_str());
  OPENMLA_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(host + F::kTableValues, buffers[last].address, buffers[last].bytes, cudaMemcpyDeviceToHost),
      (name + ": copying").c_str());
  return Status::ok();
}

}  // namespace openmla::detail
