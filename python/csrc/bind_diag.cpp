// Diagnostics: the per-call host path (tools/diag/host_profile.py): times, inside the binding, each step the per-call
// entries of bind_decode_step.cpp take (reading a tensor, the framework's current stream, an output allocation, the GIL
// release, the device switch, the launch-context checks), so a profile separates them from the Python call around
// them; in a trace build, the kernels' traces (tools/diag/kernel_trace.py); the FP8 prefill forward's key block (an
// A/B of its two kernels).
// Not an API: the names start with an underscore.
#include <nanobind/stl/optional.h>

#include <chrono>
#include <functional>
#include <optional>
#include <string>

#include "api/validate.h"
#include "bind_common.h"
#include "heuristics/mha_prefill_launch.h"
#include "object_tensors.h"

#if defined(OPENMLA_HAS_TRACE)
#include <nanobind/stl/vector.h>

#include <vector>

#include "api/trace.h"
#endif

namespace openmla::py {

namespace {

constexpr int kCallsPerBatch = 32;

// Per-call nanoseconds of `batches` batches of kCallsPerBatch calls of `what` on `tensor` (its dtype, shape and
// device where the step needs them). Steps:
//   noop            nothing (the loop's own cost)
//   read            one tensor read (the DLPack exchange API, or __dlpack__ for other exporters)
//   stream          the framework's current stream of the tensor's device
//   alloc           a new framework tensor of the tensor's shape and dtype on its device (released at once)
//   alloc_strided   the same with the tensor's strides (a view of one allocation, as decode's lse)
//   alloc_pair      decode's out (the tensor's shape) and lse in one allocation, as the entries allocate them
//   gil             release and re-acquire the GIL
//   scoped_device   make the tensor's device current (a no-op switch when it already is) and restore
//   launch_context  the C++ API's checks before a launch (pending error, current device, stream's device)
//   launch_context_known  the same for the framework's stream, which the binding vouches for (ScopedKnownStream)
//   sm_count        the binding's cached SM count
nb::list host_probe(const std::string& what, int batches, nb::handle tensor) {
  TensorReader reader;
  const TensorRef t = reader.read(tensor, "tensor");
  const dlpack::ExchangeApi* api = reader.api();
  const int device = t.device_id;
  const bool on_cuda = t.device == DeviceType::kCUDA;
  auto need = [&](bool cuda) {
    if (api == nullptr) throw nb::value_error("_host_probe needs a tensor of a framework with the exchange API");
    if (cuda && !on_cuda) throw nb::value_error(("_host_probe('" + what + "') needs a CUDA tensor").c_str());
  };
  int64_t storage = 1;
  for (int i = 0; i < t.ndim; ++i) storage += (t.shape[i] - 1) * t.stride[i];
  std::function<void()> call;
  cudaStream_t stream = nullptr;
  if (what == "noop") {
    call = [] {};
  } else if (what == "read") {
    call = [&] {
      TensorReader r;
      (void)r.read(tensor, "tensor");
    };
  } else if (what == "stream") {
    need(true);
    call = [&] { (void)current_stream(*api, device); };
  } else if (what == "alloc" || what == "alloc_strided") {
    need(true);
    if (t.ndim != 3 && t.ndim != 4) throw nb::value_error("_host_probe alloc: a 3- or 4-dimensional tensor");
    const bool strided = what == "alloc_strided";
    call = [&, strided] {
      nb::object o;
      if (t.ndim == 4)
        o = strided ? new_cuda_tensor(*api, device, t.dtype, {t.shape[0], t.shape[1], t.shape[2], t.shape[3]},
                                      {t.stride[0], t.stride[1], t.stride[2], t.stride[3]}, storage)
                    : new_cuda_tensor(*api, device, t.dtype, {t.shape[0], t.shape[1], t.shape[2], t.shape[3]});
      else
        o = strided ? new_cuda_tensor(*api, device, t.dtype, {t.shape[0], t.shape[1], t.shape[2]},
                                      {t.stride[0], t.stride[1], t.stride[2]}, storage)
                    : new_cuda_tensor(*api, device, t.dtype, {t.shape[0], t.shape[1], t.shape[2]});
    };
  } else if (what == "alloc_pair") {
    need(true);
    if (t.ndim != 4) throw nb::value_error("_host_probe alloc_pair: a decode out-like (b, s_q, h_q, d_v) tensor");
    call = [&] {
      nb::object made[2];
      const int64_t b = t.shape[0], s_q = t.shape[1], h_q = t.shape[2];
      new_cuda_tensors(*api, device,
                       {{t.dtype, {b, s_q, h_q, t.shape[3]}}, {DType::kFloat32, {b, h_q, s_q}, {s_q * h_q, 1, h_q}}},
                       made);
    };
  } else if (what == "gil") {
    call = [] { nb::gil_scoped_release release; };
  } else if (what == "scoped_device") {
    need(true);
    call = [&] { ScopedDevice d(device); };
  } else if (what == "launch_context") {
    need(true);
    stream = current_stream(*api, device);
    call = [&] { (void)detail::check_launch_context(device, "tensor", stream, "_host_probe"); };
  } else if (what == "launch_context_known") {
    need(true);
    stream = current_stream(*api, device);
    call = [&] {
      detail::ScopedKnownStream known(stream, device);
      (void)detail::check_launch_context(device, "tensor", stream, "_host_probe");
    };
  } else if (what == "sm_count") {
    need(true);
    call = [&] { (void)device_sm_count(device); };
  } else {
    throw nb::value_error(("_host_probe: unknown step '" + what + "'").c_str());
  }
  for (int i = 0; i < kCallsPerBatch; ++i) call();  // warm-up
  nb::list per_call;
  for (int b = 0; b < batches; ++b) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kCallsPerBatch; ++i) call();
    const auto t1 = std::chrono::steady_clock::now();
    per_call.append(std::chrono::duration<double, std::nano>(t1 - t0).count() / kCallsPerBatch);
  }
  return per_call;
}

