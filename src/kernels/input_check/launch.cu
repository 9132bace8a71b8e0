// Launcher of checked mode's kernel and reader of the device's record (launch.h). The record is a __device__
// variable of this unit, so only this unit reads or clears it.
#include "kernels/input_check/kernel.cuh"
#include "kernels/input_check/launch.h"

#include <algorithm>

#include "common/cuda_check.h"

namespace openmla::kernels {

namespace {
// Elements per thread before another CTA is added; CTAs per check at most (a few waves on any Hopper part).
constexpr int64_t kElementsPerThread = 8;
constexpr int64_t kMaxCtasPerCheck = 512;
}  // namespace

Status launch_input_checks(const InputCheckParams& params, cudaStream_t stream) {
  if (params.num_checks <= 0) return Status::ok();
  if (params.num_checks > kMaxInputChecks) return Status::internal("input checks: too many checks in one call");
  int64_t most = 1;
  for (int i = 0; i < params.num_checks; ++i) most = std::max(most, check_element_count(params.checks[i]));
  const int64_t ctas = std::clamp<int64_t>(
      (most + input_check::kThreads * kElementsPerThread - 1) / (input_check::kThreads * kElementsPerThread), 1,
      kMaxCtasPerCheck);
  const dim3 grid(static_cast<unsigned>(ctas), static_cast<unsigned>(params.num_checks));
  input_check::input_check_kernel<<<grid, input_check::kThreads, 0, stream>>>(params);
  return detail::last_cuda_error("checked mode: input check kernel launch");
}

Status take_input_check_record(InputCheckRecord* record) {
  OPENMLA_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize(), "checked mode: synchronising the device");
  OPENMLA_CUDA_RETURN_IF_ERROR(cudaMemcpyFromSymbol(record, input_check::g_record, sizeof(InputCheckRecord)),
                               "checked mode: reading the record");
  if (record->found != 0) {
    const InputCheckRecord empty{};
    OPENMLA_CUDA_RETURN_IF_ERROR(cudaMemcpyToSymbol(input_check::g_record, &empty, sizeof(InputCheckRecord)),
                                 "checked mode: clearing the record");
  }
  return Status::ok();
}

}  // namespace openmla::kernels
