// Internal entry points of the FP8 dense decode API (api/dense_decode_fp8.cpp), exposed for the C++ tests: the full
// argument validation and the kernel parameters a call would launch with, without launching anything. With
// problem.num_sms > 0 they make no CUDA call (tests run them with fake device pointers on machines without a GPU).
#pragma once

#include "kernels/combine/params.h"
#include "kernels/dense_decode/fp8/params.h"
#include "openmla/dense_decode_fp8.h"

namespace openmla::detail {

Status validate_dense_decode_fp8(const DenseDecodeProblem& problem, const DenseDecodeFp8Args& args,
                                 int* num_sm_parts);

struct DenseDecodeFp8Call {
  kernels::DenseDecodeFp8Params params;
  bool q_fp8;
  kernels::CombineParams combine;
  int combine_slices;
};
// Knobs only tests and the benchmark's A/B turn.
struct DenseDecodeFp8Options {
  bool hold_pv_r = true;  // DenseDecodeFp8Params::hold_pv_r
};
// `args` must have passed validate_dense_decode_fp8 (which gave num_sm_parts).
DenseDecodeFp8Call prepare_dense_decode_fp8(const DenseDecodeProblem& problem, const DenseDecodeFp8Args& args,
                                            int num_sm_parts, const DenseDecodeFp8Options& options = {});
// dense_decode_fp8() with options.
Status run_dense_decode_fp8(const DenseDecodeProblem& problem, const DenseDecodeFp8Args& args,
                            const DenseDecodeFp8Options& options, cudaStream_t stream);

}  // namespace openmla::detail
