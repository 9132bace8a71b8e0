// Internal entry points of api/mha_prefill.cpp, exposed for the C++ tests.
#pragma once

#include "kernels/mha_prefill/params.h"
#include "kernels/mha_prefill/params_fp8.h"
#include "kernels/mha_prefill_bwd/params.h"
#include "openmla/prefill.h"

namespace openmla::detail {

// Every argument check of mha_prefill() without launching anything (no CUDA call at all). On success fills *params
// (when not null) with the kernel parameters; params->grid is planned for problem.num_sms SMs (1 when num_sms == 0:
// the public entry plans again with the device's count) and is 0 when there is nothing to launch (no query row).
// Shared by the forward and the backward (api/mha_prefill.cpp):
// h_kv >= 1, h_q a multiple of it (<= 65536), (d_qk, d_v) in {(192, 128), (128, 128)} (else unsupported, the message
// ending in `supported`), dtype bf16 or fp16.
Status check_heads_and_shape(int64_t h_q, int64_t h_kv, int64_t d_qk, int64_t d_v, DType dtype, const char* supported);
// The stride of dimension `dim`, or the packed value when the dimension has size 1.
int64_t used_stride(const TensorRef& t, int dim);
// A (rows, heads, cols) operand moved by TMA or 16-byte stores: `dtype` (else the message quotes `dtype_rule`), last
// dim contiguous, the other strides positive multiples of 8 elements below 2^32, 16-byte aligned, at most 2^30 rows.
Status check_rows_operand(const TensorRef& given, const char* name, DType dtype, int64_t heads, const char* heads_what,
                          int64_t cols, const char* cols_what, const char* dtype_rule);

Status validate_mha_prefill(const MhaPrefillProblem& problem, const MhaPrefillArgs& args,
                            kernels::MhaPrefillParams* params);
// The same checks for FP8 inputs (problem.dtype = kFloat8E4M3; an internal error otherwise), filling the FP8 kernel's
// parameters (the descales' element strides: 0 for a single value; out_fp16 from out's dtype).
Status validate_mha_prefill_fp8(const MhaPrefillProblem& problem, const MhaPrefillArgs& args,
                                kernels::MhaPrefillFp8Params* params);

// Every argument check of mha_prefill_bwd() without launching anything. On success fills *params (when not null);
// params->grid is planned for problem.num_sms SMs (1 when 0: the public entry plans again with the device's count).
Status validate_mha_prefill_bwd(const MhaPrefillBwdProblem& problem, const MhaPrefillBwdArgs& args,
                                kernels::MhaPrefillBwdParams* params);
// The workspace's parts, in bytes from its start (the layout of kernels/mha_prefill_bwd/params.h).
struct MhaPrefillBwdWorkspaceLayout {
  int64_t pad_blocks;
  size_t lse2, tile_counter, dq_order, dsum, dq_accum, end;
};
MhaPrefillBwdWorkspaceLayout mha_prefill_bwd_workspace_layout(const MhaPrefillBwdProblem& problem);

}  // namespace openmla::detail