// The (out, lse) pair the decode entries allocate when the caller passes neither (one shared allocation), on
// `like`'s device (CPU too: the tests of machines without a GPU). For tests.
nb::tuple new_decode_outputs(nb::handle like, int64_t b, int64_t s_q, int64_t h_q, int64_t d_v) {
  TensorReader reader;
  const TensorRef t = reader.read(like, "like");
  if (reader.api() == nullptr) throw nb::value_error("_new_decode_outputs needs a tensor of a framework with the exchange API");
  nb::object made[2];
  new_tensors(*reader.api(), t.device == DeviceType::kCUDA ? dlpack::kDLCUDA : dlpack::kDLCPU, t.device_id,
              {{t.dtype, {b, s_q, h_q, d_v}}, {DType::kFloat32, {b, h_q, s_q}, {s_q * h_q, 1, h_q}}}, made);
  return nb::make_tuple(made[0], made[1]);
}

#if defined(OPENMLA_HAS_TRACE)
// The trace of `kernel`'s last launch (api/trace.h), flat, in the format of common/trace_format.h; [] after a clear.
std::vector<unsigned long long> read_trace(const std::string& kernel, bool clear) {
  trace::Kernel k;
  throw_if_error(detail::trace_kernel_from_name(kernel, &k));
  size_t count = 0;
  throw_if_error(detail::trace_values(k, &count));
  std::vector<unsigned long long> v(clear ? 0 : count);
  {
    nb::gil_scoped_release release;  // the read synchronises the device
    throw_if_error(detail::read_trace(k, v.data(), v.size(), clear));
  }
  return v;
}
#endif

}  // namespace

void bind_diag(nb::module_& m) {
  m.def("_new_decode_outputs", &new_decode_outputs, nb::arg("like"), nb::arg("b"), nb::arg("s_q"), nb::arg("h_q"),
        nb::arg("d_v"),
        "Tests: the (out, lse) a decode entry allocates (one shared allocation) on like's device, in like's dtype.");
  // The FP8 dense prefill forward's key block (heuristics::mha_prefill_fp8_block_n, decision fp8-d5): 128 or 192 for
  // later calls; None (or another value) clears the override (then OPENMLA_FP8_BLOCK_N, read once, or the default).
  // Process-wide. The benchmark's and the tests' A/B of the two kernels in one process.
  m.def(
      "_set_mha_prefill_fp8_block_n",
      [](std::optional<int> block_n) { heuristics::set_mha_prefill_fp8_block_n(block_n.value_or(0)); },
      nb::arg("block_n").none());
  m.def("_mha_prefill_fp8_block_n", [] { return heuristics::mha_prefill_fp8_block_n(); },
        "The key block later FP8 dense prefill calls launch (128 or 192; 0: OPENMLA_FP8_BLOCK_N is invalid).");
  m.def("_host_probe", &host_probe, nb::arg("what"), nb::arg("batches"), nb::arg("tensor"),
        "Diagnostics (tools/diag/host_profile.py): per-call ns of one step of the per-call host path, one value per "
        "batch of 32 calls.");
#if defined(OPENMLA_HAS_TRACE)
  // Trace builds only (CMake -DOPENMLA_TRACE=ON): bound whatever families the build has; for an absent one it raises
  // NotImplementedError naming the CMake option (api/trace.h).
  m.def("_trace", &read_trace, nb::arg("kernel"), nb::arg("clear") = false,
        "Trace builds: the trace of the last launch of kernel ('dense_decode', 'sparse_decode', 'sparse_prefill', "
        "'mha_prefill'; the variant that launched last), flat (common/trace_format.h; tools/diag/kernel_trace.py "
        "parses it); clear=True zeroes the trace of every variant instead and returns [].");
#endif
}

}  // namespace openmla::py
