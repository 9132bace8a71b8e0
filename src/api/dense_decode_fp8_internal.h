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
enum class HoldPvR { kAuto, kOn, kOff };
// Whether calls use the early-Q K^T kernels by default (decision dense-fp8-v4).
inline constexpr bool kDenseFp8EarlyQkDefault = false;
struct DenseDecodeFp8Options {
  HoldPvR hold_pv_r = HoldPvR::kAuto;  // DenseDecodeFp8Params::hold_pv_r; kAuto: dense_fp8_hold_pv_r()
  bool k_l1_no_allocate = false;       // DenseDecodeFp8Params::k_l1_no_allocate
  bool early_qk = kDenseFp8EarlyQkDefault;  // DenseDecodeFp8Params::early_qk
};
// The launch plan's choice of DenseDecodeFp8Params::hold_pv_r (docs/dense-decode.md, decision dense-fp8-v2): never,
// since holding WG1's P V_R measured 3-4 % slower on every row (kept as an option for the A/B).
bool dense_fp8_hold_pv_r(int num_m_blocks);
// `args` must have passed validate_dense_decode_fp8 (which gave num_sm_parts).
DenseDecodeFp8Call prepare_dense_decode_fp8(const DenseDecodeProblem& problem, const DenseDecodeFp8Args& args,
                                            int num_sm_parts, const DenseDecodeFp8Options& options = {});
// dense_decode_fp8() with options.
Status run_dense_decode_fp8(const DenseDecodeProblem& problem, const DenseDecodeFp8Args& args,
                            const DenseDecodeFp8Options& options, cudaStream_t stream);

}  // namespace openmla::detail
