// Internal entry points of the decode API (api/decode_plan.cpp, api/dense_decode.cpp, api/sparse_decode.cpp,
// api/decode_compat.cpp), exposed for the C++ tests: the full argument validation of each public decode function,
// without launching anything. With problem.num_sms > 0 they make no CUDA call at all (tests run them with fake
// device pointers on machines without a GPU). Only src/api and tests/ include this header.
#pragma once

#include "kernels/combine/params.h"
#include "kernels/dense_decode/params.h"
#include "kernels/sparse_decode/params.h"
#include "openmla/decode.h"
#include "openmla/test_hooks.h"

namespace openmla::detail {

// What get_decode_workspace_sizes / plan_decode check of a problem: the geometry the schedule and the workspace
// depend on (the family's other fields are checked by the decode call).
Status validate_schedule_problem(const DenseDecodeProblem& problem);
Status validate_schedule_problem(const SparseDecodeProblem& problem);

// Every check of plan_decode; on success *num_sm_parts is the partition count the schedule uses.
Status validate_plan_decode(const DenseDecodeProblem& problem, const TensorRef& cache_seqlens,
                            const DecodeSchedule& schedule, int* num_sm_parts);
// plan_decode's checks and launch for a dense problem, per-request query lengths included (their overload gives it
// the lengths its lengths kernel wrote: the partition count is the varlen problem's).
Status plan_dense_decode(const DenseDecodeProblem& problem, const TensorRef& lengths, const DecodeSchedule& schedule,
                         cudaStream_t stream);
Status validate_plan_decode(const SparseDecodeProblem& problem, const TensorRef& topk_length,
                            const TensorRef& extra_topk_length, const DecodeSchedule& schedule, int* num_sm_parts);

// Every check of dense_decode / sparse_decode; on success *num_sm_parts is the partition count of the schedule.
Status validate_dense_decode(const DenseDecodeProblem& problem, const DenseDecodeArgs& args, int* num_sm_parts);
Status validate_sparse_decode(const SparseDecodeProblem& problem, const SparseDecodeArgs& args, int* num_sm_parts);

// What a validated decode call launches: the main kernel's params, the combine's, and the combine's column slices.
// Built on the host from the problem and the arguments alone (no CUDA call), so the tests can check what a kernel
// would be given (e.g. the strides its TMA descriptors are built from, the split slots it writes).
struct DenseDecodeCall {
  kernels::DenseDecodeParams params;
  kernels::CombineParams combine;
  int combine_slices;
  kernels::DensePageGeometry pages;  // the cache's page size: which kernel runs (kernels::launch_dense_decode)
};
struct SparseDecodeCall {
  kernels::SparseDecodeParams params;
  kernels::CombineParams combine;
  int combine_slices;
};
// `args` must have passed validate_dense_decode / validate_sparse_decode (which gave num_sm_parts).
DenseDecodeCall prepare_dense_decode(const DenseDecodeProblem& problem, const DenseDecodeArgs& args, int num_sm_parts,
                                     const test_hooks::DenseDecodeOptions& options = {});
SparseDecodeCall prepare_sparse_decode(const SparseDecodeProblem& problem, const SparseDecodeArgs& args,
                                       int num_sm_parts);

// The compatibility form (DecodeProblem) as a family's problem, with the checks of the fields the family struct
// does not have: `sparse` must select the family; a sparse problem needs h_kv = 1 and causal = false.
// `for_decode` false: the looser rules of get_decode_workspace_sizes / plan_decode, which as before accept
// any h_kv that divides h_q and either causal flag for a sparse problem.
Status to_dense_problem(const DecodeProblem& problem, DenseDecodeProblem* out);
Status to_sparse_problem(const DecodeProblem& problem, bool for_decode, SparseDecodeProblem* out);

}  // namespace openmla::detail
