// CPU reference of every attention computation OpenMLA implements on the GPU.
//
// Deliberately naive: one query row at a time, every dot product and every softmax sum accumulated in
// double, no tiling, no online softmax. It shares no code with src/, so a bug cannot make both sides agree.
// Contracts: docs/contracts.md (sections 1-7 and 9); docs/reference.md.
//
// Conventions common to every function here:
//   * Inputs are plain pointers with int64 strides counted in ELEMENTS (bytes for FP8 caches), so any
//     layout (padded, transposed, sliced) can be passed. Real-valued inputs may be float32, float64, or
//     bf16 / fp16 given as uint16 bit patterns (RealView::type says which).
//   * Outputs are written contiguously (row-major, shapes documented per function) as float or double;
//     rounding to bf16 is the caller's business.
//   * lse is natural log of the sum of exp(scaled logits). A row with no visible/valid key gets out = 0
//     and lse = +inf (max_logits = -inf in sparse prefill), with or without a sink.
//   * attn_sink[h] (natural units) scales out by 1 / (1 + exp(sink - lse)); lse is never changed.
//   * Entries that the contract says are unused (block-table entries past the request's pages, cache rows
//     past the sequence length, index slots past topk_length) are never read, so they may hold garbage.
//   * Bad arguments (a page id or index that would read outside the cache, inconsistent sizes) throw
//     std::invalid_argument whose message names the argument.
#pragma once

#include <cstdint>

#include "openmla_ref/fp8_codec.h"

namespace openmla::ref {

enum class ElemType : uint8_t { kFloat32, kFloat64, kBFloat16, kFloat16 };

// Read-only view of a real-valued tensor of up to 4 dimensions. Shapes are carried by the argument
// structs; only the strides (in elements, outermost dimension first) live here. Unused trailing strides
// are ignored.
struct RealView {
  const void* data = nullptr;
  ElemType type = ElemType::kFloat32;
  int64_t stride[4] = {0, 0, 0, 0};

  double load(int64_t offset) const;  // element at `offset` elements from data, widened to double
  double at(int64_t i0, int64_t i1 = 0, int64_t i2 = 0, int64_t i3 = 0) const {
    return load(i0 * stride[0] + i1 * stride[1] + i2 * stride[2] + i3 * stride[3]);
  }
  bool defined() const { return data != nullptr; }
};

// Read-only view of an int32 tensor of up to 3 dimensions (block tables, index tensors).
struct IndexView {
  const int32_t* data = nullptr;
  int64_t stride[3] = {0, 0, 0};

