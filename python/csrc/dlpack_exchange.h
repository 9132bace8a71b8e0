// The DLPack C exchange API (DLPack >= 1.2): a table of C functions a tensor framework publishes on its tensor
// type as `type(t).__dlpack_c_exchange_api__`, a PyCapsule named "dlpack_exchange_api" (PyTorch >= 2.10).
// Through it a library reads a tensor object's pointer, shape, strides, dtype and device into a DLTensor, asks
// the framework for its current stream and allocates framework tensors, all without a Python call, a capsule or
// a stream synchronisation. That is what makes python/csrc/fast_path.cpp cheap (docs/python-api.md, "Host cost").
//
// Only the C ABI is declared here (the structs and function types of the DLPack specification); the DLTensor
// itself is nanobind's `nb::dlpack::dltensor`, which has the same layout.
#pragma once

#include <cstdint>

#include <nanobind/ndarray.h>

namespace openmla::py::dlpack {

using DLTensor = nanobind::dlpack::dltensor;

inline constexpr int32_t kDLCPU = 1;
inline constexpr int32_t kDLCUDA = 2;
// The exchange API major version this file implements; a table of another major version is not used.
inline constexpr uint32_t kExchangeMajorVersion = 1;

struct DLPackVersion {
  uint32_t major;
  uint32_t minor;
};

// A DLTensor with its owner: `deleter(self)` releases it. The versioned form of DLPack 1.x.
struct DLManagedTensorVersioned {
  DLPackVersion version;
  void* manager_ctx;
  void (*deleter)(DLManagedTensorVersioned* self);
  uint64_t flags;
  DLTensor dl_tensor;
};

// Every function returns 0 on success; on failure -1 with a Python exception set (the allocator reports
// through `set_error` instead).
using ManagedTensorAllocator = int (*)(DLTensor* prototype, DLManagedTensorVersioned** out, void* error_ctx,
                                       void (*set_error)(void* error_ctx, const char* kind, const char* message));
using ManagedTensorFromPyObjectNoSync = int (*)(void* py_object, DLManagedTensorVersioned** out);
using ManagedTensorToPyObjectNoSync = int (*)(DLManagedTensorVersioned* tensor, void** out_py_object);
using DLTensorFromPyObjectNoSync = int (*)(void* py_object, DLTensor* out);
using CurrentWorkStream = int (*)(int32_t device_type, int32_t device_id, void** out_current_stream);

struct ExchangeApiHeader {
  DLPackVersion version;
  ExchangeApiHeader* prev_api;  // an older version of the table, or null
};

struct ExchangeApi {
  ExchangeApiHeader header;
  ManagedTensorAllocator managed_tensor_allocator;
  ManagedTensorFromPyObjectNoSync managed_tensor_from_py_object_no_sync;
  ManagedTensorToPyObjectNoSync managed_tensor_to_py_object_no_sync;
  DLTensorFromPyObjectNoSync dltensor_from_py_object_no_sync;  // may be null
  CurrentWorkStream current_work_stream;
};

}  // namespace openmla::py::dlpack
