// Internal entry points of api/decode.cpp, exposed for the C++ tests: the full argument validation of
// each public decode function, without launching anything. With problem.num_sms > 0 they make no CUDA
// call at all (tests run them with fake device pointers on machines without a GPU).
#pragma once

#include "openmla/decode.h"

namespace openmla::detail {

// Validates `problem` for get_decode_workspace_sizes / plan_decode (geometry only).
Status validate_decode_problem(const DecodeProblem& problem);

// Every check of plan_decode; on success *num_sm_parts is the partition count the schedule uses.
Status validate_plan_decode(const DecodeProblem& problem, const TensorRef& cache_seqlens, const TensorRef& topk_length,
                            const TensorRef& extra_topk_length, const DecodeSchedule& schedule, int* num_sm_parts);

// Every check of dense_decode; on success *num_sm_parts is the partition count of the schedule.
Status validate_dense_decode(const DecodeProblem& problem, const DenseDecodeArgs& args, int* num_sm_parts);

// Every check of sparse_decode; on success *num_sm_parts is the partition count of the schedule.
Status validate_sparse_decode(const DecodeProblem& problem, const SparseDecodeArgs& args, int* num_sm_parts);

// Testing only: when on, every split chunk of dense decode publishes its partial before it may merge (it never
// takes the "the other chunk is already done" path), so the tests reach the merge by the last publisher, which
// otherwise happens only when two chunks finish at the same moment. Process-wide; off by default.
void set_dense_merge_publish_always(bool on);

}  // namespace openmla::detail
