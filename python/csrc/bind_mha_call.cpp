// The per-call entry of dense MHA prefill (include/openmla/prefill.h) for flash_attn_varlen_func, with the host path
// of bind_decode_step.cpp: tensors read through the DLPack C exchange API, the framework's current stream, the
// outputs and the workspace allocated by the framework in one allocation when the caller passes no outputs. The
// C++ API checks every argument, as for the DLPack binding (bind_mha.cpp).
//
// Returns None when the general path must take the call (a tensor that is not one of a framework with the exchange
// API, of the wrong rank, not on one CUDA device, or a problem get_mha_prefill_workspace_size refuses): that path
// names what is wrong.
#include "bind_common.h"
#include "object_tensors.h"
#include "openmla/prefill.h"

namespace openmla::py {

namespace {

nb::object mha_prefill_call(nb::handle q, nb::handle k, nb::handle v, nb::handle cu_seqlens_qo,
                            nb::handle cu_seqlens_kv, int64_t max_seqlen_qo, float softmax_scale, bool causal,
                            nb::handle out, nb::handle lse, nb::handle stream) {
  TensorReader reader;
  MhaPrefillArgs args;
  args.q = reader.read(q, "q");
  if (!args.q.defined() || args.q.device != DeviceType::kCUDA || args.q.ndim != 3 || reader.api() == nullptr)
    return nb::none();
  // FP8 inputs take the general path (python/openmla/mha.py: descales, the output dtype, no autograd).
  if (args.q.dtype == DType::kFloat8E4M3 || args.q.dtype == DType::kUInt8 || args.q.dtype == DType::kInt8)
    return nb::none();
  const int device_id = args.q.device_id;
  args.k = reader.read(k, "k");
  args.v = reader.read(v, "v");
  args.cu_seqlens_qo = reader.read(cu_seqlens_qo, "cu_seqlens_qo");
  args.cu_seqlens_kv = reader.read(cu_seqlens_kv, "cu_seqlens_kv");
  for (const TensorRef* t : {&args.k, &args.v})
    if (t->ndim != 3 || t->device != DeviceType::kCUDA || t->device_id != device_id) return nb::none();
  for (const TensorRef* t : {&args.cu_seqlens_qo, &args.cu_seqlens_kv})
    if (t->ndim != 1 || t->shape[0] < 2 || t->device != DeviceType::kCUDA || t->device_id != device_id)
      return nb::none();
  const int64_t total_q = args.q.shape[0], h_q = args.q.shape[1], d_v = args.v.shape[2];
  const MhaPrefillProblem problem{.batch = args.cu_seqlens_qo.shape[0] - 1,
                                  .h_q = h_q,
                                  .h_kv = args.k.shape[1],
                                  .d_qk = args.q.shape[2],
                                  .d_v = d_v,
                                  .dtype = args.q.dtype,
                                  .causal = causal,
                                  .max_seqlen_qo = max_seqlen_qo,
                                  .num_sms = device_sm_count(device_id)};
  MhaPrefillWorkspaceSizes sizes;
  if (!get_mha_prefill_workspace_size(problem, &sizes).is_ok()) return nb::none();
  const int64_t workspace_bytes = static_cast<int64_t>(sizes.workspace_bytes);
  args.softmax_scale = softmax_scale;
  const dlpack::ExchangeApi& api = *reader.api();
  // A fresh workspace per call (the tile counter), so calls on different streams never share one.
  nb::object out_obj, lse_obj, workspace_obj;
  if (out.is_none() && lse.is_none()) {
    nb::object made[3];
    // lse as flash_mla allocates it: the transpose of a (h_q, total_q) tensor.
    new_cuda_tensors(api, device_id,
                     {{args.q.dtype, {total_q, h_q, d_v}}, {DType::kFloat32, {total_q, h_q}, {1, total_q}},
                      {DType::kUInt8, {workspace_bytes}}},
                     made);
    out_obj = std::move(made[0]);
    lse_obj = std::move(made[1]);
    workspace_obj = std::move(made[2]);
  } else {
    out_obj = out.is_none() ? new_cuda_tensor(api, device_id, args.q.dtype, {total_q, h_q, d_v}) : nb::borrow(out);
    lse_obj = lse.is_none()
                  ? new_cuda_tensor(api, device_id, DType::kFloat32, {total_q, h_q}, {1, total_q}, total_q * h_q)
                  : nb::borrow(lse);
    workspace_obj = new_cuda_tensor(api, device_id, DType::kUInt8, {workspace_bytes});
  }
  args.out = reader.read(out_obj, "out");
  args.lse = reader.read(lse_obj, "lse");
  args.workspace = reader.read(workspace_obj, "workspace");
  const CallStream s = call_stream(reader.api(), stream, device_id);
  launch_without_gil(device_id, s, [&] { return mha_prefill(problem, args, s.stream); });
  return nb::make_tuple(out_obj, lse_obj);
}

}  // namespace

void bind_mha_call(nb::module_& m) {
  m.def("mha_prefill_call", &mha_prefill_call, nb::arg("q").none(), nb::arg("k").none(), nb::arg("v").none(),
        nb::arg("cu_seqlens_qo").none(), nb::arg("cu_seqlens_kv").none(), nb::arg("max_seqlen_qo"),
        nb::arg("softmax_scale"), nb::arg("causal"), nb::arg("out").none(), nb::arg("lse").none(),
        nb::arg("stream").none() = nb::none(),
        "flash_attn_varlen_func's per-call entry -> (out, lse), or None when the general path must take the call. "
        "softmax_scale 0 means d_qk ** -0.5; missing outputs are allocated by the tensors' framework; the stream is "
        "its current one.");
}

}  // namespace openmla::py
