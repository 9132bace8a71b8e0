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
//
// The stride of a size-1 dimension is never used: every entry replaces it before it checks or launches anything
// (frameworks export any value there, e.g. torch <= 2.8 exports 1 through DLPack for k_cache.unsqueeze(-2)).
// ndim outside [0, kMaxDims] (kInvalidNdim: what make_tensor returns for a view it cannot hold) is rejected by
// every entry with an error naming the argument.
struct TensorRef {
  static constexpr int kMaxDims = 6;
  static constexpr int kInvalidNdim = -1;

  void* data = nullptr;
  DType dtype = DType::kFloat32;
  int ndim = 0;
  int64_t shape[kMaxDims] = {};
  int64_t stride[kMaxDims] = {};
  DeviceType device = DeviceType::kCPU;
  int device_id = 0;

  bool defined() const { return data != nullptr || ndim != 0; }
  bool valid_ndim() const { return ndim >= 0 && ndim <= kMaxDims; }
  // size / stride_of: `dim` in [-ndim, ndim) of a view with valid_ndim().
  int64_t size(int dim) const { return shape[dim < 0 ? dim + ndim : dim]; }
  int64_t stride_of(int dim) const { return stride[dim < 0 ? dim + ndim : dim]; }
  int64_t numel() const;
  bool is_contiguous() const;
  size_t element_size() const { return dtype_size(dtype); }
};

// Builds a contiguous (row-major) view. A shape of more than TensorRef::kMaxDims dimensions (or, for the strided
// form, a stride list of another length than the shape) cannot be held: the result then keeps `data`, `dtype` and
// the device but has ndim = TensorRef::kInvalidNdim and zero shape and strides, nothing is written past the arrays,
// and every entry rejects it with an error naming the argument.
TensorRef make_tensor(void* data, DType dtype, std::initializer_list<int64_t> shape,
                      DeviceType device = DeviceType::kCUDA, int device_id = 0);
// Builds a strided view.
TensorRef make_tensor(void* data, DType dtype, std::initializer_list<int64_t> shape,
                      std::initializer_list<int64_t> stride, DeviceType device = DeviceType::kCUDA,
                      int device_id = 0);

}  // namespace openmla
