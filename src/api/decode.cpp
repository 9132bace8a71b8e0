// Public decode API (include/openmla/decode.h): validate -> build params -> launch.
//
// Ordering rule: every argument check runs before the first CUDA call, so a bad call never launches
// anything and the checks can be tested without a GPU. The only CUDA queries before launching are the
// SM count (only when problem.num_sms == 0) and the current device (to refuse launching on the wrong one).
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "api/decode_internal.h"
#include "api/validate.h"
#include "heuristics/decode_schedule.h"
#include "kernels/combine/params.h"
#include "kernels/decode_scheduler/launch.h"
#include "kernels/decode_scheduler/partition_walk.h"
#include "kernels/dense_decode/params.h"
#include "kernels/sparse_decode/params.h"
#include "openmla/decode.h"

namespace openmla {

namespace detail {

namespace {

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
constexpr int64_t kDenseHeadDimQK = 576;
constexpr int64_t kHeadDimV = 512;
constexpr int64_t kDensePageSize = 64;
constexpr int64_t kMaxCombineRows = 65535LL * kernels::kCombineWarps;  // combine grid.y limit
constexpr int64_t kMaxSparseSq = 65535;                                  // sparse main kernel grid.y limit
// Up to this batch (a packed record holds request numbers below 32) the host passes the sparse kernel its partition
// records in the kernel parameters when the lengths are uniform, so the kernel's head skips the schedule load.
constexpr int kSparseHostRecordsMaxBatch = 16;

Status invalid(const std::string& msg) { return Status::invalid_argument(msg); }

std::atomic<bool> g_merge_publish_always{false};  // set_dense_merge_publish_always (tests)

template <typename T>
std::string field_message(const char* field, T value, const std::string& requirement) {
  detail::MessageStream os;
  os << "argument 'problem." << field << "' is " << value << "; " << requirement;
  return os.str();
}

// A defined CUDA tensor of one of `dtypes` with `ndim` dimensions.
Status check_cuda_tensor(const TensorRef& t, const char* name, std::initializer_list<DType> dtypes, int ndim) {
  OPENMLA_RETURN_IF_ERROR(check_on_cuda(t, name));
  OPENMLA_RETURN_IF_ERROR(check_dtype(t, name, dtypes));
  return check_ndim(t, name, ndim);
}

// A (n,) int32 contiguous CUDA vector: cache_seqlens, topk_length, extra_topk_length.
Status check_lengths(const TensorRef& t, const char* name, int64_t batch) {
  OPENMLA_RETURN_IF_ERROR(check_cuda_tensor(t, name, {DType::kInt32}, 1));
  OPENMLA_RETURN_IF_ERROR(check_dim(t, name, 0, batch, "batch"));
  return check_contiguous(t, name);
}

// Shapes of the schedule that do not depend on num_sm_parts.
Status check_schedule_tensors(const DecodeSchedule& schedule, int64_t batch) {
  OPENMLA_RETURN_IF_ERROR(check_cuda_tensor(schedule.metadata, "schedule.metadata", {DType::kInt32}, 2));
  OPENMLA_RETURN_IF_ERROR(
      check_dim(schedule.metadata, "schedule.metadata", 1, kDecodeScheduleRecordInts, "ints per partition record"));
  OPENMLA_RETURN_IF_ERROR(check_contiguous(schedule.metadata, "schedule.metadata"));
  OPENMLA_RETURN_IF_ERROR(check_pointer_aligned(schedule.metadata, "schedule.metadata", 16));
  OPENMLA_RETURN_IF_ERROR(check_cuda_tensor(schedule.num_splits, "schedule.num_splits", {DType::kInt32}, 1));
  OPENMLA_RETURN_IF_ERROR(check_dim(schedule.num_splits, "schedule.num_splits", 0, batch + 1, "batch + 1"));
  return check_contiguous(schedule.num_splits, "schedule.num_splits");
}

// The optional merge counters: (>= decode_merge_counter_count(problem),) int32, contiguous, on the metadata's device.
Status check_merge_counters(const DecodeProblem& problem, const DecodeSchedule& schedule) {
  const TensorRef& c = schedule.merge_counters;
  if (!c.defined()) return Status::ok();
  OPENMLA_RETURN_IF_ERROR(check_cuda_tensor(c, "schedule.merge_counters", {DType::kInt32}, 1));
  OPENMLA_RETURN_IF_ERROR(check_contiguous(c, "schedule.merge_counters"));
  const int64_t needed = heuristics::decode_merge_counter_count(problem);
  if (c.shape[0] < needed) {
    detail::MessageStream os;
    os << "argument 'schedule.merge_counters' has " << c.shape[0] << " elements, but this problem needs at least "
       << needed << "; size it with get_decode_workspace_sizes() (merge_counter_ints)";
    return invalid(os.str());
  }
  if (needed > kInt32Max) return invalid("argument 'schedule.merge_counters': this problem needs more than 2^31 - 1 counters");
  return check_same_device(schedule.metadata, "schedule.metadata", c, "schedule.merge_counters");
}

Status check_schedule_parts(const DecodeSchedule& schedule, int num_sm_parts) {
  if (schedule.metadata.shape[0] != num_sm_parts) {
    detail::MessageStream os;
    os << "argument 'schedule.metadata' has " << schedule.metadata.shape[0] << " partition records, but this problem "
       << "uses num_sm_parts = " << num_sm_parts << "; size it with get_decode_workspace_sizes() for the same "
       << "problem (same h_q, h_kv, s_q, sparse and num_sms)";
    return invalid(os.str());
  }
  return Status::ok();
}

// The SM count the schedule is built for: problem.num_sms, or the device's count when that is 0.
Status resolve_num_sms(const DecodeProblem& problem, int device_id, int* num_sms) {
  if (problem.num_sms > 0) {
    *num_sms = problem.num_sms;
    return Status::ok();
  }
  OPENMLA_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(num_sms, cudaDevAttrMultiProcessorCount, device_id),
                               "querying the SM count (problem.num_sms == 0)");
  return Status::ok();
}

// Refuses to launch on a device other than the tensors' (kernels would fault on foreign pointers).
Status check_current_device(int device_id, const char* tensor_name) {
  int current = -1;
  OPENMLA_CUDA_RETURN_IF_ERROR(cudaGetDevice(&current), "cudaGetDevice");
  if (current != device_id) {
    detail::MessageStream os;
    os << "argument '" << tensor_name << "' is on cuda:" << device_id << " but the current device is cuda:" << current
       << "; call cudaSetDevice(" << device_id << ") first (the stream must belong to that device)";
    return invalid(os.str());
  }
  return Status::ok();
}

// out (b, s_q, h_q, d_v) of `dtype` and lse (b, h_q, s_q) float32: the caller-visible results of every decode.
Status check_outputs(const DecodeProblem& problem, const TensorRef& out, const TensorRef& lse, DType dtype) {
  OPENMLA_RETURN_IF_ERROR(check_cuda_tensor(out, "out", {dtype}, 4));
  OPENMLA_RETURN_IF_ERROR(check_dim(out, "out", 0, problem.batch, "batch"));
  OPENMLA_RETURN_IF_ERROR(check_dim(out, "out", 1, problem.s_q, "s_q"));
  OPENMLA_RETURN_IF_ERROR(check_dim(out, "out", 2, problem.h_q, "h_q"));
  OPENMLA_RETURN_IF_ERROR(check_dim(out, "out", 3, problem.d_v, "d_v"));
  OPENMLA_RETURN_IF_ERROR(check_last_dim_contiguous(out, "out"));
  OPENMLA_RETURN_IF_ERROR(check_strides_multiple(out, "out", 8, "16-byte vector stores"));
  OPENMLA_RETURN_IF_ERROR(check_pointer_aligned(out, "out", 16));
  OPENMLA_RETURN_IF_ERROR(check_fits_int32(out, "out"));
  OPENMLA_RETURN_IF_ERROR(check_cuda_tensor(lse, "lse", {DType::kFloat32}, 3));
  OPENMLA_RETURN_IF_ERROR(check_dim(lse, "lse", 0, problem.batch, "batch"));
  OPENMLA_RETURN_IF_ERROR(check_dim(lse, "lse", 1, problem.h_q, "h_q"));
  OPENMLA_RETURN_IF_ERROR(check_dim(lse, "lse", 2, problem.s_q, "s_q"));
  return check_fits_int32(lse, "lse");
}

// Split-KV scratch shapes that do not depend on num_sm_parts.
Status check_split_buffers(const DecodeProblem& problem, const DecodeSplitBuffers& split) {
  const TensorRef& po = split.partial_o;
  OPENMLA_RETURN_IF_ERROR(check_cuda_tensor(po, "split.partial_o", {DType::kFloat32}, 2));
  OPENMLA_RETURN_IF_ERROR(check_dim(po, "split.partial_o", 1, problem.d_v, "d_v"));
  OPENMLA_RETURN_IF_ERROR(check_contiguous(po, "split.partial_o"));
  OPENMLA_RETURN_IF_ERROR(check_pointer_aligned(po, "split.partial_o", 16));
  const TensorRef& pl = split.partial_lse;
  OPENMLA_RETURN_IF_ERROR(check_cuda_tensor(pl, "split.partial_lse", {DType::kFloat32}, 1));
  return check_contiguous(pl, "split.partial_lse");
}

// The schedule's partition count and the split buffers' row count against num_sm_parts (the only check that
// may query the device, when problem.num_sms == 0).
Status check_partition_sizes(const DecodeProblem& problem, int device_id, const DecodeSchedule& schedule,
                             const DecodeSplitBuffers& split, int* num_sm_parts) {
  int num_sms = 0;
  OPENMLA_RETURN_IF_ERROR(resolve_num_sms(problem, device_id, &num_sms));
  *num_sm_parts = heuristics::decode_num_sm_parts(problem, num_sms);
  OPENMLA_RETURN_IF_ERROR(check_schedule_parts(schedule, *num_sm_parts));
  const int64_t needed_rows = (problem.batch + *num_sm_parts) * problem.s_q * problem.h_q;
  if (needed_rows > kInt32Max)
    return invalid("the split-KV partials of this problem need " + std::to_string(needed_rows) +
                   " rows, more than the kernels' 32-bit row index allows; reduce batch, s_q or h_q");
  for (const auto& [t, name] :
       {std::pair{&split.partial_o, "split.partial_o"}, std::pair{&split.partial_lse, "split.partial_lse"}}) {
    if (t->shape[0] < needed_rows) {
      detail::MessageStream os;
      os << "argument '" << name << "' has " << t->shape[0] << " rows, but this problem needs at least "
         << needed_rows << " ((batch + num_sm_parts) * s_q * h_q with num_sm_parts = " << *num_sm_parts
         << "); size it with get_decode_workspace_sizes()";
      return invalid(os.str());
    }
  }
  return Status::ok();
}

// One FP8 paged cache of the sparse path: (num_blocks, page_block_size, 1, bytes_per_token) bytes, each page
// internally contiguous (stride(1) == bytes_per_token), pages 16-byte aligned.
Status check_fp8_cache(const TensorRef& k, const char* name, int64_t page_size, const char* page_field,
                       int64_t bytes_per_token) {
  OPENMLA_RETURN_IF_ERROR(check_cuda_tensor(k, name, {DType::kUInt8, DType::kInt8, DType::kFloat8E4M3}, 4));
  if (k.shape[0] < 1) return invalid(std::string("argument '") + name + "' has no page blocks; shape " + shape_string(k));
  OPENMLA_RETURN_IF_ERROR(check_dim(k, name, 1, page_size, page_field));
  OPENMLA_RETURN_IF_ERROR(check_dim(k, name, 2, 1, "h_kv (sparse decode reads one latent head)"));
  OPENMLA_RETURN_IF_ERROR(check_dim(k, name, 3, bytes_per_token, "bytes per token of the cache format"));
  if (k.stride[3] != 1 || (page_size > 1 && k.stride[1] != bytes_per_token)) {
    detail::MessageStream os;
    os << "argument '" << name << "' has strides " << stride_string(k) << "; each page must be contiguous (stride(1) == "
       << bytes_per_token << ", stride(3) == 1); only the page stride stride(0) is free";
    return invalid(os.str());
  }
  if (k.stride[0] % 16 != 0 || k.stride[0] < page_size * bytes_per_token) {
    detail::MessageStream os;
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

}  // namespace

void set_dense_merge_publish_always(bool on) { g_merge_publish_always.store(on); }

Status validate_decode_problem(const DecodeProblem& p) {
  if (p.batch < 1 || p.batch > kInt32Max) return invalid(field_message("batch", p.batch, "expected 1 <= batch < 2^31"));
  if (p.s_q < 1 || p.s_q > kInt32Max) return invalid(field_message("s_q", p.s_q, "expected s_q >= 1"));
  if (p.h_q < 1 || p.h_q > kInt32Max) return invalid(field_message("h_q", p.h_q, "expected h_q >= 1"));
  if (p.h_kv < 1 || p.h_kv > p.h_q) return invalid(field_message("h_kv", p.h_kv, "expected 1 <= h_kv <= h_q"));
  if (p.h_q % p.h_kv != 0) {
    detail::MessageStream os;
    os << "argument 'problem.h_q' (" << p.h_q << ") must be a multiple of 'problem.h_kv' (" << p.h_kv << ")";
    return invalid(os.str());
  }
  if (p.s_q * p.h_q > kMaxCombineRows)
    return invalid(field_message("s_q", p.s_q, "s_q * h_q must be <= " + std::to_string(kMaxCombineRows) +
                                                   " (query rows per request)"));
  if (p.d_v != kHeadDimV) return invalid(field_message("d_v", p.d_v, "only d_v = 512 is supported"));
  if (p.num_sms < 0) return invalid(field_message("num_sms", p.num_sms, "expected >= 0 (0: the device's SM count)"));
  if (p.sparse) {
    if (p.topk <= 0 || p.topk > kInt32Max)
      return invalid(field_message("topk", p.topk, "sparse decode needs 1 <= topk < 2^31 (any value)"));
    if (p.extra_topk < 0 || p.extra_topk > kInt32Max)
      return invalid(field_message("extra_topk", p.extra_topk, "expected 0 (no extra cache) or a positive value"));
    if (p.s_q > kMaxSparseSq)
      return invalid(field_message("s_q", p.s_q, "sparse decode supports s_q <= 65535 (a grid dimension)"));
  }
  return Status::ok();
}

Status validate_plan_decode(const DecodeProblem& problem, const TensorRef& cache_seqlens, const TensorRef& topk_length,
                            const TensorRef& extra_topk_length, const DecodeSchedule& schedule, int* num_sm_parts) {
  OPENMLA_RETURN_IF_ERROR(validate_decode_problem(problem));
  const TensorRef* device_ref = &schedule.metadata;
  const char* device_name = "schedule.metadata";
  if (!problem.sparse) {
    OPENMLA_RETURN_IF_ERROR(check_lengths(cache_seqlens, "cache_seqlens", problem.batch));
  } else {
    if (topk_length.defined()) OPENMLA_RETURN_IF_ERROR(check_lengths(topk_length, "topk_length", problem.batch));
    if (extra_topk_length.defined()) {
      if (problem.extra_topk == 0)
        return invalid("argument 'extra_topk_length' was given but problem.extra_topk is 0 (no extra cache)");
      OPENMLA_RETURN_IF_ERROR(check_lengths(extra_topk_length, "extra_topk_length", problem.batch));
    }
  }
  OPENMLA_RETURN_IF_ERROR(check_schedule_tensors(schedule, problem.batch));
  OPENMLA_RETURN_IF_ERROR(
      check_same_device(*device_ref, device_name, schedule.num_splits, "schedule.num_splits"));
  OPENMLA_RETURN_IF_ERROR(check_merge_counters(problem, schedule));
  if (!problem.sparse) OPENMLA_RETURN_IF_ERROR(check_same_device(*device_ref, device_name, cache_seqlens, "cache_seqlens"));
  if (problem.sparse && topk_length.defined())
    OPENMLA_RETURN_IF_ERROR(check_same_device(*device_ref, device_name, topk_length, "topk_length"));
  if (problem.sparse && extra_topk_length.defined())
    OPENMLA_RETURN_IF_ERROR(check_same_device(*device_ref, device_name, extra_topk_length, "extra_topk_length"));

  int num_sms = 0;
  OPENMLA_RETURN_IF_ERROR(resolve_num_sms(problem, schedule.metadata.device_id, &num_sms));
  *num_sm_parts = heuristics::decode_num_sm_parts(problem, num_sms);
  return check_schedule_parts(schedule, *num_sm_parts);
}

Status validate_dense_decode(const DecodeProblem& problem, const DenseDecodeArgs& args, int* num_sm_parts) {
  // ---- The problem ---------------------------------------------------------------------------------
  OPENMLA_RETURN_IF_ERROR(validate_decode_problem(problem));
  if (problem.sparse) return invalid("argument 'problem.sparse' is true; dense_decode needs a dense problem");
  if (problem.d_qk != kDenseHeadDimQK)
    return invalid(field_message("d_qk", problem.d_qk, "dense decode supports only d_qk = 576 (512 NoPE + 64 RoPE)"));
  if (problem.page_block_size != kDensePageSize)
    return invalid(field_message("page_block_size", problem.page_block_size,
                                 "dense decode supports only page_block_size = 64 for now"));
  if (problem.cache_format != KVCacheFormat::kBFloat16 && problem.cache_format != KVCacheFormat::kFloat16)
    return invalid(std::string("argument 'problem.cache_format' is ") + kv_cache_format_name(problem.cache_format) +
                   "; dense decode needs a bf16 or fp16 cache (FP8 caches are sparse-decode only)");
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
  OPENMLA_RETURN_IF_ERROR(check_dim(k, "k_cache", 1, kDensePageSize, "page size; only 64 is supported for now"));
  OPENMLA_RETURN_IF_ERROR(check_dim(k, "k_cache", 2, h_kv, "h_kv"));
  OPENMLA_RETURN_IF_ERROR(check_dim(k, "k_cache", 3, kDenseHeadDimQK, "d_qk"));
  OPENMLA_RETURN_IF_ERROR(check_last_dim_contiguous(k, "k_cache"));
  OPENMLA_RETURN_IF_ERROR(check_strides_multiple(k, "k_cache", 8, "TMA needs 16-byte strides"));
  OPENMLA_RETURN_IF_ERROR(check_pointer_aligned(k, "k_cache", 16));

  // ---- block_table, cache_seqlens ----------------------------------------------------------------------
  const TensorRef& bt = args.block_table;
  OPENMLA_RETURN_IF_ERROR(check_cuda_tensor(bt, "block_table", {DType::kInt32}, 2));
  OPENMLA_RETURN_IF_ERROR(check_dim(bt, "block_table", 0, b, "batch"));
  if (bt.shape[1] < 1) return invalid("argument 'block_table' has no columns; shape " + shape_string(bt));
  OPENMLA_RETURN_IF_ERROR(check_last_dim_contiguous(bt, "block_table"));
  OPENMLA_RETURN_IF_ERROR(check_fits_int32(bt, "block_table"));
  OPENMLA_RETURN_IF_ERROR(check_lengths(args.cache_seqlens, "cache_seqlens", b));

  // ---- out, lse, schedule and split buffers (shapes not depending on num_sm_parts) ----------------------
  OPENMLA_RETURN_IF_ERROR(check_outputs(problem, args.out, args.lse, q.dtype));
  OPENMLA_RETURN_IF_ERROR(check_schedule_tensors(args.schedule, b));
  OPENMLA_RETURN_IF_ERROR(check_merge_counters(problem, args.schedule));
  OPENMLA_RETURN_IF_ERROR(check_split_buffers(problem, args.split));
  const TensorRef& out = args.out;
  const TensorRef& lse = args.lse;
  const TensorRef& po = args.split.partial_o;
  const TensorRef& pl = args.split.partial_lse;

  // ---- one device -------------------------------------------------------------------------------------------
  const std::pair<const TensorRef*, const char*> others[] = {
      {&k, "k_cache"}, {&bt, "block_table"}, {&args.cache_seqlens, "cache_seqlens"}, {&out, "out"}, {&lse, "lse"},
      {&args.schedule.metadata, "schedule.metadata"}, {&args.schedule.num_splits, "schedule.num_splits"},
      {&po, "split.partial_o"}, {&pl, "split.partial_lse"}};
  for (const auto& [t, name] : others) OPENMLA_RETURN_IF_ERROR(check_same_device(q, "q", *t, name));

  if (!std::isfinite(args.softmax_scale)) {
    detail::MessageStream os;
    os << "argument 'softmax_scale' is " << args.softmax_scale << "; expected a finite value (0: d_qk ** -0.5)";
    return invalid(os.str());
  }

  // ---- sizes depending on num_sm_parts (the only check that may query the device) ----------------------------
  return check_partition_sizes(problem, q.device_id, args.schedule, args.split, num_sm_parts);
}

Status validate_sparse_decode(const DecodeProblem& problem, const SparseDecodeArgs& args, int* num_sm_parts) {
  // ---- The problem ---------------------------------------------------------------------------------
  OPENMLA_RETURN_IF_ERROR(validate_decode_problem(problem));
  if (!problem.sparse) return invalid("argument 'problem.sparse' is false; sparse_decode needs a sparse problem");
  int64_t d_qk = 0, bytes_per_token = 0;
  if (problem.cache_format == KVCacheFormat::kFp8V32) {
    d_qk = 576;
    bytes_per_token = 656;
  } else if (problem.cache_format == KVCacheFormat::kFp8Model1) {
    d_qk = 512;
    bytes_per_token = 584;
  } else {
    return invalid(std::string("argument 'problem.cache_format' is ") + kv_cache_format_name(problem.cache_format) +
                   "; sparse decode reads an FP8 cache ('fp8_v32' or 'fp8_model1')");
  }
  if (problem.d_qk != d_qk)
    return invalid(field_message("d_qk", problem.d_qk,
                                 std::string("the ") + kv_cache_format_name(problem.cache_format) + " layout has d_qk = " +
                                     std::to_string(d_qk)));
  if (problem.h_kv != 1)
    return invalid(field_message("h_kv", problem.h_kv, "sparse decode attends one latent KV head (h_kv = 1)"));
  if (problem.causal) return invalid("argument 'problem.causal' is true; sparse decode takes its mask from the indices");
  if (problem.page_block_size < 1 || problem.page_block_size > kInt32Max)
    return invalid(field_message("page_block_size", problem.page_block_size, "expected >= 1"));
  const bool has_extra = args.extra_k_cache.defined();
  if (has_extra && problem.extra_topk == 0)
    return invalid("argument 'extra_k_cache' was given but problem.extra_topk is 0; set it to extra_indices' last dim");
  if (!has_extra && problem.extra_topk != 0)
    return invalid(field_message("extra_topk", problem.extra_topk, "expected 0 when no extra_k_cache is given"));
  if (!has_extra && (args.extra_indices.defined() || args.extra_topk_length.defined()))
    return invalid(std::string("argument '") + (args.extra_indices.defined() ? "extra_indices" : "extra_topk_length") +
                   "' was given without 'extra_k_cache'");
  if (has_extra && (problem.extra_page_block_size < 1 || problem.extra_page_block_size > kInt32Max))
    return invalid(field_message("extra_page_block_size", problem.extra_page_block_size,
                                 "expected >= 1 (the extra cache's tokens per page)"));
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
  OPENMLA_RETURN_IF_ERROR(check_fp8_cache(args.k_cache, "k_cache", problem.page_block_size, "page_block_size",
                                          bytes_per_token));
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
  OPENMLA_RETURN_IF_ERROR(check_outputs(problem, args.out, args.lse, DType::kBFloat16));
  OPENMLA_RETURN_IF_ERROR(check_schedule_tensors(args.schedule, b));
  OPENMLA_RETURN_IF_ERROR(check_merge_counters(problem, args.schedule));
  OPENMLA_RETURN_IF_ERROR(check_split_buffers(problem, args.split));

  // ---- one device -------------------------------------------------------------------------------------------
  const std::pair<const TensorRef*, const char*> others[] = {
      {&args.k_cache, "k_cache"}, {&args.indices, "indices"}, {&args.topk_length, "topk_length"},
      {&args.attn_sink, "attn_sink"}, {&args.extra_k_cache, "extra_k_cache"}, {&args.extra_indices, "extra_indices"},
      {&args.extra_topk_length, "extra_topk_length"}, {&args.out, "out"}, {&args.lse, "lse"},
      {&args.schedule.metadata, "schedule.metadata"}, {&args.schedule.num_splits, "schedule.num_splits"},
      {&args.split.partial_o, "split.partial_o"}, {&args.split.partial_lse, "split.partial_lse"}};
  for (const auto& [t, name] : others)
    if (t->defined()) OPENMLA_RETURN_IF_ERROR(check_same_device(q, "q", *t, name));

  if (!std::isfinite(args.softmax_scale)) {
    detail::MessageStream os;
    os << "argument 'softmax_scale' is " << args.softmax_scale << "; expected a finite value (0: d_qk ** -0.5)";
    return invalid(os.str());
  }
  return check_partition_sizes(problem, q.device_id, args.schedule, args.split, num_sm_parts);
}

}  // namespace detail

Status get_decode_workspace_sizes(const DecodeProblem& problem, DecodeWorkspaceSizes* sizes) {
  if (sizes == nullptr) return Status::invalid_argument("argument 'sizes' must not be null");
  OPENMLA_RETURN_IF_ERROR(detail::validate_decode_problem(problem));
  int num_sms = problem.num_sms;
  if (num_sms == 0) {
    int device = 0;
    OPENMLA_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device), "cudaGetDevice (problem.num_sms == 0)");
    OPENMLA_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device),
                                 "querying the SM count (problem.num_sms == 0)");
  }
  DecodeWorkspaceSizes s;
  s.num_sm_parts = heuristics::decode_num_sm_parts(problem, num_sms);
  s.metadata_ints = static_cast<int64_t>(s.num_sm_parts) * kDecodeScheduleRecordInts;
  s.num_splits_ints = problem.batch + 1;
  s.partial_rows = (problem.batch + s.num_sm_parts) * problem.s_q * problem.h_q;
  s.partial_o_bytes = static_cast<size_t>(s.partial_rows) * static_cast<size_t>(problem.d_v) * sizeof(float);
  s.partial_lse_bytes = static_cast<size_t>(s.partial_rows) * sizeof(float);
  s.merge_counter_ints = heuristics::decode_merge_counter_count(problem);
  *sizes = s;
  return Status::ok();
}

