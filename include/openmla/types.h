// OpenMLA: framework-free tensor view used by every public entry point.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>

namespace openmla {

enum class DType : int {
  kBFloat16 = 0,
  kFloat16 = 1,
  kFloat32 = 2,
  kInt32 = 3,
  kInt64 = 4,
  kUInt8 = 5,
  kInt8 = 6,
  kFloat8E4M3 = 7,  // float8_e4m3fn
};

const char* dtype_name(DType dtype);
size_t dtype_size(DType dtype);

enum class DeviceType : int { kCPU = 0, kCUDA = 1 };

// A non-owning view of a strided tensor. Shapes and strides are int64; strides count elements, not
// bytes. A TensorRef with data == nullptr and ndim == 0 means "absent" for optional arguments.
struct TensorRef {
  static constexpr int kMaxDims = 6;

  void* data = nullptr;
  DType dtype = DType::kFloat32;
  int ndim = 0;
  int64_t shape[kMaxDims] = {};
  int64_t stride[kMaxDims] = {};
  DeviceType device = DeviceType::kCPU;
  int device_id = 0;

  bool defined() const { return data != nullptr || ndim > 0; }
  int64_t size(int dim) const { return shape[dim < 0 ? dim + ndim : dim]; }
  int64_t stride_of(int dim) const { return stride[dim < 0 ? dim + ndim : dim]; }
  int64_t numel() const;
  bool is_contiguous() const;
  size_t element_size() const { return dtype_size(dtype); }
};

// Builds a contiguous (row-major) view.
TensorRef make_tensor(void* data, DType dtype, std::initializer_list<int64_t> shape,
                      DeviceType device = DeviceType::kCUDA, int device_id = 0);
// Builds a strided view.
TensorRef make_tensor(void* data, DType dtype, std::initializer_list<int64_t> shape,
                      std::initializer_list<int64_t> stride, DeviceType device = DeviceType::kCUDA,
                      int device_id = 0);

}  // namespace openmla
