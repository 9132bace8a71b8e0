// The compatibility form of the decode API (DecodeProblem, include/openmla/decode.h): each call converts the
// problem to its family's struct, checks the fields that struct does not have, and calls the family's function.
#include "api/decode_common.h"
#include "api/decode_internal.h"
#include "api/validate.h"
#include "openmla/decode.h"
#include "openmla/test_hooks.h"

namespace openmla {

namespace detail {

Status to_dense_problem(const DecodeProblem& problem, DenseDecodeProblem* out) {
  if (problem.sparse) return invalid("argument 'problem.sparse' is true; dense_decode needs a dense problem");
  *out = problem.as_dense();
  return Status::ok();
}

Status to_sparse_problem(const DecodeProblem& problem, bool for_decode, SparseDecodeProblem* out) {
  // The geometry with the problem's own h_kv, so its errors read as before the family structs.
  OPENMLA_RETURN_IF_ERROR(check_decode_geometry(
      DecodeGeometry{problem.batch, problem.s_q, problem.h_q, problem.h_kv, problem.d_v, problem.num_sms}));
  if (for_decode) {
    if (!problem.sparse) return invalid("argument 'problem.sparse' is false; sparse_decode needs a sparse problem");
    if (problem.h_kv != 1)
      return invalid_field("h_kv", problem.h_kv, "sparse decode attends one latent KV head (h_kv = 1)");
    if (problem.causal)
      return invalid("argument 'problem.causal' is true; sparse decode takes its mask from the indices");
  }
  *out = problem.as_sparse();
  return Status::ok();
}

}  // namespace detail

Status get_decode_workspace_sizes(const DecodeProblem& problem, DecodeWorkspaceSizes* sizes) {
  if (!problem.sparse) return get_decode_workspace_sizes(problem.as_dense(), sizes);
  if (sizes == nullptr) return Status::invalid_argument("argument 'sizes' must not be null");
  SparseDecodeProblem sparse;
  OPENMLA_RETURN_IF_ERROR(detail::to_sparse_problem(problem, /*for_decode=*/false, &sparse));
  return get_decode_workspace_sizes(sparse, sizes);
}

Status plan_decode(const DecodeProblem& problem, const TensorRef& cache_seqlens, const TensorRef& topk_length,
                   const TensorRef& extra_topk_length, const DecodeSchedule& schedule, cudaStream_t stream) {
  if (!problem.sparse) return plan_decode(problem.as_dense(), cache_seqlens, schedule, stream);
  SparseDecodeProblem sparse;
  OPENMLA_RETURN_IF_ERROR(detail::to_sparse_problem(problem, /*for_decode=*/false, &sparse));
  return plan_decode(sparse, topk_length, extra_topk_length, schedule, stream);
}

Status dense_decode(const DecodeProblem& problem, const DenseDecodeArgs& args, cudaStream_t stream) {
  DenseDecodeProblem dense;
  OPENMLA_RETURN_IF_ERROR(detail::to_dense_problem(problem, &dense));
  return dense_decode(dense, args, stream);
}

Status sparse_decode(const DecodeProblem& problem, const SparseDecodeArgs& args, cudaStream_t stream) {
  SparseDecodeProblem sparse;
  OPENMLA_RETURN_IF_ERROR(detail::to_sparse_problem(problem, /*for_decode=*/true, &sparse));
  return sparse_decode(sparse, args, stream);
}

Status test_hooks::dense_decode(const DecodeProblem& problem, const DenseDecodeArgs& args,
                             const DenseDecodeOptions& options, cudaStream_t stream) {
  DenseDecodeProblem dense;
  OPENMLA_RETURN_IF_ERROR(detail::to_dense_problem(problem, &dense));
  return test_hooks::dense_decode(dense, args, options, stream);
}

}  // namespace openmla
