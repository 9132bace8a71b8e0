// Binding of the dense MHA prefill section of include/openmla/prefill.h: the forward (mha_prefill) and the backward
// (mha_prefill_bwd), each with its workspace-size query.
//
// Thin on purpose: arrays become TensorRefs, the problem's fields come as keyword arguments, the C++ API does every
// check, and its Status becomes the matching Python exception with the message unchanged. The flash_mla-compatible
// layer is python/openmla/mha.py.
#include <string>

#include "bind_common.h"
#include "openmla/prefill.h"

namespace openmla::py {

namespace {

// problem.dtype by its name ("bfloat16", "float16", ...: dtype_name's spelling).
DType dtype_from_name(const std::string& name) {
  for (DType d : {DType::kBFloat16, DType::kFloat16, DType::kFloat32, DType::kInt32, DType::kInt64, DType::kUInt8,
                  DType::kInt8, DType::kFloat8E4M3})
    if (name == dtype_name(d)) return d;
  throw nb::value_error(
      ("argument 'dtype': unknown dtype name '" + name + "'; expected 'bfloat16', 'float16' or 'float8_e4m3fn'")
          .c_str());
}

// problem.epilogue by its name.
MhaPrefillEpilogue epilogue_from_name(const std::string& name) {
  if (name == "auto") return MhaPrefillEpilogue::kAuto;
  if (name == "registers") return MhaPrefillEpilogue::kRegisters;
  if (name == "staged") return MhaPrefillEpilogue::kStaged;
  throw nb::value_error(
      ("argument 'epilogue': unknown epilogue '" + name + "'; expected 'auto', 'registers' or 'staged'").c_str());
}

MhaPrefillProblem make_problem(int64_t batch, int64_t h_q, int64_t h_kv, int64_t d_qk, int64_t d_v,
                               const std::string& dtype, bool causal, int64_t max_seqlen_qo, int num_sms,
                               const std::string& epilogue = "auto") {
  return MhaPrefillProblem{.batch = batch,
                           .h_q = h_q,
                           .h_kv = h_kv,
                           .d_qk = d_qk,
                           .d_v = d_v,
                           .dtype = dtype_from_name(dtype),
                           .causal = causal,
                           .max_seqlen_qo = max_seqlen_qo,
                           .num_sms = num_sms,
                           .epilogue = epilogue_from_name(epilogue)};
}

size_t workspace_size(int64_t batch, int64_t h_q, int64_t h_kv, int64_t d_qk, int64_t d_v, const std::string& dtype,
                      bool causal, int64_t max_seqlen_qo, int num_sms) {
  MhaPrefillWorkspaceSizes sizes;
  throw_if_error(get_mha_prefill_workspace_size(
      make_problem(batch, h_q, h_kv, d_qk, d_v, dtype, causal, max_seqlen_qo, num_sms), &sizes));
  return sizes.workspace_bytes;
}

void forward(const Array& q, const Array& k, const Array& v, const Array& cu_seqlens_qo, const Array& cu_seqlens_kv,
             const Array& workspace, const Array& out, const Array& lse, int64_t batch, int64_t h_q, int64_t h_kv,
             int64_t d_qk, int64_t d_v, const std::string& dtype, bool causal, int64_t max_seqlen_qo,
             float softmax_scale, int num_sms, const std::string& epilogue, uintptr_t stream, const OptArray& q_descale,
             const OptArray& k_descale, const OptArray& v_descale) {
  const MhaPrefillProblem problem =
      make_problem(batch, h_q, h_kv, d_qk, d_v, dtype, causal, max_seqlen_qo, num_sms, epilogue);
  MhaPrefillArgs args;
  args.q = to_tensor_ref(q, "q");
  args.k = to_tensor_ref(k, "k");
  args.v = to_tensor_ref(v, "v");
  if (problem.dtype == DType::kFloat8E4M3) {
    // FP8 inputs may come as uint8 views (DLPack exports without a float8 dtype; python/openmla/mha.py checked that
    // the tensors are float8_e4m3fn before viewing them): their bytes are e4m3.
    for (TensorRef* t : {&args.q, &args.k, &args.v})
      if (t->dtype == DType::kUInt8) t->dtype = DType::kFloat8E4M3;
  }
  args.q_descale = to_tensor_ref(q_descale, "q_descale");
  args.k_descale = to_tensor_ref(k_descale, "k_descale");
  args.v_descale = to_tensor_ref(v_descale, "v_descale");
  args.cu_seqlens_qo = to_tensor_ref(cu_seqlens_qo, "cu_seqlens_qo");
  args.cu_seqlens_kv = to_tensor_ref(cu_seqlens_kv, "cu_seqlens_kv");
  args.softmax_scale = softmax_scale;
  args.workspace = to_tensor_ref(workspace, "workspace");
  args.out = to_tensor_ref(out, "out");
  args.lse = to_tensor_ref(lse, "lse");
  Status status;
  {
    nb::gil_scoped_release release;
    status = mha_prefill(problem, args, to_stream(stream));
  }
  throw_if_error(status);
}

MhaPrefillBwdProblem make_bwd_problem(int64_t batch, int64_t total_q, int64_t h_q, int64_t h_kv, int64_t d_qk,
                                      int64_t d_v, const std::string& dtype, bool causal, bool deterministic,
                                      int num_sms) {
  return MhaPrefillBwdProblem{.batch = batch,
                              .total_q = total_q,
                              .h_q = h_q,
                              .h_kv = h_kv,
                              .d_qk = d_qk,
                              .d_v = d_v,
                              .dtype = dtype_from_name(dtype),
                              .causal = causal,
                              .deterministic = deterministic,
                              .num_sms = num_sms};
}

size_t bwd_workspace_size(int64_t batch, int64_t total_q, int64_t h_q, int64_t h_kv, int64_t d_qk, int64_t d_v,
                          const std::string& dtype, bool causal, bool deterministic, int num_sms) {
  MhaPrefillBwdWorkspaceSizes sizes;
  throw_if_error(get_mha_prefill_bwd_workspace_size(
      make_bwd_problem(batch, total_q, h_q, h_kv, d_qk, d_v, dtype, causal, deterministic, num_sms), &sizes));
  return sizes.workspace_bytes;
}

void backward(const Array& q, const Array& k, const Array& v, const Array& out, const Array& dout, const Array& lse,
              const Array& cu_seqlens_qo, const Array& cu_seqlens_kv, const Array& workspace, const Array& dq,
              const Array& dk, const Array& dv, float softmax_scale, int64_t batch, int64_t total_q, int64_t h_q,
              int64_t h_kv, int64_t d_qk, int64_t d_v, const std::string& dtype, bool causal, bool deterministic,
              int num_sms, uintptr_t stream) {
  const MhaPrefillBwdProblem problem =
      make_bwd_problem(batch, total_q, h_q, h_kv, d_qk, d_v, dtype, causal, deterministic, num_sms);
  MhaPrefillBwdArgs args;
  args.q = to_tensor_ref(q, "q");
  args.k = to_tensor_ref(k, "k");
  args.v = to_tensor_ref(v, "v");
  args.out = to_tensor_ref(out, "out");
  args.dout = to_tensor_ref(dout, "dout");
  args.lse = to_tensor_ref(lse, "lse");
  args.cu_seqlens_qo = to_tensor_ref(cu_seqlens_qo, "cu_seqlens_qo");
  args.cu_seqlens_kv = to_tensor_ref(cu_seqlens_kv, "cu_seqlens_kv");
  args.softmax_scale = softmax_scale;
  args.workspace = to_tensor_ref(workspace, "workspace");
  args.dq = to_tensor_ref(dq, "dq");
  args.dk = to_tensor_ref(dk, "dk");
  args.dv = to_tensor_ref(dv, "dv");
  Status status;
  {
    nb::gil_scoped_release release;
    status = mha_prefill_bwd(problem, args, to_stream(stream));
  }
  throw_if_error(status);
}

}  // namespace

void bind_mha(nb::module_& m) {
  m.def("get_mha_prefill_workspace_size", &workspace_size, nb::kw_only(), nb::arg("batch"), nb::arg("h_q"),
        nb::arg("h_kv"), nb::arg("d_qk"), nb::arg("d_v"), nb::arg("dtype"), nb::arg("causal") = false,
        nb::arg("max_seqlen_qo") = 0, nb::arg("num_sms") = 0,
        "get_mha_prefill_workspace_size(*, batch, h_q, h_kv, d_qk, d_v, dtype, causal=False, max_seqlen_qo=0, "
        "num_sms=0) -> int\n\n"
        "Bytes of the caller-owned workspace of mha_prefill for this problem. Host-only: launches nothing.");
  m.def(
      "mha_prefill", &forward, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("cu_seqlens_qo"),
      nb::arg("cu_seqlens_kv"), nb::arg("workspace"), nb::arg("out"), nb::arg("lse"), nb::kw_only(), nb::arg("batch"),
      nb::arg("h_q"), nb::arg("h_kv"), nb::arg("d_qk"), nb::arg("d_v"), nb::arg("dtype"), nb::arg("causal") = false,
      nb::arg("max_seqlen_qo") = 0, nb::arg("softmax_scale") = 0.f, nb::arg("num_sms") = 0,
      nb::arg("epilogue") = "auto", nb::arg("stream") = 0, nb::arg("q_descale") = nb::none(),
      nb::arg("k_descale") = nb::none(), nb::arg("v_descale") = nb::none(),
      "mha_prefill(q, k, v, cu_seqlens_qo, cu_seqlens_kv, workspace, out, lse, *, batch, h_q, h_kv, d_qk, d_v, dtype, "
      "causal=False, max_seqlen_qo=0, softmax_scale=0.0, num_sms=0, epilogue='auto', stream=0, q_descale=None, "
      "k_descale=None, v_descale=None)\n\n"
      "Dense varlen MHA prefill forward on `stream` (a cudaStream_t as int). q: (total_q, h_q, d_qk); k: (total_k, "
      "h_kv, d_qk); v: (total_k, h_kv, d_v), dtype 'bfloat16' or 'float16', (d_qk, d_v) = (192, 128) or (128, 128); "
      "cu_seqlens_qo/k: (batch + 1,) int32; workspace: >= get_mha_prefill_workspace_size bytes; out: (total_q, h_q, "
      "d_v), written; lse: (total_q, h_q) float32, written (natural log; +inf for a row without keys). "
      "softmax_scale 0 means d_qk ** -0.5. epilogue: how O is stored, 'auto' (by the mean sequence length), "
      "'registers' or 'staged' (shared memory and TMA stores); the same bits either way. dtype 'float8_e4m3fn': "
      "FP8 q, k, v (float8_e4m3fn, or their uint8 views), out bfloat16 or float16, descales (batch, h_kv) float32 "
      "or single values (None: 1); forward only.");
  m.def("get_mha_prefill_bwd_workspace_size", &bwd_workspace_size, nb::kw_only(), nb::arg("batch"),
        nb::arg("total_q"), nb::arg("h_q"), nb::arg("h_kv"), nb::arg("d_qk"), nb::arg("d_v"), nb::arg("dtype"),
        nb::arg("causal") = false, nb::arg("deterministic") = false, nb::arg("num_sms") = 0,
        "get_mha_prefill_bwd_workspace_size(*, batch, total_q, h_q, h_kv, d_qk, d_v, dtype, causal=False, "
        "deterministic=False, num_sms=0) -> int\n\n"
        "Bytes of the caller-owned workspace of mha_prefill_bwd for this problem (the fp32 dq accumulator, the "
        "per-row values of the preprocess, the counters). Host-only: launches nothing.");
  m.def("mha_prefill_bwd", &backward, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::arg("dout"),
        nb::arg("lse"), nb::arg("cu_seqlens_qo"), nb::arg("cu_seqlens_kv"), nb::arg("workspace"), nb::arg("dq"),
        nb::arg("dk"), nb::arg("dv"), nb::kw_only(), nb::arg("softmax_scale"), nb::arg("batch"),
        nb::arg("total_q"), nb::arg("h_q"), nb::arg("h_kv"), nb::arg("d_qk"), nb::arg("d_v"), nb::arg("dtype"),
        nb::arg("causal") = false, nb::arg("deterministic") = false, nb::arg("num_sms") = 0, nb::arg("stream") = 0,
        "mha_prefill_bwd(q, k, v, out, dout, lse, cu_seqlens_qo, cu_seqlens_kv, workspace, dq, dk, dv, *, "
        "softmax_scale, batch, total_q, h_q, h_kv, d_qk, d_v, dtype, causal=False, deterministic=False, "
        "num_sms=0, stream=0)\n\n"
        "Dense varlen MHA prefill backward on `stream` (a cudaStream_t as int): the gradients of sum(out * dout) "
        "with respect to q, k and v, written into dq (total_q, h_q, d_qk), dk (total_k, h_kv, d_qk) and dv "
        "(total_k, h_kv, d_v). q, k, v, cu_seqlens_qo/kv and softmax_scale are the forward's; out and lse its "
        "results (lse is not differentiated); dout (total_q, h_q, d_v). workspace: >= "
        "get_mha_prefill_bwd_workspace_size bytes, rewritten. deterministic: dq added in a fixed order (bitwise "
        "identical from run to run). softmax_scale 0 means d_qk ** -0.5.");
}

}  // namespace openmla::py