Status plan_decode(const DecodeProblem& problem, const TensorRef& cache_seqlens, const TensorRef& topk_length,
                   const TensorRef& extra_topk_length, const DecodeSchedule& schedule, cudaStream_t stream) {
  int num_sm_parts = 0;
  OPENMLA_RETURN_IF_ERROR(
      detail::validate_plan_decode(problem, cache_seqlens, topk_length, extra_topk_length, schedule, &num_sm_parts));
  OPENMLA_RETURN_IF_ERROR(detail::check_current_device(schedule.metadata.device_id, "schedule.metadata"));

  const kernels::DecodeSchedulerParams params{
      .batch = static_cast<int>(problem.batch),
      .num_sm_parts = num_sm_parts,
      .sparse = problem.sparse,
      .cache_seqlens = problem.sparse ? nullptr : static_cast<const int32_t*>(cache_seqlens.data),
      .topk = static_cast<int>(problem.topk),
      .topk_length = problem.sparse && topk_length.defined() ? static_cast<const int32_t*>(topk_length.data) : nullptr,
      .extra_topk = problem.sparse ? static_cast<int>(problem.extra_topk) : 0,
      .extra_topk_length =
          problem.sparse && extra_topk_length.defined() ? static_cast<const int32_t*>(extra_topk_length.data) : nullptr,
      .records = static_cast<kernels::DecodeScheduleRecord*>(schedule.metadata.data),
      .num_splits = static_cast<int32_t*>(schedule.num_splits.data),
      .merge_counters = schedule.merge_counters.defined() ? static_cast<int32_t*>(schedule.merge_counters.data) : nullptr,
      .merge_counter_count = schedule.merge_counters.defined() ? heuristics::decode_merge_counter_count(problem) : 0,
      .payload_override = 0,
  };
  return kernels::launch_decode_scheduler(params, stream);
}

