// CUDA error helpers shared by every layer (the public API, the launchers, the trace readers): a failed CUDA
// runtime call becomes a Status whose message names what was being done. Host-only, header-only.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "openmla/status.h"

namespace openmla::detail {

// `err` as a Status: ok for cudaSuccess, else kCudaError "<what>: CUDA error <name> (<description>)".
inline Status cuda_status(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::ok();
  return Status::cuda_error(std::string(what) + ": CUDA error " + cudaGetErrorName(err) + " (" +
                            cudaGetErrorString(err) + ")");
}

// The last CUDA error (cudaGetLastError, which also clears it), e.g. of a kernel launch, as a Status naming `what`.
inline Status last_cuda_error(const char* what) { return cuda_status(cudaGetLastError(), what); }

}  // namespace openmla::detail

// Returns from the enclosing function with a kCudaError Status if the CUDA runtime call `call` fails.
#define OPENMLA_CUDA_RETURN_IF_ERROR(call, what)                                                \
  do {                                                                                          \
    cudaError_t openmla_err_ = (call);                                                          \
    if (openmla_err_ != cudaSuccess) return ::openmla::detail::cuda_status(openmla_err_, what); \
  } while (0)
