// Public dense MHA prefill API (include/openmla/prefill.h): validate -> launch plan -> build params -> launch.
//
// Every argument check runs before the first CUDA call, so a bad call launches nothing and the checks are tested
// without a GPU (tests/cpp/test_mha_prefill_api.cpp).
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "api/families.h"
#include "api/mha_prefill_internal.h"
#include "api/validate.h"
#include "common/varlen.h"
#include "heuristics/mha_prefill_launch.h"
#include "kernels/mha_prefill/params.h"
#include "kernels/mha_prefill/params_fp8.h"
#include "openmla/prefill.h"

namespace openmla {

namespace detail {

namespace {

using kernels::varlen::kMaxRows;

// The largest stride (elements) of a TMA-loaded operand: the maps' shift dimension has byte stride 2^34 - row bytes
// (kernels/mha_prefill/launch.cu), which must stay positive.
constexpr int64_t kMaxRowStride = int64_t{1} << 32;
// Tile numbers (and the counter that hands them out, plus the grid) stay below 2^31.
constexpr int64_t kMaxTiles = kInt32Max - (int64_t{1} << 16);

constexpr const char* kDtypeRule = "problem.dtype: q, k, v and out share one dtype";

}  // namespace

// The heads, head dimensions and dtype rules of the forward and the backward (`supported`: the message's tail).
Status check_heads_and_shape(int64_t h_q, int64_t h_kv, int64_t d_qk, int64_t d_v, DType dtype, const char* supported) {
  if (h_kv < 1) return invalid_field("h_kv", h_kv, "must be >= 1");
  if (h_q < 1 || h_q % h_kv != 0) {
    MessageStream os;
    os << "must be a positive multiple of h_kv = " << h_kv << " (each kv head serves h_q / h_kv query heads)";
    return invalid_field("h_q", h_q, os.str());
  }
  if (h_q > 65536) return invalid_field("h_q", h_q, "must be at most 65536");
  if (!((d_qk == 192 || d_qk == 128) && d_v == 128)) {
    MessageStream os;
    os << "argument 'problem.d_qk' / 'problem.d_v' is " << d_qk << " / " << d_v << "; " << supported;
    return Status::unsupported(os.str());
  }
  if (dtype != DType::kBFloat16 && dtype != DType::kFloat16)
    return invalid_field("dtype", dtype_name(dtype), "must be bfloat16 or float16");
  return Status::ok();
}

namespace {

Status check_problem(const MhaPrefillProblem& p) {
  if (p.batch < 1) return invalid_field("batch", p.batch, "must be >= 1 (the number of sequences)");
  if (p.batch > kInt32Max - 1) return invalid_field("batch", p.batch, "must be below 2^31 - 1");
  if (p.dtype != DType::kBFloat16 && p.dtype != DType::kFloat16 && p.dtype != DType::kFloat8E4M3)
    return invalid_field("dtype", dtype_name(p.dtype), "must be bfloat16, float16 or float8_e4m3fn (FP8, forward only)");
  // The FP8 forward serves the 16-bit kernels' shapes (the dtype rule is checked above).
  const DType shape_dtype = p.dtype == DType::kFloat8E4M3 ? DType::kBFloat16 : p.dtype;
  OPENMLA_RETURN_IF_ERROR(check_heads_and_shape(p.h_q, p.h_kv, p.d_qk, p.d_v, shape_dtype,
                                                "dense MHA prefill supports (d_qk, d_v) = (192, 128) (MLA: 128 NoPE + "
                                                "64 RoPE) or (128, 128)"));
  if (p.max_seqlen_qo < 0) return invalid_field("max_seqlen_qo", p.max_seqlen_qo, "must be >= 0 (0: unknown)");
  if (p.num_sms < 0) return invalid_field("num_sms", p.num_sms, "must be >= 0 (0: the current device's SM count)");
  const int epilogue = static_cast<int>(p.epilogue);
  if (epilogue < 0 || epilogue > 2)
    return invalid_field("epilogue", epilogue, "must be MhaPrefillEpilogue kAuto (0), kRegisters (1) or kStaged (2)");
  return Status::ok();
}

// Every tensor argument with the strides of its size-1 dimensions replaced (api/validate.h, canonical()).
MhaPrefillArgs canonical_args(const MhaPrefillArgs& args) {
  MhaPrefillArgs c = args;
  for (TensorRef* t : {&c.q, &c.k, &c.v, &c.cu_seqlens_qo, &c.cu_seqlens_kv, &c.workspace, &c.out, &c.lse})
    *t = canonical(*t);
  return c;
}

// The layout part of a (rows, heads, cols) operand's checks: its heads and cols, at most 2^30 rows, last dim
// contiguous, the other strides positive multiples of `stride_elems` elements (16 bytes; `why` says so in the
// message) below kMaxRowStride, 16-byte aligned.
Status check_rows_layout(const TensorRef& t, const char* name, int64_t heads, const char* heads_what, int64_t cols,
                         const char* cols_what, int64_t stride_elems, const char* why) {
  OPENMLA_RETURN_IF_ERROR(check_dim(t, name, 1, heads, heads_what));
  OPENMLA_RETURN_IF_ERROR(check_dim(t, name, 2, cols, cols_what));
  if (t.shape[0] > kMaxRows) {
    MessageStream os;
    os << "argument '" << name << "' has " << t.shape[0] << " rows; at most 2^30 are supported (shape "
       << shape_string(t) << ")";
    return invalid(os.str());
  }
  OPENMLA_RETURN_IF_ERROR(check_last_dim_contiguous(t, name));
  for (int i = 0; i < 2; ++i) {
    const int64_t s = used_stride(t, i);
    if (s <= 0 || s % stride_elems != 0 || s >= kMaxRowStride) {
      MessageStream os;
      os << "argument '" << name << "' has stride " << t.stride[i] << " in dimension " << i
         << ", which must be a positive multiple of " << stride_elems << " elements (" << why
         << ") below 2^32; strides " << stride_string(t);
      return invalid(os.str());
    }
  }
  return check_pointer_aligned(t, name, 16);
}

constexpr const char* kFp8OutRule = "the output of float8_e4m3fn q, k, v is bfloat16 or float16";

// An FP8 (rows, heads, cols) operand loaded by TMA: float8_e4m3fn, last dim contiguous, the other strides positive
// multiples of 16 elements (16 bytes) below kMaxRowStride, 16-byte aligned, at most 2^30 rows.
Status check_rows_operand_e4m3(const TensorRef& given, const char* name, int64_t heads, const char* heads_what,
                               int64_t cols, const char* cols_what) {
  const bool empty = given.data == nullptr && given.ndim == 3 && given.shape[0] == 0;
  TensorRef t = given;
  if (empty) t.data = reinterpret_cast<void*>(uintptr_t{256});
  OPENMLA_RETURN_IF_ERROR(check_on_cuda(t, name));
  if (t.dtype != DType::kFloat8E4M3) {
    MessageStream os;
    os << "argument '" << name << "' has dtype " << dtype_name(t.dtype)
       << ", expected float8_e4m3fn (problem.dtype: q, k and v share one dtype)";
    return invalid(os.str());
  }
  OPENMLA_RETURN_IF_ERROR(check_cuda_tensor(t, name, {DType::kFloat8E4M3}, 3));
  return check_rows_layout(t, name, heads, heads_what, cols, cols_what, 16,
                           "16 bytes of float8_e4m3fn: rows are moved by TMA");
}

// A descale of the FP8 forward: absent, or float32 on q's device of shape (batch, h_kv) (any strides) or one value.
// Fills the element strides the kernel reads it with (0, 0 for one value).
Status check_descale(const TensorRef& t, const char* name, bool fp8, int64_t batch, int64_t h_kv, const TensorRef& q,
                     int64_t* stride_b, int64_t* stride_h) {
  *stride_b = *stride_h = 0;
  if (!t.defined()) return Status::ok();
  if (!fp8) {
    MessageStream os;
    os << "argument '" << name << "': only float8_e4m3fn q, k, v take descales (problem.dtype is " << dtype_name(q.dtype)
       << ")";
    return invalid(os.str());
  }
  OPENMLA_RETURN_IF_ERROR(check_on_cuda(t, name));
  OPENMLA_RETURN_IF_ERROR(check_dtype(t, name, {DType::kFloat32}));
  if (!t.valid_ndim()) return check_ndim(t, name, 2);
  OPENMLA_RETURN_IF_ERROR(check_strides_sane(t, name));
  OPENMLA_RETURN_IF_ERROR(check_pointer_aligned(t, name, 4));
  OPENMLA_RETURN_IF_ERROR(check_same_device(q, "q", t, name));
  const bool single = t.numel() == 1 && t.ndim <= 2;
  if (t.ndim == 2 && t.shape[0] == batch && t.shape[1] == h_kv) {
    *stride_b = t.shape[0] > 1 ? t.stride[0] : 0;
    *stride_h = t.shape[1] > 1 ? t.stride[1] : 0;
    return Status::ok();
  }
  if (single) return Status::ok();
  MessageStream os;
  os << "argument '" << name << "' has shape " << shape_string(t) << "; expected (batch, h_kv) = (" << batch << ", "
     << h_kv << ") or a single value";
  return invalid(os.str());
}

}  // namespace

// The stride of dimension `dim`, or the packed value when the dimension has size 1 (its stride is never stepped, and
// frameworks leave anything there).
int64_t used_stride(const TensorRef& t, int dim) {
  if (t.shape[dim] > 1) return t.stride[dim];
  int64_t packed = 1;
  for (int i = dim + 1; i < t.ndim; ++i) packed *= t.shape[i] > 0 ? t.shape[i] : 1;
  return packed;
}

// A (rows, heads, cols) operand moved by TMA or 16-byte stores: `dtype`, last dim contiguous, the other strides
// positive multiples of 8 elements (16 bytes) below kMaxRowStride, 16-byte aligned.
// A tensor of no rows may come without a data pointer (frameworks allocate nothing for it); it is never read.
Status check_rows_operand(const TensorRef& given, const char* name, DType dtype, int64_t heads, const char* heads_what,
                          int64_t cols, const char* cols_what, const char* dtype_rule) {
  const bool empty = given.data == nullptr && given.ndim == 3 && given.shape[0] == 0;
  TensorRef t = given;
  if (empty) t.data = reinterpret_cast<void*>(uintptr_t{256});  // checked as if it had an (aligned) address
  OPENMLA_RETURN_IF_ERROR(check_cuda_tensor(t, name, {DType::kBFloat16, DType::kFloat16}, 3));
  if (t.dtype != dtype) {
    MessageStream os;
    os << "argument '" << name << "' has dtype " << dtype_name(t.dtype) << ", expected " << dtype_name(dtype)
       << " (" << dtype_rule << ")";
    return invalid(os.str());
  }
  return check_rows_layout(t, name, heads, heads_what, cols, cols_what, 8,
                           "16 bytes: rows are moved by TMA and 16-byte stores");
}

namespace {

// validate_mha_prefill's body; `descale_strides` (when not null) receives the descales' element strides (b, h) x 3.
Status validate_mha_prefill_impl(const MhaPrefillProblem& pr, const MhaPrefillArgs& args,
                                 kernels::MhaPrefillParams* params, int64_t (*descale_strides)[2]) {
  OPENMLA_RETURN_IF_ERROR(check_problem(pr));
  const MhaPrefillArgs a = canonical_args(args);
  const bool fp8 = pr.dtype == DType::kFloat8E4M3;
  auto check_operand = [&](const TensorRef& t, const char* name, int64_t heads, const char* heads_what, int64_t cols,
                           const char* cols_what) {
    return fp8 ? check_rows_operand_e4m3(t, name, heads, heads_what, cols, cols_what)
               : check_rows_operand(t, name, pr.dtype, heads, heads_what, cols, cols_what, kDtypeRule);
  };

  // ---- q, k, v
  OPENMLA_RETURN_IF_ERROR(check_operand(a.q, "q", pr.h_q, "h_q", pr.d_qk, "d_qk"));
  const int64_t total_q = a.q.shape[0];
  const int64_t max_tiles = heuristics::mha_prefill_max_tiles(pr.batch, total_q, pr.h_q, 0);
  if (max_tiles > kMaxTiles) {
    MessageStream os;
    os << "argument 'q' has " << total_q << " rows x " << pr.h_q << " heads in " << pr.batch << " sequences: up to "
       << max_tiles
       << " tiles of 128 rows, more than the 2^31 - 2^16 one call supports "
          "(split the call)";
    return invalid(os.str());
  }
  OPENMLA_RETURN_IF_ERROR(check_operand(a.k, "k", pr.h_kv, "h_kv", pr.d_qk, "d_qk"));
  OPENMLA_RETURN_IF_ERROR(check_same_device(a.q, "q", a.k, "k"));
  const int64_t total_k = a.k.shape[0];
  OPENMLA_RETURN_IF_ERROR(check_operand(a.v, "v", pr.h_kv, "h_kv", pr.d_v, "d_v"));
  OPENMLA_RETURN_IF_ERROR(check_same_device(a.q, "q", a.v, "v"));
  OPENMLA_RETURN_IF_ERROR(check_dim(a.v, "v", 0, total_k, "total_k, as k"));

  // ---- cumulative lengths
  OPENMLA_RETURN_IF_ERROR(check_lengths(a.cu_seqlens_qo, "cu_seqlens_qo", pr.batch + 1, "batch + 1"));
  OPENMLA_RETURN_IF_ERROR(check_same_device(a.q, "q", a.cu_seqlens_qo, "cu_seqlens_qo"));
  OPENMLA_RETURN_IF_ERROR(check_pointer_aligned(a.cu_seqlens_qo, "cu_seqlens_qo", 4));
  OPENMLA_RETURN_IF_ERROR(check_lengths(a.cu_seqlens_kv, "cu_seqlens_kv", pr.batch + 1, "batch + 1"));
  OPENMLA_RETURN_IF_ERROR(check_same_device(a.q, "q", a.cu_seqlens_kv, "cu_seqlens_kv"));
  OPENMLA_RETURN_IF_ERROR(check_pointer_aligned(a.cu_seqlens_kv, "cu_seqlens_kv", 4));

  // ---- scalars
  const double scale = a.softmax_scale == 0.f ? 1.0 / std::sqrt(static_cast<double>(pr.d_qk)) : a.softmax_scale;
  if (!(scale > 0.0) || !std::isfinite(scale)) {
    MessageStream os;
    os << "argument 'softmax_scale' is " << a.softmax_scale
       << "; it must be a positive finite number (0: d_qk ** -0.5)";
    return invalid(os.str());
  }

  // ---- workspace and outputs
  OPENMLA_RETURN_IF_ERROR(check_on_cuda(a.workspace, "workspace"));
  OPENMLA_RETURN_IF_ERROR(check_same_device(a.q, "q", a.workspace, "workspace"));
  OPENMLA_RETURN_IF_ERROR(check_contiguous(a.workspace, "workspace"));
  OPENMLA_RETURN_IF_ERROR(check_pointer_aligned(a.workspace, "workspace", 16));
  const auto ws_bytes = static_cast<size_t>(a.workspace.numel()) * a.workspace.element_size();
  if (ws_bytes < heuristics::kMhaPrefillWorkspaceBytes) {
    MessageStream os;
    os << "argument 'workspace' has " << ws_bytes << " bytes; get_mha_prefill_workspace_size asks for "
       << heuristics::kMhaPrefillWorkspaceBytes;
    return invalid(os.str());
  }
  const DType out_dtype = fp8 ? (a.out.dtype == DType::kFloat16 ? DType::kFloat16 : DType::kBFloat16) : pr.dtype;
  OPENMLA_RETURN_IF_ERROR(
      check_rows_operand(a.out, "out", out_dtype, pr.h_q, "h_q", pr.d_v, "d_v", fp8 ? kFp8OutRule : kDtypeRule));
  OPENMLA_RETURN_IF_ERROR(check_same_device(a.q, "q", a.out, "out"));
  OPENMLA_RETURN_IF_ERROR(check_dim(a.out, "out", 0, total_q, "total_q, as q"));
  OPENMLA_RETURN_IF_ERROR(check_cuda_tensor(a.lse, "lse", {DType::kFloat32}, 2));
  OPENMLA_RETURN_IF_ERROR(check_same_device(a.q, "q", a.lse, "lse"));
  OPENMLA_RETURN_IF_ERROR(check_dim(a.lse, "lse", 0, total_q, "total_q, as q"));
  OPENMLA_RETURN_IF_ERROR(check_dim(a.lse, "lse", 1, pr.h_q, "h_q"));
  OPENMLA_RETURN_IF_ERROR(check_pointer_aligned(a.lse, "lse", 4));
  OPENMLA_RETURN_IF_ERROR(check_no_self_overlap(a.out, "out"));
  OPENMLA_RETURN_IF_ERROR(check_no_self_overlap(a.lse, "lse"));
  // ---- descales (FP8 only)
  int64_t strides[3][2];
  OPENMLA_RETURN_IF_ERROR(
      check_descale(a.q_descale, "q_descale", fp8, pr.batch, pr.h_kv, a.q, &strides[0][0], &strides[0][1]));
  OPENMLA_RETURN_IF_ERROR(
      check_descale(a.k_descale, "k_descale", fp8, pr.batch, pr.h_kv, a.q, &strides[1][0], &strides[1][1]));
  OPENMLA_RETURN_IF_ERROR(
      check_descale(a.v_descale, "v_descale", fp8, pr.batch, pr.h_kv, a.q, &strides[2][0], &strides[2][1]));
  if (descale_strides != nullptr)
    for (int i = 0; i < 3; ++i) descale_strides[i][0] = strides[i][0], descale_strides[i][1] = strides[i][1];
  OPENMLA_RETURN_IF_ERROR(check_disjoint({{&a.out, "out"}, {&a.lse, "lse"}, {&a.workspace, "workspace"}},
                                         {{&a.q, "q"},
                                          {&a.k, "k"},
                                          {&a.v, "v"},
                                          {&a.cu_seqlens_qo, "cu_seqlens_qo"},
                                          {&a.cu_seqlens_kv, "cu_seqlens_kv"},
                                          {&a.q_descale, "q_descale"},
                                          {&a.k_descale, "k_descale"},
                                          {&a.v_descale, "v_descale"}}));

  if (params != nullptr) {
    const heuristics::MhaPrefillLaunchPlan plan =
        heuristics::plan_mha_prefill_launch(pr, total_q, pr.num_sms > 0 ? pr.num_sms : 1);
    kernels::MhaPrefillParams& p = *params;
    p = kernels::MhaPrefillParams{};
    p.seqs = kernels::varlen::VarlenBatch{.batch = static_cast<int>(pr.batch),
                                          .total_q = static_cast<int>(total_q),
                                          .total_k = static_cast<int>(total_k),
                                          .cu_seqlens_q = static_cast<const int32_t*>(a.cu_seqlens_qo.data),
                                          .cu_seqlens_k = static_cast<const int32_t*>(a.cu_seqlens_kv.data)};
    p.h_q = static_cast<int>(pr.h_q);
    p.h_kv = static_cast<int>(pr.h_kv);
    p.heads_per_kv = static_cast<int>(pr.h_q / pr.h_kv);
    p.d_qk = static_cast<int>(pr.d_qk);
    p.fp16 = pr.dtype == DType::kFloat16;  // FP8: unused (false)
    p.causal = pr.causal;
    p.scale_log2 = static_cast<float>(scale * 1.4426950408889634);
    p.q = a.q.data;
    p.q_stride_t = used_stride(a.q, 0);
    p.q_stride_h = used_stride(a.q, 1);
    // Without keys no K or V row is ever loaded, but the maps are still built: give them q's (valid, aligned) address.
    p.k = total_k > 0 ? a.k.data : a.q.data;
    p.k_stride_t = used_stride(a.k, 0);
    p.k_stride_h = used_stride(a.k, 1);
    p.v = total_k > 0 ? a.v.data : a.q.data;
    p.v_stride_t = used_stride(a.v, 0);
    p.v_stride_h = used_stride(a.v, 1);
    p.output = kernels::OutputView::for_tokens(a.out.data, a.out.stride[0], a.out.stride[1],
                                               static_cast<float*>(a.lse.data), a.lse.stride[0], a.lse.stride[1]);
    p.grid = plan.grid;
    p.dynamic_tiles = plan.dynamic_tiles;
    p.staged_out = plan.staged_out;
    p.tile_counter = static_cast<int*>(a.workspace.data);
  }
  return Status::ok();
}

}  // namespace

Status validate_mha_prefill(const MhaPrefillProblem& pr, const MhaPrefillArgs& args,
                            kernels::MhaPrefillParams* params) {
  return validate_mha_prefill_impl(pr, args, params, nullptr);
}

Status validate_mha_prefill_fp8(const MhaPrefillProblem& pr, const MhaPrefillArgs& args,
                                kernels::MhaPrefillFp8Params* params) {
  if (pr.dtype != DType::kFloat8E4M3)
    return Status::internal("validate_mha_prefill_fp8: problem.dtype is not float8_e4m3fn");
  int64_t strides[3][2] = {};
  OPENMLA_RETURN_IF_ERROR(validate_mha_prefill_impl(pr, args, params ? &params->base : nullptr, strides));
  if (params != nullptr) {
    kernels::MhaPrefillFp8Params& p = *params;
    p.base.fp16 = false;
    p.base.staged_out = false;  // the FP8 kernel stores O from the registers
    p.out_fp16 = args.out.dtype == DType::kFloat16;
    p.block_n = heuristics::mha_prefill_fp8_block_n();
    if (p.block_n == 0) {
      const char* env = std::getenv(heuristics::kMhaPrefillFp8BlockNEnv);  // read once by the heuristics; quoted here
      return Status::invalid_argument(std::string("environment variable ") + heuristics::kMhaPrefillFp8BlockNEnv +
                                      " is '" + (env != nullptr ? env : "") +
                                      "'; expected 128 or 192 (the FP8 forward's key block), or unset");
    }
    p.q_descale = static_cast<const float*>(args.q_descale.data);
    p.q_descale_stride_b = strides[0][0];
    p.q_descale_stride_h = strides[0][1];
    p.k_descale = static_cast<const float*>(args.k_descale.data);
    p.k_descale_stride_b = strides[1][0];
    p.k_descale_stride_h = strides[1][1];
    p.v_descale = static_cast<const float*>(args.v_descale.data);
    p.v_descale_stride_b = strides[2][0];
    p.v_descale_stride_h = strides[2][1];
  }
  return Status::ok();
}

}  // namespace detail

Status get_mha_prefill_workspace_size(const MhaPrefillProblem& problem, MhaPrefillWorkspaceSizes* sizes) {
  if (sizes == nullptr) return Status::invalid_argument("argument 'sizes' must not be null");
  OPENMLA_RETURN_IF_ERROR(detail::check_problem(problem));
  sizes->workspace_bytes = heuristics::kMhaPrefillWorkspaceBytes;
  return Status::ok();
}

namespace {

// The FP8 forward (problem.dtype = kFloat8E4M3): the same plan, the FP8 kernel.
Status mha_prefill_fp8(const MhaPrefillProblem& problem, const MhaPrefillArgs& args, cudaStream_t stream) {
  kernels::MhaPrefillFp8Params params;
  OPENMLA_RETURN_IF_ERROR(detail::validate_mha_prefill_fp8(problem, args, &params));
#if !defined(OPENMLA_HAS_MHA_PREFILL)
  (void)stream;
  return detail::family_not_built(detail::KernelFamily::kMhaPrefill, "mha_prefill");
#else
  OPENMLA_RETURN_IF_ERROR(detail::check_launch_context(args.q.device_id, "q", stream, "mha_prefill"));
  if (problem.num_sms == 0) {
    int num_sms = 0;
    OPENMLA_RETURN_IF_ERROR(detail::device_sm_count(args.q.device_id, &num_sms, "dense MHA prefill: SM count"));
    params.base.grid = heuristics::plan_mha_prefill_launch(problem, params.base.seqs.total_q, num_sms).grid;
  }
  if (params.base.grid == 0) return Status::ok();
  if (params.base.dynamic_tiles)
    OPENMLA_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(params.base.tile_counter, 0, sizeof(int), stream),
                                 "dense MHA prefill: resetting the tile counter");
  return kernels::launch_mha_prefill_fp8(params, stream);
#endif
}

}  // namespace

