// Public API of sparse prefill from the paged FP8 cache (include/openmla/prefill.h, sparse_prefill_fp8):
// validate -> build params -> launch. Every check runs before the first CUDA call (args.num_sms > 0: no CUDA call at
// all before the launch), so the checks are tested without a GPU.
#include <algorithm>
#include <cstdint>
#include <string>

#include "api/families.h"
#include "api/sparse_prefill_checks.h"
#include "api/sparse_prefill_internal.h"
#include "api/validate.h"
#include "common/cuda_check.h"
#include "kernels/sparse_prefill/fp8_params.h"
#include "openmla/kv_cache.h"
#include "openmla/prefill.h"

namespace openmla {

namespace detail {

namespace {

// The FP8 cache: (num_blocks, page_size, 1, bytes_per_token) bytes, each page contiguous, pages 16-byte aligned
// apart and not overlapping (the page stride of a one-page cache is never used).
Status check_cache(const TensorRef& k, int64_t bytes_per_token, const char* format_name) {
  constexpr const char* name = "kv_cache";
  OPENMLA_RETURN_IF_ERROR(check_cuda_tensor(k, name, {DType::kUInt8, DType::kInt8, DType::kFloat8E4M3}, 4));
  if (k.shape[0] < 1 || k.shape[1] < 1) {
    return invalid(std::string("argument 'kv_cache' must have num_blocks >= 1 and page_size >= 1, got shape ") +
                   shape_string(k));
  }
  OPENMLA_RETURN_IF_ERROR(check_dim(k, name, 2, 1, "h_kv (MLA caches have one latent head)"));
  const std::string what = std::string("bytes per token of ") + format_name;
  OPENMLA_RETURN_IF_ERROR(check_dim(k, name, 3, bytes_per_token, what.c_str()));
  const int64_t page_size = k.shape[1];
  if (k.stride[3] != 1 || (page_size > 1 && k.stride[1] != bytes_per_token)) {
    MessageStream os;
    os << "argument 'kv_cache' has strides " << stride_string(k) << "; each page must be contiguous (stride(1) == "
       << bytes_per_token << ", stride(3) == 1); only the page stride stride(0) is free";
    return invalid(os.str());
  }
  if (k.shape[0] > 1 && (k.stride[0] % 16 != 0 || k.stride[0] < page_size * bytes_per_token)) {
    MessageStream os;
    os << "argument 'kv_cache' has page stride " << k.stride[0] << " bytes; expected a multiple of 16 that is at "
       << "least page_size * " << bytes_per_token << " = " << page_size * bytes_per_token;
    return invalid(os.str());
  }
  if (page_size > kInt32Max / bytes_per_token) {  // the kernel's in-page offsets are 32-bit
    MessageStream os;
    os << "argument 'kv_cache' has page_size " << page_size << "; at most " << kInt32Max / bytes_per_token
       << " tokens per page (page_size * " << bytes_per_token << " bytes must stay below 2^31)";
    return invalid(os.str());
  }
  if (k.shape[0] > kInt32Max / page_size) {
    MessageStream os;
    os << "argument 'kv_cache' has " << k.shape[0] << " pages of " << page_size
       << " tokens; at most 2^31 - 1 cache slots are addressable (indices are int32)";
    return invalid(os.str());
  }
  return check_pointer_aligned(k, name, 16);
}

SparsePrefillFp8Args canonical_fp8_args(const SparsePrefillFp8Args& args) {
  SparsePrefillFp8Args a = args;
  for (TensorRef* t : {&a.q, &a.kv_cache, &a.indices, &a.topk_length, &a.attn_sink, &a.out, &a.max_logits, &a.lse})
    *t = canonical(*t);
  return a;
}

}  // namespace

Status validate_sparse_prefill_fp8(const SparsePrefillFp8Args& args, kernels::SparsePrefillFp8Params* params) {
  const SparsePrefillFp8Args a = canonical_fp8_args(args);
  // ---- the format, q, the cache, indices
  if (a.cache_format != KVCacheFormat::kFp8V32 && a.cache_format != KVCacheFormat::kFp8Model1) {
    return invalid(std::string("argument 'cache_format' is ") + kv_cache_format_name(a.cache_format) +
                   "; sparse prefill from an FP8 cache reads kFp8V32 (d_qk 576, 656 B/token) or kFp8Model1 (d_qk 512, "
                   "584 B/token)");
  }
  const int64_t d_qk = kv_cache_fp8_head_dim(a.cache_format);
  const int64_t bytes_per_token = kv_cache_bytes_per_token(a.cache_format, d_qk);
  OPENMLA_RETURN_IF_ERROR(check_cuda_tensor(a.q, "q", {DType::kBFloat16}, 3));
  const int64_t s_q = a.q.shape[0], h_q = a.q.shape[1];
  if (a.q.shape[2] != d_qk) {
    MessageStream os;
    os << "argument 'q' has head dimension " << a.q.shape[2] << " (shape " << shape_string(a.q) << "); the "
       << kv_cache_format_name(a.cache_format) << " cache holds d_qk = " << d_qk;
    return invalid(os.str());
  }
  if (s_q < 1 || h_q < 1) return invalid("argument 'q' must have s_q >= 1 and h_q >= 1, got shape " + shape_string(a.q));
  OPENMLA_RETURN_IF_ERROR(check_bf16_rows(a.q, "q"));

  OPENMLA_RETURN_IF_ERROR(check_cache(a.kv_cache, bytes_per_token, kv_cache_format_name(a.cache_format)));
  OPENMLA_RETURN_IF_ERROR(check_same_device(a.q, "q", a.kv_cache, "kv_cache"));
  const int64_t num_slots = a.kv_cache.shape[0] * a.kv_cache.shape[1];

  // ---- indices, optional inputs, scalars, outputs (api/sparse_prefill_checks.h)
  const SparsePrefillCommonArgs common{.q = &a.q, .kv = &a.kv_cache, .kv_name = "kv_cache", .indices = &a.indices,
                                       .topk_length = &a.topk_length, .attn_sink = &a.attn_sink, .out = &a.out,
                                       .max_logits = &a.max_logits, .lse = &a.lse, .d_v = a.d_v,
                                       .softmax_scale = a.softmax_scale, .num_sms = a.num_sms};
  SparsePrefillShape shape;
  OPENMLA_RETURN_IF_ERROR(check_sparse_prefill_common(common, s_q, h_q, d_qk, &shape));

  if (params != nullptr) {
    kernels::SparsePrefillFp8Params& pf = *params;
    pf = kernels::SparsePrefillFp8Params{};
    pf.base = sparse_prefill_params(common, s_q, h_q, d_qk, num_slots, shape);
    pf.cache = static_cast<const uint8_t*>(a.kv_cache.data);
    pf.page_size = static_cast<int>(a.kv_cache.shape[1]);
    pf.page_stride = a.kv_cache.shape[0] > 1 ? a.kv_cache.stride[0] : a.kv_cache.shape[1] * bytes_per_token;
  }
  return Status::ok();
}

}  // namespace detail

Status sparse_prefill_fp8(const SparsePrefillFp8Args& args, cudaStream_t stream) {
  kernels::SparsePrefillFp8Params params;
  OPENMLA_RETURN_IF_ERROR(detail::validate_sparse_prefill_fp8(args, &params));
#if !defined(OPENMLA_HAS_SPARSE_PREFILL)
  (void)stream;
  return detail::family_not_built(detail::KernelFamily::kSparsePrefill, "sparse_prefill_fp8");
#else
  const int device = args.q.device_id;
  OPENMLA_RETURN_IF_ERROR(detail::check_launch_context(device, "q", stream, "sparse_prefill_fp8"));
  int num_sms = args.num_sms;
  if (num_sms == 0)
    OPENMLA_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device),
                                 "sparse prefill (FP8 cache): querying the SM count");
  params.base.grid = static_cast<int>(std::min<int64_t>(params.base.num_tiles, num_sms));
  return kernels::launch_sparse_prefill_fp8(params, stream);
#endif
}

}  // namespace openmla
