#include "object_tensors.h"

#include <atomic>
#include <string>

namespace openmla::py {

namespace {

// Exchange tables by Python type: a handful of types ever reach the binding (torch.Tensor, nn.Parameter, numpy
// arrays...). A type with a table is recorded with a reference, so its address cannot be reused by another type; one
// without is recorded without (a Python class passed by mistake must not keep its module alive until the process
// ends), so a new type at its address would at worst be read through __dlpack__.
struct TypeApi {
  PyTypeObject* type;
  const dlpack::ExchangeApi* api;
};
constexpr int kMaxTypes = 16;
TypeApi g_type_apis[kMaxTypes];
int g_num_type_apis = 0;

const dlpack::ExchangeApi* find_exchange_api(PyTypeObject* type) {
  PyObject* capsule = PyObject_GetAttrString(reinterpret_cast<PyObject*>(type), "__dlpack_c_exchange_api__");
  if (capsule == nullptr) {
    PyErr_Clear();
    return nullptr;
  }
  const dlpack::ExchangeApiHeader* header = nullptr;
  if (PyCapsule_CheckExact(capsule)) {
    header = static_cast<const dlpack::ExchangeApiHeader*>(PyCapsule_GetPointer(capsule, "dlpack_exchange_api"));
    if (header == nullptr) PyErr_Clear();
  }
  // DLPack: the table lives as long as the process, so the capsule itself need not be kept.
  Py_DECREF(capsule);
  // A newer major version links the older tables it still serves.
  while (header != nullptr && header->version.major != dlpack::kExchangeMajorVersion) header = header->prev_api;
  const auto* api = reinterpret_cast<const dlpack::ExchangeApi*>(header);
  if (api == nullptr || api->dltensor_from_py_object_no_sync == nullptr || api->current_work_stream == nullptr ||
      api->managed_tensor_allocator == nullptr || api->managed_tensor_to_py_object_no_sync == nullptr)
    return nullptr;
  return api;
}

[[noreturn]] void bad_tensor(const char* name, const std::string& what) {
  throw nb::value_error((std::string("argument '") + name + "' " + what).c_str());
}

TensorRef from_dltensor(const dlpack::DLTensor& dl, const char* name) {
  TensorRef t;
  if (dl.ndim < 0 || dl.ndim > TensorRef::kMaxDims)
    bad_tensor(name, "has " + std::to_string(dl.ndim) + " dimensions; at most " + std::to_string(TensorRef::kMaxDims) +
                         " are supported");
  if (!to_dtype(dl.dtype, &t.dtype))
    bad_tensor(name, "has a dtype OpenMLA does not handle (DLPack code " + std::to_string(dl.dtype.code) + ", " +
                         std::to_string(dl.dtype.bits) + " bits)");
  t.data = static_cast<char*>(dl.data) + dl.byte_offset;
  t.ndim = dl.ndim;
  int64_t compact = 1;  // DLPack: null strides mean a compact row-major tensor
  for (int i = t.ndim - 1; i >= 0; --i) {
    t.shape[i] = dl.shape[i];
    t.stride[i] = dl.strides != nullptr ? dl.strides[i] : compact;
    compact *= dl.shape[i];
  }
  t.device = dl.device.device_type == dlpack::kDLCUDA ? DeviceType::kCUDA : DeviceType::kCPU;
  t.device_id = dl.device.device_id;
  return t;
}

nb::dlpack::dtype dl_dtype(DType dtype) {
  using Code = nb::dlpack::dtype_code;
  auto make = [](Code code, int bits) {
    return nb::dlpack::dtype{static_cast<uint8_t>(code), static_cast<uint8_t>(bits), 1};
  };
  switch (dtype) {
    case DType::kBFloat16: return make(Code::Bfloat, 16);
    case DType::kFloat16: return make(Code::Float, 16);
    case DType::kFloat32: return make(Code::Float, 32);
    case DType::kInt32: return make(Code::Int, 32);
    case DType::kInt64: return make(Code::Int, 64);
    case DType::kUInt8: return make(Code::UInt, 8);
    case DType::kInt8: return make(Code::Int, 8);
    case DType::kFloat8E4M3: return make(Code::Float8_E4M3FN, 8);
  }
  throw std::runtime_error("openmla: unknown DType");
}

// A strided view of a framework allocation, handed back to the framework as a DLPack tensor of our own making:
// its deleter releases the allocation.
struct StridedView {
  dlpack::DLManagedTensorVersioned self;
  dlpack::DLManagedTensorVersioned* base;
  int64_t shape[TensorRef::kMaxDims];
  int64_t strides[TensorRef::kMaxDims];

  static void release(dlpack::DLManagedTensorVersioned* self) {
    auto* view = static_cast<StridedView*>(self->manager_ctx);
    if (view->base->deleter != nullptr) view->base->deleter(view->base);
    delete view;
  }
};

// A view of a shared framework allocation (new_cuda_tensors), handed to the framework as a DLPack tensor of our own
// making: the last view released releases the allocation.
struct SharedAllocation {
  std::atomic<int> refs;
  dlpack::DLManagedTensorVersioned* base;

