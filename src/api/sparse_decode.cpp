// Public sparse decode API (include/openmla/decode.h): validate -> launch plan -> build params -> launch the main
// kernel and the combine. Every check runs before the first CUDA call.
#include <cstdint>
#include <string>

#include "api/checked.h"
#include "api/decode_common.h"
#include "api/decode_internal.h"
#include "api/decode_varlen_q.h"
#include "api/families.h"
#include "api/validate.h"
#include "heuristics/decode_launch.h"
#include "heuristics/decode_schedule.h"
#include "kernels/combine/launch.h"
#include "kernels/sparse_decode/launch.h"
#include "openmla/decode.h"

namespace openmla {

namespace detail {

namespace {

// Every tensor argument with the strides of its size-1 dimensions replaced (api/validate.h, canonical()).
SparseDecodeArgs canonical_args(const SparseDecodeArgs& args) {
  SparseDecodeArgs a = args;
  for (TensorRef* t : {&a.q, &a.k_cache, &a.indices, &a.topk_length, &a.attn_sink, &a.extra_k_cache, &a.extra_indices,
                       &a.extra_topk_length, &a.out, &a.lse})
    *t = canonical(*t);
  a.schedule = canonical(args.schedule);
  a.split = canonical(args.split);
  return a;
}

// One FP8 paged cache of the sparse path: (num_blocks, page_block_size, 1, bytes_per_token) bytes, each page
// internally contiguous (stride(1) == bytes_per_token), pages 16-byte aligned (the page stride of a one-page cache
// is never used).
Status check_fp8_cache(const TensorRef& k, const char* name, int64_t page_size, const char* page_field,
                       int64_t bytes_per_token) {
  OPENMLA_RETURN_IF_ERROR(check_cuda_tensor(k, name, {DType::kUInt8, DType::kInt8, DType::kFloat8E4M3}, 4));
  if (k.shape[0] < 1)
    return invalid(std::string("argument '") + name + "' has no page blocks; shape " + shape_string(k));
  OPENMLA_RETURN_IF_ERROR(check_dim(k, name, 1, page_size, page_field));
  OPENMLA_RETURN_IF_ERROR(check_dim(k, name, 2, 1, "h_kv (sparse decode reads one latent head)"));
  OPENMLA_RETURN_IF_ERROR(check_dim(k, name, 3, bytes_per_token, "bytes per token of the cache format"));
  if (k.stride[3] != 1 || (page_size > 1 && k.stride[1] != bytes_per_token)) {
    MessageStream os;
    os << "argument '" << name << "' has strides " << stride_string(k)
       << "; each page must be contiguous (stride(1) == " << bytes_per_token
       << ", stride(3) == 1); only the page stride stride(0) is free";
    return invalid(os.str());
  }
  if (k.shape[0] > 1 && (k.stride[0] % 16 != 0 || k.stride[0] < page_size * bytes_per_token)) {
    MessageStream os;
    os << "argument '" << name << "' has page stride " << k.stride[0] << " bytes; expected a multiple of 16 that is at "
       << "least page_block_size * " << bytes_per_token << " = " << page_size * bytes_per_token;
    return invalid(os.str());
  }
  if (k.shape[0] > kInt32Max) return invalid(std::string("argument '") + name + "' has more than 2^31 - 1 page blocks");
  return check_pointer_aligned(k, name, 16);
}

// (b, s_q, topk) int32 index rows, last dim contiguous.
Status check_index_rows(const TensorRef& t, const char* name, int64_t b, int64_t s_q, int64_t topk,
                        const char* topk_field) {
  OPENMLA_RETURN_IF_ERROR(check_cuda_tensor(t, name, {DType::kInt32}, 3));
  OPENMLA_RETURN_IF_ERROR(check_dim(t, name, 0, b, "batch"));
  OPENMLA_RETURN_IF_ERROR(check_dim(t, name, 1, s_q, "s_q"));
  OPENMLA_RETURN_IF_ERROR(check_dim(t, name, 2, topk, topk_field));
  OPENMLA_RETURN_IF_ERROR(check_last_dim_contiguous(t, name));
  return check_fits_int32(t, name);
}

// One FP8 cache as the kernel reads it, with the index rows that select from it.
kernels::SparseCacheView cache_view(const TensorRef& cache, const TensorRef& indices, const TensorRef& lengths,
                                    int64_t topk) {
  return kernels::SparseCacheView{
      .data = static_cast<const uint8_t*>(cache.data),
      .page_stride = cache.stride[0],
      .page_size = static_cast<int>(cache.shape[1]),
      .capacity = cache.shape[0] * cache.shape[1],
      .indices = static_cast<const int32_t*>(indices.data),
      .idx_stride_b = indices.stride[0],
      .idx_stride_s = indices.stride[1],
      .topk = static_cast<int>(topk),
      .topk_length = lengths.defined() ? static_cast<const int32_t*>(lengths.data) : nullptr,
  };
}

}  // namespace

Status validate_sparse_decode(const SparseDecodeProblem& problem, const SparseDecodeArgs& args_in, int* num_sm_parts) {
  if (problem.varlen_q) {  // per-request query lengths: the call of b * s_q one-token requests (api/decode_varlen_q.h)
    SparseDecodeArgs flat;
    OPENMLA_RETURN_IF_ERROR(flatten_sparse_varlen_args(problem, args_in, &flat));
    return validate_sparse_decode(varlen_flat_problem(problem), flat, num_sm_parts);
  }
  OPENMLA_RETURN_IF_ERROR(check_seqused_q(false, args_in.seqused_q, problem.batch));
  OPENMLA_RETURN_IF_ERROR(check_varlen_lengths(false, args_in.schedule, 0));
  const SparseDecodeArgs args = canonical_args(args_in);
  // ---- The problem ---------------------------------------------------------------------------------
  OPENMLA_RETURN_IF_ERROR(validate_schedule_problem(problem));
  int64_t d_qk = 0, bytes_per_token = 0;
  if (problem.cache_format == KVCacheFormat::kFp8V32 || problem.cache_format == KVCacheFormat::kFp8Model1) {
    d_qk = kv_cache_fp8_head_dim(problem.cache_format);
    bytes_per_token = kv_cache_bytes_per_token(problem.cache_format, d_qk);
  } else {
    return invalid(std::string("argument 'problem.cache_format' is ") + kv_cache_format_name(problem.cache_format) +
                   "; sparse decode reads an FP8 cache ('fp8_v32' or 'fp8_model1')");
  }
  if (problem.d_qk != d_qk)
    return invalid_field("d_qk", problem.d_qk,
                         std::string("the ") + kv_cache_format_name(problem.cache_format) +
                             " layout has d_qk = " + std::to_string(d_qk));
  if (problem.page_block_size < 1 || problem.page_block_size > kInt32Max)
    return invalid_field("page_block_size", problem.page_block_size, "expected >= 1");
  const bool has_extra = args.extra_k_cache.defined();
  if (has_extra && problem.extra_topk == 0)
    return invalid("argument 'extra_k_cache' was given but problem.extra_topk is 0; set it to extra_indices' last dim");
  if (!has_extra && problem.extra_topk != 0)
    return invalid_field("extra_topk", problem.extra_topk, "expected 0 when no extra_k_cache is given");
  if (!has_extra && (args.extra_indices.defined() || args.extra_topk_length.defined()))
    return invalid(std::string("argument '") + (args.extra_indices.defined() ? "extra_indices" : "extra_topk_length") +
                   "' was given without 'extra_k_cache'");
  if (has_extra && (problem.extra_page_block_size < 1 || problem.extra_page_block_size > kInt32Max))
    return invalid_field("extra_page_block_size", problem.extra_page_block_size,
                         "expected >= 1 (the extra cache's tokens per page)");
  const DecodeGeometry g = geometry_of(problem);
  const int64_t b = problem.batch, s_q = problem.s_q, h_q = problem.h_q;

  // ---- q ---------------------------------------------------------------------------------------------
  const TensorRef& q = args.q;
  OPENMLA_RETURN_IF_ERROR(check_cuda_tensor(q, "q", {DType::kBFloat16}, 4));
  OPENMLA_RETURN_IF_ERROR(check_dim(q, "q", 0, b, "batch"));
  OPENMLA_RETURN_IF_ERROR(check_dim(q, "q", 1, s_q, "s_q"));
  OPENMLA_RETURN_IF_ERROR(check_dim(q, "q", 2, h_q, "h_q"));
  OPENMLA_RETURN_IF_ERROR(check_dim(q, "q", 3, d_qk, "d_qk"));
  OPENMLA_RETURN_IF_ERROR(check_last_dim_contiguous(q, "q"));
  OPENMLA_RETURN_IF_ERROR(check_strides_multiple(q, "q", 8, "16-byte loads"));
  OPENMLA_RETURN_IF_ERROR(check_pointer_aligned(q, "q", 16));
  OPENMLA_RETURN_IF_ERROR(check_fits_int32(q, "q"));

  // ---- caches, indices, lengths, sink ---------------------------------------------------------------
  OPENMLA_RETURN_IF_ERROR(
      check_fp8_cache(args.k_cache, "k_cache", problem.page_block_size, "page_block_size", bytes_per_token));
  OPENMLA_RETURN_IF_ERROR(check_index_rows(args.indices, "indices", b, s_q, problem.topk, "topk"));
  if (args.topk_length.defined()) OPENMLA_RETURN_IF_ERROR(check_lengths(args.topk_length, "topk_length", b));
  if (args.attn_sink.defined()) {
    OPENMLA_RETURN_IF_ERROR(check_cuda_tensor(args.attn_sink, "attn_sink", {DType::kFloat32}, 1));
    OPENMLA_RETURN_IF_ERROR(check_dim(args.attn_sink, "attn_sink", 0, h_q, "h_q"));
    OPENMLA_RETURN_IF_ERROR(check_contiguous(args.attn_sink, "attn_sink"));
  }
  if (has_extra) {
    OPENMLA_RETURN_IF_ERROR(check_fp8_cache(args.extra_k_cache, "extra_k_cache", problem.extra_page_block_size,
                                            "extra_page_block_size", bytes_per_token));
    if (!args.extra_indices.defined())
      return invalid("argument 'extra_indices' is required when 'extra_k_cache' is given");
    OPENMLA_RETURN_IF_ERROR(
        check_index_rows(args.extra_indices, "extra_indices", b, s_q, problem.extra_topk, "extra_topk"));
    if (args.extra_topk_length.defined())
      OPENMLA_RETURN_IF_ERROR(check_lengths(args.extra_topk_length, "extra_topk_length", b));
  }

  // ---- out, lse, schedule and split buffers ---------------------------------------------------------
  OPENMLA_RETURN_IF_ERROR(check_decode_outputs(g, args.out, args.lse, DType::kBFloat16));
  OPENMLA_RETURN_IF_ERROR(check_schedule_tensors(args.schedule, b));
  OPENMLA_RETURN_IF_ERROR(check_merge_counters(args.schedule, heuristics::decode_merge_counter_count(problem)));
  OPENMLA_RETURN_IF_ERROR(check_split_buffers(args.split, problem.d_v));

  // ---- one device -------------------------------------------------------------------------------------------
  OPENMLA_RETURN_IF_ERROR(check_same_device_all(q, "q",
                                                {{&args.k_cache, "k_cache"},
                                                 {&args.indices, "indices"},
                                                 {&args.topk_length, "topk_length"},
                                                 {&args.attn_sink, "attn_sink"},
                                                 {&args.extra_k_cache, "extra_k_cache"},
                                                 {&args.extra_indices, "extra_indices"},
                                                 {&args.extra_topk_length, "extra_topk_length"},
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
                                          {&args.split.partial_lse, "split.partial_lse"},
                                          {&args.schedule.merge_counters, "schedule.merge_counters"}},
                                         {{&q, "q"},
                                          {&args.k_cache, "k_cache"},
                                          {&args.indices, "indices"},
                                          {&args.topk_length, "topk_length"},
                                          {&args.attn_sink, "attn_sink"},
                                          {&args.extra_k_cache, "extra_k_cache"},
                                          {&args.extra_indices, "extra_indices"},
                                          {&args.extra_topk_length, "extra_topk_length"},
                                          {&args.schedule.metadata, "schedule.metadata"},
                                          {&args.schedule.num_splits, "schedule.num_splits"}}));

  // ---- sizes depending on num_sm_parts (the only check that may query the device) ----------------------------
  OPENMLA_RETURN_IF_ERROR(resolve_num_sm_parts(problem, q.device_id, num_sm_parts));
  return check_partition_sizes(g, *num_sm_parts, heuristics::decode_split_slots(problem, *num_sm_parts), args.schedule,
                               args.split);
}

SparseDecodeCall prepare_sparse_decode(const SparseDecodeProblem& problem, const SparseDecodeArgs& args_in,
                                       int num_sm_parts) {
  const SparseDecodeArgs args = canonical_args(args_in);
  const bool has_extra = args.extra_k_cache.defined();
  const heuristics::SparseDecodeLaunchPlan plan = heuristics::plan_sparse_decode_launch(
      problem, num_sm_parts, args.topk_length.defined(), has_extra && args.extra_topk_length.defined());
  const SoftmaxScale scale = softmax_scale_of(args.softmax_scale, problem.d_qk);
  SparseDecodeCall call;
  kernels::SparseDecodeParams& params = call.params;
  params = kernels::SparseDecodeParams{
      .batch = static_cast<int>(problem.batch),
      .s_q = static_cast<int>(problem.s_q),
      .h_q = static_cast<int>(problem.h_q),
      .num_head_blocks = static_cast<int>((problem.h_q + 63) / 64),
      .num_sm_parts = num_sm_parts,
      .is_model1 = problem.cache_format == KVCacheFormat::kFp8Model1,
      .crossover = plan.crossover,
      .softmax_scale = scale.scale,
      .scale_log2 = scale.scale_log2,
      .q = args.q.data,
      .q_stride_b = args.q.stride[0],
      .q_stride_s = args.q.stride[1],
      .q_stride_h = args.q.stride[2],
      .main = cache_view(args.k_cache, args.indices, args.topk_length, problem.topk),
      .has_extra = has_extra,
      .chunk_blocks = heuristics::decode_chunk_blocks(problem),
      .extra = has_extra
                   ? cache_view(args.extra_k_cache, args.extra_indices, args.extra_topk_length, problem.extra_topk)
                   : kernels::SparseCacheView{},
      .attn_sink = args.attn_sink.defined() ? static_cast<const float*>(args.attn_sink.data) : nullptr,
      .output = detail::decode_output_view(args.out, args.lse),
      .partial_o = static_cast<float*>(args.split.partial_o.data),
      .partial_lse = static_cast<float*>(args.split.partial_lse.data),
      .schedule = static_cast<const kernels::DecodeScheduleRecord*>(args.schedule.metadata.data),
      .num_splits = static_cast<const int32_t*>(args.schedule.num_splits.data),
      .uniform_blocks = plan.uniform_blocks,
      .split_capacity = split_capacity(geometry_of(problem), args.split),
      .uniform_records = {},
      .uniform_num_splits = {},
  };
  for (int part = 0; part < kMaxDecodeSmParts; ++part) params.uniform_records[part] = plan.uniform_records[part];
  for (int i = 0; i <= kernels::kHostScheduleMaxBatch; ++i) params.uniform_num_splits[i] = plan.uniform_num_splits[i];
  // The sparse main kernel writes every split chunk's partial: the combine merges every split request. With host
  // records the combine takes their prefix sums too: the call then never reads the device schedule.
  call.combine = combine_params(geometry_of(problem), /*is_fp16=*/false, args.schedule, args.split, args.out, args.lse,
                                params.attn_sink, /*merged_in_kernel=*/1,
                                plan.uniform_blocks > 0 ? plan.uniform_num_splits : nullptr, problem.batch_invariant);
  call.combine_slices = plan.combine_slices;
  return call;
}

}  // namespace detail

Status sparse_decode(const SparseDecodeProblem& problem, const SparseDecodeArgs& args, cudaStream_t stream) {
  if (problem.varlen_q) {  // per-request query lengths: b * s_q one-token requests (docs/sparse-decode.md)
    SparseDecodeArgs flat;
    OPENMLA_RETURN_IF_ERROR(detail::flatten_sparse_varlen_args(problem, args, &flat));
    return sparse_decode(detail::varlen_flat_problem(problem), flat, stream);
  }
  int num_sm_parts = 0;
  OPENMLA_RETURN_IF_ERROR(detail::validate_sparse_decode(problem, args, &num_sm_parts));
#if !defined(OPENMLA_HAS_DENSE_DECODE)
  (void)stream;
  return detail::family_not_built(detail::KernelFamily::kDecode, "sparse_decode");
#else
  OPENMLA_RETURN_IF_ERROR(detail::check_decode_launch(args.q.device_id, stream, "sparse_decode"));
  const detail::SparseDecodeCall call = detail::prepare_sparse_decode(problem, args, num_sm_parts);
  if (detail::checked_mode_enabled())
    OPENMLA_RETURN_IF_ERROR(detail::run_input_checks(
        kernels::CheckedEntry::kSparseDecode,
        detail::sparse_decode_checks(problem, detail::canonical_args(args), num_sm_parts,
                                     /*schedule_read=*/call.params.uniform_blocks == 0),
        stream));
  OPENMLA_RETURN_IF_ERROR(kernels::launch_sparse_decode(call.params, stream));
  return kernels::launch_combine(call.combine, call.combine_slices, stream);
#endif
}

}  // namespace openmla
