// Argument validation shared by every public entry point. Each check returns a Status whose message
// names the argument, what was expected and what was given.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <initializer_list>
#include <string>
#include <type_traits>

#include "openmla/status.h"
#include "openmla/types.h"

namespace openmla::detail {

// Builds error messages with `<<` but without iostreams: std::ostringstream formats numbers through the
// process-wide locale, and inside a Python process whose other extensions (torch) bring their own
// libstdc++ the locale facets can belong to a different library build — seen crashing on the GPU machine.
class MessageStream {
 public:
  MessageStream& operator<<(const std::string& v) { text_ += v; return *this; }
  MessageStream& operator<<(const char* v) { text_ += v; return *this; }
  MessageStream& operator<<(char v) { text_ += v; return *this; }
  MessageStream& operator<<(bool v) { text_ += v ? "true" : "false"; return *this; }
  template <class T, std::enable_if_t<std::is_integral_v<T>, int> = 0>
  MessageStream& operator<<(T v) { text_ += std::to_string(v); return *this; }
  template <class T, std::enable_if_t<std::is_floating_point_v<T>, int> = 0>
  MessageStream& operator<<(T v) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%g", static_cast<double>(v));
    text_ += buf;
    return *this;
  }
  const std::string& str() const { return text_; }

 private:
  std::string text_;
};

std::string shape_string(const TensorRef& t);
std::string stride_string(const TensorRef& t);

Status check_defined(const TensorRef& t, const char* name);
Status check_on_cuda(const TensorRef& t, const char* name);
Status check_same_device(const TensorRef& a, const char* a_name, const TensorRef& b, const char* b_name);
Status check_dtype(const TensorRef& t, const char* name, std::initializer_list<DType> allowed);
Status check_ndim(const TensorRef& t, const char* name, int ndim);
Status check_dim(const TensorRef& t, const char* name, int dim, int64_t expected, const char* what = nullptr);
Status check_last_dim_contiguous(const TensorRef& t, const char* name);
Status check_contiguous(const TensorRef& t, const char* name);
// Every stride except the last must be a multiple of `elems` elements (16-byte vector/TMA alignment).
Status check_strides_multiple(const TensorRef& t, const char* name, int64_t elems, const char* why);
// The data pointer must be aligned to `bytes`.
Status check_pointer_aligned(const TensorRef& t, const char* name, int64_t bytes);
// Every stride (in elements) and extent must fit in int32 where kernels index with 32-bit arithmetic.
Status check_fits_int32(const TensorRef& t, const char* name);

// Wraps the last CUDA error (cudaGetLastError) into a Status naming `what`.
Status last_cuda_error(const char* what);
Status cuda_status(cudaError_t err, const char* what);

}  // namespace openmla::detail

#define OPENMLA_CUDA_RETURN_IF_ERROR(call, what)                                          \
  do {                                                                                    \
    cudaError_t openmla_err_ = (call);                                                    \
    if (openmla_err_ != cudaSuccess) return ::openmla::detail::cuda_status(openmla_err_, what); \
  } while (0)