  void release() {
    if (refs.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
    if (base->deleter != nullptr) base->deleter(base);
    delete this;
  }
};

struct SharedView {
  dlpack::DLManagedTensorVersioned self;
  SharedAllocation* shared;
  int64_t shape[TensorRef::kMaxDims];
  int64_t strides[TensorRef::kMaxDims];

  static void release(dlpack::DLManagedTensorVersioned* self) {
    auto* view = static_cast<SharedView*>(self->manager_ctx);
    view->shared->release();
    delete view;
  }
};

void record_allocation_error(void* ctx, const char* kind, const char* message) {
  *static_cast<std::string*>(ctx) = std::string(kind ? kind : "error") + ": " + (message ? message : "");
}

std::atomic<int> g_sm_counts[64];

}  // namespace

const dlpack::ExchangeApi* exchange_api_of(PyObject* obj) {
  PyTypeObject* type = Py_TYPE(obj);
  for (int i = 0; i < g_num_type_apis; ++i)
    if (g_type_apis[i].type == type) return g_type_apis[i].api;
  const dlpack::ExchangeApi* api = find_exchange_api(type);
  if (g_num_type_apis < kMaxTypes) {
    if (api != nullptr) Py_INCREF(reinterpret_cast<PyObject*>(type));
    g_type_apis[g_num_type_apis++] = {type, api};
  }
  return api;
}

TensorRef TensorReader::read(nb::handle obj, const char* name) {
  last_route_ = nullptr;
  if (obj.is_none()) return TensorRef{};
  if (const dlpack::ExchangeApi* api = exchange_api_of(obj.ptr())) {
    last_route_ = api;
    dlpack::DLTensor dl{};
    if (api->dltensor_from_py_object_no_sync(obj.ptr(), &dl) != 0) throw nb::python_error();
    if (api_ == nullptr) api_ = api;
    return from_dltensor(dl, name);
  }
  Array array;
  if (!nb::try_cast(obj, array))
    throw nb::type_error((std::string("argument '") + name + "' must be a tensor (a torch.Tensor or another DLPack "
                          "exporter), got " + nb::cast<std::string>(nb::str(obj.type())))
                             .c_str());
  kept_.push_back(std::move(array));
  return to_tensor_ref(kept_.back(), name);
}

cudaStream_t current_stream(const dlpack::ExchangeApi& api, int device_id) {
  void* stream = nullptr;
  if (api.current_work_stream(dlpack::kDLCUDA, device_id, &stream) != 0) throw nb::python_error();
  return static_cast<cudaStream_t>(stream);
}

nb::object new_cuda_tensor(const dlpack::ExchangeApi& api, int device_id, DType dtype,
                           std::initializer_list<int64_t> shape, std::initializer_list<int64_t> strides,
                           int64_t storage_elems) {
  const bool strided = strides.size() != 0;
  int64_t elems = 1;
  for (int64_t s : shape) elems *= s;
  int64_t flat[1] = {strided ? storage_elems : elems};
  int64_t dims[TensorRef::kMaxDims];
  int ndim = 0;
  for (int64_t s : shape) dims[ndim++] = s;

  dlpack::DLTensor prototype{};
  prototype.device = {dlpack::kDLCUDA, device_id};
  prototype.dtype = dl_dtype(dtype);
  prototype.ndim = strided ? 1 : ndim;
  prototype.shape = strided ? flat : dims;
  dlpack::DLManagedTensorVersioned* base = nullptr;
  std::string error;
  if (api.managed_tensor_allocator(&prototype, &base, &error, record_allocation_error) != 0 || base == nullptr)
    throw std::runtime_error("openmla: allocating an output on cuda:" + std::to_string(device_id) +
                             " failed: " + error);

  dlpack::DLManagedTensorVersioned* handed = base;
  if (strided) {
    auto* view = new StridedView{};
    view->base = base;
    int i = 0;
    for (int64_t s : shape) view->shape[i++] = s;
    i = 0;
    for (int64_t s : strides) view->strides[i++] = s;
    view->self.version = base->version;
    view->self.manager_ctx = view;
    view->self.deleter = &StridedView::release;
    view->self.flags = base->flags;
    view->self.dl_tensor = base->dl_tensor;
    view->self.dl_tensor.ndim = ndim;
    view->self.dl_tensor.shape = view->shape;
    view->self.dl_tensor.strides = view->strides;
    handed = &view->self;
  }
  void* tensor = nullptr;
  // On success the framework owns `handed`; on failure it is left alive rather than risk releasing it twice.
  if (api.managed_tensor_to_py_object_no_sync(handed, &tensor) != 0 || tensor == nullptr) throw nb::python_error();
  return nb::steal(static_cast<PyObject*>(tensor));
}

void new_cuda_tensors(const dlpack::ExchangeApi& api, int device_id, std::initializer_list<NewTensor> tensors,
                      nb::object* out) {
  new_tensors(api, dlpack::kDLCUDA, device_id, tensors, out);
}

void new_tensors(const dlpack::ExchangeApi& api, int32_t device_type, int device_id,
                 std::initializer_list<NewTensor> tensors, nb::object* out) {
  constexpr int64_t kAlign = 256;
  int64_t offsets[8];
  if (tensors.size() > std::size(offsets)) throw std::runtime_error("openmla: new_cuda_tensors: too many tensors");
  int64_t total = 0;
  size_t n = 0;
  for (const NewTensor& t : tensors) {
    int64_t span = 1;  // elements the view reaches
    if (t.strides.size() == 0) {
      for (int64_t s : t.shape) span *= s;
    } else {
      auto stride = t.strides.begin();
      for (int64_t s : t.shape) span += (s - 1) * *stride++;
    }
    offsets[n++] = total;
    total += (span * static_cast<int64_t>(dtype_size(t.dtype)) + kAlign - 1) / kAlign * kAlign;
  }
  int64_t bytes[1] = {total > 0 ? total : kAlign};
  dlpack::DLTensor prototype{};
  prototype.device = {device_type, device_type == dlpack::kDLCPU ? 0 : device_id};
  prototype.dtype = dl_dtype(DType::kUInt8);
  prototype.ndim = 1;
  prototype.shape = bytes;
  dlpack::DLManagedTensorVersioned* base = nullptr;
  std::string error;
  if (api.managed_tensor_allocator(&prototype, &base, &error, record_allocation_error) != 0 || base == nullptr)
    throw std::runtime_error("openmla: allocating the outputs on " +
                             std::string(device_type == dlpack::kDLCUDA ? "cuda:" : "device ") +
                             std::to_string(device_id) + " failed: " + error);
  // The creator's reference, released at the end: views made until then hold their own.
  auto* shared = new SharedAllocation{{1}, base};
  char* data = static_cast<char*>(base->dl_tensor.data) + base->dl_tensor.byte_offset;
  n = 0;
  for (const NewTensor& t : tensors) {
    auto* view = new SharedView{};
    view->shared = shared;
    int ndim = 0;
    for (int64_t s : t.shape) view->shape[ndim++] = s;
    if (t.strides.size() == 0) {
      int64_t compact = 1;
      for (int i = ndim - 1; i >= 0; --i) {
        view->strides[i] = compact;
        compact *= view->shape[i];
      }
    } else {
      int i = 0;
      for (int64_t s : t.strides) view->strides[i++] = s;
    }
    view->self.version = base->version;
    view->self.manager_ctx = view;
    view->self.deleter = &SharedView::release;
    view->self.flags = base->flags;
    view->self.dl_tensor = base->dl_tensor;
    view->self.dl_tensor.data = data + offsets[n];
    view->self.dl_tensor.byte_offset = 0;
    view->self.dl_tensor.dtype = dl_dtype(t.dtype);
    view->self.dl_tensor.ndim = ndim;
    view->self.dl_tensor.shape = view->shape;
    view->self.dl_tensor.strides = view->strides;
    shared->refs.fetch_add(1, std::memory_order_relaxed);
    void* tensor = nullptr;
    // On success the framework owns the view; on failure it is left alive (with its reference) rather than risk
    // releasing it twice, and the views made before it are released by out[]'s owners.
    if (api.managed_tensor_to_py_object_no_sync(&view->self, &tensor) != 0 || tensor == nullptr) {
      shared->release();
      throw nb::python_error();
    }
    out[n++] = nb::steal(static_cast<PyObject*>(tensor));
  }
  shared->release();
}

CallStream call_stream(const dlpack::ExchangeApi* api, nb::handle stream, int device_id) {
  if (!stream.is_none()) return CallStream{to_stream(nb::cast<uintptr_t>(stream)), false};
  if (api == nullptr)
    throw nb::value_error("argument 'stream' is required when the tensors do not come from a framework with the "
                          "DLPack exchange API (torch >= 2.10)");
  return CallStream{current_stream(*api, device_id), true};
}

int device_sm_count(int device_id) {
  const bool cached = device_id >= 0 && device_id < static_cast<int>(std::size(g_sm_counts));
  if (cached) {
    const int known = g_sm_counts[device_id].load(std::memory_order_relaxed);
    if (known > 0) return known;
  }
  int count = 0;
  const cudaError_t err = cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device_id);
  if (err != cudaSuccess) {
    cudaGetLastError();  // the query's error is reported here, not left for the next launch to find
    throw std::runtime_error("openmla: querying the SM count of cuda:" + std::to_string(device_id) +
                             " failed: " + cudaGetErrorString(err));
  }
  if (cached) g_sm_counts[device_id].store(count, std::memory_order_relaxed);
  return count;
}

ScopedDevice::ScopedDevice(int device_id) {
  int current = -1;
  if (cudaGetDevice(&current) == cudaSuccess && current != device_id && cudaSetDevice(device_id) == cudaSuccess)
    previous_ = current;
}

ScopedDevice::~ScopedDevice() {
  if (previous_ >= 0) cudaSetDevice(previous_);
}

}  // namespace openmla::py
