// Per-request query lengths of the decode API (DenseDecodeProblem::varlen_q, SparseDecodeProblem::varlen_q;
// docs/dense-decode.md and docs/sparse-decode.md, "Per-request query lengths"): the checks and the views the decode
// entries share. Internal to src/api (and the C++ tests).
#pragma once

#include <cstdint>

#include "openmla/decode.h"

namespace openmla::detail {

// The problem-level rules (no tensor): not with batch_invariant; sparse: b * s_q one-token requests fit in int32.
Status check_varlen_problem(const DenseDecodeProblem& problem);
Status check_varlen_problem(const SparseDecodeProblem& problem);

// DecodeWorkspaceSizes::varlen_ints of a problem (0 without varlen_q).
int64_t varlen_ints(const DenseDecodeProblem& problem);
int64_t varlen_ints(const SparseDecodeProblem& problem);

// A sparse varlen problem as the kernels run it: b * s_q requests of one query token each (varlen_q off).
SparseDecodeProblem varlen_flat_problem(const SparseDecodeProblem& problem);

// seqused_q of a call or a plan: given exactly when problem.varlen_q, a (b,) int32 contiguous CUDA vector.
Status check_seqused_q(bool varlen_q, const TensorRef& seqused_q, int64_t batch);
// schedule.varlen_lengths: given exactly when problem.varlen_q, (>= needed,) int32, contiguous, on the metadata's
// device.
Status check_varlen_lengths(bool varlen_q, const DecodeSchedule& schedule, int64_t needed);

// Every check of a sparse varlen call on the caller's (b, s_q, ...) shapes, then the one-token-request arguments the
// kernels take (q, indices, out, lse viewed as b * s_q requests; topk_length / extra_topk_length from the schedule's
// varlen_lengths). On success *flat_args holds them.
Status flatten_sparse_varlen_args(const SparseDecodeProblem& problem, const SparseDecodeArgs& args,
                                  SparseDecodeArgs* flat_args);

}  // namespace openmla::detail
