// Public dense MHA prefill backward API (include/openmla/prefill.h): validate -> workspace layout -> params -> reset
// the workspace -> launch the three kernels (kernels/mha_prefill_bwd/kernel.cuh).
//
// Every argument check runs before the first CUDA call (tests/cpp/test_mha_prefill_bwd_api.cpp).
#include <cmath>
#include <cstdint>
#include <string>

#include "api/families.h"
#include "api/mha_prefill_internal.h"
#include "api/validate.h"
#include "common/varlen.h"
#include "kernels/mha_prefill_bwd/config.h"
#include "kernels/mha_prefill_bwd/params.h"
#include "openmla/prefill.h"

namespace openmla {

namespace detail {

namespace {

using kernels::varlen::kMaxRows;
constexpr const char* kDtypeRule = "problem.dtype: q, k, v, out, dout, dq, dk and dv share one dtype";

Status check_bwd_problem(const MhaPrefillBwdProblem& p) {
  if (p.batch < 1) return invalid_field("batch", p.batch, "must be >= 1 (the number of sequences)");
  if (p.batch > (int64_t{1} << 24)) return invalid_field("batch", p.batch, "must be at most 2^24");
  if (p.total_q < 0 || p.total_q > kMaxRows)
    return invalid_field("total_q", p.total_q, "must be in [0, 2^30] (the rows of q)");
  OPENMLA_RETURN_IF_ERROR(check_heads_and_shape(
      p.h_q, p.h_kv, p.d_qk, p.d_v, p.dtype,
      "the dense MHA prefill backward supports (d_qk, d_v) = (192, 128) or (128, 128)"));
  if (p.num_sms < 0) return invalid_field("num_sms", p.num_sms, "must be >= 0 (0: the current device's SM count)");
  // Indices of the accumulator and of the auxiliary kernels' threads stay far below 2^63 / 2^31 blocks.
  const int64_t pad_blocks = kernels::mha_prefill_bwd::dq_padded_blocks(p.total_q, p.batch);
  if (pad_blocks * p.h_q > (int64_t{1} << 31) - 1) {
    MessageStream os;
    os << "argument 'problem.total_q' is " << p.total_q << " with h_q = " << p.h_q << " and batch = " << p.batch
       << ": more than 2^31 blocks of 64 rows in the dq accumulator (split the call)";
    return invalid(os.str());
  }
  return Status::ok();
}

size_t align256(size_t x) { return (x + 255) / 256 * 256; }

// Persistent CTAs of the main kernel: at most one per SM and per tile (a sequence has at most s_k / 128 + 1 key
// blocks per kv head).
int bwd_grid(int64_t h_kv, int64_t total_k, int64_t batch, int sms) {
  const int64_t max_tiles = h_kv * (total_k / kernels::mha_prefill_bwd::kBlockN + batch);
  return static_cast<int>(max_tiles < sms ? max_tiles : sms);
}

MhaPrefillBwdArgs canonical_bwd_args(const MhaPrefillBwdArgs& args) {
  MhaPrefillBwdArgs c = args;
  for (TensorRef* t : {&c.q, &c.k, &c.v, &c.out, &c.dout, &c.lse, &c.cu_seqlens_qo, &c.cu_seqlens_kv, &c.workspace,
                       &c.dq, &c.dk, &c.dv})
    *t = canonical(*t);
  return c;
}

}  // namespace

MhaPrefillBwdWorkspaceLayout mha_prefill_bwd_workspace_layout(const MhaPrefillBwdProblem& p) {
  MhaPrefillBwdWorkspaceLayout l{};
  l.pad_blocks = kernels::mha_prefill_bwd::dq_padded_blocks(p.total_q, p.batch);
  const size_t stat_bytes = static_cast<size_t>(p.h_q) * l.pad_blocks * 64 * sizeof(float);
  // The base-2 lse first (reset to a huge value), then everything reset to 0 in one memset.
  l.lse2 = 0;
  l.tile_counter = align256(stat_bytes);
  l.dq_order = l.tile_counter + 256;
  l.dsum = align256(l.dq_order + static_cast<size_t>(p.h_q) * l.pad_blocks * sizeof(int));
  l.dq_accum = align256(l.dsum + stat_bytes);
  l.end = l.dq_accum + static_cast<size_t>(p.h_q) * l.pad_blocks * (p.d_qk / 64) *
                           kernels::mha_prefill_bwd::kSubBlockFloats * sizeof(float);
  return l;
}

Status validate_mha_prefill_bwd(const MhaPrefillBwdProblem& pr, const MhaPrefillBwdArgs& args,
                                kernels::MhaPrefillBwdParams* params) {
  OPENMLA_RETURN_IF_ERROR(check_bwd_problem(pr));
  const MhaPrefillBwdArgs a = canonical_bwd_args(args);

  // ---- q, k, v, out, dout
  OPENMLA_RETURN_IF_ERROR(check_rows_operand(a.q, "q", pr.dtype, pr.h_q, "h_q", pr.d_qk, "d_qk", kDtypeRule));
  OPENMLA_RETURN_IF_ERROR(check_dim(a.q, "q", 0, pr.total_q, "problem.total_q"));
  const int64_t total_q = pr.total_q;
  OPENMLA_RETURN_IF_ERROR(check_rows_operand(a.k, "k", pr.dtype, pr.h_kv, "h_kv", pr.d_qk, "d_qk", kDtypeRule));
  OPENMLA_RETURN_IF_ERROR(check_same_device(a.q, "q", a.k, "k"));
  const int64_t total_k = a.k.shape[0];
  OPENMLA_RETURN_IF_ERROR(check_rows_operand(a.v, "v", pr.dtype, pr.h_kv, "h_kv", pr.d_v, "d_v", kDtypeRule));
  OPENMLA_RETURN_IF_ERROR(check_same_device(a.q, "q", a.v, "v"));
  OPENMLA_RETURN_IF_ERROR(check_dim(a.v, "v", 0, total_k, "total_k, as k"));
  OPENMLA_RETURN_IF_ERROR(check_rows_operand(a.out, "out", pr.dtype, pr.h_q, "h_q", pr.d_v, "d_v", kDtypeRule));
  OPENMLA_RETURN_IF_ERROR(check_same_device(a.q, "q", a.out, "out"));
  OPENMLA_RETURN_IF_ERROR(check_dim(a.out, "out", 0, total_q, "total_q, as q"));
  OPENMLA_RETURN_IF_ERROR(check_rows_operand(a.dout, "dout", pr.dtype, pr.h_q, "h_q", pr.d_v, "d_v", kDtypeRule));
  OPENMLA_RETURN_IF_ERROR(check_same_device(a.q, "q", a.dout, "dout"));
  OPENMLA_RETURN_IF_ERROR(check_dim(a.dout, "dout", 0, total_q, "total_q, as q"));
  OPENMLA_RETURN_IF_ERROR(check_cuda_tensor(a.lse, "lse", {DType::kFloat32}, 2));
  OPENMLA_RETURN_IF_ERROR(check_same_device(a.q, "q", a.lse, "lse"));
  OPENMLA_RETURN_IF_ERROR(check_dim(a.lse, "lse", 0, total_q, "total_q, as q"));
  OPENMLA_RETURN_IF_ERROR(check_dim(a.lse, "lse", 1, pr.h_q, "h_q"));
  OPENMLA_RETURN_IF_ERROR(check_pointer_aligned(a.lse, "lse", 4));

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
  const MhaPrefillBwdWorkspaceLayout layout = mha_prefill_bwd_workspace_layout(pr);
  OPENMLA_RETURN_IF_ERROR(check_on_cuda(a.workspace, "workspace"));
  OPENMLA_RETURN_IF_ERROR(check_same_device(a.q, "q", a.workspace, "workspace"));
  OPENMLA_RETURN_IF_ERROR(check_contiguous(a.workspace, "workspace"));
  OPENMLA_RETURN_IF_ERROR(check_pointer_aligned(a.workspace, "workspace", 256));
  const auto ws_bytes = static_cast<size_t>(a.workspace.numel()) * a.workspace.element_size();
  if (ws_bytes < layout.end) {
    MessageStream os;
    os << "argument 'workspace' has " << ws_bytes << " bytes; get_mha_prefill_bwd_workspace_size asks for "
       << layout.end;
    return invalid(os.str());
  }
  OPENMLA_RETURN_IF_ERROR(check_rows_operand(a.dq, "dq", pr.dtype, pr.h_q, "h_q", pr.d_qk, "d_qk", kDtypeRule));
  OPENMLA_RETURN_IF_ERROR(check_same_device(a.q, "q", a.dq, "dq"));
  OPENMLA_RETURN_IF_ERROR(check_dim(a.dq, "dq", 0, total_q, "total_q, as q"));
  OPENMLA_RETURN_IF_ERROR(check_rows_operand(a.dk, "dk", pr.dtype, pr.h_kv, "h_kv", pr.d_qk, "d_qk", kDtypeRule));
  OPENMLA_RETURN_IF_ERROR(check_same_device(a.q, "q", a.dk, "dk"));
  OPENMLA_RETURN_IF_ERROR(check_dim(a.dk, "dk", 0, total_k, "total_k, as k"));
  OPENMLA_RETURN_IF_ERROR(check_rows_operand(a.dv, "dv", pr.dtype, pr.h_kv, "h_kv", pr.d_v, "d_v", kDtypeRule));
  OPENMLA_RETURN_IF_ERROR(check_same_device(a.q, "q", a.dv, "dv"));
  OPENMLA_RETURN_IF_ERROR(check_dim(a.dv, "dv", 0, total_k, "total_k, as k"));
  OPENMLA_RETURN_IF_ERROR(check_no_self_overlap(a.dq, "dq"));
  OPENMLA_RETURN_IF_ERROR(check_no_self_overlap(a.dk, "dk"));
  OPENMLA_RETURN_IF_ERROR(check_no_self_overlap(a.dv, "dv"));
  OPENMLA_RETURN_IF_ERROR(check_disjoint({{&a.dq, "dq"}, {&a.dk, "dk"}, {&a.dv, "dv"}, {&a.workspace, "workspace"}},
                                         {{&a.q, "q"},
                                          {&a.k, "k"},
                                          {&a.v, "v"},
                                          {&a.out, "out"},
                                          {&a.dout, "dout"},
                                          {&a.lse, "lse"},
                                          {&a.cu_seqlens_qo, "cu_seqlens_qo"},
                                          {&a.cu_seqlens_kv, "cu_seqlens_kv"}}));

  if (params != nullptr) {
    kernels::MhaPrefillBwdParams& p = *params;
    p = kernels::MhaPrefillBwdParams{};
    p.seqs = kernels::varlen::VarlenBatch{.batch = static_cast<int>(pr.batch),
                                          .total_q = static_cast<int>(total_q),
                                          .total_k = static_cast<int>(total_k),
                                          .cu_seqlens_q = static_cast<const int32_t*>(a.cu_seqlens_qo.data),
                                          .cu_seqlens_k = static_cast<const int32_t*>(a.cu_seqlens_kv.data)};
    p.h_q = static_cast<int>(pr.h_q);
    p.h_kv = static_cast<int>(pr.h_kv);
    p.heads_per_kv = static_cast<int>(pr.h_q / pr.h_kv);
    p.d_qk = static_cast<int>(pr.d_qk);
    p.fp16 = pr.dtype == DType::kFloat16;
    p.causal = pr.causal;
    p.deterministic = pr.deterministic;
    p.scale = static_cast<float>(scale);
    p.scale_log2 = static_cast<float>(scale * 1.4426950408889634);
    // Operands of no rows are never loaded, but their maps are built: give them q's or the workspace's address.
    const void* any = total_q > 0 ? a.q.data : a.workspace.data;
    p.q = total_q > 0 ? a.q.data : any;
    p.q_stride_t = used_stride(a.q, 0);
    p.q_stride_h = used_stride(a.q, 1);
    p.k = total_k > 0 ? a.k.data : any;
    p.k_stride_t = used_stride(a.k, 0);
    p.k_stride_h = used_stride(a.k, 1);
    p.v = total_k > 0 ? a.v.data : any;
    p.v_stride_t = used_stride(a.v, 0);
    p.v_stride_h = used_stride(a.v, 1);
    p.dout = total_q > 0 ? a.dout.data : any;
    p.dout_stride_t = used_stride(a.dout, 0);
    p.dout_stride_h = used_stride(a.dout, 1);
    p.out = a.out.data;
    p.out_stride_t = used_stride(a.out, 0);
    p.out_stride_h = used_stride(a.out, 1);
    p.lse = static_cast<const float*>(a.lse.data);
    p.lse_stride_t = a.lse.stride[0];
    p.lse_stride_h = a.lse.stride[1];
    p.dq = a.dq.data;
    p.dq_stride_t = used_stride(a.dq, 0);
    p.dq_stride_h = used_stride(a.dq, 1);
    p.dk = a.dk.data;
    p.dk_stride_t = used_stride(a.dk, 0);
    p.dk_stride_h = used_stride(a.dk, 1);
    p.dv = a.dv.data;
    p.dv_stride_t = used_stride(a.dv, 0);
    p.dv_stride_h = used_stride(a.dv, 1);
    uint8_t* ws = static_cast<uint8_t*>(a.workspace.data);
    p.pad_blocks = static_cast<int>(layout.pad_blocks);
    p.lse2 = reinterpret_cast<float*>(ws + layout.lse2);
    p.tile_counter = reinterpret_cast<int*>(ws + layout.tile_counter);
    p.dq_order = reinterpret_cast<int*>(ws + layout.dq_order);
    p.dsum = reinterpret_cast<float*>(ws + layout.dsum);
    p.dq_accum = reinterpret_cast<float*>(ws + layout.dq_accum);
    p.grid = bwd_grid(pr.h_kv, total_k, pr.batch, pr.num_sms > 0 ? pr.num_sms : 1);
    // GQA: a tile runs h_q / h_kv query heads, so a kv head's first key blocks are long; taking them first across
    // the kv heads keeps the longest tiles off the end of the call (docs/mha-prefill-bwd.md, decision bwd-7). Not in
    // the deterministic mode, whose causal order takes a kv head's key blocks last first (the longest would come
    // last of all: measured 17.7 -> 22.1 ms there).
    p.key_block_major = pr.h_q > pr.h_kv && !pr.deterministic;
  }
  return Status::ok();
}

}  // namespace detail

Status get_mha_prefill_bwd_workspace_size(const MhaPrefillBwdProblem& problem, MhaPrefillBwdWorkspaceSizes* sizes) {
  if (sizes == nullptr) return Status::invalid_argument("argument 'sizes' must not be null");
  OPENMLA_RETURN_IF_ERROR(detail::check_bwd_problem(problem));
  sizes->workspace_bytes = detail::mha_prefill_bwd_workspace_layout(problem).end;
  return Status::ok();
}

Status mha_prefill_bwd(const MhaPrefillBwdProblem& problem, const MhaPrefillBwdArgs& args, cudaStream_t stream) {
  kernels::MhaPrefillBwdParams params;
  OPENMLA_RETURN_IF_ERROR(detail::validate_mha_prefill_bwd(problem, args, &params));
#if !defined(OPENMLA_HAS_MHA_PREFILL)
  (void)stream;
  return detail::family_not_built(detail::KernelFamily::kMhaPrefill, "mha_prefill_bwd");
#else
  OPENMLA_RETURN_IF_ERROR(detail::check_launch_context(args.q.device_id, "q", stream, "mha_prefill_bwd"));
  if (problem.num_sms == 0) {
    int num_sms = 0;
    OPENMLA_RETURN_IF_ERROR(
        detail::device_sm_count(args.q.device_id, &num_sms, "dense MHA prefill backward: SM count"));
    params.grid = detail::bwd_grid(problem.h_kv, params.seqs.total_k, problem.batch, num_sms);
  }
  const detail::MhaPrefillBwdWorkspaceLayout layout = detail::mha_prefill_bwd_workspace_layout(problem);
  uint8_t* ws = static_cast<uint8_t*>(args.workspace.data);
  // The base-2 lse of padded rows: 0x7f7f7f7f (3.4e38), so that their P = 2^(s - lse) is 0; the rest: 0.
  OPENMLA_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(ws + layout.lse2, 0x7f, layout.tile_counter - layout.lse2, stream),
                               "dense MHA prefill backward: resetting the workspace");
  OPENMLA_CUDA_RETURN_IF_ERROR(
      cudaMemsetAsync(ws + layout.tile_counter, 0, layout.end - layout.tile_counter, stream),
      "dense MHA prefill backward: resetting the workspace");
  return kernels::launch_mha_prefill_bwd(params, stream);
#endif
}

}  // namespace openmla
