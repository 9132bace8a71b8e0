// Public sparse prefill API (include/openmla/prefill.h): validate -> build params -> launch.
//
// Every argument check runs before the first CUDA call, so a bad call launches nothing and the checks can be
// tested without a GPU (args.num_sms > 0: no CUDA call at all before the launch).
#include <cstdint>
#include <string>

#include "api/checked.h"
#include "api/families.h"
#include "api/sparse_prefill_checks.h"
#include "api/sparse_prefill_internal.h"
#include "api/validate.h"
#include "kernels/sparse_prefill/params.h"
#include "openmla/prefill.h"

namespace openmla {

namespace detail {

// Every tensor argument with the strides of its size-1 dimensions replaced (api/validate.h, canonical()).
SparsePrefillArgs canonical_args(const SparsePrefillArgs& args) {
  SparsePrefillArgs a = args;
  for (TensorRef* t : {&a.q, &a.kv, &a.indices, &a.topk_length, &a.attn_sink, &a.out, &a.max_logits, &a.lse})
    *t = canonical(*t);
  return a;
}

Status validate_sparse_prefill(const SparsePrefillArgs& args, kernels::SparsePrefillParams* params) {
  const SparsePrefillArgs a = canonical_args(args);
  // ---- q, kv, indices: shapes and layouts
  OPENMLA_RETURN_IF_ERROR(check_cuda_tensor(a.q, "q", {DType::kBFloat16}, 3));
  const int64_t s_q = a.q.shape[0], h_q = a.q.shape[1], d_qk = a.q.shape[2];
  if (d_qk != 576 && d_qk != 512) {
    MessageStream os;
    os << "argument 'q' has head dimension " << d_qk << " (shape " << shape_string(a.q)
       << "); sparse prefill supports d_qk = 576 (DeepSeek-V3.2) or 512 (MODEL1)";
    return Status::unsupported(os.str());
  }
  if (s_q < 1 || h_q < 1) return invalid("argument 'q' must have s_q >= 1 and h_q >= 1, got shape " + shape_string(a.q));
  OPENMLA_RETURN_IF_ERROR(check_bf16_rows(a.q, "q"));

  OPENMLA_RETURN_IF_ERROR(check_cuda_tensor(a.kv, "kv", {DType::kBFloat16}, 3));
  OPENMLA_RETURN_IF_ERROR(check_same_device(a.q, "q", a.kv, "kv"));
  if (a.kv.shape[1] != 1) {
    MessageStream os;
    os << "argument 'kv' has " << a.kv.shape[1] << " kv heads (shape " << shape_string(a.kv)
       << "); sparse prefill needs h_kv = 1 (MLA's shared latent)";
    return Status::unsupported(os.str());
  }
  OPENMLA_RETURN_IF_ERROR(check_dim(a.kv, "kv", 2, d_qk, "d_qk, as q"));
  const int64_t s_kv = a.kv.shape[0];
  if (s_kv < 1) return invalid("argument 'kv' must have s_kv >= 1 rows, got shape " + shape_string(a.kv));
  if (s_kv > kInt32Max) return invalid("argument 'kv' has more than 2^31 - 1 rows (indices are int32)");
  OPENMLA_RETURN_IF_ERROR(check_bf16_rows(a.kv, "kv"));

  // ---- indices, optional inputs, scalars, outputs (api/sparse_prefill_checks.h)
  const SparsePrefillCommonArgs common{.q = &a.q, .kv = &a.kv, .kv_name = "kv", .indices = &a.indices,
                                       .topk_length = &a.topk_length, .attn_sink = &a.attn_sink, .out = &a.out,
                                       .max_logits = &a.max_logits, .lse = &a.lse, .d_v = a.d_v,
                                       .softmax_scale = a.softmax_scale, .num_sms = a.num_sms};
  SparsePrefillShape shape;
  OPENMLA_RETURN_IF_ERROR(check_sparse_prefill_common(common, s_q, h_q, d_qk, &shape));

  if (params != nullptr) {
    kernels::SparsePrefillParams& p = *params;
    p = sparse_prefill_params(common, s_q, h_q, d_qk, s_kv, shape);
    p.kv = a.kv.data;
    p.kv_stride_s = s_kv > 1 ? a.kv.stride[0] : d_qk;
  }
  return Status::ok();
}

}  // namespace detail

Status sparse_prefill(const SparsePrefillArgs& args, cudaStream_t stream) {
  kernels::SparsePrefillParams params;
  OPENMLA_RETURN_IF_ERROR(detail::validate_sparse_prefill(args, &params));
  // Checks first, so that argument errors are reported whether or not the family is built.
#if !defined(OPENMLA_HAS_SPARSE_PREFILL)
  (void)stream;
  return detail::family_not_built(detail::KernelFamily::kSparsePrefill, "sparse_prefill");
#else
  const int device = args.q.device_id;
  OPENMLA_RETURN_IF_ERROR(detail::check_launch_context(device, "q", stream, "sparse_prefill"));
  int num_sms = args.num_sms;
  if (num_sms == 0)
    OPENMLA_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device),
                                 "sparse prefill: querying the SM count");
  params.grid = static_cast<int>(std::min<int64_t>(params.num_tiles, num_sms));
  if (detail::checked_mode_enabled())
    OPENMLA_RETURN_IF_ERROR(detail::run_input_checks(kernels::CheckedEntry::kSparsePrefill,
                                                     detail::sparse_prefill_checks(detail::canonical_args(args)),
                                                     stream));
  return kernels::launch_sparse_prefill(params, stream);
#endif
}

}  // namespace openmla
