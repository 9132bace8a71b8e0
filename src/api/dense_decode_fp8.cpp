// Public FP8 dense decode API (include/openmla/dense_decode_fp8.h): validate -> build params -> launch the main
// kernel and the combine. Every check runs before the first CUDA call.
#include <cmath>
#include <cstdint>
#include <string>

#include "api/decode_common.h"
#include "api/decode_internal.h"
#include "api/dense_decode_fp8_internal.h"
#include "api/families.h"
#include "api/validate.h"
#include "heuristics/decode_launch.h"
#include "heuristics/decode_schedule.h"
#include "kernels/combine/launch.h"
#include "kernels/dense_decode/fp8/launch.h"
#include "openmla/dense_decode_fp8.h"

namespace openmla {

namespace detail {

namespace {
constexpr int64_t kHeadDimQK = 576;
constexpr int64_t kVectorBytes = 16;

DenseDecodeFp8Args canonical_args(const DenseDecodeFp8Args& args) {
  DenseDecodeFp8Args a = args;
  for (TensorRef* t :
       {&a.q, &a.k_cache, &a.block_table, &a.cache_seqlens, &a.descale_q, &a.descale_k, &a.out, &a.lse})
    *t = canonical(*t);
  a.schedule = canonical(args.schedule);
  a.split = canonical(args.split);
  return a;
}

// A per-tensor scale: a float32 CUDA tensor of one element (shape (1,) or 0-d), or, undefined, a finite positive host
// value.
Status check_descale(const TensorRef& t, const char* name, float value, const char* value_name) {
  if (!t.defined()) {
    if (!std::isfinite(value) || !(value > 0.f)) {
      MessageStream os;
      os << "argument '" << value_name << "' is " << value << "; a per-tensor scale must be finite and > 0";
      return invalid(os.str());
    }
    return Status::ok();
  }
  if (value != 1.f) {
    MessageStream os;
    os << "arguments '" << name << "' and '" << value_name << "' were both given (" << value_name << " = " << value
       << "); pass the scale once: the device tensor or the host value";
    return invalid(os.str());
  }
  OPENMLA_RETURN_IF_ERROR(check_on_cuda(t, name));
  OPENMLA_RETURN_IF_ERROR(check_dtype(t, name, {DType::kFloat32}));
  if (t.ndim > 1 || t.numel() != 1) {
    return invalid(std::string("argument '") + name + "' has shape " + shape_string(t) +
                   "; a per-tensor scale is one float32 value: shape (1,) or a 0-d tensor");
  }
  return check_pointer_aligned(t, name, 4);
}

// The FP8 cache: (num_blocks, page_block_size, 1, 576) bytes, last dim contiguous; row and page strides whole 16-byte
// units (the kernel's 16-byte loads), rows at least 576 bytes apart.
Status check_fp8_dense_cache(const TensorRef& k, int64_t page_size) {
  OPENMLA_RETURN_IF_ERROR(check_cuda_tensor(k, "k_cache", {DType::kFloat8E4M3, DType::kUInt8, DType::kInt8}, 4));
  if (k.shape[0] < 1) return invalid("argument 'k_cache' has no page blocks; shape " + shape_string(k));
  if (k.shape[0] > kInt32Max) return invalid("argument 'k_cache' has more than 2^31 - 1 page blocks");
  OPENMLA_RETURN_IF_ERROR(check_dim(k, "k_cache", 1, page_size, "page size = problem.page_block_size"));
  OPENMLA_RETURN_IF_ERROR(check_dim(k, "k_cache", 2, 1, "h_kv (FP8 dense decode reads one latent head)"));
  OPENMLA_RETURN_IF_ERROR(check_dim(k, "k_cache", 3, kHeadDimQK, "d_qk"));
  OPENMLA_RETURN_IF_ERROR(check_last_dim_contiguous(k, "k_cache"));
  if (k.stride[1] % kVectorBytes != 0 || k.stride[1] < kHeadDimQK || k.stride[0] % kVectorBytes != 0 ||
      k.stride[0] < 1) {
    MessageStream os;
    os << "argument 'k_cache' has strides " << stride_string(k)
       << "; the row stride (dim 1) must be a multiple of 16 bytes and >= 576, the page stride (dim 0) a positive "
          "multiple of 16 bytes (16-byte loads)";
    return invalid(os.str());
  }
  OPENMLA_RETURN_IF_ERROR(check_strides_sane(k, "k_cache"));
  return check_pointer_aligned(k, "k_cache", kVectorBytes);
}
}  // namespace

Status validate_dense_decode_fp8(const DenseDecodeProblem& problem, const DenseDecodeFp8Args& args_in,
                                 int* num_sm_parts) {
  const DenseDecodeFp8Args args = canonical_args(args_in);
  // ---- The problem ---------------------------------------------------------------------------------
  OPENMLA_RETURN_IF_ERROR(validate_schedule_problem(problem));
  if (problem.cache_format != KVCacheFormat::kFp8E4M3)
    return invalid(std::string("argument 'problem.cache_format' is ") + kv_cache_format_name(problem.cache_format) +
                   "; dense_decode_fp8 reads an e4m3 cache with a per-tensor scale ('fp8_e4m3'); bf16 / fp16 caches "
                   "go to dense_decode");
  if (problem.d_qk != kHeadDimQK)
    return invalid_field("d_qk", problem.d_qk, "FP8 dense decode supports only d_qk = 576 (512 NoPE + 64 RoPE)");
  if (problem.h_kv != 1)
    return invalid_field("h_kv", problem.h_kv, "FP8 dense decode reads one latent KV head (MLA): h_kv must be 1");
  if (problem.page_block_size < 1 || problem.page_block_size > kInt32Max)
    return invalid_field("page_block_size", problem.page_block_size, "expected >= 1 (any page size)");
  const DecodeGeometry g = geometry_of(problem);
  const int64_t b = problem.batch, s_q = problem.s_q, h_q = problem.h_q;

  // ---- q ---------------------------------------------------------------------------------------------
  const TensorRef& q = args.q;
  OPENMLA_RETURN_IF_ERROR(check_defined(q, "q"));
  if (q.dtype != DType::kBFloat16 && q.dtype != DType::kFloat8E4M3)
    return invalid(std::string("argument 'q' has dtype ") + dtype_name(q.dtype) +
                   "; FP8 dense decode takes a bfloat16 or float8_e4m3 q (the output is bfloat16)");
  OPENMLA_RETURN_IF_ERROR(check_cuda_tensor(q, "q", {DType::kBFloat16, DType::kFloat8E4M3}, 4));
  OPENMLA_RETURN_IF_ERROR(check_dim(q, "q", 0, b, "batch"));
  OPENMLA_RETURN_IF_ERROR(check_dim(q, "q", 1, s_q, "s_q"));
  OPENMLA_RETURN_IF_ERROR(check_dim(q, "q", 2, h_q, "h_q"));
  OPENMLA_RETURN_IF_ERROR(check_dim(q, "q", 3, kHeadDimQK, "d_qk"));
  OPENMLA_RETURN_IF_ERROR(check_last_dim_contiguous(q, "q"));
  OPENMLA_RETURN_IF_ERROR(check_strides_multiple(q, "q", kVectorBytes / static_cast<int64_t>(q.element_size()),
                                                 "16-byte loads need 16-byte strides"));
  OPENMLA_RETURN_IF_ERROR(check_pointer_aligned(q, "q", kVectorBytes));
  OPENMLA_RETURN_IF_ERROR(check_fits_int32(q, "q"));

  // ---- k_cache, scales ----------------------------------------------------------------------------------
  OPENMLA_RETURN_IF_ERROR(check_fp8_dense_cache(args.k_cache, problem.page_block_size));
  OPENMLA_RETURN_IF_ERROR(check_descale(args.descale_q, "descale_q", args.descale_q_value, "descale_q_value"));
  OPENMLA_RETURN_IF_ERROR(check_descale(args.descale_k, "descale_k", args.descale_k_value, "descale_k_value"));

  // ---- block_table, cache_seqlens ----------------------------------------------------------------------
  const TensorRef& bt = args.block_table;
  OPENMLA_RETURN_IF_ERROR(check_dense_block_table(bt, args.cache_seqlens, b, problem));

  // ---- out, lse, schedule and split buffers -------------------------------------------------------------
  if (problem.batch_invariant)
    return invalid_field("batch_invariant", problem.batch_invariant,
                         "FP8 dense decode has no batch-invariant schedule yet; plan the default one");
  if (problem.varlen_q)
    return Status::unsupported("argument 'problem.varlen_q': FP8 dense decode takes a uniform s_q (per-request query "
                               "lengths are served for the bf16 / fp16 cache)");
  OPENMLA_RETURN_IF_ERROR(check_decode_outputs(g, args.out, args.lse, DType::kBFloat16));
  OPENMLA_RETURN_IF_ERROR(check_schedule_tensors(args.schedule, b));
  OPENMLA_RETURN_IF_ERROR(check_merge_counters(args.schedule, heuristics::decode_merge_counter_count(problem)));
  OPENMLA_RETURN_IF_ERROR(check_split_buffers(args.split, problem.d_v));

  // ---- one device -------------------------------------------------------------------------------------------
  OPENMLA_RETURN_IF_ERROR(check_same_device_all(q, "q",
                                                {{&args.k_cache, "k_cache"},
                                                 {&bt, "block_table"},
                                                 {&args.cache_seqlens, "cache_seqlens"},
                                                 {&args.descale_q, "descale_q"},
                                                 {&args.descale_k, "descale_k"},
                                                 {&args.out, "out"},
                                                 {&args.lse, "lse"},
                                                 {&args.schedule.metadata, "schedule.metadata"},
                                                 {&args.schedule.num_splits, "schedule.num_splits"},
                                                 {&args.split.partial_o, "split.partial_o"},
                                                 {&args.split.partial_lse, "split.partial_lse"}}));

  OPENMLA_RETURN_IF_ERROR(check_softmax_scale(args.softmax_scale));

  // ---- no tensor the call writes shares memory with another argument ---------------------------------------
  OPENMLA_RETURN_IF_ERROR(check_disjoint({{&args.out, "out"},
                                          {&args.lse, "lse"},
                                          {&args.split.partial_o, "split.partial_o"},
                                          {&args.split.partial_lse, "split.partial_lse"}},
                                         {{&q, "q"},
                                          {&args.k_cache, "k_cache"},
                                          {&bt, "block_table"},
                                          {&args.cache_seqlens, "cache_seqlens"},
                                          {&args.descale_q, "descale_q"},
                                          {&args.descale_k, "descale_k"},
                                          {&args.schedule.metadata, "schedule.metadata"},
                                          {&args.schedule.num_splits, "schedule.num_splits"}}));

  // ---- sizes depending on num_sm_parts (the only check that may query the device) ----------------------------
  OPENMLA_RETURN_IF_ERROR(resolve_num_sm_parts(problem, q.device_id, num_sm_parts));
  return check_partition_sizes(g, *num_sm_parts, heuristics::decode_split_slots(problem, *num_sm_parts),
                               args.schedule, args.split);
}

// Measured 3-4 % slower on every row of the suite (H200, train of 4b4e954): never held by default.
bool dense_fp8_hold_pv_r(int /*num_m_blocks*/) { return false; }

DenseDecodeFp8Call prepare_dense_decode_fp8(const DenseDecodeProblem& problem, const DenseDecodeFp8Args& args_in,
                                            int num_sm_parts, const DenseDecodeFp8Options& options) {
  const DenseDecodeFp8Args args = canonical_args(args_in);
  const int b = static_cast<int>(problem.batch), s_q = static_cast<int>(problem.s_q);
  const int h_q = static_cast<int>(problem.h_q);
  const int rows = s_q * h_q;
  const SoftmaxScale scale = softmax_scale_of(args.softmax_scale, problem.d_qk);
  const int64_t elem = static_cast<int64_t>(args.k_cache.element_size());  // 1: strides in bytes
  DenseDecodeFp8Call call;
  call.q_fp8 = args.q.dtype == DType::kFloat8E4M3;
  call.params = kernels::DenseDecodeFp8Params{
      .batch = b,
      .s_q = s_q,
      .h_q = h_q,
      .rows = rows,
      .num_m_blocks = (rows + 63) / 64,
      .num_sm_parts = num_sm_parts,
      .causal = problem.causal && s_q > 1,
      .softmax_scale = scale.scale,
      .scale_log2 = scale.scale_log2,
      .descale_q = args.descale_q.defined() ? static_cast<const float*>(args.descale_q.data) : nullptr,
      .descale_k = args.descale_k.defined() ? static_cast<const float*>(args.descale_k.data) : nullptr,
      .descale_q_value = args.descale_q.defined() ? 1.f : args.descale_q_value,
      .descale_k_value = args.descale_k.defined() ? 1.f : args.descale_k_value,
      .q = args.q.data,
      .q_stride_b = args.q.stride[0],
      .q_stride_s = args.q.stride[1],
      .q_stride_h = args.q.stride[2],
      .k_cache = static_cast<const uint8_t*>(args.k_cache.data),
      .page_stride = args.k_cache.stride[0] * elem,
      .row_stride = args.k_cache.stride[1] * elem,
      .page_size = static_cast<int>(problem.page_block_size),
      .num_pages = args.k_cache.shape[0],
      .block_table = static_cast<const int32_t*>(args.block_table.data),
      .block_table_stride = args.block_table.stride[0],
      .max_blocks_per_seq = static_cast<int>(args.block_table.shape[1]),
      .cache_seqlens = static_cast<const int32_t*>(args.cache_seqlens.data),
      .output = decode_output_view(args.out, args.lse),
      .partial_o = static_cast<float*>(args.split.partial_o.data),
      .partial_lse = static_cast<float*>(args.split.partial_lse.data),
      .schedule = static_cast<const kernels::DecodeScheduleRecord*>(args.schedule.metadata.data),
      .num_splits = static_cast<const int32_t*>(args.schedule.num_splits.data),
      .hold_pv_r = options.hold_pv_r == HoldPvR::kAuto ? dense_fp8_hold_pv_r((rows + 63) / 64)
                                                       : options.hold_pv_r == HoldPvR::kOn,
      .k_l1_no_allocate = options.k_l1_no_allocate,
      .early_qk = options.early_qk,
  };
  // The main kernel writes every split chunk's partial: the combine merges every split request.
  call.combine = combine_params(geometry_of(problem), /*is_fp16=*/false, args.schedule, args.split, args.out, args.lse,
                                /*attn_sink=*/nullptr, /*merged_in_kernel=*/1);
  call.combine_slices = heuristics::combine_slices(problem.batch, problem.s_q, problem.h_q);
  return call;
}

Status run_dense_decode_fp8(const DenseDecodeProblem& problem, const DenseDecodeFp8Args& args,
                            const DenseDecodeFp8Options& options, cudaStream_t stream) {
  int num_sm_parts = 0;
  OPENMLA_RETURN_IF_ERROR(validate_dense_decode_fp8(problem, args, &num_sm_parts));
#if !defined(OPENMLA_HAS_DENSE_DECODE)
  (void)options;
  (void)stream;
  return family_not_built(KernelFamily::kDecode, "dense_decode_fp8");
#else
  OPENMLA_RETURN_IF_ERROR(check_decode_launch(args.q.device_id, stream, "dense_decode_fp8"));
  const DenseDecodeFp8Call call = prepare_dense_decode_fp8(problem, args, num_sm_parts, options);
  OPENMLA_RETURN_IF_ERROR(kernels::launch_dense_decode_fp8(call.params, call.q_fp8, stream));
  return kernels::launch_combine(call.combine, call.combine_slices, stream);
#endif
}

}  // namespace detail

Status dense_decode_fp8(const DenseDecodeProblem& problem, const DenseDecodeFp8Args& args, cudaStream_t stream) {
  return detail::run_dense_decode_fp8(problem, args, detail::DenseDecodeFp8Options{}, stream);
}

}  // namespace openmla
