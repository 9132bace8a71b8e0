#include "openmla/types.h"

#include "openmla/status.h"

namespace openmla {

const char* status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "ok";
    case StatusCode::kInvalidArgument: return "invalid_argument";
    case StatusCode::kUnsupported: return "unsupported";
    case StatusCode::kCudaError: return "cuda_error";
    case StatusCode::kInternal: return "internal";
  }
  return "unknown";
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kBFloat16: return "bfloat16";
    case DType::kFloat16: return "float16";
    case DType::kFloat32: return "float32";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
    case DType::kUInt8: return "uint8";
    case DType::kInt8: return "int8";
    case DType::kFloat8E4M3: return "float8_e4m3fn";
  }
  return "unknown";
}

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kBFloat16:
    case DType::kFloat16: return 2;
    case DType::kFloat32:
    case DType::kInt32: return 4;
    case DType::kInt64: return 8;
    case DType::kUInt8:
    case DType::kInt8:
    case DType::kFloat8E4M3: return 1;
  }
  return 0;
}

int64_t TensorRef::numel() const {
  if (!valid_ndim()) return 0;
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[i];
  return n;
}

bool TensorRef::is_contiguous() const {
  if (!valid_ndim()) return false;
  int64_t expected = 1;
  for (int i = ndim - 1; i >= 0; --i) {
    if (shape[i] != 1 && stride[i] != expected) return false;
    expected *= shape[i];
  }
  return true;
}

namespace {
// A view of `shape`, or of no valid rank (ndim = kInvalidNdim, shape and strides left zero) when the shape has more
// dimensions than a TensorRef holds: nothing is ever written past its arrays (include/openmla/types.h).
TensorRef make_base(void* data, DType dtype, std::initializer_list<int64_t> shape, DeviceType device, int device_id) {
  TensorRef t;
  t.data = data;
  t.dtype = dtype;
  t.device = device;
  t.device_id = device_id;
  if (shape.size() > static_cast<size_t>(TensorRef::kMaxDims)) {
    t.ndim = TensorRef::kInvalidNdim;
    return t;
  }
  t.ndim = static_cast<int>(shape.size());
  int i = 0;
  for (int64_t s : shape) t.shape[i++] = s;
  return t;
}
}  // namespace

TensorRef make_tensor(void* data, DType dtype, std::initializer_list<int64_t> shape, DeviceType device,
                      int device_id) {
  TensorRef t = make_base(data, dtype, shape, device, device_id);
  int64_t s = 1;
  for (int i = t.ndim - 1; i >= 0; --i) {
    t.stride[i] = s;
    s *= t.shape[i];
  }
  return t;
}

TensorRef make_tensor(void* data, DType dtype, std::initializer_list<int64_t> shape,
                      std::initializer_list<int64_t> stride, DeviceType device, int device_id) {
  TensorRef t = make_base(data, dtype, shape, device, device_id);
  if (!t.valid_ndim() || stride.size() != shape.size()) {
    t = make_base(data, dtype, {}, device, device_id);
    t.ndim = TensorRef::kInvalidNdim;
    return t;
  }
  int i = 0;
  for (int64_t s : stride) t.stride[i++] = s;
  return t;
}

}  // namespace openmla
