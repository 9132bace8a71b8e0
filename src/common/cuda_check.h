// CUDA error helpers shared by every layer (the public API, the launchers, the trace readers): a failed CUDA
// runtime call becomes a Status whose message names what was being done. Host-only, header-only.
//
// Attribution. The runtime keeps one "last error" per host thread, set by every failed runtime call and by a
// failed kernel launch, whoever made it. OpenMLA reports only its own errors and never clears anyone else's:
//   - every public entry calls check_no_pending_cuda_error() right before its first launch (through
//     api/validate.h's check_launch_context): an error already pending there was left by an earlier operation, so
//     the entry launches nothing, says so, and leaves the error in place for its owner;
//   - after that, an error found by last_cuda_error() right after a launch is the launch's own: it is reported and
//     cleared (the Status carries it), so it cannot be mistaken later for someone else's.
// cudaErrorNotReady is not an error (some runtimes leave it behind after a stream or event query): it is ignored
// and left alone.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "openmla/status.h"

namespace openmla::detail {

// `err` as a Status: ok for cudaSuccess, else kCudaError "<what>: CUDA error <name> (<description>)". `err` is the
// result of one of OpenMLA's own runtime calls: when it is also the thread's pending last error, that error is
// cleared (the Status carries it).
inline Status cuda_status(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::ok();
  if (cudaPeekAtLastError() == err) (void)cudaGetLastError();
  return Status::cuda_error(std::string(what) + ": CUDA error " + cudaGetErrorName(err) + " (" +
                            cudaGetErrorString(err) + ")");
}

// A CUDA error pending before `entry` launched anything: not OpenMLA's. Reported as such and NOT cleared.
inline Status check_no_pending_cuda_error(const char* entry) {
  const cudaError_t pending = cudaPeekAtLastError();
  if (pending == cudaSuccess || pending == cudaErrorNotReady) return Status::ok();
  return Status::cuda_error(std::string(entry) + ": a CUDA error left by an earlier operation (not OpenMLA's) is " +
                            "pending: " + cudaGetErrorName(pending) + " (" + cudaGetErrorString(pending) +
                            "); nothing was launched and the error was left in place for its owner (cudaGetLastError "
                            "reads and clears it; a sticky error such as an illegal address needs a new context)");
}

// The error of the launch just made (call it right after the launch, in an entry that ran
// check_no_pending_cuda_error first, so any pending error is the launch's own): reported and cleared.
inline Status last_cuda_error(const char* what) {
  const cudaError_t err = cudaPeekAtLastError();
  if (err == cudaSuccess || err == cudaErrorNotReady) return Status::ok();
  return cuda_status(err, what);
}

}  // namespace openmla::detail

// Returns from the enclosing function with a kCudaError Status if the CUDA runtime call `call` fails.
#define OPENMLA_CUDA_RETURN_IF_ERROR(call, what)                                                \
  do {                                                                                          \
    cudaError_t openmla_err_ = (call);                                                          \
    if (openmla_err_ != cudaSuccess) return ::openmla::detail::cuda_status(openmla_err_, what); \
  } while (0)
