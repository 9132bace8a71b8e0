// Host launcher of checked mode's kernel and the reader of its record (params.h, kernel.cuh).
#pragma once

#include <cuda_runtime.h>

#include "kernels/input_check/params.h"
#include "openmla/status.h"

namespace openmla::kernels {

// Launches the checks of one call on `stream` (no sync, no allocation; graph-capturable). Nothing when
// params.num_checks == 0.
Status launch_input_checks(const InputCheckParams& params, cudaStream_t stream);

// Synchronises the current device, copies its record into *record and clears it (found = 0 after).
Status take_input_check_record(InputCheckRecord* record);

}  // namespace openmla::kernels
