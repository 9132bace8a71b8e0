// Argument checks shared by every kernel family's API (decode, KV cache, prefill). Each check returns a Status
// whose message names the argument, what was expected and what was given. A family's own rules (its shapes,
// its problem fields) live in its api/<family>.cpp and are built from these; checks shared by the families
// of one kind live beside them (api/decode_common.h for the decode calls).
//
// Ordering rule of every public entry point: all argument checks run before the first CUDA call, so a bad call
// launches nothing and the checks can be tested without a GPU. The only CUDA queries a check may make are the
// SM count (device_sm_count) and the current device (check_current_device), both right before launching.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>

#include "common/cuda_check.h"
#include "openmla/status.h"
#include "openmla/types.h"

namespace openmla::detail {

inline constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

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

inline Status invalid(const std::string& message) { return Status::invalid_argument(message); }

// "argument 'problem.<field>' is <value>; <requirement>": a bad field of a family's problem struct.
template <typename T>
Status invalid_field(const char* field, T value, const std::string& requirement) {
  MessageStream os;
  os << "argument 'problem." << field << "' is " << value << "; " << requirement;
  return invalid(os.str());
}

std::string shape_string(const TensorRef& t);
std::string stride_string(const TensorRef& t);

// ---- One tensor ------------------------------------------------------------------------------------------------
Status check_defined(const TensorRef& t, const char* name);
Status check_on_cuda(const TensorRef& t, const char* name);
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
// A defined CUDA tensor of one of `dtypes` with `ndim` dimensions.
Status check_cuda_tensor(const TensorRef& t, const char* name, std::initializer_list<DType> dtypes, int ndim);
// A (n,) int32 contiguous CUDA vector (per-request lengths: cache_seqlens, topk_length, ...); `what` names n.
Status check_lengths(const TensorRef& t, const char* name, int64_t n, const char* what = "batch");

// ---- Several tensors -------------------------------------------------------------------------------------------
Status check_same_device(const TensorRef& a, const char* a_name, const TensorRef& b, const char* b_name);
// Every DEFINED tensor of `others` is on `ref`'s device (absent optional arguments are skipped).
Status check_same_device_all(const TensorRef& ref, const char* ref_name,
                             std::initializer_list<std::pair<const TensorRef*, const char*>> others);

// ---- Scalars ---------------------------------------------------------------------------------------------------
// softmax_scale must be finite (0 means the family's default, d_qk ** -0.5).
Status check_softmax_scale(float softmax_scale);

// ---- The device (the only CUDA calls a check makes) --------------------------------------------------------------
// The SM count of CUDA device `device_id`; `why` goes into the error message of a failed query.
Status device_sm_count(int device_id, int* num_sms, const char* why);
// Refuses to launch on a device other than the tensors' (kernels would fault on foreign pointers).
Status check_current_device(int device_id, const char* tensor_name);

}  // namespace openmla::detail