Status dense_decode(const DecodeProblem& problem, const DenseDecodeArgs& args, cudaStream_t stream) {
  int num_sm_parts = 0;
  OPENMLA_RETURN_IF_ERROR(detail::validate_dense_decode(problem, args, &num_sm_parts));
  OPENMLA_RETURN_IF_ERROR(detail::check_current_device(args.q.device_id, "q"));

  const int b = static_cast<int>(problem.batch), s_q = static_cast<int>(problem.s_q);
  const int h_q = static_cast<int>(problem.h_q), h_kv = static_cast<int>(problem.h_kv);
  const int q_per_kv = h_q / h_kv;
  const int rows_per_kv_head = s_q * q_per_kv;
  const float scale = args.softmax_scale != 0.f ? args.softmax_scale
                                                : static_cast<float>(1.0 / std::sqrt(static_cast<double>(problem.d_qk)));
  constexpr double kLog2e = 1.4426950408889634;
  const bool is_fp16 = args.q.dtype == DType::kFloat16;
  const auto* records = static_cast<const kernels::DecodeScheduleRecord*>(args.schedule.metadata.data);
  const auto* num_splits = static_cast<const int32_t*>(args.schedule.num_splits.data);
  auto* partial_o = static_cast<float*>(args.split.partial_o.data);
  auto* partial_lse = static_cast<float*>(args.split.partial_lse.data);

  const kernels::DenseDecodeParams params{
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
      .softmax_scale = scale,
      .scale_log2 = static_cast<float>(static_cast<double>(scale) * kLog2e),
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
      .out = args.out.data,
      .out_stride_b = args.out.stride[0],
      .out_stride_s = args.out.stride[1],
      .out_stride_h = args.out.stride[2],
      .lse = static_cast<float*>(args.lse.data),
      .lse_stride_b = args.lse.stride[0],
      .lse_stride_h = args.lse.stride[1],
      .lse_stride_s = args.lse.stride[2],
      .partial_o = partial_o,
      .partial_lse = partial_lse,
      .schedule = records,
      .num_splits = num_splits,
      .merge_counters = args.schedule.merge_counters.defined() ? static_cast<int*>(args.schedule.merge_counters.data)
                                                               : nullptr,
      .merge_publish_always = detail::g_merge_publish_always.load(),
  };
  OPENMLA_RETURN_IF_ERROR(kernels::launch_dense_decode(params, stream));

  // Always launched: which requests were split is only known on the device (num_splits), and a fixed
  // launch sequence keeps the call graph-capturable. Unsplit requests exit in the prologue.
  const kernels::CombineParams combine{
      .batch = b,
      .s_q = s_q,
      .h_q = h_q,
      .h_kv = h_kv,
      .q_per_kv = q_per_kv,
      .is_fp16 = is_fp16,
      .partial_o = partial_o,
      .partial_lse = partial_lse,
      .num_splits = num_splits,
      .attn_sink = nullptr,  // dense decode has no sink
      .merged_in_kernel = params.merge_counters != nullptr ? kernels::kMaxMergeChunks : 1,
      .out = args.out.data,
      .out_stride_b = args.out.stride[0],
      .out_stride_s = args.out.stride[1],
      .out_stride_h = args.out.stride[2],
      .lse = static_cast<float*>(args.lse.data),
      .lse_stride_b = args.lse.stride[0],
      .lse_stride_h = args.lse.stride[1],
      .lse_stride_s = args.lse.stride[2],
  };
  return kernels::launch_combine(combine, stream);
}

