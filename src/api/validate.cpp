// Argument checks shared by every kernel family (api/validate.h).
#include "api/validate.h"

#include <algorithm>
#include <cmath>

namespace openmla::detail {

namespace {
std::string join_dims(const int64_t* v, int n) {
  n = std::clamp(n, 0, TensorRef::kMaxDims);  // a view of no valid rank prints as ()
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

TensorRef canonical(const TensorRef& t) {
  if (!t.valid_ndim()) return t;
  TensorRef c = t;
  for (int i = c.ndim - 1; i >= 0; --i) {
    if (c.shape[i] != 1) continue;
    int64_t packed = 1;
    if (i + 1 < c.ndim && __builtin_mul_overflow(c.stride[i + 1], c.shape[i + 1], &packed))
      packed = std::numeric_limits<int64_t>::max();
    c.stride[i] = packed;
  }
  return c;
}

Status check_defined(const TensorRef& t, const char* name) {
  if (!t.valid_ndim()) {
    MessageStream os;
    os << quoted(name) << " has ndim = " << t.ndim << "; a tensor has 0 to " << TensorRef::kMaxDims
       << " dimensions (make_tensor returns ndim = " << TensorRef::kInvalidNdim
       << " for a shape of more dimensions, or a stride list of another length than the shape)";
    return Status::invalid_argument(os.str());
  }
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
    if (t.shape[i] > kMax || (t.shape[i] > 1 && (t.stride[i] > kMax || t.stride[i] < -kMax))) {
      MessageStream os;
      os << quoted(name) << " has a size or stride that does not fit in int32: shape " << shape_string(t)
         << ", strides " << stride_string(t);
      return Status::invalid_argument(os.str());
    }
  }
  return Status::ok();
}

Status check_strides_sane(const TensorRef& t, const char* name) {
  int64_t max_offset = 0;  // elements
  bool overflow = false;
  for (int i = 0; i < t.ndim; ++i) {
    if (t.shape[i] < 0) {
      MessageStream os;
      os << quoted(name) << " has a negative size in dimension " << i << "; shape " << shape_string(t);
      return Status::invalid_argument(os.str());
    }
    if (t.shape[i] <= 1) continue;
    if (t.stride[i] < 0) {
      MessageStream os;
      os << quoted(name) << " has stride " << t.stride[i] << " in dimension " << i
         << "; negative strides are not supported; strides " << stride_string(t);
      return Status::invalid_argument(os.str());
    }
    int64_t ext = 0;
    overflow = overflow || __builtin_mul_overflow(t.shape[i] - 1, t.stride[i], &ext) ||
               __builtin_add_overflow(max_offset, ext, &max_offset);
  }
  if (t.numel() == 0) return Status::ok();
  int64_t bytes = 0;
  const int64_t es = static_cast<int64_t>(t.element_size());
  overflow = overflow || __builtin_add_overflow(max_offset, 1, &bytes) || __builtin_mul_overflow(bytes, es, &bytes);
  uintptr_t end = 0;
  if (overflow || bytes > kMaxSpanBytes ||
      __builtin_add_overflow(reinterpret_cast<uintptr_t>(t.data), static_cast<uintptr_t>(overflow ? 0 : bytes), &end)) {
    MessageStream os;
    os << quoted(name) << " would span more than 2^48 bytes (shape " << shape_string(t) << ", strides "
       << stride_string(t) << ", " << es << "-byte elements); a stride is too large";
    return Status::invalid_argument(os.str());
  }
  return Status::ok();
}

Status check_no_self_overlap(const TensorRef& t, const char* name) {
  if (t.numel() <= 1) return Status::ok();
  int dims[TensorRef::kMaxDims];
  int n = 0;
  for (int i = 0; i < t.ndim; ++i)
    if (t.shape[i] > 1) dims[n++] = i;
  for (int k = 1; k < n; ++k)  // by stride, ascending (at most 6: insertion sort)
    for (int j = k; j > 0 && t.stride[dims[j]] < t.stride[dims[j - 1]]; --j) std::swap(dims[j], dims[j - 1]);
  int64_t inner = 0;  // largest offset reachable inside the dimensions sorted so far (strides are sane: no overflow)
  for (int k = 0; k < n; ++k) {
    const int d = dims[k];
    if (t.stride[d] <= inner) {
      MessageStream os;
      os << quoted(name) << " is written by the call, but its stride " << t.stride[d] << " in dimension " << d
         << " does not step past the elements inside it; outputs must not overlap themselves (shape "
         << shape_string(t) << ", strides " << stride_string(t) << ")";
      return Status::invalid_argument(os.str());
    }
    inner += (t.shape[d] - 1) * t.stride[d];
  }
  return Status::ok();
}

Status check_cuda_tensor(const TensorRef& t, const char* name, std::initializer_list<DType> dtypes, int ndim) {
  OPENMLA_RETURN_IF_ERROR(check_on_cuda(t, name));
  OPENMLA_RETURN_IF_ERROR(check_dtype(t, name, dtypes));
  OPENMLA_RETURN_IF_ERROR(check_ndim(t, name, ndim));
  OPENMLA_RETURN_IF_ERROR(check_strides_sane(t, name));
  return check_pointer_aligned(t, name, static_cast<int64_t>(t.element_size()));
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

ByteSpan byte_span(const TensorRef& t) {
  if (!t.defined() || t.data == nullptr || !t.valid_ndim() || t.numel() == 0) return ByteSpan{};
  int64_t min_off = 0, max_off = 0;
  for (int i = 0; i < t.ndim; ++i) {
    if (t.shape[i] <= 1) continue;
    const int64_t ext = (t.shape[i] - 1) * t.stride[i];
    if (ext < 0) min_off += ext; else max_off += ext;
  }
  const int64_t es = static_cast<int64_t>(t.element_size());
  const auto base = reinterpret_cast<uintptr_t>(t.data);
  return ByteSpan{base + static_cast<uintptr_t>(min_off * es), base + static_cast<uintptr_t>((max_off + 1) * es)};
}

namespace {
Status overlap_error(const char* out_name, const char* in_name) {
  return Status::invalid_argument(quoted(out_name) + " overlaps " + quoted(in_name) +
                                  " in memory; a tensor the call writes must not share memory with any other "
                                  "argument of the call");
}
}  // namespace

Status check_no_overlap(const TensorRef& out, const char* out_name, const TensorRef& in, const char* in_name) {
  const ByteSpan a = byte_span(out), b = byte_span(in);
  if (a.empty() || b.empty()) return Status::ok();
  if (a.lo < b.hi && b.lo < a.hi) return overlap_error(out_name, in_name);
  return Status::ok();
}

Status check_disjoint(NamedTensors written, NamedTensors read) {
  constexpr int kMax = 24;
  ByteSpan w[kMax], r[kMax];
  const char* w_name[kMax];
  const char* r_name[kMax];
  int nw = 0, nr = 0;
  for (const auto& [t, name] : written) {
    if (nw == kMax) break;
    w_name[nw] = name;
    w[nw++] = byte_span(*t);
  }
  for (const auto& [t, name] : read) {
    if (nr == kMax) break;
    r_name[nr] = name;
    r[nr++] = byte_span(*t);
  }
  auto overlap = [](const ByteSpan& a, const ByteSpan& b) {
    return !a.empty() && !b.empty() && a.lo < b.hi && b.lo < a.hi;
  };
  for (int i = 0; i < nw; ++i) {
    for (int j = i + 1; j < nw; ++j)
      if (overlap(w[i], w[j])) return overlap_error(w_name[i], w_name[j]);
    for (int j = 0; j < nr; ++j)
      if (overlap(w[i], r[j])) return overlap_error(w_name[i], r_name[j]);
  }
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

thread_local ScopedKnownStream::Known ScopedKnownStream::known_ = {nullptr, -1, false};

ScopedKnownStream::ScopedKnownStream(cudaStream_t stream, int device_id) : previous_(known_) {
  known_ = Known{stream, device_id, true};
}

ScopedKnownStream::~ScopedKnownStream() { known_ = previous_; }

Status check_stream_device(cudaStream_t stream, int device_id, const char* tensor_name) {
  const ScopedKnownStream::Known& known = ScopedKnownStream::known_;
  if (known.set && known.stream == stream && known.device_id == device_id) return Status::ok();
#if CUDART_VERSION >= 12080
  // A stream under capture answers only capture-safe queries: cudaStreamGetDevice on it would be rejected and would
  // invalidate the capture. So the check is made outside capture only (cudaStreamIsCapturing is capture-safe; it
  // fails on the legacy stream while a blocking stream captures: the check is skipped then too).
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  const cudaError_t query = cudaStreamIsCapturing(stream, &capture);
  if (query != cudaSuccess) {
    if (cudaPeekAtLastError() == query) (void)cudaGetLastError();  // ours, and not an error of the call
    return Status::ok();
  }
  if (capture != cudaStreamCaptureStatusNone) return Status::ok();
  int stream_device = -1;
  OPENMLA_CUDA_RETURN_IF_ERROR(cudaStreamGetDevice(stream, &stream_device), "cudaStreamGetDevice (argument 'stream')");
  if (stream_device != device_id) {
    MessageStream os;
    os << "argument 'stream' belongs to cuda:" << stream_device << " but argument '" << tensor_name
       << "' is on cuda:" << device_id << "; launch on a stream of the tensors' device";
    return invalid(os.str());
  }
#else
  (void)stream;
  (void)device_id;
  (void)tensor_name;
#endif
  return Status::ok();
}

Status check_launch_context(int device_id, const char* tensor_name, cudaStream_t stream, const char* entry) {
  OPENMLA_RETURN_IF_ERROR(check_no_pending_cuda_error(entry));  // first: before any call of ours can fail
  OPENMLA_RETURN_IF_ERROR(check_current_device(device_id, tensor_name));
  return check_stream_device(stream, device_id, tensor_name);
}

}  // namespace openmla::detail