Status mha_prefill(const MhaPrefillProblem& problem, const MhaPrefillArgs& args, cudaStream_t stream) {
  if (problem.dtype == DType::kFloat8E4M3) return mha_prefill_fp8(problem, args, stream);
  // Checks first, so that argument errors are reported whether or not the family is built.
  kernels::MhaPrefillParams params;
  OPENMLA_RETURN_IF_ERROR(detail::validate_mha_prefill(problem, args, &params));
#if !defined(OPENMLA_HAS_MHA_PREFILL)
  (void)stream;
  return detail::family_not_built(detail::KernelFamily::kMhaPrefill, "mha_prefill");
#else
  OPENMLA_RETURN_IF_ERROR(detail::check_launch_context(args.q.device_id, "q", stream, "mha_prefill"));
  if (problem.num_sms == 0) {
    int num_sms = 0;
    OPENMLA_RETURN_IF_ERROR(detail::device_sm_count(args.q.device_id, &num_sms, "dense MHA prefill: SM count"));
    params.grid = heuristics::plan_mha_prefill_launch(problem, params.seqs.total_q, num_sms).grid;
  }
  if (params.grid == 0) return Status::ok();  // no query row: nothing to write
  if (params.dynamic_tiles)
    OPENMLA_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(params.tile_counter, 0, sizeof(int), stream),
                                 "dense MHA prefill: resetting the tile counter");
  return kernels::launch_mha_prefill(params, stream);
#endif
}

}  // namespace openmla
