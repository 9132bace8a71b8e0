// Argument checks shared by every kernel family's API (decode, KV cache, prefill). Each check returns a Status
// whose message names the argument, what was expected and what was given. A family's own rules (its shapes,
// its problem fields) live in its api/<family>.cpp and are built from these; checks shared by the families
// of one kind live beside them (api/decode_common.h for the decode calls).
//
// Ordering rule of every public entry point: all argument checks run before the first CUDA call, so a bad call
// launches nothing and the checks can be tested without a GPU. The only CUDA queries a check may make are the
// SM count (device_sm_count) and, right before launching, the launch context (check_launch_context: the current
// device, the stream's device, an error left pending by someone else).
//
// Every entry first replaces the stride of each size-1 dimension of every tensor argument (canonical()), so such a
// stride, which is never stepped, cannot matter to a check, a TMA descriptor or a kernel.
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

// ---- Size-1 dimensions -----------------------------------------------------------------------------------------
// `t` with the stride of every size-1 dimension replaced by the packed value (the next inner dimension's stride
// times its size; 1 for the last dimension; saturated at INT64_MAX). A view of no valid rank is returned as is.
TensorRef canonical(const TensorRef& t);

// ---- One tensor ------------------------------------------------------------------------------------------------
// Defined (a data pointer) and of a valid rank (ndim in [0, TensorRef::kMaxDims]).
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
// Every stride (in elements) and extent must fit in int32 where kernels index with 32-bit arithmetic (the stride of
// a size-1 dimension is not checked: it is never used).
Status check_fits_int32(const TensorRef& t, const char* name);
// Strides of dimensions of size > 1 are >= 0 (no negative strides), and the bytes the view spans fit in
// kMaxSpanBytes without overflowing the address: a huge stride is named here, not left to fail later.
inline constexpr int64_t kMaxSpanBytes = int64_t{1} << 48;
Status check_strides_sane(const TensorRef& t, const char* name);
// An output: no two elements share an address (dimensions of size > 1, sorted by stride, each step over
// everything inside it); a zero or overlapping stride would let rows overwrite each other.
Status check_no_self_overlap(const TensorRef& t, const char* name);
// A defined CUDA tensor of one of `dtypes` with `ndim` dimensions, sane strides (check_strides_sane) and its data
// pointer aligned to its element size.
Status check_cuda_tensor(const TensorRef& t, const char* name, std::initializer_list<DType> dtypes, int ndim);
// A (n,) int32 contiguous CUDA vector (per-request lengths: cache_seqlens, topk_length, ...); `what` names n.
Status check_lengths(const TensorRef& t, const char* name, int64_t n, const char* what = "batch");

// ---- Several tensors -------------------------------------------------------------------------------------------
Status check_same_device(const TensorRef& a, const char* a_name, const TensorRef& b, const char* b_name);
// Every DEFINED tensor of `others` is on `ref`'s device (absent optional arguments are skipped).
Status check_same_device_all(const TensorRef& ref, const char* ref_name,
                             std::initializer_list<std::pair<const TensorRef*, const char*>> others);

// The byte range [lo, hi) a strided view can touch (size-1 dimensions contribute nothing); empty for a view of no
// elements or no data.
struct ByteSpan {
  uintptr_t lo = 0, hi = 0;
  bool empty() const { return hi <= lo; }
};
ByteSpan byte_span(const TensorRef& t);
// `out` (written by the call) does not overlap `in` (read, or written, by the call): the result would otherwise depend
// on the order the kernels run in. Conservative: the views' address ranges must be disjoint.
Status check_no_overlap(const TensorRef& out, const char* out_name, const TensorRef& in, const char* in_name);
using NamedTensors = std::initializer_list<std::pair<const TensorRef*, const char*>>;
// Every written tensor against every other written one and every read one (absent or empty tensors are skipped).
Status check_disjoint(NamedTensors written, NamedTensors read);

// ---- Scalars ---------------------------------------------------------------------------------------------------
// softmax_scale must be finite (0 means the family's default, d_qk ** -0.5).
Status check_softmax_scale(float softmax_scale);

// ---- The device (the only CUDA calls a check makes) --------------------------------------------------------------
// The SM count of CUDA device `device_id`; `why` goes into the error message of a failed query.
Status device_sm_count(int device_id, int* num_sms, const char* why);
// Refuses to launch on a device other than the tensors' (kernels would fault on foreign pointers).
Status check_current_device(int device_id, const char* tensor_name);
// The stream belongs to device `device_id` (cudaStreamGetDevice, CUDA runtime >= 12.8; with an older runtime the
// check is skipped: there is no runtime query for it). The legacy and per-thread default streams belong to the
// current device. Skipped for a stream under CUDA-graph capture (the query is not capture-safe), and for the stream
// of an enclosing ScopedKnownStream on its device.
Status check_stream_device(cudaStream_t stream, int device_id, const char* tensor_name);
// The caller's promise, for the calls of one scope on this thread: `stream` belongs to device `device_id`. The Python
// binding makes it for the stream it takes from the framework (torch's current stream of the tensors' device, which
// belongs to that device by construction), so check_stream_device need not ask the driver (two runtime calls per
// entry); any other stream, and every call outside such a scope, is checked in full. Scopes nest.
class ScopedKnownStream {
 public:
  ScopedKnownStream(cudaStream_t stream, int device_id);
  ~ScopedKnownStream();
  ScopedKnownStream(const ScopedKnownStream&) = delete;
  ScopedKnownStream& operator=(const ScopedKnownStream&) = delete;

 private:
  struct Known {
    cudaStream_t stream;
    int device_id;
    bool set;
  };
  Known previous_;
  friend Status check_stream_device(cudaStream_t stream, int device_id, const char* tensor_name);
  static thread_local Known known_;
};
// Everything an entry checks right before its first launch: no CUDA error left by an earlier operation is pending
// (check_no_pending_cuda_error, with `entry` in its message), and the current device and the stream's device are
// the tensors' (`device_id`, named by `tensor_name`).
Status check_launch_context(int device_id, const char* tensor_name, cudaStream_t stream, const char* entry);

}  // namespace openmla::detail
