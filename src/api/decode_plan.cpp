// Public decode API, planning (include/openmla/decode.h): workspace sizes and plan_decode for each family.
// Validate -> build the scheduler's params -> launch; every check runs before the first CUDA call.
#include <cstdint>
#include <string>

#include "api/checked.h"
#include "api/decode_common.h"
#include "api/decode_internal.h"
#include "api/decode_varlen_q.h"
#include "api/families.h"
#include "api/validate.h"
#include "heuristics/decode_schedule.h"
#include "kernels/decode_scheduler/launch.h"
#include "openmla/decode.h"

namespace openmla {

namespace detail {

namespace {

constexpr int64_t kMaxSparseSq = 65535;  // sparse main kernel grid.y limit

// A batch-invariant dense problem sizes its split slots from the block table's width.
Status check_sizable(const DenseDecodeProblem& p) {
  if (p.batch_invariant && p.max_blocks_per_seq == 0)
    return invalid_field("max_blocks_per_seq", p.max_blocks_per_seq,
                         "a batch-invariant problem needs the block table's column count: its split buffers hold "
                         "every chunk of the longest request it allows");
  return Status::ok();
}
Status check_sizable(const SparseDecodeProblem&) { return Status::ok(); }

template <typename Problem>
Status workspace_sizes(const Problem& problem, DecodeWorkspaceSizes* sizes) {
  if (sizes == nullptr) return Status::invalid_argument("argument 'sizes' must not be null");
  OPENMLA_RETURN_IF_ERROR(validate_schedule_problem(problem));
  OPENMLA_RETURN_IF_ERROR(check_sizable(problem));
  int num_sms = problem.num_sms;
  if (num_sms == 0) {
    int device = 0;
    OPENMLA_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device), "cudaGetDevice (problem.num_sms == 0)");
    OPENMLA_RETURN_IF_ERROR(device_sm_count(device, &num_sms, "querying the SM count (problem.num_sms == 0)"));
  }
  DecodeWorkspaceSizes s;
  s.num_sm_parts = heuristics::decode_num_sm_parts(problem, num_sms);
  s.metadata_ints = static_cast<int64_t>(s.num_sm_parts) * kDecodeScheduleRecordInts;
  s.num_splits_ints = problem.batch + 1;
  s.partial_rows = heuristics::decode_split_slots(problem, s.num_sm_parts) * problem.s_q * problem.h_q;
  s.partial_o_bytes = static_cast<size_t>(s.partial_rows) * static_cast<size_t>(problem.d_v) * sizeof(float);
  s.partial_lse_bytes = static_cast<size_t>(s.partial_rows) * sizeof(float);
  s.merge_counter_ints = heuristics::decode_merge_counter_ints(problem);
  s.varlen_ints = varlen_ints(problem);
  *sizes = s;
  return Status::ok();
}

// The scheduler's params common to both families (unused in a build without the decode kernels).
[[maybe_unused]] kernels::DecodeSchedulerParams scheduler_params(int64_t batch, int num_sm_parts,
                                                                 const DecodeSchedule& schedule,
                                                                 int64_t merge_counter_count, int32_t chunk_blocks) {
  const bool counters = schedule.merge_counters.defined();
  return kernels::DecodeSchedulerParams{
      .batch = static_cast<int>(batch),
      .num_sm_parts = num_sm_parts,
      .sparse = false,
      .chunk_blocks = chunk_blocks,
      .cache_seqlens = nullptr,
      .max_seqlen = 0,
      .topk = 0,
      .topk_length = nullptr,
      .extra_topk = 0,
      .extra_topk_length = nullptr,
      .records = static_cast<kernels::DecodeScheduleRecord*>(schedule.metadata.data),
      .num_splits = static_cast<int32_t*>(schedule.num_splits.data),
      .merge_counters = counters ? static_cast<int32_t*>(schedule.merge_counters.data) : nullptr,
      .merge_counter_count = counters ? merge_counter_count : 0,
      .payload_override = 0,
  };
}

// The schedule's tensors (written by plan_decode) share no memory with each other or with the lengths it reads.
Status check_schedule_disjoint(const DecodeSchedule& schedule, NamedTensors read) {
  return check_disjoint({{&schedule.metadata, "schedule.metadata"},
                         {&schedule.num_splits, "schedule.num_splits"},
                         {&schedule.merge_counters, "schedule.merge_counters"}},
                        read);
}

}  // namespace

