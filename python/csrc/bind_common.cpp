#include "bind_common.h"

#include <string>

namespace openmla::py {

bool to_dtype(const nb::dlpack::dtype& dt, DType* out) {
  using Code = nb::dlpack::dtype_code;
  const auto code = static_cast<Code>(dt.code);
  if (dt.lanes != 1) return false;
  switch (code) {
    case Code::Bfloat:
      if (dt.bits == 16) { *out = DType::kBFloat16; return true; }
      return false;
    case Code::Float:
      if (dt.bits == 16) { *out = DType::kFloat16; return true; }
      if (dt.bits == 32) { *out = DType::kFloat32; return true; }
      return false;
    case Code::Int:
      if (dt.bits == 32) { *out = DType::kInt32; return true; }
      if (dt.bits == 64) { *out = DType::kInt64; return true; }
      if (dt.bits == 8) { *out = DType::kInt8; return true; }
      return false;
    case Code::UInt:
      if (dt.bits == 8) { *out = DType::kUInt8; return true; }
      return false;
    case Code::Float8_E4M3FN:
      if (dt.bits == 8) { *out = DType::kFloat8E4M3; return true; }
      return false;
    default:
      return false;
  }
}

TensorRef to_tensor_ref(const Array& a, const char* name) {
  TensorRef t;
  if (a.ndim() > static_cast<size_t>(TensorRef::kMaxDims))
    throw nb::value_error((std::string("argument '") + name + "' has " + std::to_string(a.ndim()) +
                           " dimensions; at most " + std::to_string(TensorRef::kMaxDims) + " are supported")
                              .c_str());
  if (!to_dtype(a.dtype(), &t.dtype))
    throw nb::value_error((std::string("argument '") + name + "' has a dtype OpenMLA does not handle (DLPack code " +
                           std::to_string(a.dtype().code) + ", " + std::to_string(a.dtype().bits) + " bits)")
                              .c_str());
  t.data = const_cast<void*>(a.data());
  t.ndim = static_cast<int>(a.ndim());
  for (int i = 0; i < t.ndim; ++i) {
    t.shape[i] = static_cast<int64_t>(a.shape(i));
    t.stride[i] = static_cast<int64_t>(a.stride(i));
  }
  t.device = a.device_type() == nb::device::cuda::value ? DeviceType::kCUDA : DeviceType::kCPU;
  t.device_id = a.device_id();
  // Zero-size tensors may carry a null pointer; keep them "defined" through ndim.
  return t;
}

TensorRef to_tensor_ref(const OptArray& a, const char* name) {
  if (!a.has_value()) return TensorRef{};
  return to_tensor_ref(*a, name);
}

void throw_if_error(const Status& status) {
  if (status.is_ok()) return;
  switch (status.code()) {
    case StatusCode::kInvalidArgument: throw nb::value_error(status.message().c_str());
    case StatusCode::kUnsupported:
      PyErr_SetString(PyExc_NotImplementedError, status.message().c_str());
      throw nb::python_error();
    default: throw std::runtime_error(status.message());
  }
}

}  // namespace openmla::py
