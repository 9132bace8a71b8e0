// Per-request query lengths of the decode API (api/decode_varlen_q.h): checks, the sparse one-token view, and the
// plan_decode overloads that take seqused_q.
#include "api/decode_varlen_q.h"

#include <string>

#include "api/checked.h"
#include "api/decode_common.h"
#include "api/decode_internal.h"
#include "api/families.h"
#include "api/validate.h"
#include "heuristics/decode_schedule.h"
#include "kernels/decode_scheduler/launch.h"
#include "kernels/decode_scheduler/varlen_q.h"
#include "kernels/dense_decode/params.h"

namespace openmla {

namespace detail {

namespace {

// The view of a (b, s_q, rest...) tensor as (b * s_q, 1, rest...): needs stride(0) == s_q * stride(1) (or b == 1, or
// s_q == 1). `name` and `what` for the message.
Status flatten_rows(const TensorRef& t, const char* name, int64_t s_q, TensorRef* flat) {
  if (t.shape[0] > 1 && s_q > 1 && t.stride[0] != s_q * t.stride[1]) {
    MessageStream os;
    os << "argument '" << name << "' has strides " << stride_string(t) << "; with per-request query lengths (sparse "
       << "decode) its first two dimensions must be one run of query rows: stride(0) == s_q * stride(1) = "
       << s_q * t.stride[1];
    return invalid(os.str());
  }
  *flat = t;
  flat->shape[0] = t.shape[0] * s_q;
  flat->stride[0] = t.stride[1];
  flat->shape[1] = 1;
  flat->stride[1] = t.stride[1];
  return Status::ok();
}

// lse (b, h_q, s_q) as (b * s_q, h_q, 1).
Status flatten_lse(const TensorRef& t, int64_t s_q, TensorRef* flat) {
  if (t.shape[0] > 1 && s_q > 1 && t.stride[0] != s_q * t.stride[2]) {
    MessageStream os;
    os << "argument 'lse' has strides " << stride_string(t) << "; with per-request query lengths (sparse decode) "
       << "stride(0) must equal s_q * stride(2) = " << s_q * t.stride[2]
       << " (the (b, s_q, h_q) storage that flash_mla_with_kvcache allocates, viewed as (b, h_q, s_q), has it)";
    return invalid(os.str());
  }
  *flat = t;
  flat->shape[0] = t.shape[0] * s_q;
  flat->stride[0] = t.stride[2];
  flat->shape[2] = 1;
  return Status::ok();
}

TensorRef slice_ints(const TensorRef& t, int64_t offset, int64_t n) {
  TensorRef s = t;
  s.data = static_cast<int32_t*>(t.data) + offset;
  s.ndim = 1;
  s.shape[0] = n;
  s.stride[0] = 1;
  return s;
}

Status varlen_with_invariant() {
  return Status::unsupported(
      "argument 'problem.varlen_q' (per-request query lengths) cannot be combined with problem.batch_invariant");
}

}  // namespace

Status check_varlen_problem(const DenseDecodeProblem& p) {
  if (p.varlen_q && p.batch_invariant) return varlen_with_invariant();
  if (p.varlen_q && p.page_block_size < kernels::kDenseMinTmaPageSize)
    return Status::unsupported("argument 'problem.page_block_size' is " + std::to_string(p.page_block_size) +
                               ": per-request query lengths (problem.varlen_q) need pages of 16 or more tokens (the "
                               "gather kernel of pages 1-8 has no varlen variant)");
  return Status::ok();
}

Status check_varlen_problem(const SparseDecodeProblem& p) {
  if (!p.varlen_q) return Status::ok();
  if (p.batch_invariant) return varlen_with_invariant();
  if (p.batch * p.s_q > kInt32Max - 1)
    return invalid_field("s_q", p.s_q, "with per-request query lengths (sparse), batch * s_q must stay below 2^31 - 1");
  return Status::ok();
}

int64_t varlen_ints(const DenseDecodeProblem& p) { return p.varlen_q ? p.batch : 0; }
int64_t varlen_ints(const SparseDecodeProblem& p) {
  return p.varlen_q ? p.batch * p.s_q * (p.extra_topk > 0 ? 2 : 1) : 0;
}

SparseDecodeProblem varlen_flat_problem(const SparseDecodeProblem& p) {
  SparseDecodeProblem flat = p;
  flat.batch = p.batch * p.s_q;
  flat.s_q = 1;
  flat.varlen_q = false;
  return flat;
}

Status check_seqused_q(bool varlen_q, const TensorRef& seqused_q, int64_t batch) {
  if (!varlen_q) {
    if (seqused_q.defined())
      return invalid("argument 'seqused_q' was given but problem.varlen_q is false (set it for per-request query "
                     "lengths, and plan with seqused_q)");
    return Status::ok();
  }
  if (!seqused_q.defined())
    return invalid("argument 'seqused_q' is required: problem.varlen_q is set (per-request query lengths, (b,) int32)");
  return check_lengths(canonical(seqused_q), "seqused_q", batch);
}

Status check_varlen_lengths(bool varlen_q, const DecodeSchedule& schedule, int64_t needed) {
  const TensorRef t = canonical(schedule.varlen_lengths);
  if (!varlen_q) {
    if (t.defined())
      return invalid("argument 'schedule.varlen_lengths' was given but problem.varlen_q is false");
    return Status::ok();
  }
  if (!t.defined())
    return invalid("argument 'schedule.varlen_lengths' is required: problem.varlen_q is set (sized by "
                   "get_decode_workspace_sizes: varlen_ints)");
  OPENMLA_RETURN_IF_ERROR(check_cuda_tensor(t, "schedule.varlen_lengths", {DType::kInt32}, 1));
  if (!t.is_contiguous()) return invalid("argument 'schedule.varlen_lengths' must be contiguous");
  if (t.shape[0] < needed) {
    MessageStream os;
    os << "argument 'schedule.varlen_lengths' has " << t.shape[0] << " elements; the problem needs " << needed
       << " (get_decode_workspace_sizes: varlen_ints)";
    return invalid(os.str());
  }
  return check_same_device(canonical(schedule.metadata), "schedule.metadata", t, "schedule.varlen_lengths");
}

Status flatten_sparse_varlen_args(const SparseDecodeProblem& problem, const SparseDecodeArgs& args,
                                  SparseDecodeArgs* flat_args) {
  OPENMLA_RETURN_IF_ERROR(validate_schedule_problem(problem));
  const int64_t b = problem.batch, s_q = problem.s_q, h_q = problem.h_q;
  OPENMLA_RETURN_IF_ERROR(check_seqused_q(true, args.seqused_q, b));
  OPENMLA_RETURN_IF_ERROR(check_varlen_lengths(true, args.schedule, varlen_ints(problem)));
  if (args.topk_length.defined() || args.extra_topk_length.defined())
    OPENMLA_RETURN_IF_ERROR(check_lengths(canonical(args.topk_length.defined() ? args.topk_length
                                                                                : args.extra_topk_length),
                                          args.topk_length.defined() ? "topk_length" : "extra_topk_length", b));
  const TensorRef q = canonical(args.q), indices = canonical(args.indices), out = canonical(args.out),
                  lse = canonical(args.lse), extra = canonical(args.extra_indices);
  // The caller's shapes first, so a wrong one is named as the caller sees it.
  OPENMLA_RETURN_IF_ERROR(check_cuda_tensor(q, "q", {DType::kBFloat16}, 4));
  OPENMLA_RETURN_IF_ERROR(check_dim(q, "q", 0, b, "batch"));
  OPENMLA_RETURN_IF_ERROR(check_dim(q, "q", 1, s_q, "s_q, the largest query length"));
  OPENMLA_RETURN_IF_ERROR(check_dim(q, "q", 2, h_q, "h_q"));
  OPENMLA_RETURN_IF_ERROR(check_cuda_tensor(indices, "indices", {DType::kInt32}, 3));
  OPENMLA_RETURN_IF_ERROR(check_dim(indices, "indices", 0, b, "batch"));
  OPENMLA_RETURN_IF_ERROR(check_dim(indices, "indices", 1, s_q, "s_q"));
  OPENMLA_RETURN_IF_ERROR(check_cuda_tensor(out, "out", {DType::kBFloat16}, 4));
  OPENMLA_RETURN_IF_ERROR(check_dim(out, "out", 0, b, "batch"));
  OPENMLA_RETURN_IF_ERROR(check_dim(out, "out", 1, s_q, "s_q"));
  OPENMLA_RETURN_IF_ERROR(check_cuda_tensor(lse, "lse", {DType::kFloat32}, 3));
  OPENMLA_RETURN_IF_ERROR(check_dim(lse, "lse", 0, b, "batch"));
  OPENMLA_RETURN_IF_ERROR(check_dim(lse, "lse", 2, s_q, "s_q"));
  if (extra.defined()) {
    OPENMLA_RETURN_IF_ERROR(check_cuda_tensor(extra, "extra_indices", {DType::kInt32}, 3));
    OPENMLA_RETURN_IF_ERROR(check_dim(extra, "extra_indices", 0, b, "batch"));
    OPENMLA_RETURN_IF_ERROR(check_dim(extra, "extra_indices", 1, s_q, "s_q"));
  }
  SparseDecodeArgs f = args;
  OPENMLA_RETURN_IF_ERROR(flatten_rows(q, "q", s_q, &f.q));
  OPENMLA_RETURN_IF_ERROR(flatten_rows(indices, "indices", s_q, &f.indices));
  OPENMLA_RETURN_IF_ERROR(flatten_rows(out, "out", s_q, &f.out));
  OPENMLA_RETURN_IF_ERROR(flatten_lse(lse, s_q, &f.lse));
  if (extra.defined()) OPENMLA_RETURN_IF_ERROR(flatten_rows(extra, "extra_indices", s_q, &f.extra_indices));
  const TensorRef lengths = canonical(args.schedule.varlen_lengths);
  const int64_t tokens = b * s_q;
  f.topk_length = slice_ints(lengths, 0, tokens);
  f.extra_topk_length = problem.extra_topk > 0 ? slice_ints(lengths, tokens, tokens) : TensorRef{};
  f.schedule.varlen_lengths = TensorRef{};
  f.seqused_q = TensorRef{};
  *flat_args = f;
  return Status::ok();
}

}  // namespace detail

Status plan_decode(const DenseDecodeProblem& problem, const TensorRef& cache_seqlens, const TensorRef& seqused_q,
                   const DecodeSchedule& schedule, cudaStream_t stream) {
  if (!problem.varlen_q) {
    OPENMLA_RETURN_IF_ERROR(detail::check_seqused_q(false, seqused_q, problem.batch));
    return plan_decode(problem, cache_seqlens, schedule, stream);
  }
  OPENMLA_RETURN_IF_ERROR(detail::check_varlen_problem(problem));
  DecodeSchedule inner_schedule = schedule;
  inner_schedule.varlen_lengths = TensorRef{};
  int num_sm_parts = 0;
  // The varlen problem's own partition count (a one-position problem's: heuristics::decode_num_sm_parts).
  OPENMLA_RETURN_IF_ERROR(detail::validate_plan_decode(problem, cache_seqlens, inner_schedule, &num_sm_parts));
  OPENMLA_RETURN_IF_ERROR(detail::check_seqused_q(true, seqused_q, problem.batch));
  OPENMLA_RETURN_IF_ERROR(detail::check_varlen_lengths(true, schedule, detail::varlen_ints(problem)));
  OPENMLA_RETURN_IF_ERROR(detail::check_same_device(detail::canonical(seqused_q), "seqused_q",
                                                    detail::canonical(cache_seqlens), "cache_seqlens"));
  OPENMLA_RETURN_IF_ERROR(detail::check_disjoint({{&schedule.varlen_lengths, "schedule.varlen_lengths"}},
                                                 {{&cache_seqlens, "cache_seqlens"},
                                                  {&seqused_q, "seqused_q"},
                                                  {&schedule.metadata, "schedule.metadata"},
                                                  {&schedule.num_splits, "schedule.num_splits"},
                                                  {&schedule.merge_counters, "schedule.merge_counters"}}));
#if !defined(OPENMLA_HAS_DENSE_DECODE)
  (void)stream;
  return detail::family_not_built(detail::KernelFamily::kDecode, "plan_decode");
#else
  OPENMLA_RETURN_IF_ERROR(
      detail::check_launch_context(schedule.metadata.device_id, "schedule.metadata", stream, "plan_decode"));
  const TensorRef lengths = detail::canonical(schedule.varlen_lengths);
  kernels::VarlenQExpandParams expand;
  expand.batch = static_cast<int>(problem.batch);
  expand.s_q = static_cast<int>(problem.s_q);
  expand.sparse = false;
  expand.seqused_q = static_cast<const int32_t*>(seqused_q.data);
  expand.cache_seqlens = static_cast<const int32_t*>(cache_seqlens.data);
  expand.out = static_cast<int32_t*>(lengths.data);
  if (detail::checked_mode_enabled())
    OPENMLA_RETURN_IF_ERROR(detail::run_input_checks(kernels::CheckedEntry::kPlanDecode,
                                                     detail::seqused_q_checks(detail::canonical(seqused_q), problem.s_q),
                                                     stream));
  OPENMLA_RETURN_IF_ERROR(kernels::launch_varlen_q_expand(expand, stream));
  return detail::plan_dense_decode(problem, detail::slice_ints(lengths, 0, problem.batch), inner_schedule, stream);
#endif
}

Status plan_decode(const SparseDecodeProblem& problem, const TensorRef& topk_length, const TensorRef& extra_topk_length,
                   const TensorRef& seqused_q, const DecodeSchedule& schedule, cudaStream_t stream) {
  if (!problem.varlen_q) {
    OPENMLA_RETURN_IF_ERROR(detail::check_seqused_q(false, seqused_q, problem.batch));
    return plan_decode(problem, topk_length, extra_topk_length, schedule, stream);
  }
  // Checked on the caller's problem and lengths, then on the b * s_q one-token requests the scheduler sees.
  OPENMLA_RETURN_IF_ERROR(detail::validate_schedule_problem(problem));
  const TensorRef tl = detail::canonical(topk_length), etl = detail::canonical(extra_topk_length);
  if (tl.defined()) OPENMLA_RETURN_IF_ERROR(detail::check_lengths(tl, "topk_length", problem.batch));
  if (etl.defined()) {
    if (problem.extra_topk == 0)
      return detail::invalid("argument 'extra_topk_length' was given but problem.extra_topk is 0 (no extra cache)");
    OPENMLA_RETURN_IF_ERROR(detail::check_lengths(etl, "extra_topk_length", problem.batch));
  }
  OPENMLA_RETURN_IF_ERROR(detail::check_seqused_q(true, seqused_q, problem.batch));
  OPENMLA_RETURN_IF_ERROR(detail::check_varlen_lengths(true, schedule, detail::varlen_ints(problem)));
  const SparseDecodeProblem flat = detail::varlen_flat_problem(problem);
  const TensorRef lengths = detail::canonical(schedule.varlen_lengths);
  const int64_t tokens = flat.batch;
  const TensorRef flat_tl = detail::slice_ints(lengths, 0, tokens);
  const TensorRef flat_etl = problem.extra_topk > 0 ? detail::slice_ints(lengths, tokens, tokens) : TensorRef{};
  DecodeSchedule inner_schedule = schedule;
  inner_schedule.varlen_lengths = TensorRef{};
  int num_sm_parts = 0;
  OPENMLA_RETURN_IF_ERROR(detail::validate_plan_decode(flat, flat_tl, flat_etl, inner_schedule, &num_sm_parts));
  OPENMLA_RETURN_IF_ERROR(detail::check_same_device_all(
      lengths, "schedule.varlen_lengths",
      {{&seqused_q, "seqused_q"}, {&topk_length, "topk_length"}, {&extra_topk_length, "extra_topk_length"}}));
  OPENMLA_RETURN_IF_ERROR(detail::check_disjoint({{&schedule.varlen_lengths, "schedule.varlen_lengths"}},
                                                 {{&topk_length, "topk_length"},
                                                  {&extra_topk_length, "extra_topk_length"},
                                                  {&seqused_q, "seqused_q"},
                                                  {&schedule.metadata, "schedule.metadata"},
                                                  {&schedule.num_splits, "schedule.num_splits"},
                                                  {&schedule.merge_counters, "schedule.merge_counters"}}));
#if !defined(OPENMLA_HAS_DENSE_DECODE)
  (void)stream;
  return detail::family_not_built(detail::KernelFamily::kDecode, "plan_decode");
#else
  OPENMLA_RETURN_IF_ERROR(
      detail::check_launch_context(schedule.metadata.device_id, "schedule.metadata", stream, "plan_decode"));
  kernels::VarlenQExpandParams expand;
  expand.batch = static_cast<int>(problem.batch);
  expand.s_q = static_cast<int>(problem.s_q);
  expand.sparse = true;
  expand.seqused_q = static_cast<const int32_t*>(seqused_q.data);
  expand.topk = static_cast<int>(problem.topk);
  expand.topk_length = tl.defined() ? static_cast<const int32_t*>(tl.data) : nullptr;
  expand.extra_topk = static_cast<int>(problem.extra_topk);
  expand.extra_topk_length = etl.defined() ? static_cast<const int32_t*>(etl.data) : nullptr;
  expand.out = static_cast<int32_t*>(lengths.data);
  if (detail::checked_mode_enabled())
    OPENMLA_RETURN_IF_ERROR(detail::run_input_checks(kernels::CheckedEntry::kPlanDecode,
                                                     detail::seqused_q_checks(detail::canonical(seqused_q), problem.s_q),
                                                     stream));
  OPENMLA_RETURN_IF_ERROR(kernels::launch_varlen_q_expand(expand, stream));
  return plan_decode(flat, flat_tl, flat_etl, inner_schedule, stream);
#endif
}

}  // namespace openmla