Status validate_schedule_problem(const DenseDecodeProblem& p) {
  OPENMLA_RETURN_IF_ERROR(check_decode_geometry(geometry_of(p)));
  OPENMLA_RETURN_IF_ERROR(check_varlen_problem(p));
  if (p.max_blocks_per_seq < 0 || p.max_blocks_per_seq > kMaxBlocksPerSeq)
    return invalid_field("max_blocks_per_seq", p.max_blocks_per_seq,
                         "expected 0 (not given) or the block table's column count, at most 2^25 - 1 "
                         "(max_blocks_per_seq * 64 tokens must fit in int32)");
  // The block table's capacity in tokens is max_blocks_per_seq * page_block_size (the schedule clamps lengths to it).
  if (p.max_blocks_per_seq > 0 && (p.page_block_size < 1 || p.max_blocks_per_seq > dense_max_blocks_per_seq(p.page_block_size)))
    return invalid_field("max_blocks_per_seq", p.max_blocks_per_seq,
                         "with page_block_size " + std::to_string(p.page_block_size) +
                             ": max_blocks_per_seq * page_block_size tokens must fit in int32 (page_block_size >= 1)");
  return Status::ok();
}

Status validate_schedule_problem(const SparseDecodeProblem& p) {
  OPENMLA_RETURN_IF_ERROR(check_decode_geometry(geometry_of(p)));
  OPENMLA_RETURN_IF_ERROR(check_varlen_problem(p));
  if (p.topk <= 0 || p.topk > kInt32Max)
    return invalid_field("topk", p.topk, "sparse decode needs 1 <= topk < 2^31 (any value)");
  if (p.extra_topk < 0 || p.extra_topk > kInt32Max)
    return invalid_field("extra_topk", p.extra_topk, "expected 0 (no extra cache) or a positive value");
  if (p.s_q > kMaxSparseSq)
    return invalid_field("s_q", p.s_q, "sparse decode supports s_q <= 65535 (a grid dimension)");
  return Status::ok();
}

Status validate_plan_decode(const DenseDecodeProblem& problem, const TensorRef& cache_seqlens_in,
                            const DecodeSchedule& schedule_in, int* num_sm_parts) {
  const TensorRef cache_seqlens = canonical(cache_seqlens_in);
  const DecodeSchedule schedule = canonical(schedule_in);
  OPENMLA_RETURN_IF_ERROR(validate_schedule_problem(problem));
  OPENMLA_RETURN_IF_ERROR(check_lengths(cache_seqlens, "cache_seqlens", problem.batch));
  OPENMLA_RETURN_IF_ERROR(check_schedule_tensors(schedule, problem.batch));
  OPENMLA_RETURN_IF_ERROR(
      check_same_device(schedule.metadata, "schedule.metadata", schedule.num_splits, "schedule.num_splits"));
  OPENMLA_RETURN_IF_ERROR(check_merge_counters(schedule, heuristics::decode_merge_counter_ints(problem)));
  OPENMLA_RETURN_IF_ERROR(check_same_device(schedule.metadata, "schedule.metadata", cache_seqlens, "cache_seqlens"));
  OPENMLA_RETURN_IF_ERROR(check_schedule_disjoint(schedule, {{&cache_seqlens, "cache_seqlens"}}));
  OPENMLA_RETURN_IF_ERROR(resolve_num_sm_parts(problem, schedule.metadata.device_id, num_sm_parts));
  return check_schedule_parts(schedule, *num_sm_parts);
}

Status validate_plan_decode(const SparseDecodeProblem& problem, const TensorRef& topk_length_in,
                            const TensorRef& extra_topk_length_in, const DecodeSchedule& schedule_in,
                            int* num_sm_parts) {
  const TensorRef topk_length = canonical(topk_length_in), extra_topk_length = canonical(extra_topk_length_in);
  const DecodeSchedule schedule = canonical(schedule_in);
  OPENMLA_RETURN_IF_ERROR(validate_schedule_problem(problem));
  if (problem.varlen_q) return invalid("problem.varlen_q is set: plan with the plan_decode overload that takes seqused_q");
  if (topk_length.defined()) OPENMLA_RETURN_IF_ERROR(check_lengths(topk_length, "topk_length", problem.batch));
  if (extra_topk_length.defined()) {
    if (problem.extra_topk == 0)
      return invalid("argument 'extra_topk_length' was given but problem.extra_topk is 0 (no extra cache)");
    OPENMLA_RETURN_IF_ERROR(check_lengths(extra_topk_length, "extra_topk_length", problem.batch));
  }
  OPENMLA_RETURN_IF_ERROR(check_schedule_tensors(schedule, problem.batch));
  OPENMLA_RETURN_IF_ERROR(
      check_same_device(schedule.metadata, "schedule.metadata", schedule.num_splits, "schedule.num_splits"));
  OPENMLA_RETURN_IF_ERROR(check_merge_counters(schedule, heuristics::decode_merge_counter_ints(problem)));
  OPENMLA_RETURN_IF_ERROR(
      check_same_device_all(schedule.metadata, "schedule.metadata",
                            {{&topk_length, "topk_length"}, {&extra_topk_length, "extra_topk_length"}}));
  OPENMLA_RETURN_IF_ERROR(check_schedule_disjoint(
      schedule, {{&topk_length, "topk_length"}, {&extra_topk_length, "extra_topk_length"}}));
  OPENMLA_RETURN_IF_ERROR(resolve_num_sm_parts(problem, schedule.metadata.device_id, num_sm_parts));
  return check_schedule_parts(schedule, *num_sm_parts);
}

}  // namespace detail

