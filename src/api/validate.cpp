// Argument checks shared by every kernel family (api/validate.h).
#include "api/validate.h"

#include <cmath>

namespace openmla::detail {

namespace {
std::string join_dims(const int64_t* v, int n) {
  MessageStream os;
  os << "(";
  for (int i = 0; i < n; ++i) os << (i ? ", " : "") << v[i];
  if (n == 1) os << ",";
  os << ")";
  return os.str();
}
std::string quoted(const char* name) { return std::string("argument '") + name + "'"; }
}  // namespace

std::string shape_string(const TensorRef& t) { return join_dims(t.shape, t.ndim); }
std::string stride_string(const TensorRef& t) { return join_dims(t.stride, t.ndim); }

Status check_defined(const TensorRef& t, const char* name) {
  if (!t.defined() || t.data == nullptr) return Status::invalid_argument(quoted(name) + " is required but was not given");
  return Status::ok();
}

Status check_on_cuda(const TensorRef& t, const char* name) {
  OPENMLA_RETURN_IF_ERROR(check_defined(t, name));
  if (t.device != DeviceType::kCUDA)
    return Status::invalid_argument(quoted(name) + " must be a CUDA tensor, got a CPU (host) tensor");
  return Status::ok();
}

Status check_same_device(const TensorRef& a, const char* a_name, const TensorRef& b, const char* b_name) {
  if (a.device != b.device || a.device_id != b.device_id) {
    MessageStream os;
    os << quoted(b_name) << " is on " << (b.device == DeviceType::kCUDA ? "cuda:" : "cpu:") << b.device_id
       << " but " << quoted(a_name) << " is on " << (a.device == DeviceType::kCUDA ? "cuda:" : "cpu:")
       << a.device_id << "; all tensors must be on the same device";
    return Status::invalid_argument(os.str());
  }
  return Status::ok();
}

Status check_dtype(const TensorRef& t, const char* name, std::initializer_list<DType> allowed) {
  for (DType d : allowed)
    if (t.dtype == d) return Status::ok();
  MessageStream os;
  os << quoted(name) << " has dtype " << dtype_name(t.dtype) << ", expected ";
  int i = 0;
  for (DType d : allowed) os << (i++ ? " or " : "") << dtype_name(d);
  return Status::invalid_argument(os.str());
}

Status check_ndim(const TensorRef& t, const char* name, int ndim) {
  if (t.ndim != ndim) {
    MessageStream os;
    os << quoted(name) << " must have " << ndim << " dimensions, got shape " << shape_string(t);
    return Status::invalid_argument(os.str());
  }
  return Status::ok();
}

Status check_dim(const TensorRef& t, const char* name, int dim, int64_t expected, const char* what) {
  int d = dim < 0 ? dim + t.ndim : dim;
  if (t.shape[d] != expected) {
    MessageStream os;
    os << quoted(name) << " has size " << t.shape[d] << " in dimension " << d;
    if (what) os << " (" << what << ")";
    os << ", expected " << expected << "; shape " << shape_string(t);
    return Status::invalid_argument(os.str());
  }
  return Status::ok();
}

Status check_last_dim_contiguous(const TensorRef& t, const char* name) {
  if (t.ndim > 0 && t.shape[t.ndim - 1] > 1 && t.stride[t.ndim - 1] != 1) {
    MessageStream os;
    os << quoted(name) << " must be contiguous in its last dimension, got strides " << stride_string(t);
    return Status::invalid_argument(os.str());
  }
  return Status::ok();
}

Status check_contiguous(const TensorRef& t, const char* name) {
  if (!t.is_contiguous()) {
    MessageStream os;
    os << quoted(name) << " must be contiguous, got shape " << shape_string(t) << " with strides "
       << stride_string(t);
    return Status::invalid_argument(os.str());
  }
  return Status::ok();
}

Status check_strides_multiple(const TensorRef& t, const char* name, int64_t elems, const char* why) {
  for (int i = 0; i + 1 < t.ndim; ++i) {
    if (t.shape[i] > 1 && t.stride[i] % elems != 0) {
      MessageStream os;
      os << quoted(name) << " has stride " << t.stride[i] << " in dimension " << i << ", which must be a multiple of "
         << elems << " elements (" << elems * static_cast<int64_t>(t.element_size()) << " bytes; " << why
         << "); strides " << stride_string(t);
      return Status::invalid_argument(os.str());
    }
  }
  return Status::ok();
}

Status check_pointer_aligned(const TensorRef& t, const char* name, int64_t bytes) {
  if (reinterpret_cast<uintptr_t>(t.data) % static_cast<uintptr_t>(bytes) != 0) {
    MessageStream os;
    os << quoted(name) << " data pointer must be " << bytes << "-byte aligned";
    return Status::invalid_argument(os.str());
  }
  return Status::ok();
}

Status check_fits_int32(const TensorRef& t, const char* name) {
  constexpr int64_t kMax = 2147483647;
  for (int i = 0; i < t.ndim; ++i) {
    if (t.shape[i] > kMax || t.stride[i] > kMax || t.stride[i] < -kMax) {
      MessageStream os;
      os << quoted(name) << " has a size or stride that does not fit in int32: shape " << shape_string(t)
         << ", strides " << stride_string(t);
      return Status::invalid_argument(os.str());
    }
  }
  return Status::ok();
}

Status check_cuda_tensor(const TensorRef& t, const char* name, std::initializer_list<DType> dtypes, int ndim) {
  OPENMLA_RETURN_IF_ERROR(check_on_cuda(t, name));
  OPENMLA_RETURN_IF_ERROR(check_dtype(t, name, dtypes));
  return check_ndim(t, name, ndim);
}

Status check_lengths(const TensorRef& t, const char* name, int64_t n, const char* what) {
  OPENMLA_RETURN_IF_ERROR(check_cuda_tensor(t, name, {DType::kInt32}, 1));
  OPENMLA_RETURN_IF_ERROR(check_dim(t, name, 0, n, what));
  return check_contiguous(t, name);
}

Status check_same_device_all(const TensorRef& ref, const char* ref_name,
                             std::initializer_list<std::pair<const TensorRef*, const char*>> others) {
  for (const auto& [t, name] : others)
    if (t->defined()) OPENMLA_RETURN_IF_ERROR(check_same_device(ref, ref_name, *t, name));
  return Status::ok();
}

Status check_softmax_scale(float softmax_scale) {
  if (std::isfinite(softmax_scale)) return Status::ok();
  MessageStream os;
  os << "argument 'softmax_scale' is " << softmax_scale << "; expected a finite value (0: d_qk ** -0.5)";
  return invalid(os.str());
}

Status device_sm_count(int device_id, int* num_sms, const char* why) {
  OPENMLA_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(num_sms, cudaDevAttrMultiProcessorCount, device_id), why);
  return Status::ok();
}

Status check_current_device(int device_id, const char* tensor_name) {
  int current = -1;
  OPENMLA_CUDA_RETURN_IF_ERROR(cudaGetDevice(&current), "cudaGetDevice");
  if (current != device_id) {
    MessageStream os;
    os << "argument '" << tensor_name << "' is on cuda:" << device_id << " but the current device is cuda:" << current
       << "; call cudaSetDevice(" << device_id << ") first (the stream must belong to that device)";
    return invalid(os.str());
  }
  return Status::ok();
}

}  // namespace openmla::detail
