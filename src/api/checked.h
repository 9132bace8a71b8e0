// Checked mode inside the API (include/openmla/checked.h): the switch, and for each entry the device-side checks of
// its arguments (kernels/input_check/params.h), built on the host from the validated call. Internal to src/api and
// the tests: the builders and the message are pure host functions, tested on the CPU.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "kernels/input_check/params.h"
#include "openmla/checked.h"
#include "openmla/decode.h"
#include "openmla/prefill.h"
#include "openmla/status.h"
#include "openmla/types.h"

namespace openmla::detail {

// The switch an entry reads (one relaxed atomic load once initialised from OPENMLA_CHECK).
bool checked_mode_enabled();
// What OPENMLA_CHECK asks for now: set to anything but "" or "0" (read once by checked_mode_enabled).
bool checked_mode_from_environment();

// The checks of each entry, in its argument order, for arguments that passed validation (canonical strides). The
// entry and the epoch are filled by run_input_checks.
kernels::InputCheckParams plan_decode_checks(const DenseDecodeProblem& problem, const TensorRef& cache_seqlens);
kernels::InputCheckParams plan_decode_checks(const SparseDecodeProblem& problem, const TensorRef& topk_length,
                                             const TensorRef& extra_topk_length);
// `num_sm_parts`: the schedule's partitions.
// Per-request query lengths (plan_decode with seqused_q): seqused_q in [0, s_q].
kernels::InputCheckParams seqused_q_checks(const TensorRef& seqused_q, int64_t s_q);
kernels::InputCheckParams dense_decode_checks(const DenseDecodeProblem& problem, const DenseDecodeArgs& args,
                                              int num_sm_parts);
// `schedule_read`: false when the call never reads the device schedule (host records at small batch).
kernels::InputCheckParams sparse_decode_checks(const SparseDecodeProblem& problem, const SparseDecodeArgs& args,
                                               int num_sm_parts, bool schedule_read);
kernels::InputCheckParams append_kv_cache_checks(const TensorRef& slots, const TensorRef& cache);
kernels::InputCheckParams sparse_prefill_checks(const SparsePrefillArgs& args);

// Numbers the call (the record keeps the earliest call's violation) and launches its checks on `stream`.
Status run_input_checks(kernels::CheckedEntry entry, kernels::InputCheckParams params, cudaStream_t stream);

// The message of a violation record: "checked mode: <entry>: argument '<name>' ...".
std::string describe_violation(const kernels::InputCheckRecord& record);

}  // namespace openmla::detail
