// Public FP8 KV-cache API: validate every argument (messages name it), build the launch parameters, launch.
// Validation order: format, then each tensor's dtype / rank / sizes / strides / alignment, then the shapes
// shared between tensors, and the device last (so structural errors are reported for host arrays too, which
// keeps them testable without a GPU). Nothing here touches CUDA before the launch.
#include "openmla/kv_cache.h"

#include <string>

#include "api/checked.h"
#include "api/families.h"
#include "api/validate.h"
#include "common/fp8_cache_layout.h"
#include "kernels/kv_cache/launch.h"

namespace openmla {

namespace kvk = kernels::kv_cache;

const char* kv_cache_format_name(KVCacheFormat format) {
  switch (format) {
    case KVCacheFormat::kBFloat16: return "bfloat16";
    case KVCacheFormat::kFloat16: return "float16";
    case KVCacheFormat::kFp8V32: return "fp8_v32";
    case KVCacheFormat::kFp8Model1: return "fp8_model1";
    case KVCacheFormat::kFp8E4M3: return "fp8_e4m3";
  }
  return "unknown";
}

int64_t kv_cache_bytes_per_token(KVCacheFormat format, int64_t head_dim) {
  switch (format) {
    case KVCacheFormat::kBFloat16:
    case KVCacheFormat::kFloat16: return 2 * head_dim;
    case KVCacheFormat::kFp8V32: return fp8_cache::V32::kBytesPerToken;
    case KVCacheFormat::kFp8Model1: return fp8_cache::Model1::kBytesPerToken;
    case KVCacheFormat::kFp8E4M3: return head_dim;
  }
  return 0;
}

int64_t kv_cache_fp8_head_dim(KVCacheFormat format) {
  switch (format) {
    case KVCacheFormat::kFp8V32: return fp8_cache::V32::kHeadDim;
    case KVCacheFormat::kFp8Model1: return fp8_cache::Model1::kHeadDim;
    default: return 0;
  }
}

namespace {

using detail::check_dim;
using detail::check_dtype;
using detail::check_ndim;
using detail::shape_string;
using detail::stride_string;

constexpr int64_t kVectorBytes = 16;  // every kernel access is a 16-byte vector
constexpr int64_t kBf16PerVector = 8;
constexpr int64_t kMaxTokens = 2147483647;  // kernels split token indices with 32-bit arithmetic

std::string quoted(const char* name) { return std::string("argument '") + name + "'"; }

// Like check_defined, but an empty tensor (a zero extent) may carry a null pointer: there is nothing to access.
Status check_present(const TensorRef& t, const char* name) {
  if (t.ndim > 0 && t.numel() == 0) return Status::ok();
  return detail::check_defined(t, name);
}

Status fp8_layout_of(KVCacheFormat format, kvk::Fp8Layout* layout) {
  if (format == KVCacheFormat::kFp8V32) {
    *layout = kvk::Fp8Layout::kV32;
    return Status::ok();
  }
  if (format == KVCacheFormat::kFp8Model1) {
    *layout = kvk::Fp8Layout::kModel1;
    return Status::ok();
  }
  return Status::invalid_argument(std::string("argument 'format' is ") + kv_cache_format_name(format) +
                                  ", expected an FP8 cache format: fp8_v32 (d_qk 576, 656 B/token) or fp8_model1 "
                                  "(d_qk 512, 584 B/token)");
}

// A paged bf16 cache (num_blocks, page_size, 1, d_qk): last dim contiguous, other strides multiples of 8 elements,
// data 16-byte aligned.
Status check_bf16_pages(const TensorRef& t, const char* name, int64_t head_dim) {
  OPENMLA_RETURN_IF_ERROR(check_present(t, name));
  OPENMLA_RETURN_IF_ERROR(check_dtype(t, name, {DType::kBFloat16}));
  OPENMLA_RETURN_IF_ERROR(check_ndim(t, name, 4));
  OPENMLA_RETURN_IF_ERROR(detail::check_strides_sane(t, name));
  OPENMLA_RETURN_IF_ERROR(check_dim(t, name, 2, 1, "KV heads; MLA caches have one"));
  OPENMLA_RETURN_IF_ERROR(check_dim(t, name, 3, head_dim, "d_qk of the format"));
  OPENMLA_RETURN_IF_ERROR(detail::check_last_dim_contiguous(t, name));
  OPENMLA_RETURN_IF_ERROR(detail::check_strides_multiple(t, name, kBf16PerVector, "16-byte vector access"));
  return detail::check_pointer_aligned(t, name, kVectorBytes);
}

// A paged FP8 cache (num_blocks, page_size, 1, bytes_per_token) of bytes: tokens bytes_per_token apart inside a
// page, page stride a multiple of 16 bytes and at least one page.
Status check_fp8_pages(const TensorRef& t, const char* name, KVCacheFormat format) {
  const int64_t bpt = kv_cache_bytes_per_token(format, 0);
  OPENMLA_RETURN_IF_ERROR(check_present(t, name));
  OPENMLA_RETURN_IF_ERROR(check_dtype(t, name, {DType::kUInt8, DType::kInt8, DType::kFloat8E4M3}));
  OPENMLA_RETURN_IF_ERROR(check_ndim(t, name, 4));
  OPENMLA_RETURN_IF_ERROR(detail::check_strides_sane(t, name));
  OPENMLA_RETURN_IF_ERROR(check_dim(t, name, 2, 1, "KV heads; MLA caches have one"));
  std::string bytes_what = std::string("bytes per token of ") + kv_cache_format_name(format);
  OPENMLA_RETURN_IF_ERROR(check_dim(t, name, 3, bpt, bytes_what.c_str()));
  OPENMLA_RETURN_IF_ERROR(detail::check_last_dim_contiguous(t, name));
  const int64_t num_blocks = t.shape[0], page_size = t.shape[1];
  if (page_size > 1 && t.stride[1] != bpt) {
    detail::MessageStream os;
    os << quoted(name) << " must store the tokens of a page " << bpt << " bytes apart (stride(1) == " << bpt << " for "
       << kv_cache_format_name(format) << "), got strides " << stride_string(t);
    return Status::invalid_argument(os.str());
  }
  if (num_blocks > 1) {
    if (t.stride[0] % kVectorBytes != 0) {
      detail::MessageStream os;
      os << quoted(name) << " has page stride " << t.stride[0]
         << " bytes (stride(0)), which must be a multiple of 16 bytes (16-byte vector access); strides "
         << stride_string(t);
      return Status::invalid_argument(os.str());
    }
    if (t.stride[0] < page_size * bpt) {
      detail::MessageStream os;
      os << quoted(name) << " has page stride " << t.stride[0] << " bytes (stride(0)), smaller than a page of "
         << page_size << " tokens x " << bpt << " bytes = " << page_size * bpt << "; pages would overlap";
      return Status::invalid_argument(os.str());
    }
  }
  return detail::check_pointer_aligned(t, name, kVectorBytes);
}

Status check_same_pages(const TensorRef& a, const char* a_name, const TensorRef& b, const char* b_name) {
  const char* what[2] = {"num_blocks", "page_size"};
  for (int d = 0; d < 2; ++d) {
    if (a.shape[d] != b.shape[d]) {
      detail::MessageStream os;
      os << quoted(b_name) << " has " << what[d] << " = " << b.shape[d] << " (dimension " << d << ") but "
         << quoted(a_name) << " has " << what[d] << " = " << a.shape[d] << "; shapes " << shape_string(b) << " and "
         << shape_string(a);
      return Status::invalid_argument(os.str());
    }
  }
  return Status::ok();
}

Status check_token_count(const TensorRef& cache, const char* name) {
  if (cache.shape[0] * cache.shape[1] > kMaxTokens) {
    detail::MessageStream os;
    os << quoted(name) << " holds " << cache.shape[0] * cache.shape[1]
       << " tokens (num_blocks * page_size); at most 2^31 - 1 are supported";
    return Status::invalid_argument(os.str());
  }
  return Status::ok();
}

Status check_devices(const TensorRef& a, const char* a_name, const TensorRef& b, const char* b_name) {
  OPENMLA_RETURN_IF_ERROR(detail::check_on_cuda(a, a_name));
  OPENMLA_RETURN_IF_ERROR(detail::check_on_cuda(b, b_name));
  return detail::check_same_device(a, a_name, b, b_name);
}

// A call that passed every check but has nothing to launch (empty tensors) succeeds; in a build without the codec
// kernels it gets the answer a call with data gets (api/families.h).
Status nothing_to_launch(const char* entry) {
  if (detail::family_built(detail::KernelFamily::kKVCache)) return Status::ok();
  return detail::family_not_built(detail::KernelFamily::kKVCache, entry);
}

}  // namespace

Status quantize_kv_cache(const TensorRef& src_in, const TensorRef& dst_in, KVCacheFormat format, cudaStream_t stream) {
  const TensorRef src = detail::canonical(src_in), dst = detail::canonical(dst_in);
  kvk::Fp8Layout layout;
  OPENMLA_RETURN_IF_ERROR(fp8_layout_of(format, &layout));
  OPENMLA_RETURN_IF_ERROR(check_bf16_pages(src, "src", kv_cache_fp8_head_dim(format)));
  OPENMLA_RETURN_IF_ERROR(check_fp8_pages(dst, "dst", format));
  OPENMLA_RETURN_IF_ERROR(check_same_pages(src, "src", dst, "dst"));
  OPENMLA_RETURN_IF_ERROR(check_token_count(dst, "dst"));
  OPENMLA_RETURN_IF_ERROR(detail::check_no_overlap(dst, "dst", src, "src"));
  if (src.numel() == 0) return nothing_to_launch("quantize_kv_cache");  // empty tensors may carry null pointers
  OPENMLA_RETURN_IF_ERROR(check_devices(src, "src", dst, "dst"));
#if !defined(OPENMLA_HAS_KV_CACHE)
  (void)stream;
  (void)layout;
  return detail::family_not_built(detail::KernelFamily::kKVCache, "quantize_kv_cache");
#else
  OPENMLA_RETURN_IF_ERROR(detail::check_launch_context(src.device_id, "src", stream, "quantize_kv_cache"));
  const kvk::QuantizeParams params{
      .src = src.data,
      .src_page_stride = src.stride[0],
      .src_row_stride = src.stride[1],
      .dst = dst.data,
      .dst_page_stride = dst.stride[0],
      .num_blocks = src.shape[0],
      .page_size = src.shape[1],
  };
  return kvk::launch_quantize(params, layout, stream);
#endif
}

Status dequantize_kv_cache(const TensorRef& src_in, const TensorRef& dst_in, KVCacheFormat format,
                           cudaStream_t stream) {
  const TensorRef src = detail::canonical(src_in), dst = detail::canonical(dst_in);
  kvk::Fp8Layout layout;
  OPENMLA_RETURN_IF_ERROR(fp8_layout_of(format, &layout));
  OPENMLA_RETURN_IF_ERROR(check_fp8_pages(src, "src", format));
  OPENMLA_RETURN_IF_ERROR(check_bf16_pages(dst, "dst", kv_cache_fp8_head_dim(format)));
  OPENMLA_RETURN_IF_ERROR(check_same_pages(src, "src", dst, "dst"));
  OPENMLA_RETURN_IF_ERROR(check_token_count(src, "src"));
  OPENMLA_RETURN_IF_ERROR(detail::check_no_overlap(dst, "dst", src, "src"));
  if (src.numel() == 0) return nothing_to_launch("dequantize_kv_cache");  // empty tensors may carry null pointers
  OPENMLA_RETURN_IF_ERROR(check_devices(src, "src", dst, "dst"));
#if !defined(OPENMLA_HAS_KV_CACHE)
  (void)stream;
  (void)layout;
  return detail::family_not_built(detail::KernelFamily::kKVCache, "dequantize_kv_cache");
#else
  OPENMLA_RETURN_IF_ERROR(detail::check_launch_context(src.device_id, "src", stream, "dequantize_kv_cache"));
  const kvk::DequantizeParams params{
      .src = src.data,
      .src_page_stride = src.stride[0],
      .dst = dst.data,
      .dst_page_stride = dst.stride[0],
      .dst_row_stride = dst.stride[1],
      .num_blocks = src.shape[0],
      .page_size = src.shape[1],
  };
  return kvk::launch_dequantize(params, layout, stream);
#endif
}

Status append_kv_cache(const TensorRef& new_kv_in, const TensorRef& slots_in, const TensorRef& cache_in,
                       KVCacheFormat format, cudaStream_t stream) {
  const TensorRef new_kv = detail::canonical(new_kv_in), slots = detail::canonical(slots_in),
                  cache = detail::canonical(cache_in);
  kvk::Fp8Layout layout;
  OPENMLA_RETURN_IF_ERROR(fp8_layout_of(format, &layout));
  const int64_t head_dim = kv_cache_fp8_head_dim(format);

  // new_kv: (n, d_qk) or (n, 1, d_qk) bf16 rows.
  OPENMLA_RETURN_IF_ERROR(check_present(new_kv, "new_kv"));
  OPENMLA_RETURN_IF_ERROR(check_dtype(new_kv, "new_kv", {DType::kBFloat16}));
  if (new_kv.ndim != 2 && new_kv.ndim != 3) {
    return Status::invalid_argument("argument 'new_kv' must have shape (n, d_qk) or (n, 1, d_qk), got shape " +
                                    shape_string(new_kv));
  }
  OPENMLA_RETURN_IF_ERROR(detail::check_strides_sane(new_kv, "new_kv"));
  if (new_kv.ndim == 3) OPENMLA_RETURN_IF_ERROR(check_dim(new_kv, "new_kv", 1, 1, "KV heads; MLA caches have one"));
  OPENMLA_RETURN_IF_ERROR(check_dim(new_kv, "new_kv", -1, head_dim, "d_qk of the format"));
  OPENMLA_RETURN_IF_ERROR(detail::check_last_dim_contiguous(new_kv, "new_kv"));
  OPENMLA_RETURN_IF_ERROR(detail::check_strides_multiple(new_kv, "new_kv", kBf16PerVector, "16-byte vector access"));
  const int64_t num_new = new_kv.shape[0];
  if (num_new > kMaxTokens)
    return Status::invalid_argument("argument 'new_kv' has " + std::to_string(num_new) +
                                    " rows; at most 2^31 - 1 are supported per call");

  // slots: (n,) int32 / int64, contiguous.
  OPENMLA_RETURN_IF_ERROR(check_present(slots, "slots"));
  OPENMLA_RETURN_IF_ERROR(check_dtype(slots, "slots", {DType::kInt32, DType::kInt64}));
  OPENMLA_RETURN_IF_ERROR(check_ndim(slots, "slots", 1));
  OPENMLA_RETURN_IF_ERROR(detail::check_strides_sane(slots, "slots"));
  OPENMLA_RETURN_IF_ERROR(check_dim(slots, "slots", 0, num_new, "one slot per row of new_kv"));
  OPENMLA_RETURN_IF_ERROR(detail::check_contiguous(slots, "slots"));
  OPENMLA_RETURN_IF_ERROR(detail::check_pointer_aligned(slots, "slots", static_cast<int64_t>(slots.element_size())));

  OPENMLA_RETURN_IF_ERROR(check_fp8_pages(cache, "cache", format));
  OPENMLA_RETURN_IF_ERROR(check_token_count(cache, "cache"));
  OPENMLA_RETURN_IF_ERROR(detail::check_disjoint({{&cache, "cache"}}, {{&new_kv, "new_kv"}, {&slots, "slots"}}));

  // Zero-size tensors may carry null pointers: nothing to launch, and nothing to check on the device.
  if (num_new == 0) return nothing_to_launch("append_kv_cache");
  OPENMLA_RETURN_IF_ERROR(detail::check_pointer_aligned(new_kv, "new_kv", kVectorBytes));
  OPENMLA_RETURN_IF_ERROR(check_devices(new_kv, "new_kv", slots, "slots"));
  OPENMLA_RETURN_IF_ERROR(check_devices(new_kv, "new_kv", cache, "cache"));
#if !defined(OPENMLA_HAS_KV_CACHE)
  (void)stream;
  (void)layout;
  return detail::family_not_built(detail::KernelFamily::kKVCache, "append_kv_cache");
#else
  OPENMLA_RETURN_IF_ERROR(detail::check_launch_context(new_kv.device_id, "new_kv", stream, "append_kv_cache"));

  const kvk::AppendParams params{
      .new_kv = new_kv.data,
      .new_kv_row_stride = new_kv.stride[0],
      .slots = slots.data,
      .slots_are_int64 = slots.dtype == DType::kInt64,
      .num_new = num_new,
      .cache = cache.data,
      .cache_page_stride = cache.stride[0],
      .num_blocks = cache.shape[0],
      .page_size = cache.shape[1],
  };
  if (detail::checked_mode_enabled())
    OPENMLA_RETURN_IF_ERROR(detail::run_input_checks(kernels::CheckedEntry::kAppendKVCache,
                                                     detail::append_kv_cache_checks(slots, cache), stream));
  return kvk::launch_append(params, layout, stream);
#endif
}

}  // namespace openmla
