// Binding of include/openmla/kv_cache.h (FP8 KV-cache quantise / dequantise / append) and of the CPU codec the
// GPU tests compare against. Thin on purpose: arrays become TensorRefs, the C++ API does every check, and its
// Status becomes the matching Python exception with the message unchanged. The user-facing layer (output
// allocation with torch, the current stream) is python/openmla/kv_cache.py.
#include <cstring>
#include <string>

#include <nanobind/stl/string.h>

#include "bind_common.h"
#include "common/fp8_cache_layout.h"
#include "openmla/kv_cache.h"
#include "openmla_ref/fp8_codec.h"

namespace openmla::py {

namespace {

KVCacheFormat fp8_format_from_name(const std::string& name) {
  if (name == "v32" || name == "fp8_v32") return KVCacheFormat::kFp8V32;
  if (name == "model1" || name == "fp8_model1") return KVCacheFormat::kFp8Model1;
  throw nb::value_error(("argument 'format': unknown FP8 cache format '" + name +
                         "'; expected 'v32' (d_qk 576, 656 B/token) or "
                         "'model1' (d_qk 512, 584 B/token)")
                            .c_str());
}

ref::Fp8Layout ref_layout(KVCacheFormat format) {
  return format == KVCacheFormat::kFp8V32 ? ref::Fp8Layout::kV32 : ref::Fp8Layout::kModel1;
}

// One FP8 cache layout's constants (common/fp8_cache_layout.h, the one definition) as a dict for the Python
// package: sizes in dims, offsets and strides in bytes.
template <class Cache>
nb::dict fp8_layout_dict() {
  nb::dict d;
  d["head_dim"] = Cache::kHeadDim;
  d["nope_dim"] = Cache::kNopeDim;
  d["rope_dim"] = Cache::kRopeDim;
  d["tile_dim"] = Cache::kTileDim;
  d["num_tiles"] = Cache::kNumTiles;
  d["scale_bytes"] = Cache::kScaleBytes;
  d["bytes_per_token"] = Cache::kBytesPerToken;
  d["data_stride"] = Cache::kDataStride;
  d["rope_offset"] = Cache::kRopeOffset;
  if constexpr (requires { Cache::kScaleOffset; }) d["scale_offset"] = Cache::kScaleOffset;  // V3.2: in the record
  if constexpr (requires { Cache::kScaleStride; }) d["scale_stride"] = Cache::kScaleStride;  // MODEL1: scale section
  return d;
}

// ---- CPU codec (host numpy arrays): the truth the GPU kernels are tested against --------------------------------
using HostBf16Pages = nb::ndarray<const uint16_t, nb::ndim<4>, nb::device::cpu>;
using HostBytePages = nb::ndarray<const uint8_t, nb::ndim<4>, nb::device::cpu>;

template <typename T>
nb::ndarray<nb::numpy, T, nb::ndim<4>> new_host_array(int64_t a, int64_t b, int64_t c, int64_t d) {
  const size_t n = static_cast<size_t>(a * b * c * d);
  T* data = new T[n == 0 ? 1 : n];
  nb::capsule owner(data, [](void* p) noexcept { delete[] static_cast<T*>(p); });
  const size_t shape[4] = {static_cast<size_t>(a), static_cast<size_t>(b), static_cast<size_t>(c),
                           static_cast<size_t>(d)};
  return nb::ndarray<nb::numpy, T, nb::ndim<4>>(data, 4, shape, owner);
}

void check_host_pages(int64_t heads, int64_t last, int64_t last_stride, int64_t expected_last, const char* name,
                      const char* what) {
  if (heads != 1 || last != expected_last || (last > 1 && last_stride != 1))
    throw nb::value_error((std::string("argument '") + name + "' must have shape (num_blocks, page_size, 1, " +
                           std::to_string(expected_last) + ") " + what + " with a contiguous last dimension")
                              .c_str());
}

// (num_blocks, page_size, 1, d_qk) bf16 bit patterns (uint16, any strides with a contiguous last dim) ->
// a new contiguous (num_blocks, page_size, 1, bytes_per_token) uint8 cache.
nb::ndarray<nb::numpy, uint8_t, nb::ndim<4>> cpu_encode(const HostBf16Pages& src, const std::string& format_name) {
  const KVCacheFormat format = fp8_format_from_name(format_name);
  const ref::Fp8Layout layout = ref_layout(format);
  const int64_t d = ref::fp8_head_dim(layout), bpt = ref::fp8_bytes_per_token(layout);
  const int64_t nb_ = static_cast<int64_t>(src.shape(0)), ps = static_cast<int64_t>(src.shape(1));
  check_host_pages(static_cast<int64_t>(src.shape(2)), static_cast<int64_t>(src.shape(3)), src.stride(3), d, "src",
                   "uint16 (bf16 bits)");
  auto out = new_host_array<uint8_t>(nb_, ps, 1, bpt);
  uint8_t* dst = out.data();
  for (int64_t p = 0; p < nb_; ++p)
    for (int64_t r = 0; r < ps; ++r)
      ref::fp8_encode_token(layout, src.data() + p * src.stride(0) + r * src.stride(1), dst + p * ps * bpt, ps, r);
  return out;
}

// (num_blocks, page_size, 1, bytes_per_token) uint8 cache (tokens bytes_per_token apart, any page stride) ->
// a new contiguous (num_blocks, page_size, 1, d_qk) uint16 array of bf16 bit patterns.
nb::ndarray<nb::numpy, uint16_t, nb::ndim<4>> cpu_decode(const HostBytePages& cache, const std::string& format_name) {
  const KVCacheFormat format = fp8_format_from_name(format_name);
  const ref::Fp8Layout layout = ref_layout(format);
  const int64_t d = ref::fp8_head_dim(layout), bpt = ref::fp8_bytes_per_token(layout);
  const int64_t nb_ = static_cast<int64_t>(cache.shape(0)), ps = static_cast<int64_t>(cache.shape(1));
  check_host_pages(static_cast<int64_t>(cache.shape(2)), static_cast<int64_t>(cache.shape(3)), cache.stride(3), bpt,
                   "cache", "uint8");
  if (ps > 1 && cache.stride(1) != bpt)
    throw nb::value_error(("argument 'cache' must store the tokens of a page " + std::to_string(bpt) +
                           " bytes apart (stride(1) == " + std::to_string(bpt) + ")")
                              .c_str());
  auto out = new_host_array<uint16_t>(nb_, ps, 1, d);
  uint16_t* dst = out.data();
  for (int64_t p = 0; p < nb_; ++p)
    ref::fp8_decode_page_bf16(layout, cache.data() + p * cache.stride(0), ps, dst + p * ps * d, d);
  return out;
}

}  // namespace

void bind_kv_cache(nb::module_& m) {
  // {"v32": {...}, "model1": {...}}: what decode.py tells the layouts apart by (bytes_per_token) and reports.
  nb::dict layouts;
  layouts["v32"] = fp8_layout_dict<fp8_cache::V32>();
  layouts["model1"] = fp8_layout_dict<fp8_cache::Model1>();
  m.attr("fp8_cache_layouts") = layouts;
  m.def(
      "kv_cache_quantize",
      [](const Array& src, const Array& dst, const std::string& format, uintptr_t stream) {
        throw_if_error(quantize_kv_cache(to_tensor_ref(src, "src"), to_tensor_ref(dst, "dst"),
                                         fp8_format_from_name(format), to_stream(stream)));
      },
      nb::arg("src"), nb::arg("dst"), nb::arg("format"), nb::arg("stream") = 0,
      "Quantise a paged bf16 cache src (num_blocks, page_size, 1, d_qk) into the FP8 cache dst "
      "(num_blocks, page_size, 1, bytes_per_token) on the CUDA stream `stream` (a cudaStream_t as int).");
  m.def(
      "kv_cache_dequantize",
      [](const Array& src, const Array& dst, const std::string& format, uintptr_t stream) {
        throw_if_error(dequantize_kv_cache(to_tensor_ref(src, "src"), to_tensor_ref(dst, "dst"),
                                           fp8_format_from_name(format), to_stream(stream)));
      },
      nb::arg("src"), nb::arg("dst"), nb::arg("format"), nb::arg("stream") = 0,
      "Dequantise the FP8 cache src into the paged bf16 cache dst.");
  m.def(
      "kv_cache_append",
      [](const Array& new_kv, const Array& slots, const Array& cache, const std::string& format, uintptr_t stream) {
        throw_if_error(append_kv_cache(to_tensor_ref(new_kv, "new_kv"), to_tensor_ref(slots, "slots"),
                                       to_tensor_ref(cache, "cache"), fp8_format_from_name(format), to_stream(stream)));
      },
      nb::arg("new_kv"), nb::arg("slots"), nb::arg("cache"), nb::arg("format"), nb::arg("stream") = 0,
      "Quantise the rows of new_kv (n, d_qk) into cache at slots (n,) int32/int64 (page * page_size + offset; "
      "negative: skipped).");
  m.def(
      "kv_cache_bytes_per_token",
      [](const std::string& format) {
        const KVCacheFormat f = fp8_format_from_name(format);
        return kv_cache_bytes_per_token(f, kv_cache_fp8_head_dim(f));
      },
      nb::arg("format"), "Bytes per token of an FP8 cache format: 656 ('v32') or 584 ('model1').");
  m.def(
      "kv_cache_head_dim",
      [](const std::string& format) { return kv_cache_fp8_head_dim(fp8_format_from_name(format)); }, nb::arg("format"),
      "d_qk of an FP8 cache format: 576 ('v32') or 512 ('model1').");
  m.def("kv_cache_cpu_encode", &cpu_encode, nb::arg("src"), nb::arg("format"),
        "CPU codec (the reference): (num_blocks, page_size, 1, d_qk) uint16 bf16 bits -> new contiguous uint8 "
        "cache (num_blocks, page_size, 1, bytes_per_token).");
  m.def("kv_cache_cpu_decode", &cpu_decode, nb::arg("cache"), nb::arg("format"),
        "CPU codec (the reference): uint8 cache (num_blocks, page_size, 1, bytes_per_token), any page stride -> "
        "new contiguous uint16 array of bf16 bits (num_blocks, page_size, 1, d_qk).");
}

}  // namespace openmla::py
