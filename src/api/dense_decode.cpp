// Public dense decode API (include/openmla/decode.h): validate -> launch plan -> build params -> launch the main
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
#include "kernels/dense_decode/launch.h"
#include "openmla/decode.h"
#include "openmla/test_hooks.h"

namespace openmla {

namespace detail {

namespace {
constexpr int64_t kDenseHeadDimQK = 576;
constexpr int64_t kTmaMaxStrideBytes = int64_t{1} << 40;  // cuTensorMapEncodeTiled: global strides below 2^40 bytes
// CombineParams::merged_in_kernel of a batch-invariant call with merge counters: the main kernel merges every split
// request (the chunk that publishes last merges them all: docs/decode-schedule.md, "Batch invariance"), so the
// combine kernel is not launched.
constexpr int kMergedAllInKernel = 0x7fffffff;

// Every tensor argument with the strides of its size-1 dimensions replaced (api/validate.h, canonical()): the k_cache
// TMA descriptor then never sees a stride that a framework exported for a size-1 dimension (k_cache.unsqueeze(-2)
// with stride 1 on the head dimension; one page).
DenseDecodeArgs canonical_args(const DenseDecodeArgs& args) {
  DenseDecodeArgs a = args;
  for (TensorRef* t : {&a.q, &a.k_cache, &a.block_table, &a.cache_seqlens, &a.out, &a.lse}) *t = canonical(*t);
  a.schedule = canonical(args.schedule);
  a.split = canonical(args.split);
  return a;
}

// The cache as the kernel's TMA descriptor reads it: page, row and head strides positive, whole 16-byte units (the
// multiple-of-8 check) and below the descriptor's 2^40-byte limit.
Status check_cache_tma_strides(const TensorRef& k) {
  for (int d = 0; d < 3; ++d) {
    const int64_t bytes = k.stride[d] * static_cast<int64_t>(k.element_size());
    if (k.stride[d] <= 0 || bytes >= kTmaMaxStrideBytes) {
      MessageStream os;
      os << "argument 'k_cache' has stride " << k.stride[d] << " in dimension " << d
         << "; the kernel reads the cache through a TMA descriptor, which needs positive strides below 2^40 bytes; "
            "strides "
         << stride_string(k);
      return invalid(os.str());
    }
  }
  return Status::ok();
}
}  // namespace

Status validate_dense_decode(const DenseDecodeProblem& problem, const DenseDecodeArgs& args_in, int* num_sm_parts) {
  const DenseDecodeArgs args = canonical_args(args_in);
  // ---- The problem ---------------------------------------------------------------------------------
  OPENMLA_RETURN_IF_ERROR(validate_schedule_problem(problem));
  if (problem.d_qk != kDenseHeadDimQK)
    return invalid_field("d_qk", problem.d_qk, "dense decode supports only d_qk = 576 (512 NoPE + 64 RoPE)");
  if (!kernels::dense_decode_page_size_supported(problem.page_block_size))
    return invalid_field("page_block_size", problem.page_block_size,
                         "dense decode supports page sizes 1, 2, 4, 8, 16, 32, 64, 128 and 256 (powers of two in "
                         "[1, 256])");
  if (problem.cache_format != KVCacheFormat::kBFloat16 && problem.cache_format != KVCacheFormat::kFloat16)
    return invalid(std::string("argument 'problem.cache_format' is ") + kv_cache_format_name(problem.cache_format) +
                   "; dense decode needs a bf16 or fp16 cache (an e4m3 cache with a per-tensor scale: dense_decode_fp8, "
                   "openmla/dense_decode_fp8.h; the FP8 V3.2 / MODEL1 layouts: sparse_decode)");
  const DecodeGeometry g = geometry_of(problem);
  const int64_t b = problem.batch, s_q = problem.s_q, h_q = problem.h_q, h_kv = problem.h_kv;

  // ---- q ---------------------------------------------------------------------------------------------
  const TensorRef& q = args.q;
  OPENMLA_RETURN_IF_ERROR(check_cuda_tensor(q, "q", {DType::kBFloat16, DType::kFloat16}, 4));
  const DType expected_dtype = problem.cache_format == KVCacheFormat::kFloat16 ? DType::kFloat16 : DType::kBFloat16;
  if (q.dtype != expected_dtype)
    return invalid(std::string("argument 'q' has dtype ") + dtype_name(q.dtype) + " but problem.cache_format is " +
                   kv_cache_format_name(problem.cache_format) + "; q and the cache must share one dtype");
  OPENMLA_RETURN_IF_ERROR(check_dim(q, "q", 0, b, "batch"));
  OPENMLA_RETURN_IF_ERROR(check_dim(q, "q", 1, s_q, "s_q"));
  OPENMLA_RETURN_IF_ERROR(check_dim(q, "q", 2, h_q, "h_q"));
  OPENMLA_RETURN_IF_ERROR(check_dim(q, "q", 3, kDenseHeadDimQK, "d_qk"));
  OPENMLA_RETURN_IF_ERROR(check_last_dim_contiguous(q, "q"));
  OPENMLA_RETURN_IF_ERROR(check_strides_multiple(q, "q", 8, "TMA needs 16-byte strides"));
  OPENMLA_RETURN_IF_ERROR(check_pointer_aligned(q, "q", 16));
  OPENMLA_RETURN_IF_ERROR(check_fits_int32(q, "q"));

  // ---- k_cache -----------------------------------------------------------------------------------------
  const TensorRef& k = args.k_cache;
  OPENMLA_RETURN_IF_ERROR(check_cuda_tensor(k, "k_cache", {q.dtype}, 4));
  if (k.shape[0] < 1) return invalid("argument 'k_cache' has no page blocks; shape " + shape_string(k));
  if (k.shape[0] > kInt32Max) return invalid("argument 'k_cache' has more than 2^31 - 1 page blocks");
  OPENMLA_RETURN_IF_ERROR(check_dim(k, "k_cache", 1, problem.page_block_size, "page size = problem.page_block_size"));
  OPENMLA_RETURN_IF_ERROR(check_dim(k, "k_cache", 2, h_kv, "h_kv"));
  OPENMLA_RETURN_IF_ERROR(check_dim(k, "k_cache", 3, kDenseHeadDimQK, "d_qk"));
  OPENMLA_RETURN_IF_ERROR(check_last_dim_contiguous(k, "k_cache"));
  OPENMLA_RETURN_IF_ERROR(check_strides_multiple(k, "k_cache", 8, "TMA needs 16-byte strides"));
  OPENMLA_RETURN_IF_ERROR(check_cache_tma_strides(k));
  OPENMLA_RETURN_IF_ERROR(check_pointer_aligned(k, "k_cache", 16));

  // ---- block_table, cache_seqlens ----------------------------------------------------------------------
  const TensorRef& bt = args.block_table;
  OPENMLA_RETURN_IF_ERROR(check_dense_block_table(bt, args.cache_seqlens, b, problem));
  // Per-request query lengths (problem.varlen_q): seqused_q, read by the kernel, on q's device (below).
  OPENMLA_RETURN_IF_ERROR(check_seqused_q(problem.varlen_q, args.seqused_q, b));

  // ---- out, lse, schedule and split buffers (shapes not depending on num_sm_parts) ----------------------
  OPENMLA_RETURN_IF_ERROR(check_decode_outputs(g, args.out, args.lse, q.dtype));
  OPENMLA_RETURN_IF_ERROR(check_schedule_tensors(args.schedule, b));
  OPENMLA_RETURN_IF_ERROR(check_merge_counters(args.schedule, heuristics::decode_merge_counter_ints(problem)));
  OPENMLA_RETURN_IF_ERROR(check_split_buffers(args.split, problem.d_v));

  // ---- one device -------------------------------------------------------------------------------------------
  OPENMLA_RETURN_IF_ERROR(check_same_device_all(q, "q",
                                                {{&k, "k_cache"},
                                                 {&bt, "block_table"},
                                                 {&args.cache_seqlens, "cache_seqlens"},
                                                 {&args.out, "out"},
                                                 {&args.lse, "lse"},
                                                 {&args.schedule.metadata, "schedule.metadata"},
                                                 {&args.schedule.num_splits, "schedule.num_splits"},
                                                 {&args.split.partial_o, "split.partial_o"},
                                                 {&args.split.partial_lse, "split.partial_lse"},
                                                 {&args.seqused_q, "seqused_q"}}));

  OPENMLA_RETURN_IF_ERROR(check_softmax_scale(args.softmax_scale));

  // ---- no tensor the call writes shares memory with another argument ---------------------------------------
  OPENMLA_RETURN_IF_ERROR(check_disjoint({{&args.out, "out"},
                                          {&args.lse, "lse"},
                                          {&args.split.partial_o, "split.partial_o"},
                                          {&args.split.partial_lse, "split.partial_lse"},
                                          {&args.schedule.merge_counters, "schedule.merge_counters"}},
                                         {{&q, "q"},
                                          {&k, "k_cache"},
                                          {&bt, "block_table"},
                                          {&args.cache_seqlens, "cache_seqlens"},
                                          {&args.seqused_q, "seqused_q"},
                                          {&args.schedule.metadata, "schedule.metadata"},
                                          {&args.schedule.num_splits, "schedule.num_splits"}}));

  // ---- sizes depending on num_sm_parts (the only check that may query the device) ----------------------------
  OPENMLA_RETURN_IF_ERROR(resolve_num_sm_parts(problem, q.device_id, num_sm_parts));
  // A batch-invariant call sizes its split slots from the block table's width (the plan may not have been told it).
  DenseDecodeProblem sized = problem;
  sized.max_blocks_per_seq = bt.shape[1];
  return check_partition_sizes(g, *num_sm_parts, heuristics::decode_split_slots(sized, *num_sm_parts), args.schedule,
                               args.split);
}

DenseDecodeCall prepare_dense_decode(const DenseDecodeProblem& problem, const DenseDecodeArgs& args_in,
                                     int num_sm_parts, const test_hooks::DenseDecodeOptions& options) {
  const DenseDecodeArgs args = canonical_args(args_in);
  const heuristics::DenseDecodeLaunchPlan plan = heuristics::plan_dense_decode_launch(problem, args.q);
  const int b = static_cast<int>(problem.batch), s_q = static_cast<int>(problem.s_q);
  const int h_q = static_cast<int>(problem.h_q), h_kv = static_cast<int>(problem.h_kv);
  const int q_per_kv = h_q / h_kv;
  const int rows_per_kv_head = s_q * q_per_kv;
  const SoftmaxScale scale = softmax_scale_of(args.softmax_scale, problem.d_qk);
  const bool is_fp16 = args.q.dtype == DType::kFloat16;
  const bool merge_counters = args.schedule.merge_counters.defined();

  DenseDecodeCall call;
  call.params = kernels::DenseDecodeParams{
      .batch = b,
      .s_q = s_q,
      .h_q = h_q,
      .h_kv = h_kv,
      .q_per_kv = q_per_kv,
      .rows_per_kv_head = rows_per_kv_head,
      .num_m_blocks = (rows_per_kv_head + 63) / 64,
      .num_sm_parts = num_sm_parts,
      .causal = problem.causal && s_q > 1,  // one query token sees the whole cache either way
      .is_fp16 = is_fp16,
      .softmax_scale = scale.scale,
      .scale_log2 = scale.scale_log2,
      .q = args.q.data,
      .q_stride_b = args.q.stride[0],
      .q_stride_s = args.q.stride[1],
      .q_stride_h = args.q.stride[2],
      .k_cache = args.k_cache.data,
      .k_stride_block = args.k_cache.stride[0],
      .k_stride_row = args.k_cache.stride[1],
      .k_stride_head = args.k_cache.stride[2],
      .num_cache_blocks = args.k_cache.shape[0],
      .block_table = static_cast<const int32_t*>(args.block_table.data),
      .block_table_stride = args.block_table.stride[0],
      .max_blocks_per_seq = static_cast<int>(args.block_table.shape[1]),
      .cache_seqlens = static_cast<const int32_t*>(args.cache_seqlens.data),
      .output = decode_output_view(args.out, args.lse),
      .partial_o = static_cast<float*>(args.split.partial_o.data),
      .partial_lse = static_cast<float*>(args.split.partial_lse.data),
      .schedule = static_cast<const kernels::DecodeScheduleRecord*>(args.schedule.metadata.data),
      .num_splits = static_cast<const int32_t*>(args.schedule.num_splits.data),
      .merge_counters = merge_counters ? static_cast<int*>(args.schedule.merge_counters.data) : nullptr,
      .merge_publish_always = options.merge_publish_always,
      .q_tma = plan.q_tma,
      .chunk_blocks = heuristics::decode_chunk_blocks(problem),
      .split_capacity = split_capacity(geometry_of(problem), args.split),
  };
  // Always launched: which requests were split is only known on the device (num_splits), and a fixed
  // launch sequence keeps the call graph-capturable. Unsplit requests exit in the prologue. With merge counters
  // the main kernel already merged the requests of two chunks; in a batch-invariant call, every split request (the
  // combine is then not launched).
  const int merged_in_kernel =
      !merge_counters ? 1 : problem.batch_invariant ? kMergedAllInKernel : kernels::kMaxMergeChunks;
  call.combine = combine_params(geometry_of(problem), is_fp16, args.schedule, args.split, args.out, args.lse,
                                /*attn_sink=*/nullptr, merged_in_kernel,
                                /*host_num_splits=*/nullptr, problem.batch_invariant);
  call.combine_slices = plan.combine_slices;
  call.pages = kernels::dense_page_geometry(static_cast<int>(problem.page_block_size));
  return call;
}

namespace {

Status run_dense_decode(const DenseDecodeProblem& problem, const DenseDecodeArgs& args,
                        const test_hooks::DenseDecodeOptions& options, cudaStream_t stream) {
  int num_sm_parts = 0;
  OPENMLA_RETURN_IF_ERROR(validate_dense_decode(problem, args, &num_sm_parts));
#if !defined(OPENMLA_HAS_DENSE_DECODE)
  (void)options;
  (void)stream;
  return family_not_built(KernelFamily::kDecode, "dense_decode");
#else
  OPENMLA_RETURN_IF_ERROR(check_decode_launch(args.q.device_id, stream, "dense_decode"));
  const DenseDecodeCall call = prepare_dense_decode(problem, args, num_sm_parts, options);
  if (checked_mode_enabled())
    OPENMLA_RETURN_IF_ERROR(run_input_checks(kernels::CheckedEntry::kDenseDecode,
                                             dense_decode_checks(problem, canonical_args(args), num_sm_parts), stream));
  if (problem.varlen_q) {  // per-request query lengths: the varlen kernels (docs/dense-decode.md)
    const kernels::DenseVarlenQ varlen{.seqused_q = static_cast<const int32_t*>(canonical(args.seqused_q).data)};
    OPENMLA_RETURN_IF_ERROR(kernels::launch_dense_decode_varlen_q(call.params, call.pages, varlen, stream));
  } else {
    OPENMLA_RETURN_IF_ERROR(kernels::launch_dense_decode(call.params, call.pages, stream));
  }
  if (call.combine.merged_in_kernel == kMergedAllInKernel) return Status::ok();  // (no split request left)
  return kernels::launch_combine(call.combine, call.combine_slices, stream);
#endif
}

}  // namespace

}  // namespace detail

Status dense_decode(const DenseDecodeProblem& problem, const DenseDecodeArgs& args, cudaStream_t stream) {
  return detail::run_dense_decode(problem, args, test_hooks::DenseDecodeOptions{}, stream);
}

Status test_hooks::dense_decode(const DenseDecodeProblem& problem, const DenseDecodeArgs& args,
                             const DenseDecodeOptions& options, cudaStream_t stream) {
  return detail::run_dense_decode(problem, args, options, stream);
}

}  // namespace openmla
