// Binding of the CPU reference library (reference/include/openmla_ref/) as the submodule _openmla.ref.
//
// Takes CPU arrays (numpy or any DLPack exporter) of any strides and returns new float64 numpy arrays. The
// reference does the math and its own range checks (bad page ids, bad indices -> std::invalid_argument ->
// ValueError); this file only checks that the arrays' shapes agree, so that the reference never reads past
// an array, and names the offending argument when they do not.
// 16-bit inputs: float16 / bfloat16 DLPack arrays are taken as they are; uint16/int16 arrays are bit patterns
// whose meaning `half` gives ("bf16" or "fp16"): numpy has no bfloat16, so python/openmla/reference.py hands
// ml_dtypes.bfloat16 arrays over as uint16 views.
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "bind_common.h"
#include "openmla_ref/attention.h"
#include "openmla_ref/fp8_codec.h"

namespace openmla::py {

namespace {

namespace ref = openmla::ref;

using InArray = nb::ndarray<nb::ro, nb::device::cpu>;
using OptIn = std::optional<InArray>;
using OutArray = nb::ndarray<nb::numpy, double>;

[[noreturn]] void bad(const std::string& name, const std::string& what) {
  throw nb::value_error(("argument '" + name + "': " + what).c_str());
}

std::string shape_str(const InArray& a) {
  std::string s = "(";
  for (size_t i = 0; i < a.ndim(); ++i) s += (i ? ", " : "") + std::to_string(a.shape(i));
  return s + (a.ndim() == 1 ? ",)" : ")");
}

void expect_ndim(const InArray& a, size_t ndim, const std::string& name) {
  if (a.ndim() != ndim)
    bad(name, "expected " + std::to_string(ndim) + " dimensions, got shape " + shape_str(a));
}

void expect_dim(const InArray& a, size_t dim, int64_t size, const std::string& name, const std::string& what) {
  if (static_cast<int64_t>(a.shape(dim)) != size)
    bad(name, "dimension " + std::to_string(dim) + " has size " + std::to_string(a.shape(dim)) + ", expected " +
                  std::to_string(size) + " (" + what + ")");
}

int64_t dim(const InArray& a, size_t d) { return static_cast<int64_t>(a.shape(d)); }

ref::ElemType real_type(const InArray& a, const std::string& name, const std::string& half) {
  using Code = nb::dlpack::dtype_code;
  const auto dt = a.dtype();
  const auto code = static_cast<Code>(dt.code);
  if (dt.lanes == 1) {
    if (code == Code::Float && dt.bits == 32) return ref::ElemType::kFloat32;
    if (code == Code::Float && dt.bits == 64) return ref::ElemType::kFloat64;
    if (code == Code::Float && dt.bits == 16) return ref::ElemType::kFloat16;
    if (code == Code::Bfloat && dt.bits == 16) return ref::ElemType::kBFloat16;
    if ((code == Code::UInt || code == Code::Int) && dt.bits == 16) {
      if (half == "bf16") return ref::ElemType::kBFloat16;
      if (half == "fp16") return ref::ElemType::kFloat16;
      bad("half", "must be 'bf16' or 'fp16' (how 16-bit integer arrays such as '" + name + "' are read), got '" +
                      half + "'");
    }
  }
  bad(name, "expected float32, float64, float16, bfloat16 or 16-bit bit patterns, got DLPack code " +
                std::to_string(dt.code) + " with " + std::to_string(dt.bits) + " bits");
}

// A RealView over array `a` whose dimensions `dims` (in order) become the view's strides.
ref::RealView real_view(const InArray& a, const std::string& name, const std::string& half,
                        std::initializer_list<size_t> dims) {
  ref::RealView v{.data = a.data(), .type = real_type(a, name, half)};
  int i = 0;
  for (size_t d : dims) v.stride[i++] = a.stride(d);
  return v;
}

void expect_int32(const InArray& a, const std::string& name) {
  const auto dt = a.dtype();
  if (dt.code != static_cast<uint8_t>(nb::dlpack::dtype_code::Int) || dt.bits != 32 || dt.lanes != 1)
    bad(name, "expected int32");
}

ref::IndexView index_view(const InArray& a, const std::string& name, size_t ndim) {
  expect_ndim(a, ndim, name);
  expect_int32(a, name);
  ref::IndexView v{.data = static_cast<const int32_t*>(a.data())};
  for (size_t d = 0; d < ndim; ++d) v.stride[d] = a.stride(d);
  return v;
}

// A contiguous int32 vector of `len` entries (the reference reads these with unit stride).
const int32_t* int_vector(const InArray& a, const std::string& name, int64_t len) {
  expect_ndim(a, 1, name);
  expect_int32(a, name);
  expect_dim(a, 0, len, name, "its length");
  if (len > 1 && a.stride(0) != 1) bad(name, "must be contiguous");
  return static_cast<const int32_t*>(a.data());
}

const int32_t* opt_int_vector(const OptIn& a, const std::string& name, int64_t len) {
  return a ? int_vector(*a, name, len) : nullptr;
}

// A contiguous float32 vector (attention sinks).
const float* float_vector(const OptIn& a, const std::string& name, int64_t len) {
  if (!a) return nullptr;
  expect_ndim(*a, 1, name);
  const auto dt = a->dtype();
  if (dt.code != static_cast<uint8_t>(nb::dlpack::dtype_code::Float) || dt.bits != 32 || dt.lanes != 1)
    bad(name, "expected float32");
  expect_dim(*a, 0, len, name, "one value per query head");
  if (len > 1 && a->stride(0) != 1) bad(name, "must be contiguous");
  return static_cast<const float*>(a->data());
}

// A fresh zero-filled float64 numpy array that owns its memory.
OutArray new_array(std::vector<size_t> shape, double** data) {
  size_t n = 1;
  for (size_t s : shape) n *= s;
  double* p = new double[n > 0 ? n : 1]();
  nb::capsule owner(p, [](void* q) noexcept { delete[] static_cast<double*>(q); });
  *data = p;
  return OutArray(p, shape.size(), shape.data(), owner);
}

bool is_byte_array(const InArray& a) { return a.dtype().bits == 8 && a.dtype().lanes == 1; }

ref::Fp8Layout layout_from_bytes(int64_t bytes, const std::string& name) {
  if (bytes == ref::fp8_bytes_per_token(ref::Fp8Layout::kV32)) return ref::Fp8Layout::kV32;
  if (bytes == ref::fp8_bytes_per_token(ref::Fp8Layout::kModel1)) return ref::Fp8Layout::kModel1;
  bad(name, "last dimension " + std::to_string(bytes) + " is not an FP8 token size (656 for V3.2, 584 for MODEL1)");
}

// Describes an FP8 byte cache (num_blocks, page_size, 1, bytes) or (num_blocks, page_size, bytes): each page
// internally contiguous (stride(1) == bytes per token), any page stride.
ref::PagedTokenCache fp8_cache(const InArray& a, const std::string& name) {
  if (a.ndim() != 4 && a.ndim() != 3) bad(name, "expected (num_blocks, page_size, 1, bytes), got " + shape_str(a));
  if (a.ndim() == 4) expect_dim(a, 2, 1, name, "one KV head");
  const size_t last = a.ndim() - 1;
  const int64_t bytes = dim(a, last);
  const ref::Fp8Layout layout = layout_from_bytes(bytes, name);
  if ((bytes > 1 && a.stride(last) != 1) || (dim(a, 1) > 1 && a.stride(1) != bytes))
    bad(name, "each page must be contiguous: strides of the token and byte dimensions must be " +
                  std::to_string(bytes) + " and 1");
  return {.num_blocks = dim(a, 0), .page_size = dim(a, 1), .fp8 = static_cast<const uint8_t*>(a.data()),
          .layout = layout, .page_stride_bytes = dim(a, 0) > 1 ? a.stride(0) : dim(a, 1) * bytes};
}

// A paged token cache from either FP8 bytes or dequantised values (num_blocks, page_size, [1,] d_qk).
ref::PagedTokenCache token_cache(const InArray& a, const std::string& name, const std::string& half, int64_t d_qk) {
  if (is_byte_array(a)) return fp8_cache(a, name);
  if (a.ndim() != 4 && a.ndim() != 3) bad(name, "expected (num_blocks, page_size, 1, d_qk), got " + shape_str(a));
  if (a.ndim() == 4) expect_dim(a, 2, 1, name, "one KV head");
  const size_t last = a.ndim() - 1;
  expect_dim(a, last, d_qk, name, "d_qk of q");
  return {.num_blocks = dim(a, 0), .page_size = dim(a, 1), .values = real_view(a, name, half, {0, 1, last})};
}

nb::tuple dense_decode(const InArray& q, const InArray& k_cache, const InArray& block_table,
                       const InArray& cache_seqlens, int64_t head_dim_v, double softmax_scale, bool causal,
                       const std::string& half) {
  expect_ndim(q, 4, "q");
  expect_ndim(k_cache, 4, "k_cache");
  const int64_t b = dim(q, 0), s_q = dim(q, 1), h_q = dim(q, 2), d_qk = dim(q, 3);
  expect_dim(k_cache, 3, d_qk, "k_cache", "d_qk of q");
  const ref::IndexView table = index_view(block_table, "block_table", 2);
  expect_dim(block_table, 0, b, "block_table", "batch of q");
  const ref::DenseDecodeArgs args{
      .batch = b, .s_q = s_q, .h_q = h_q, .h_kv = dim(k_cache, 2), .d_qk = d_qk, .d_v = head_dim_v,
      .num_blocks = dim(k_cache, 0), .page_size = dim(k_cache, 1), .max_blocks_per_seq = dim(block_table, 1),
      .q = real_view(q, "q", half, {0, 1, 2, 3}), .k_cache = real_view(k_cache, "k_cache", half, {0, 1, 2, 3}),
      .block_table = table, .cache_seqlens = int_vector(cache_seqlens, "cache_seqlens", b),
      .softmax_scale = softmax_scale, .causal = causal};
  double *out, *lse;
  OutArray o = new_array({size_t(b), size_t(s_q), size_t(h_q), size_t(std::max<int64_t>(head_dim_v, 0))}, &out);
  OutArray l = new_array({size_t(b), size_t(h_q), size_t(s_q)}, &lse);
  ref::dense_decode(args, out, lse);
  return nb::make_tuple(o, l);
}

nb::tuple sparse_decode(const InArray& q, const InArray& k_cache, const InArray& indices, double softmax_scale,
                        int64_t d_v, const OptIn& topk_length, const OptIn& attn_sink, const OptIn& extra_k_cache,
                        const OptIn& extra_indices, const OptIn& extra_topk_length, const std::string& half) {
  expect_ndim(q, 4, "q");
  const int64_t b = dim(q, 0), s_q = dim(q, 1), h_q = dim(q, 2), d_qk = dim(q, 3);
  ref::SparseDecodeArgs args{.batch = b, .s_q = s_q, .h_q = h_q, .d_qk = d_qk, .d_v = d_v,
                             .q = real_view(q, "q", half, {0, 1, 2, 3}),
                             .cache = token_cache(k_cache, "k_cache", half, d_qk),
                             .topk = 0, .indices = index_view(indices, "indices", 3),
                             .topk_length = opt_int_vector(topk_length, "topk_length", b),
                             .attn_sink = float_vector(attn_sink, "attn_sink", h_q), .softmax_scale = softmax_scale};
  expect_dim(indices, 0, b, "indices", "batch of q");
  expect_dim(indices, 1, s_q, "indices", "s_q of q");
  args.topk = dim(indices, 2);
  if (extra_k_cache.has_value() != extra_indices.has_value())
    bad("extra_indices", "extra_k_cache and extra_indices must be given together");
  if (extra_topk_length && !extra_k_cache) bad("extra_topk_length", "only allowed with extra_k_cache");
  if (extra_k_cache) {
    args.has_extra = true;
    args.extra_cache = token_cache(*extra_k_cache, "extra_k_cache", half, d_qk);
    args.extra_indices = index_view(*extra_indices, "extra_indices", 3);
    expect_dim(*extra_indices, 0, b, "extra_indices", "batch of q");
    expect_dim(*extra_indices, 1, s_q, "extra_indices", "s_q of q");
    args.extra_topk = dim(*extra_indices, 2);
    args.extra_topk_length = opt_int_vector(extra_topk_length, "extra_topk_length", b);
  }
  double *out, *lse;
  OutArray o = new_array({size_t(b), size_t(s_q), size_t(h_q), size_t(std::max<int64_t>(d_v, 0))}, &out);
  OutArray l = new_array({size_t(b), size_t(h_q), size_t(s_q)}, &lse);
  ref::sparse_decode(args, out, lse);
  return nb::make_tuple(o, l);
}

nb::tuple sparse_prefill(const InArray& q, const InArray& kv, const InArray& indices, double sm_scale, int64_t d_v,
                         const OptIn& attn_sink, const OptIn& topk_length, const std::string& half) {
  expect_ndim(q, 3, "q");
  expect_ndim(kv, 3, "kv");
  const int64_t s_q = dim(q, 0), h_q = dim(q, 1), d_qk = dim(q, 2);
  expect_dim(kv, 2, d_qk, "kv", "d_qk of q");
  const ref::IndexView idx = index_view(indices, "indices", 3);
  expect_dim(indices, 0, s_q, "indices", "s_q of q");
  expect_dim(indices, 1, dim(kv, 1), "indices", "h_kv of kv");
  const ref::SparsePrefillArgs args{
      .s_q = s_q, .s_kv = dim(kv, 0), .h_q = h_q, .h_kv = dim(kv, 1), .d_qk = d_qk, .d_v = d_v,
      .topk = dim(indices, 2), .q = real_view(q, "q", half, {0, 1, 2}), .kv = real_view(kv, "kv", half, {0, 1, 2}),
      .indices = idx, .topk_length = opt_int_vector(topk_length, "topk_length", s_q),
      .attn_sink = float_vector(attn_sink, "attn_sink", h_q), .softmax_scale = sm_scale};
  double *out, *max_logits, *lse;
  OutArray o = new_array({size_t(s_q), size_t(h_q), size_t(std::max<int64_t>(d_v, 0))}, &out);
  OutArray m = new_array({size_t(s_q), size_t(h_q)}, &max_logits);
  OutArray l = new_array({size_t(s_q), size_t(h_q)}, &lse);
  ref::sparse_prefill(args, out, max_logits, lse);
  return nb::make_tuple(o, m, l);
}

ref::MhaArgs mha_args(const InArray& q, const InArray& k, const InArray& v, const InArray& cu_seqlens_q,
                      const InArray& cu_seqlens_k, double softmax_scale, bool causal, const std::string& half) {
  expect_ndim(q, 3, "q");
  expect_ndim(k, 3, "k");
  expect_ndim(v, 3, "v");
  expect_ndim(cu_seqlens_q, 1, "cu_seqlens_q");
  if (cu_seqlens_q.shape(0) < 1) bad("cu_seqlens_q", "needs batch + 1 >= 1 entries");
  const int64_t batch = dim(cu_seqlens_q, 0) - 1;
  const int32_t* cu_q = int_vector(cu_seqlens_q, "cu_seqlens_q", batch + 1);
  const int32_t* cu_k = int_vector(cu_seqlens_k, "cu_seqlens_k", batch + 1);
  expect_dim(q, 0, cu_q[batch], "q", "total_q = cu_seqlens_q[-1]");
  expect_dim(k, 0, cu_k[batch], "k", "total_k = cu_seqlens_k[-1]");
  expect_dim(v, 0, cu_k[batch], "v", "total_k = cu_seqlens_k[-1]");
  expect_dim(k, 2, dim(q, 2), "k", "d_qk of q");
  expect_dim(v, 1, dim(k, 1), "v", "h_kv of k");
  return {.batch = batch, .h_q = dim(q, 1), .h_kv = dim(k, 1), .d_qk = dim(q, 2), .d_v = dim(v, 2),
          .cu_seqlens_q = cu_q, .cu_seqlens_k = cu_k, .q = real_view(q, "q", half, {0, 1, 2}),
          .k = real_view(k, "k", half, {0, 1, 2}), .v = real_view(v, "v", half, {0, 1, 2}),
          .softmax_scale = softmax_scale, .causal = causal};
}

nb::tuple mha_forward(const InArray& q, const InArray& k, const InArray& v, const InArray& cu_seqlens_q,
                      const InArray& cu_seqlens_k, double softmax_scale, bool causal, const std::string& half) {
  const ref::MhaArgs args = mha_args(q, k, v, cu_seqlens_q, cu_seqlens_k, softmax_scale, causal, half);
  double *out, *lse;
  OutArray o = new_array({q.shape(0), size_t(args.h_q), size_t(args.d_v)}, &out);
  OutArray l = new_array({q.shape(0), size_t(args.h_q)}, &lse);
  ref::mha_forward(args, out, lse);
  return nb::make_tuple(o, l);
}

nb::tuple mha_backward(const InArray& q, const InArray& k, const InArray& v, const InArray& cu_seqlens_q,
                       const InArray& cu_seqlens_k, const InArray& dout, double softmax_scale, bool causal,
                       const std::string& half) {
  const ref::MhaArgs args = mha_args(q, k, v, cu_seqlens_q, cu_seqlens_k, softmax_scale, causal, half);
  expect_ndim(dout, 3, "dout");
  expect_dim(dout, 0, dim(q, 0), "dout", "total_q");
  expect_dim(dout, 1, args.h_q, "dout", "h_q");
  expect_dim(dout, 2, args.d_v, "dout", "d_v");
  double *dq, *dk, *dv;
  OutArray gq = new_array({q.shape(0), q.shape(1), q.shape(2)}, &dq);
  OutArray gk = new_array({k.shape(0), k.shape(1), k.shape(2)}, &dk);
  OutArray gv = new_array({v.shape(0), v.shape(1), v.shape(2)}, &dv);
  ref::mha_backward(args, real_view(dout, "dout", half, {0, 1, 2}), dq, dk, dv);
  return nb::make_tuple(gq, gk, gv);
}

// o (rows, n, d_v), lse (rows, n), attn_sink (rows) float32 or None.
nb::tuple merge_partials(const InArray& o, const InArray& lse, const std::string& lse_base, const OptIn& attn_sink) {
  expect_ndim(o, 3, "o");
  expect_ndim(lse, 2, "lse");
  const int64_t rows = dim(o, 0), n = dim(o, 1), d_v = dim(o, 2);
  expect_dim(lse, 0, rows, "lse", "rows of o");
  expect_dim(lse, 1, n, "lse", "partials of o");
  ref::LseBase base;
  if (lse_base == "2") base = ref::LseBase::kTwo;
  else if (lse_base == "e") base = ref::LseBase::kNatural;
  else bad("lse_base", "must be '2' or 'e', got '" + lse_base + "'");
  const float* sinks = float_vector(attn_sink, "attn_sink", rows);
  double *out, *lse_out;
  OutArray res = new_array({size_t(rows), size_t(d_v)}, &out);
  OutArray res_lse = new_array({size_t(rows)}, &lse_out);
  const ref::RealView ov = real_view(o, "o", "bf16", {0, 1, 2}), lv = real_view(lse, "lse", "bf16", {0, 1});
  const size_t o_size = ov.type == ref::ElemType::kFloat64 ? 8 : ov.type == ref::ElemType::kFloat32 ? 4 : 2;
  const size_t l_size = lv.type == ref::ElemType::kFloat64 ? 8 : lv.type == ref::ElemType::kFloat32 ? 4 : 2;
  for (int64_t r = 0; r < rows; ++r) {
    const ref::MergeArgs args{
        .num_partials = n, .d_v = d_v,
        .o = {.data = static_cast<const char*>(ov.data) + r * ov.stride[0] * o_size, .type = ov.type,
              .stride = {ov.stride[1], ov.stride[2]}},
        .lse = {.data = static_cast<const char*>(lv.data) + r * lv.stride[0] * l_size, .type = lv.type,
                .stride = {lv.stride[1]}},
        .lse_base = base, .attn_sink = sinks ? sinks + r : nullptr};
    ref::merge_partials(args, out + r * d_v, lse_out + r);
  }
  return nb::make_tuple(res, res_lse);
}

// Encodes bf16 values (num_blocks, page_size, 1, d_qk) (any strides) into `out`, an FP8 byte cache
// (num_blocks, page_size, 1, bytes) with any page stride, token by token through the CPU codec.
void fp8_encode_pages(const InArray& values, nb::ndarray<nb::device::cpu> out, const std::string& half) {
  const ref::PagedTokenCache c = fp8_cache(InArray(out), "out");
  const int64_t d_qk = ref::fp8_head_dim(c.layout);
  expect_ndim(values, 4, "values");
  expect_dim(values, 0, c.num_blocks, "values", "num_blocks of out");
  expect_dim(values, 1, c.page_size, "values", "page_size of out");
  expect_dim(values, 2, 1, "values", "one KV head");
  expect_dim(values, 3, d_qk, "values", "d_qk of the layout");
  if (real_type(values, "values", half) != ref::ElemType::kBFloat16)
    bad("values", "must be bfloat16 (or uint16 bit patterns with half='bf16')");
  const auto* src = static_cast<const uint16_t*>(values.data());
  auto* dst = static_cast<uint8_t*>(out.data());
  std::vector<uint16_t> token(static_cast<size_t>(d_qk));
  for (int64_t p = 0; p < c.num_blocks; ++p)
    for (int64_t r = 0; r < c.page_size; ++r) {
      for (int64_t k = 0; k < d_qk; ++k) token[k] = src[p * values.stride(0) + r * values.stride(1) + k * values.stride(3)];
      ref::fp8_encode_token(c.layout, token.data(), dst + p * c.page_stride_bytes, c.page_size, r);
    }
}

// Decodes an FP8 byte cache into bf16 bit patterns (num_blocks, page_size, 1, d_qk) as a new uint16 array.
nb::ndarray<nb::numpy, uint16_t> fp8_decode_pages(const InArray& cache) {
  const ref::PagedTokenCache c = fp8_cache(cache, "cache");
  const int64_t d_qk = ref::fp8_head_dim(c.layout);
  const size_t n = static_cast<size_t>(c.num_blocks * c.page_size * d_qk);
  uint16_t* p = new uint16_t[n > 0 ? n : 1]();
  nb::capsule owner(p, [](void* q) noexcept { delete[] static_cast<uint16_t*>(q); });
  for (int64_t b = 0; b < c.num_blocks; ++b)
    for (int64_t r = 0; r < c.page_size; ++r)
      ref::fp8_decode_token_bf16(c.layout, c.fp8 + b * c.page_stride_bytes, c.page_size, r,
                                 p + (b * c.page_size + r) * d_qk);
  const size_t shape[4] = {size_t(c.num_blocks), size_t(c.page_size), 1, size_t(d_qk)};
  return nb::ndarray<nb::numpy, uint16_t>(p, 4, shape, owner);
}

}  // namespace

void bind_reference(nb::module_& m) {
  nb::module_ r = m.def_submodule("ref", "CPU reference implementations (double accumulation, float64 outputs)");
  r.def("dense_decode", &dense_decode, nb::arg("q"), nb::arg("k_cache"), nb::arg("block_table"),
        nb::arg("cache_seqlens"), nb::arg("head_dim_v"), nb::arg("softmax_scale"), nb::arg("causal") = false,
        nb::arg("half") = "bf16",
        "Dense paged decode. q (b, s_q, h_q, d_qk), k_cache (num_blocks, page_size, h_kv, d_qk), block_table "
        "(b, max_blocks) int32, cache_seqlens (b,) int32 -> (out (b, s_q, h_q, d_v), lse (b, h_q, s_q)).");
  r.def("sparse_decode", &sparse_decode, nb::arg("q"), nb::arg("k_cache"), nb::arg("indices"),
        nb::arg("softmax_scale"), nb::arg("d_v") = 512, nb::arg("topk_length") = nb::none(),
        nb::arg("attn_sink") = nb::none(), nb::arg("extra_k_cache") = nb::none(),
        nb::arg("extra_indices") = nb::none(), nb::arg("extra_topk_length") = nb::none(), nb::arg("half") = "bf16",
        "Sparse decode. k_cache: FP8 bytes (num_blocks, page_size, 1, 656|584) or dequantised values "
        "(num_blocks, page_size, 1, d_qk); indices (b, s_q, topk) int32 -> (out (b, s_q, h_q, d_v), lse (b, h_q, s_q)).");
  r.def("sparse_prefill", &sparse_prefill, nb::arg("q"), nb::arg("kv"), nb::arg("indices"), nb::arg("sm_scale"),
        nb::arg("d_v") = 512, nb::arg("attn_sink") = nb::none(), nb::arg("topk_length") = nb::none(),
        nb::arg("half") = "bf16",
        "Sparse prefill. q (s_q, h_q, d_qk), kv (s_kv, h_kv, d_qk), indices (s_q, h_kv, topk) int32 -> "
        "(out (s_q, h_q, d_v), max_logits (s_q, h_q), lse (s_q, h_q)).");
  r.def("mha_forward", &mha_forward, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("cu_seqlens_q"),
        nb::arg("cu_seqlens_k"), nb::arg("softmax_scale"), nb::arg("causal") = false, nb::arg("half") = "bf16",
        "Dense varlen MHA forward -> (out (total_q, h_q, d_v), lse (total_q, h_q)).");
  r.def("mha_backward", &mha_backward, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("cu_seqlens_q"),
        nb::arg("cu_seqlens_k"), nb::arg("dout"), nb::arg("softmax_scale"), nb::arg("causal") = false,
        nb::arg("half") = "bf16", "Gradients of sum(out * dout) -> (dq, dk, dv).");
  r.def("merge_partials", &merge_partials, nb::arg("o"), nb::arg("lse"), nb::arg("lse_base") = "2",
        nb::arg("attn_sink") = nb::none(),
        "Merges split-KV partials: o (rows, n, d_v), lse (rows, n) in base '2' or 'e' -> (out (rows, d_v), "
        "lse (rows,) natural).");
  r.def("fp8_encode_pages", &fp8_encode_pages, nb::arg("values"), nb::arg("out"), nb::arg("half") = "bf16",
        "Encodes bf16 values (num_blocks, page_size, 1, d_qk) into the FP8 byte cache `out` in place.");
  r.def("fp8_decode_pages", &fp8_decode_pages, nb::arg("cache"),
        "Decodes an FP8 byte cache into bf16 bit patterns (num_blocks, page_size, 1, d_qk), uint16.");
}

}  // namespace openmla::py
