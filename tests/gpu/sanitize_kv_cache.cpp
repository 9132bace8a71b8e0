// Sanitizer cases of the FP8 KV-cache kernels (run by openmla_sanitize under compute-sanitizer memcheck, racecheck,
// synccheck): tiny quantise + dequantise + append through the public C++ API for both layouts, odd page sizes,
// padded page strides, int32 and int64 slots with skipped (negative) entries. Buffers are cudaMalloc'ed to the
// exact size the views need, so any out-of-bounds access is a memcheck error. Results are also compared with the
// CPU codec.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "device_buffer.h"
#include "openmla/kv_cache.h"
#include "openmla_ref/fp8_codec.h"
#include "openmla_ref/numeric.h"

namespace {

using openmla::DType;
using openmla::KVCacheFormat;
using openmla::make_tensor;

using openmla_sanitize::DeviceBuffer;

// One case; returns true when every step succeeded and matched the CPU codec.
bool run_case(KVCacheFormat format, int64_t num_blocks, int64_t page_size, int64_t extra_page_bytes, bool int64_slots) {
  const auto layout =
      format == KVCacheFormat::kFp8V32 ? openmla::ref::Fp8Layout::kV32 : openmla::ref::Fp8Layout::kModel1;
  const int64_t d = openmla::kv_cache_fp8_head_dim(format);
  const int64_t bpt = openmla::kv_cache_bytes_per_token(format, d);
  const int64_t tokens = num_blocks * page_size;
  const int64_t page_stride = (page_size * bpt + 15) / 16 * 16 + extra_page_bytes;
  // The last page needs only page_size * bpt bytes: allocate exactly that, so a write past it is caught.
  const size_t cache_bytes = static_cast<size_t>((num_blocks - 1) * page_stride + page_size * bpt);

  std::vector<uint16_t> host(tokens * d);
  uint32_t state = 12345u + static_cast<uint32_t>(tokens);
  for (size_t i = 0; i < host.size(); ++i) {
    state = state * 1664525u + 1013904223u;
    const float v =
        (static_cast<float>(state >> 8) / 16777216.0f - 0.5f) * std::ldexp(1.0f, static_cast<int>(i / 64 % 30) - 15);
    host[i] = openmla::ref::float_to_bf16(v);
  }
  for (int64_t i = 0; i < d; ++i) host[i] = 0;  // an all-zero token

  DeviceBuffer src(host.size() * 2), cache(cache_bytes), back(host.size() * 2), slots(tokens * 8);
  if (!src.ptr || !cache.ptr || !back.ptr || !slots.ptr) return false;
  if (cudaMemcpy(src.ptr, host.data(), host.size() * 2, cudaMemcpyHostToDevice) != cudaSuccess) return false;
  if (cudaMemset(cache.ptr, 0, cache_bytes) != cudaSuccess) return false;

  const auto src_t = make_tensor(src.ptr, DType::kBFloat16, {num_blocks, page_size, 1, d});
  const auto cache_t =
      make_tensor(cache.ptr, DType::kUInt8, {num_blocks, page_size, 1, bpt}, {page_stride, bpt, bpt, 1});
  const auto back_t = make_tensor(back.ptr, DType::kBFloat16, {num_blocks, page_size, 1, d});
  auto report = [&](const openmla::Status& st, const char* what) {
    if (!st.is_ok()) std::printf("  kv_cache %s: %s\n", what, st.message().c_str());
    return st.is_ok();
  };
  if (!report(openmla::quantize_kv_cache(src_t, cache_t, format, nullptr), "quantize")) return false;
  if (!report(openmla::dequantize_kv_cache(cache_t, back_t, format, nullptr), "dequantize")) return false;

  // Append every token to a reversed slot, skipping every fourth (negative slot).
  std::vector<int64_t> slot64(tokens);
  std::vector<int32_t> slot32(tokens);
  for (int64_t i = 0; i < tokens; ++i) {
    slot64[i] = (i % 4 == 1) ? -1 - i : tokens - 1 - i;
    slot32[i] = static_cast<int32_t>(slot64[i]);
  }
  const void* slot_host = int64_slots ? static_cast<const void*>(slot64.data()) : slot32.data();
  if (cudaMemcpy(slots.ptr, slot_host, tokens * (int64_slots ? 8 : 4), cudaMemcpyHostToDevice) != cudaSuccess)
    return false;
  const auto kv_t = make_tensor(src.ptr, DType::kBFloat16, {tokens, d});
  const auto slots_t = make_tensor(slots.ptr, int64_slots ? DType::kInt64 : DType::kInt32, {tokens});
  if (!report(openmla::append_kv_cache(kv_t, slots_t, cache_t, format, nullptr), "append")) return false;
  if (cudaDeviceSynchronize() != cudaSuccess) return false;

  // Check: after the append, token slot s holds the encoding of row tokens-1-s unless that row was skipped, in
  // which case it still holds the quantised original.
  std::vector<uint8_t> got(cache_bytes), want(cache_bytes, 0);
  if (cudaMemcpy(got.data(), cache.ptr, cache_bytes, cudaMemcpyDeviceToHost) != cudaSuccess) return false;
  std::vector<uint8_t> page(page_size * bpt);
  for (int64_t p = 0; p < num_blocks; ++p) {
    openmla::ref::fp8_encode_page(layout, host.data() + p * page_size * d, d, page.data(), page_size);
    for (int64_t r = 0; r < page_size; ++r) {
      const int64_t row = tokens - 1 - (p * page_size + r);
      if (row % 4 != 1) openmla::ref::fp8_encode_token(layout, host.data() + row * d, page.data(), page_size, r);
    }
    std::memcpy(want.data() + p * page_stride, page.data(), page.size());
  }
  for (int64_t p = 0; p < num_blocks; ++p)
    if (std::memcmp(got.data() + p * page_stride, want.data() + p * page_stride, page_size * bpt) != 0) return false;
  return true;
}

}  // namespace

int run_kv_cache_sanitize_cases() {
  struct Case {
    KVCacheFormat format;
    int64_t num_blocks, page_size, extra_page_bytes;
    bool int64_slots;
  };
  const Case cases[] = {
      {KVCacheFormat::kFp8V32, 3, 1, 0, false},      {KVCacheFormat::kFp8V32, 2, 53, 48, true},
      {KVCacheFormat::kFp8V32, 2, 64, 0, false},     {KVCacheFormat::kFp8Model1, 3, 1, 16, true},
      {KVCacheFormat::kFp8Model1, 2, 53, 32, false}, {KVCacheFormat::kFp8Model1, 2, 64, 0, true},
  };
  int failed = 0, ran = 0;
  for (const Case& c : cases) {
    ++ran;
    if (!run_case(c.format, c.num_blocks, c.page_size, c.extra_page_bytes, c.int64_slots)) {
      ++failed;
      std::printf("  kv_cache FAILED: %s, %lld pages of %lld tokens, page padding %lld B, %s slots\n",
                  openmla::kv_cache_format_name(c.format), static_cast<long long>(c.num_blocks),
                  static_cast<long long>(c.page_size), static_cast<long long>(c.extra_page_bytes),
                  c.int64_slots ? "int64" : "int32");
    }
  }
  std::printf("  kv_cache: %d case(s) of quantise + dequantise + append, %d failed\n", ran, failed);
  return failed;
}
