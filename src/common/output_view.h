// Where an attention kernel writes its caller-visible results: the output rows and their log-sum-exp. One plain-data
// struct for every params struct that has them (DenseDecodeParams, SparseDecodeParams, CombineParams), so the kernels
// and the combine index `out` and `lse` with the same code. Host and device; plain data (docs/architecture.md,
// "Device layer").
//
//   out: (b, s_q, h_q, d_v), last dim contiguous, in the kernel's element type (a template argument of the
//        kernel, or bf16 where there is only one); strides in elements.
//   lse: logical (b, h_q, s_q) float32, natural log; strides in elements (any order, e.g. a (b, s_q, h_q) storage).
//
// A family without a batch or position dimension (the prefill kernels: out (tokens, h_q, d_v), lse (tokens, h_q)) uses
// it with the packed token as `req` and stride 0 for the missing position dimension (token_out_offset,
// token_lse_offset).
//
// NOTE: the field order and types are the params layout of every kernel that embeds the view (it replaced eight
// fields that were in this order in each), so the kernels read them at the constant-bank offsets they always had.
// Do not add a field here (the element type, say): every params field after the view would move by 8 bytes, and
// with it the machine code of every kernel (docs/architecture.md, "Device layer").
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define OPENMLA_VIEW_FN __host__ __device__ __forceinline__
#else
#define OPENMLA_VIEW_FN inline
#endif

namespace openmla::kernels {

struct OutputView {
  void* out;                                       // (b, s_q, h_q, d_v), last dim contiguous
  int64_t out_stride_b, out_stride_s, out_stride_h;  // elements
  float* lse;                                      // logical (b, h_q, s_q) float32, natural log
  int64_t lse_stride_b, lse_stride_h, lse_stride_s;  // elements

  // Element offset of the first column of out row (req, s_idx, head).
  OPENMLA_VIEW_FN int64_t out_offset(int req, int s_idx, int head) const {
    return static_cast<int64_t>(req) * out_stride_b + static_cast<int64_t>(s_idx) * out_stride_s +
           static_cast<int64_t>(head) * out_stride_h;
  }
  // Element offset of lse (req, head, s_idx).
  OPENMLA_VIEW_FN int64_t lse_offset(int req, int s_idx, int head) const {
    return static_cast<int64_t>(req) * lse_stride_b + static_cast<int64_t>(head) * lse_stride_h +
           static_cast<int64_t>(s_idx) * lse_stride_s;
  }
  // The same for a family without a position dimension, whose rows are packed tokens (the prefill kernels: the token
  // is the view's `req`, a 64-bit row index of the packed tensors).
  OPENMLA_VIEW_FN int64_t token_out_offset(int64_t token, int head) const {
    return token * out_stride_b + head * out_stride_h;
  }
  OPENMLA_VIEW_FN int64_t token_lse_offset(int64_t token, int head) const {
    return token * lse_stride_b + head * lse_stride_h;
  }

  // The view of a prefill call's (tokens, h_q, d_v) out and (tokens, h_q) lse: the token as `req`, no position
  // dimension (stride 0). Strides in elements.
  static OutputView for_tokens(void* out, int64_t out_stride_t, int64_t out_stride_h, float* lse,
                               int64_t lse_stride_t, int64_t lse_stride_h) {
    return OutputView{out, out_stride_t, 0, out_stride_h, lse, lse_stride_t, lse_stride_h, 0};
  }
};
static_assert(sizeof(OutputView) == 64 && alignof(OutputView) == 8, "eight 8-byte fields, no padding");

}  // namespace openmla::kernels

#undef OPENMLA_VIEW_FN
