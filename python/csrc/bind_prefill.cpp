// Binding of include/openmla/prefill.h: sparse top-k prefill.
//
// Thin on purpose: arrays become TensorRefs, the C++ API does every check, and its Status becomes the matching
// Python exception with the message unchanged. The flash_mla-compatible layer is python/openmla/prefill.py.
#include <string>

#include <nanobind/stl/string.h>

#include "bind_common.h"
#include "openmla/prefill.h"

namespace openmla::py {

namespace {

void sparse(const Array& q, const Array& kv, const Array& indices, const Array& out, const Array& max_logits,
            const Array& lse, const OptArray& topk_length, const OptArray& attn_sink, float softmax_scale,
            int64_t d_v, uintptr_t stream) {
  SparsePrefillArgs args;
  args.q = to_tensor_ref(q, "q");
  args.kv = to_tensor_ref(kv, "kv");
  args.indices = to_tensor_ref(indices, "indices");
  args.topk_length = to_tensor_ref(topk_length, "topk_length");
  args.attn_sink = to_tensor_ref(attn_sink, "attn_sink");
  args.softmax_scale = softmax_scale;
  args.d_v = d_v;
  args.out = to_tensor_ref(out, "out");
  args.max_logits = to_tensor_ref(max_logits, "max_logits");
  args.lse = to_tensor_ref(lse, "lse");
  Status status;
  {
    nb::gil_scoped_release release;
    status = sparse_prefill(args, to_stream(stream));
  }
  throw_if_error(status);
}

// Sparse prefill from the FP8 cache: `format` is "v32" or "model1" (the names of openmla.kv_cache).
void sparse_fp8(const Array& q, const Array& kv_cache, const std::string& format, const Array& indices,
                const Array& out, const Array& max_logits, const Array& lse, const OptArray& topk_length,
                const OptArray& attn_sink, float softmax_scale, int64_t d_v, uintptr_t stream) {
  SparsePrefillFp8Args args;
  if (format == "v32" || format == "fp8_v32") {
    args.cache_format = KVCacheFormat::kFp8V32;
  } else if (format == "model1" || format == "fp8_model1") {
    args.cache_format = KVCacheFormat::kFp8Model1;
  } else {
    throw nb::value_error(("argument 'kv_cache_format': unknown FP8 cache format '" + format +
                           "'; expected 'v32' (d_qk 576, 656 B/token) or 'model1' (d_qk 512, 584 B/token)")
                              .c_str());
  }
  args.q = to_tensor_ref(q, "q");
  args.kv_cache = to_tensor_ref(kv_cache, "kv_cache");
  args.indices = to_tensor_ref(indices, "indices");
  args.topk_length = to_tensor_ref(topk_length, "topk_length");
  args.attn_sink = to_tensor_ref(attn_sink, "attn_sink");
  args.softmax_scale = softmax_scale;
  args.d_v = d_v;
  args.out = to_tensor_ref(out, "out");
  args.max_logits = to_tensor_ref(max_logits, "max_logits");
  args.lse = to_tensor_ref(lse, "lse");
  Status status;
  {
    nb::gil_scoped_release release;
    status = sparse_prefill_fp8(args, to_stream(stream));
  }
  throw_if_error(status);
}

}  // namespace

void bind_prefill(nb::module_& m) {
  m.def("sparse_prefill", &sparse, nb::arg("q"), nb::arg("kv"), nb::arg("indices"), nb::arg("out"),
        nb::arg("max_logits"), nb::arg("lse"), nb::arg("topk_length") = nb::none(), nb::arg("attn_sink") = nb::none(),
        nb::arg("softmax_scale") = 0.f, nb::arg("d_v") = 512, nb::arg("stream") = 0,
        "sparse_prefill(q, kv, indices, out, max_logits, lse, topk_length=None, attn_sink=None, softmax_scale=0.0, "
        "d_v=512, stream=0)\n\n"
        "Sparse top-k MLA prefill on `stream` (a cudaStream_t as int). q: (s_q, h_q, d_qk) bf16, d_qk 576 or 512; "
        "kv: (s_kv, 1, d_qk) bf16; indices: (s_q, 1, topk) int32 (invalid: < 0 or >= s_kv); topk_length: (s_q,) "
        "int32 per query token; attn_sink: (h_q,) float32; out: (s_q, h_q, 512) bf16, written; max_logits, lse: "
        "(s_q, h_q) float32, written (natural log; +inf lse / -inf max for a row without a valid key). "
        "softmax_scale 0 means d_qk ** -0.5.");
  m.def("sparse_prefill_fp8", &sparse_fp8, nb::arg("q"), nb::arg("kv_cache"), nb::arg("kv_cache_format"),
        nb::arg("indices"), nb::arg("out"), nb::arg("max_logits"), nb::arg("lse"), nb::arg("topk_length") = nb::none(),
        nb::arg("attn_sink") = nb::none(), nb::arg("softmax_scale") = 0.f, nb::arg("d_v") = 512,
        nb::arg("stream") = 0,
        "sparse_prefill_fp8(q, kv_cache, kv_cache_format, indices, out, max_logits, lse, topk_length=None, "
        "attn_sink=None, softmax_scale=0.0, d_v=512, stream=0)\n\n"
        "Sparse top-k MLA prefill straight from the paged FP8 cache (bf16 compute). kv_cache: (num_blocks, "
        "page_size, 1, 656 | 584) bytes of kv_cache_format 'v32' | 'model1'; indices: (s_q, 1, topk) int32 cache "
        "slots (page * page_size + row; invalid: < 0 or >= num_blocks * page_size); the rest as sparse_prefill.");
}

}  // namespace openmla::py
