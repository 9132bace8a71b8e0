// The per-call entry of sparse prefill (include/openmla/prefill.h) for flash_mla_sparse_fwd, with the host path of
// bind_decode_step.cpp: tensors read through the DLPack C exchange API, the framework's current stream, outputs
// the caller does not pass allocated by the framework. The C++ API checks every argument, as for the DLPack
// binding (bind_prefill.cpp).
//
// Returns None when the general path must take the call (q not a 3-dimensional CUDA tensor of a framework with
// the exchange API, or sm_scale not a positive finite number): that path names what is wrong.
#include <cmath>

#include "bind_common.h"
#include "object_tensors.h"
#include "openmla/prefill.h"

namespace openmla::py {

namespace {

nb::object sparse_prefill_call(nb::handle q, nb::handle kv, nb::handle indices, nb::handle sm_scale, int64_t d_v,
                               nb::handle attn_sink, nb::handle topk_length, nb::handle out, nb::handle max_logits,
                               nb::handle lse, nb::handle stream) {
  if (!PyFloat_Check(sm_scale.ptr()) && !PyLong_Check(sm_scale.ptr())) return nb::none();
  const double scale = nb::cast<double>(sm_scale);
  if (!(scale > 0.0 && std::isfinite(scale))) return nb::none();
  TensorReader reader;
  SparsePrefillArgs args;
  args.q = reader.read(q, "q");
  if (!args.q.defined() || args.q.device != DeviceType::kCUDA || args.q.ndim != 3 || reader.api() == nullptr)
    return nb::none();
  const int device_id = args.q.device_id;
  const int64_t s_q = args.q.shape[0], h_q = args.q.shape[1];
  args.kv = reader.read(kv, "kv");
  args.indices = reader.read(indices, "indices");
  args.topk_length = reader.read(topk_length, "topk_length");
  args.attn_sink = reader.read(attn_sink, "attn_sink");
  args.softmax_scale = static_cast<float>(scale);
  args.d_v = d_v;
  args.num_sms = device_sm_count(device_id);  // queried once per device (0 would query it on every call)
  const dlpack::ExchangeApi& api = *reader.api();
  nb::object out_obj, max_obj, lse_obj;
  if (out.is_none() && max_logits.is_none() && lse.is_none()) {
    // One allocation for the three (new_cuda_tensors: one allocator call instead of three).
    nb::object made[3];
    new_cuda_tensors(api, device_id,
                     {{args.q.dtype, {s_q, h_q, d_v}}, {DType::kFloat32, {s_q, h_q}}, {DType::kFloat32, {s_q, h_q}}},
                     made);
    out_obj = std::move(made[0]);
    max_obj = std::move(made[1]);
    lse_obj = std::move(made[2]);
  } else {
    out_obj = out.is_none() ? new_cuda_tensor(api, device_id, args.q.dtype, {s_q, h_q, d_v}) : nb::borrow(out);
    max_obj = max_logits.is_none() ? new_cuda_tensor(api, device_id, DType::kFloat32, {s_q, h_q})
                                   : nb::borrow(max_logits);
    lse_obj = lse.is_none() ? new_cuda_tensor(api, device_id, DType::kFloat32, {s_q, h_q}) : nb::borrow(lse);
  }
  args.out = reader.read(out_obj, "out");
  args.max_logits = reader.read(max_obj, "max_logits");
  args.lse = reader.read(lse_obj, "lse");
  const CallStream s = call_stream(reader.api(), stream, device_id);
  launch_without_gil(device_id, s, [&] { return sparse_prefill(args, s.stream); });
  return nb::make_tuple(out_obj, max_obj, lse_obj);
}

}  // namespace

void bind_prefill_call(nb::module_& m) {
  m.def("sparse_prefill_call", &sparse_prefill_call, nb::arg("q").none(), nb::arg("kv").none(),
        nb::arg("indices").none(), nb::arg("sm_scale").none(), nb::arg("d_v"), nb::arg("attn_sink").none(),
        nb::arg("topk_length").none(), nb::arg("out").none(), nb::arg("max_logits").none(), nb::arg("lse").none(),
        nb::arg("stream").none() = nb::none(),
        "flash_mla_sparse_fwd's per-call entry -> (out, max_logits, lse), or None when the general path must take "
        "the call. Missing outputs are allocated by the tensors' framework; the stream is its current one.");
}

}  // namespace openmla::py
