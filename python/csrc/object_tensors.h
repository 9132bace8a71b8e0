// Python tensor objects -> TensorRefs, the framework's current stream and framework-owned outputs, for the
// per-call entries of bind_decode_step.cpp.
//
// A tensor whose type publishes the DLPack C exchange API (torch >= 2.10: dlpack_exchange.h) is read in place:
// one C call fills a DLTensor view, with no Python call, capsule or __dlpack__ export, and no stream
// synchronisation. Any other DLPack exporter (older torch, numpy, cupy...) goes through nanobind's ndarray
// (__dlpack__), which TensorReader keeps alive until the call returns.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>
#include <vector>

#include "api/validate.h"
#include "bind_common.h"
#include "dlpack_exchange.h"

namespace openmla::py {

// The exchange table of `obj`'s type, or null when the type publishes none (or one of another major version).
// Looked up once per type. Needs the GIL.
const dlpack::ExchangeApi* exchange_api_of(PyObject* obj);

// Reads the tensor arguments of one call. Needs the GIL; the TensorRefs it returns stay valid while the
// objects (and this reader) are alive.
class TensorReader {
 public:
  // None -> an undefined TensorRef. Anything that is not a tensor raises TypeError naming `name`; a tensor
  // with more dimensions than a TensorRef holds, or a dtype OpenMLA does not know, raises ValueError.
  TensorRef read(nanobind::handle obj, const char* name);

  // The exchange table of the first tensor read through one (the framework that owns the call's tensors),
  // or null when none was.
  const dlpack::ExchangeApi* api() const { return api_; }

  // The exchange table the last tensor read came through, or null (read through __dlpack__, or None): which
  // framework it belongs to, for the entries that take one framework's tensors only.
  const dlpack::ExchangeApi* last_route() const { return last_route_; }

 private:
  const dlpack::ExchangeApi* api_ = nullptr;
  const dlpack::ExchangeApi* last_route_ = nullptr;
  std::vector<Array> kept_;  // arrays imported through __dlpack__: they own their DLPack capsules
};

// The framework's current stream on CUDA device `device_id` (torch.cuda.current_stream(device_id)).
cudaStream_t current_stream(const dlpack::ExchangeApi& api, int device_id);

// A new framework tensor (a torch.Tensor for torch) of `dtype` on CUDA device `device_id`, allocated by the
// framework's allocator on its current stream of that device (so CUDA-graph capture and stream-ordered reuse
// behave as for the framework's own tensors). `strides` (elements) may be empty for a contiguous tensor;
// otherwise the tensor is a strided view of one allocation of `storage_elems` elements.
nanobind::object new_cuda_tensor(const dlpack::ExchangeApi& api, int device_id, DType dtype,
                                 std::initializer_list<int64_t> shape, std::initializer_list<int64_t> strides = {},
                                 int64_t storage_elems = -1);

// One tensor of new_cuda_tensors: dtype, shape and strides in elements (empty: contiguous).
struct NewTensor {
  DType dtype;
  std::initializer_list<int64_t> shape;
  std::initializer_list<int64_t> strides = {};
};

// Several new framework tensors on CUDA device `device_id` carved from ONE framework allocation: one allocator call
// instead of one per tensor (each costs microseconds: docs/integration.md, "Host cost"). Tensor i starts at a
// multiple of 256 bytes from the allocation's start (itself 512-byte aligned by torch's CUDA allocator) and is
// written to out[i]; the allocation is released when the last of them is (so a
// tensor kept alive keeps the others' memory too).
void new_cuda_tensors(const dlpack::ExchangeApi& api, int device_id, std::initializer_list<NewTensor> tensors,
                      nanobind::object* out);
// The same on a device of DLPack type `device_type` (kDLCPU for the tests of machines without a GPU).
void new_tensors(const dlpack::ExchangeApi& api, int32_t device_type, int device_id,
                 std::initializer_list<NewTensor> tensors, nanobind::object* out);

// The stream of a call: the caller's (`stream` an int) when given, else the framework's current stream of
// `device_id` (`api` may be null only when the caller gives the stream).
struct CallStream {
  cudaStream_t stream = nullptr;
  // The framework's current stream of the call's device, which belongs to that device by construction: the C++
  // API need not ask the driver for its device (api/validate.h, ScopedKnownStream). False for a caller's stream.
  bool framework = false;
};
CallStream call_stream(const dlpack::ExchangeApi* api, nanobind::handle stream, int device_id);

// The SM count of CUDA device `device_id`, queried once per device.
int device_sm_count(int device_id);

// Makes `device_id` the current CUDA device for the scope when it is not already (the C++ API refuses to
// launch on another device than its tensors'); restores the previous one on exit.
class ScopedDevice {
 public:
  explicit ScopedDevice(int device_id);
  ~ScopedDevice();
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;

 private:
  int previous_ = -1;
};

// Runs `launch` (a callable returning a Status) with the GIL released and `device_id` current, then raises the
// Python exception of its status (throw_if_error). `stream`: the call's stream (a framework stream is known to
// belong to `device_id`).
template <class Launch>
void launch_without_gil(int device_id, const CallStream& stream, Launch&& launch) {
  Status status;
  {
    nanobind::gil_scoped_release release;
    ScopedDevice device(device_id);
    if (stream.framework) {
      detail::ScopedKnownStream known(stream.stream, device_id);
      status = launch();
    } else {
      status = launch();
    }
  }
  throw_if_error(status);
}

}  // namespace openmla::py