Status sparse_decode(const DecodeProblem& problem, const SparseDecodeArgs& args, cudaStream_t stream) {
  int num_sm_parts = 0;
  OPENMLA_RETURN_IF_ERROR(detail::validate_sparse_decode(problem, args, &num_sm_parts));
  OPENMLA_RETURN_IF_ERROR(detail::check_current_device(args.q.device_id, "q"));

  const int b = static_cast<int>(problem.batch), s_q = static_cast<int>(problem.s_q);
  const int h_q = static_cast<int>(problem.h_q);
  const float scale = args.softmax_scale != 0.f ? args.softmax_scale
                                                : static_cast<float>(1.0 / std::sqrt(static_cast<double>(problem.d_qk)));
  constexpr double kLog2e = 1.4426950408889634;
  const auto* records = static_cast<const kernels::DecodeScheduleRecord*>(args.schedule.metadata.data);
  const auto* num_splits = static_cast<const int32_t*>(args.schedule.num_splits.data);
  auto* partial_o = static_cast<float*>(args.split.partial_o.data);
  auto* partial_lse = static_cast<float*>(args.split.partial_lse.data);
  auto cache_view = [](const TensorRef& cache, const TensorRef& indices, const TensorRef& lengths, int64_t topk) {
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
  };
  const bool has_extra = args.extra_k_cache.defined();
  const int num_head_blocks = (h_q + 63) / 64;
  // Small batch with the work per request fixed by topk alone: the records are known on the host (the CPU twin of
  // the scheduler, one pass) and go to the kernel in its parameters (perf-notes sparse v20).
  int uniform_blocks = 0;
  int64_t uniform_payload = 0;
  if (b <= detail::kSparseHostRecordsMaxBatch && !args.topk_length.defined() &&
      (!has_extra || !args.extra_topk_length.defined())) {
    uniform_blocks = heuristics::sparse_request_blocks(problem.topk, nullptr, has_extra ? problem.extra_topk : 0, nullptr);
    uniform_payload = heuristics::decode_payload(
        static_cast<int64_t>(b) * (uniform_blocks + kernels::kDecodeRequestOverheadBlocks), num_sm_parts);
  }
  // Crossover pairs or the plain kernel (heuristics::sparse_use_crossover): the blocks per partition are known here
  // when the schedule is uniform (payload = ceil(total / parts) + overhead).
  const bool crossover = heuristics::sparse_use_crossover(
      num_head_blocks, uniform_blocks > 0 ? uniform_payload - kernels::kDecodeRequestOverheadBlocks : 0);
  kernels::SparseDecodeParams params{
      .batch = b,
      .s_q = s_q,
      .h_q = h_q,
      .num_head_blocks = num_head_blocks,
      .num_sm_parts = num_sm_parts,
      .is_model1 = problem.cache_format == KVCacheFormat::kFp8Model1,
      .crossover = crossover,
      .softmax_scale = scale,
      .scale_log2 = static_cast<float>(static_cast<double>(scale) * kLog2e),
      .q = args.q.data,
      .q_stride_b = args.q.stride[0],
      .q_stride_s = args.q.stride[1],
      .q_stride_h = args.q.stride[2],
      .main = cache_view(args.k_cache, args.indices, args.topk_length, problem.topk),
      .has_extra = has_extra,
      .extra = has_extra ? cache_view(args.extra_k_cache, args.extra_indices, args.extra_topk_length, problem.extra_topk)
                         : kernels::SparseCacheView{},
      .attn_sink = args.attn_sink.defined() ? static_cast<const float*>(args.attn_sink.data) : nullptr,
      .out = args.out.data,
      .out_stride_b = args.out.stride[0],
      .out_stride_s = args.out.stride[1],
      .out_stride_h = args.out.stride[2],
      .lse = static_cast<float*>(args.lse.data),
      .lse_stride_b = args.lse.stride[0],
      .lse_stride_h = args.lse.stride[1],
      .lse_stride_s = args.lse.stride[2],
      .partial_o = partial_o,
      .partial_lse = partial_lse,
      .schedule = records,
      .num_splits = num_splits,
      .uniform_blocks = uniform_blocks,
      .uniform_records = {},
  };
  // Every partition's record, packed; a record that does not pack sends the kernel back to the schedule. The pass
  // takes the payload computed above (the same formula) instead of computing it again.
  if (uniform_blocks > 0) {
    const heuristics::DecodeScheduleHost host = heuristics::build_decode_schedule(
        std::vector<int32_t>(static_cast<size_t>(b), uniform_blocks), std::vector<bool>(static_cast<size_t>(b), false),
        num_sm_parts, uniform_payload);
    if (!host.all_assigned) params.uniform_blocks = 0;
    for (int part = 0; params.uniform_blocks > 0 && part < num_sm_parts; ++part)
      if (!kernels::pack_partition_record(host.records[part], params.uniform_records[part])) params.uniform_blocks = 0;
  }
  OPENMLA_RETURN_IF_ERROR(kernels::launch_sparse_decode(params, stream));

  const kernels::CombineParams combine{
      .batch = b,
      .s_q = s_q,
      .h_q = h_q,
      .h_kv = 1,
      .q_per_kv = h_q,
      .is_fp16 = false,
      .partial_o = partial_o,
      .partial_lse = partial_lse,
      .num_splits = num_splits,
      .attn_sink = params.attn_sink,
      .merged_in_kernel = 1,  // the sparse main kernel writes every split chunk's partial
      .out = args.out.data,
      .out_stride_b = args.out.stride[0],
      .out_stride_s = args.out.stride[1],
      .out_stride_h = args.out.stride[2],
      .lse = static_cast<float*>(args.lse.data),
      .lse_stride_b = args.lse.stride[0],
      .lse_stride_h = args.lse.stride[1],
      .lse_stride_s = args.lse.stride[2],
  };
  return kernels::launch_combine(combine, stream);
}

}  // namespace openmla
