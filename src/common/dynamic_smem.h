// The dynamic shared-memory limit of a kernel (cudaFuncAttributeMaxDynamicSharedMemorySize), set once per device
// instead of before every launch: the attribute belongs to the kernel in a device's context and stays set, so
// repeating cudaFuncSetAttribute on every call (as the launchers did) only costs host time (docs/integration.md,
// "Host cost"). Host-only, header-only.
//
// Each launcher keeps one DynamicSmemLimit per kernel instantiation (a function-local static: a kernel's shared
// memory size is a compile-time constant). Thread-safe: two threads that race both set the attribute, which is
// harmless. A device whose context was reset since (cudaDeviceReset) has lost the attribute: the launch then fails
// with cudaErrorInvalidValue, and launch_with_dynamic_smem sets the attribute again and retries once.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "common/cuda_check.h"
#include "openmla/status.h"

namespace openmla::detail {

class DynamicSmemLimit {
 public:
  constexpr DynamicSmemLimit() = default;

  // `kernel` may launch with `bytes` of dynamic shared memory on the current device. *set_now: the attribute was set
  // by this call (false: it was known to be set already).
  Status ensure(const void* kernel, int bytes, const char* what, bool* set_now) {
    int device = -1;
    OPENMLA_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device), what);
    const bool tracked = device >= 0 && device < kTrackedDevices;
    const uint64_t bit = tracked ? uint64_t{1} << device : 0;
    if (tracked && (devices_.load(std::memory_order_acquire) & bit) != 0) {
      *set_now = false;
      return Status::ok();
    }
    OPENMLA_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes),
                                 what);
    if (tracked) devices_.fetch_or(bit, std::memory_order_release);
    *set_now = true;
    return Status::ok();
  }

  // Forgets every device (the next ensure() sets the attribute again).
  void forget() { devices_.store(0, std::memory_order_release); }

 private:
  static constexpr int kTrackedDevices = 64;  // devices past this set the attribute on every launch
  std::atomic<uint64_t> devices_{0};          // bit d: the attribute is set on device d
};

// Launches a kernel that needs `bytes` of dynamic shared memory: `launch()` enqueues it and returns the launch's
// error (cudaLaunchKernelEx's result, or cudaPeekAtLastError() after <<<>>>). `set_what` names the attribute call
// and `launch_what` the launch in an error message. Call it in an entry that checked that no error was pending
// (src/common/cuda_check.h, "Attribution"): an error after the launch is the launch's own, reported and cleared.
template <class Launch>
Status launch_with_dynamic_smem(DynamicSmemLimit& limit, const void* kernel, int bytes, const char* set_what,
                                const char* launch_what, Launch&& launch) {
  bool set_now = false;
  OPENMLA_RETURN_IF_ERROR(limit.ensure(kernel, bytes, set_what, &set_now));
  cudaError_t err = launch();
  if (err == cudaErrorInvalidValue && !set_now) {
    // The attribute was set earlier: the device's context may have been reset since. Ours to clear, set, retry.
    if (cudaPeekAtLastError() == err) (void)cudaGetLastError();
    limit.forget();
    OPENMLA_RETURN_IF_ERROR(limit.ensure(kernel, bytes, set_what, &set_now));
    err = launch();
  }
  if (err == cudaSuccess || err == cudaErrorNotReady) return Status::ok();
  return cuda_status(err, launch_what);
}

}  // namespace openmla::detail