Status get_decode_workspace_sizes(const DenseDecodeProblem& problem, DecodeWorkspaceSizes* sizes) {
  return detail::workspace_sizes(problem, sizes);
}

Status get_decode_workspace_sizes(const SparseDecodeProblem& problem, DecodeWorkspaceSizes* sizes) {
  if (!problem.varlen_q) return detail::workspace_sizes(problem, sizes);
  // Per-request query lengths: the sizes of the b * s_q one-token requests the kernels run, and the lengths buffer.
  OPENMLA_RETURN_IF_ERROR(detail::validate_schedule_problem(problem));
  OPENMLA_RETURN_IF_ERROR(detail::workspace_sizes(detail::varlen_flat_problem(problem), sizes));
  sizes->varlen_ints = detail::varlen_ints(problem);
  return Status::ok();
}

Status plan_decode(const DenseDecodeProblem& problem, const TensorRef& cache_seqlens, const DecodeSchedule& schedule,
                   cudaStream_t stream) {
  if (problem.varlen_q)
    return detail::invalid("problem.varlen_q is set: plan with the plan_decode overload that takes seqused_q");
  return detail::plan_dense_decode(problem, cache_seqlens, schedule, stream);
}

Status detail::plan_dense_decode(const DenseDecodeProblem& problem, const TensorRef& cache_seqlens,
                                 const DecodeSchedule& schedule, cudaStream_t stream) {
  int num_sm_parts = 0;
  OPENMLA_RETURN_IF_ERROR(detail::validate_plan_decode(problem, cache_seqlens, schedule, &num_sm_parts));
#if !defined(OPENMLA_HAS_DENSE_DECODE)
  (void)stream;
  return detail::family_not_built(detail::KernelFamily::kDecode, "plan_decode");
#else
  OPENMLA_RETURN_IF_ERROR(
      detail::check_launch_context(schedule.metadata.device_id, "schedule.metadata", stream, "plan_decode"));
  kernels::DecodeSchedulerParams params =
      detail::scheduler_params(problem.batch, num_sm_parts, schedule, heuristics::decode_merge_counter_count(problem),
                               heuristics::decode_chunk_blocks(problem));
  params.cache_seqlens = static_cast<const int32_t*>(cache_seqlens.data);
  params.max_seqlen = static_cast<int32_t>(problem.max_blocks_per_seq * problem.page_block_size);
  if (detail::checked_mode_enabled())
    OPENMLA_RETURN_IF_ERROR(detail::run_input_checks(kernels::CheckedEntry::kPlanDecode,
                                                     detail::plan_decode_checks(problem, cache_seqlens), stream));
  return kernels::launch_decode_scheduler(params, stream);
#endif
}

Status plan_decode(const SparseDecodeProblem& problem, const TensorRef& topk_length, const TensorRef& extra_topk_length,
                   const DecodeSchedule& schedule, cudaStream_t stream) {
  int num_sm_parts = 0;
  OPENMLA_RETURN_IF_ERROR(
      detail::validate_plan_decode(problem, topk_length, extra_topk_length, schedule, &num_sm_parts));
#if !defined(OPENMLA_HAS_DENSE_DECODE)
  (void)stream;
  return detail::family_not_built(detail::KernelFamily::kDecode, "plan_decode");
#else
  OPENMLA_RETURN_IF_ERROR(
      detail::check_launch_context(schedule.metadata.device_id, "schedule.metadata", stream, "plan_decode"));
  kernels::DecodeSchedulerParams params =
      detail::scheduler_params(problem.batch, num_sm_parts, schedule, heuristics::decode_merge_counter_count(problem),
                               heuristics::decode_chunk_blocks(problem));
  params.sparse = true;
  params.topk = static_cast<int>(problem.topk);
  params.topk_length = topk_length.defined() ? static_cast<const int32_t*>(topk_length.data) : nullptr;
  params.extra_topk = static_cast<int>(problem.extra_topk);
  params.extra_topk_length =
      extra_topk_length.defined() ? static_cast<const int32_t*>(extra_topk_length.data) : nullptr;
  if (detail::checked_mode_enabled())
    OPENMLA_RETURN_IF_ERROR(
        detail::run_input_checks(kernels::CheckedEntry::kPlanDecode,
                                 detail::plan_decode_checks(problem, detail::canonical(topk_length),
                                                            detail::canonical(extra_topk_length)),
                                 stream));
  return kernels::launch_decode_scheduler(params, stream);
#endif
}

}  // namespace openmla
