// The per-call entry of append_kv_cache (include/openmla/kv_cache.h), which engines call for every layer of every
// step, with the host path of bind_decode_step.cpp: tensors read through the DLPack C exchange API, the
// framework's current stream, the cache's device current while launching. The C++ API checks every argument, as
// for the DLPack binding (bind_kv_cache.cpp).
//
// Returns None when the general path must take the call (the cache is not a CUDA tensor of a framework with the
// exchange API, or the format name is not one of python/openmla/kv_cache.py's): that path names what is wrong.
#include <string>

#include "bind_common.h"
#include "object_tensors.h"
#include "openmla/kv_cache.h"

namespace openmla::py {

namespace {

nb::object append_kv_cache_call(nb::handle new_kv, nb::handle slots, nb::handle cache, nb::handle format,
                                nb::handle stream) {
  if (!PyUnicode_Check(format.ptr())) return nb::none();
  const std::string name = nb::cast<std::string>(format);
  KVCacheFormat fmt;
  if (name == "v32")
    fmt = KVCacheFormat::kFp8V32;
  else if (name == "model1")
    fmt = KVCacheFormat::kFp8Model1;
  else
    return nb::none();
  TensorReader reader;
  const TensorRef cache_ref = reader.read(cache, "cache");
  if (!cache_ref.defined() || cache_ref.device != DeviceType::kCUDA || reader.api() == nullptr) return nb::none();
  const TensorRef new_ref = reader.read(new_kv, "new_kv");
  const TensorRef slots_ref = reader.read(slots, "slots");
  const CallStream s = call_stream(reader.api(), stream, cache_ref.device_id);
  launch_without_gil(cache_ref.device_id, s,
                     [&] { return append_kv_cache(new_ref, slots_ref, cache_ref, fmt, s.stream); });
  return nb::borrow(Py_True);
}

}  // namespace

void bind_kv_cache_call(nb::module_& m) {
  m.def("kv_cache_append_call", &append_kv_cache_call, nb::arg("new_kv").none(), nb::arg("slots").none(),
        nb::arg("cache").none(), nb::arg("format").none(), nb::arg("stream").none() = nb::none(),
        "append_kv_cache's per-call entry: True when it ran, None when the general path must take the call.");
}

}  // namespace openmla::py