  int32_t at(int64_t i0, int64_t i1 = 0, int64_t i2 = 0) const {
    return data[i0 * stride[0] + i1 * stride[1] + i2 * stride[2]];
  }
  bool defined() const { return data != nullptr; }
};

// ---------------------------------------------------------------------------------------------------------
// 1. Dense paged MLA decode (docs/contracts.md section 2; any page size, any d_qk/d_v with d_v <= d_qk).
// ---------------------------------------------------------------------------------------------------------
struct DenseDecodeArgs {
  int64_t batch = 0, s_q = 1, h_q = 0, h_kv = 1, d_qk = 576, d_v = 512;
  int64_t num_blocks = 0, page_size = 64, max_blocks_per_seq = 0;
  RealView q;                             // (batch, s_q, h_q, d_qk)
  RealView k_cache;                       // (num_blocks, page_size, h_kv, d_qk); V = first d_v dims of K
  IndexView block_table;                  // (batch, max_blocks_per_seq); entries past ceil(L/page) unused
  const int32_t* cache_seqlens = nullptr; // (batch), contiguous; 0 allowed
  double softmax_scale = 0.0;
  bool causal = false;                    // bottom-right aligned; ignored when s_q == 1
};
// out (batch, s_q, h_q, d_v); lse (batch, h_q, s_q). Query i of a request of length L sees keys
// j <= L - s_q + i when causal; head h reads kv head h / (h_q / h_kv).
template <class Real>
void dense_decode(const DenseDecodeArgs& args, Real* out, Real* lse);

// ---------------------------------------------------------------------------------------------------------
// 2. Sparse decode (docs/contracts.md section 3): indices into one or two paged token caches.
// ---------------------------------------------------------------------------------------------------------
// A paged cache of single-head tokens addressed by index = page * page_size + offset. Either FP8 bytes in
// one of the codec layouts (decoded with fp8_decode_token), or already-dequantised real values.
struct PagedTokenCache {
  int64_t num_blocks = 0, page_size = 0;
  const uint8_t* fp8 = nullptr;           // FP8 form: page p starts at fp8 + p * page_stride_bytes
  Fp8Layout layout = Fp8Layout::kV32;
  int64_t page_stride_bytes = 0;
  RealView values;                        // dequantised form (used when fp8 == nullptr): (num_blocks, page_size, d_qk)
};

struct SparseDecodeArgs {
  int64_t batch = 0, s_q = 1, h_q = 0, d_qk = 576, d_v = 512;
  RealView q;                             // (batch, s_q, h_q, d_qk)
  PagedTokenCache cache;
  int64_t topk = 0;
  IndexView indices;                      // (batch, s_q, topk); -1 = invalid (the only invalid value)
  const int32_t* topk_length = nullptr;   // (batch) per REQUEST, may be null; slots >= it are never read
  const float* attn_sink = nullptr;       // (h_q), may be null; +-inf allowed
  // Optional second cache whose selection joins the main one under one softmax.
  bool has_extra = false;
  PagedTokenCache extra_cache;
  int64_t extra_topk = 0;
  IndexView extra_indices;                // (batch, s_q, extra_topk)
  const int32_t* extra_topk_length = nullptr;  // (batch), may be null
  double softmax_scale = 0.0;
};
// out (batch, s_q, h_q, d_v); lse (batch, h_q, s_q).
template <class Real>
void sparse_decode(const SparseDecodeArgs& args, Real* out, Real* lse);

// ---------------------------------------------------------------------------------------------------------
// 3. Sparse prefill (docs/contracts.md section 6): no batch dimension, indices straight into kv.
// ---------------------------------------------------------------------------------------------------------
struct SparsePrefillArgs {
  int64_t s_q = 0, s_kv = 0, h_q = 0, h_kv = 1, d_qk = 576, d_v = 512, topk = 0;
  RealView q;                             // (s_q, h_q, d_qk)
  RealView kv;                            // (s_kv, h_kv, d_qk); V = first d_v dims
  IndexView indices;                      // (s_q, h_kv, topk); invalid: < 0 or >= s_kv
  const int32_t* topk_length = nullptr;   // (s_q) per QUERY TOKEN, may be null
  const float* attn_sink = nullptr;       // (h_q), may be null
  double softmax_scale = 0.0;
};
// out (s_q, h_q, d_v); max_logits (s_q, h_q) (-inf if none valid); lse (s_q, h_q) (+inf if none valid).
template <class Real>
void sparse_prefill(const SparsePrefillArgs& args, Real* out, Real* max_logits, Real* lse);

// ---------------------------------------------------------------------------------------------------------
// 4. Dense MHA prefill, forward and backward (docs/contracts.md section 7): varlen through cumulative
//    sequence lengths.
// ---------------------------------------------------------------------------------------------------------
struct MhaArgs {
  int64_t batch = 0, h_q = 0, h_kv = 0, d_qk = 0, d_v = 0;
  const int32_t* cu_seqlens_q = nullptr;  // (batch + 1), contiguous, non-decreasing, starts at 0
  const int32_t* cu_seqlens_k = nullptr;  // (batch + 1)
  RealView q;                             // (total_q, h_q, d_qk)
  RealView k;                             // (total_k, h_kv, d_qk)
  RealView v;                             // (total_k, h_kv, d_v)
  double softmax_scale = 0.0;
  bool causal = false;                    // bottom-right: query i sees keys j <= i + s_k - s_q
};
// out (total_q, h_q, d_v); lse (total_q, h_q).
template <class Real>
void mha_forward(const MhaArgs& args, Real* out, Real* lse);
// Gradients of sum(out * dout) (lse treated as not an output). Recomputes the forward in double.
// dout (total_q, h_q, d_v); dq (total_q, h_q, d_qk); dk (total_k, h_kv, d_qk); dv (total_k, h_kv, d_v).
template <class Real>
void mha_backward(const MhaArgs& args, const RealView& dout, Real* dq, Real* dk, Real* dv);

// ---------------------------------------------------------------------------------------------------------
// 5. Merging split-KV partials (docs/contracts.md section 5, docs/decode-schedule.md).
// ---------------------------------------------------------------------------------------------------------
enum class LseBase { kNatural, kTwo };

struct MergeArgs {
  int64_t num_partials = 0, d_v = 0;
  RealView o;                             // (num_partials, d_v): each normalised by its own row sum (0 if empty)
  RealView lse;                           // (num_partials): log of its row sum incl. max; -inf or +inf if empty
  LseBase lse_base = LseBase::kTwo;       // the GPU split-KV buffers store base 2
  const float* attn_sink = nullptr;       // one value (natural units) or null
};
// out (d_v); *lse_out natural log (+inf if every partial is empty); sink applied to out only. An empty partial
// (lse -inf, as split-KV chunks write it, or +inf, as an attention row without keys returns it) has weight 0 and its
// O is never read; a NaN lse makes out and *lse_out NaN. Also merge_attn_states' reference (include/openmla/merge.h).
template <class Real>
void merge_partials(const MergeArgs& args, Real* out, Real* lse_out);

}  // namespace openmla::ref
