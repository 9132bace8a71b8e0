// Host launcher of the split-KV combine kernel, shared by dense and sparse decode. How many column slices a row
// is split over is the launch plan's choice (heuristics::combine_slices); the launcher takes it as given.
#pragma once

#include <cuda_runtime.h>

#include "kernels/combine/params.h"
#include "openmla/status.h"

namespace openmla::kernels {

// Launches the combine kernel on `stream` with programmatic dependent launch: its prologue overlaps the
// tail of the main kernel launched just before on the same stream, and it waits on the grid dependency
// (griddepcontrol.wait) before reading partials. Grid (b, ceil(s_q * h_q / kCombineWarps), slices);
// `slices` is 1 or kCombineMaxSlices.
Status launch_combine(const CombineParams& params, int slices, cudaStream_t stream);

}  // namespace openmla::kernels
