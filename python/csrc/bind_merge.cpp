// Binding of include/openmla/merge.h: merge_attn_states.
//
// Thin on purpose: arrays become TensorRefs, the C++ API does every check, and its Status becomes the matching
// Python exception with the message unchanged. The user-facing layer (lists, output allocation, the current stream)
// is python/openmla/merge.py.
#include "bind_common.h"
#include "openmla/merge.h"

namespace openmla::py {

namespace {

void merge(const Array& outs, const Array& lses, const Array& out, const OptArray& lse_out, uintptr_t stream) {
  MergeStatesArgs args;
  args.outs = to_tensor_ref(outs, "outs");
  args.lses = to_tensor_ref(lses, "lses");
  args.out = to_tensor_ref(out, "out");
  args.lse_out = to_tensor_ref(lse_out, "lse_out");
  Status status;
  {
    nb::gil_scoped_release release;
    status = merge_attn_states(args, to_stream(stream));
  }
  throw_if_error(status);
}

}  // namespace

void bind_merge(nb::module_& m) {
  m.def("merge_attn_states", &merge, nb::arg("outs"), nb::arg("lses"), nb::arg("out"),
        nb::arg("lse_out") = nb::none(), nb::arg("stream") = 0,
        "merge_attn_states(outs, lses, out, lse_out=None, stream=0)\n\n"
        "Merges partial attention states on `stream` (a cudaStream_t as int). outs: (num_partials, tokens, heads, "
        "d_v) bf16/fp16/fp32, d_v a multiple of 8; lses: (num_partials, tokens, heads) float32, natural log, +-inf "
        "= empty partial; out: (tokens, heads, d_v) bf16/fp16/fp32, written; lse_out: (tokens, heads) float32, "
        "written (+inf where every partial is empty), or None.");
}

}  // namespace openmla::py
