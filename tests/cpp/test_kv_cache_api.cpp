// Public FP8 KV-cache API (src/api/kv_cache.cpp): every validation error, without a GPU (validation runs before any
// CUDA call; the device pointers are fake), plus GPU cases against the CPU codec that skip without a device.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "openmla/capability.h"
#include "openmla/kv_cache.h"
#include "openmla_ref/fp8_codec.h"
#include "openmla_ref/numeric.h"

namespace {

using openmla::DeviceType;
using openmla::DType;
using openmla::KVCacheFormat;
using openmla::make_tensor;
using openmla::Status;
using openmla::StatusCode;
using openmla::TensorRef;

// Never dereferenced: validation fails before any launch. 256-byte aligned like a real allocation.
void* fake_device_ptr(uintptr_t k = 1) { return reinterpret_cast<void*>(k << 20); }

TensorRef bf16_pages(int64_t nb, int64_t ps, int64_t d) {
  return make_tensor(fake_device_ptr(1), DType::kBFloat16, {nb, ps, 1, d});
}
TensorRef fp8_pages(int64_t nb, int64_t ps, int64_t bpt) {
  return make_tensor(fake_device_ptr(2), DType::kUInt8, {nb, ps, 1, bpt});
}

void expect_invalid(const Status& st, std::initializer_list<const char*> fragments) {
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.message();
  for (const char* f : fragments)
    EXPECT_NE(st.message().find(f), std::string::npos) << "expected \"" << f << "\" in: " << st.message();
}

Status quantize(const TensorRef& src, const TensorRef& dst, KVCacheFormat f = KVCacheFormat::kFp8V32) {
  return openmla::quantize_kv_cache(src, dst, f, nullptr);
}
Status dequantize(const TensorRef& src, const TensorRef& dst, KVCacheFormat f = KVCacheFormat::kFp8V32) {
  return openmla::dequantize_kv_cache(src, dst, f, nullptr);
}

// ---------------------------------------------------------------------------------------------------------------
// Helpers of the header
// ---------------------------------------------------------------------------------------------------------------
TEST(KvCacheApi, FormatHelpers) {
  EXPECT_EQ(openmla::kv_cache_bytes_per_token(KVCacheFormat::kFp8V32, 576), 656);
  EXPECT_EQ(openmla::kv_cache_bytes_per_token(KVCacheFormat::kFp8Model1, 512), 584);
  EXPECT_EQ(openmla::kv_cache_bytes_per_token(KVCacheFormat::kBFloat16, 576), 1152);
  EXPECT_EQ(openmla::kv_cache_fp8_head_dim(KVCacheFormat::kFp8V32), 576);
  EXPECT_EQ(openmla::kv_cache_fp8_head_dim(KVCacheFormat::kFp8Model1), 512);
  EXPECT_EQ(openmla::kv_cache_fp8_head_dim(KVCacheFormat::kBFloat16), 0);
  EXPECT_STREQ(openmla::kv_cache_format_name(KVCacheFormat::kFp8Model1), "fp8_model1");
}

// ---------------------------------------------------------------------------------------------------------------
// quantize_kv_cache validation
// ---------------------------------------------------------------------------------------------------------------
// Validation tests hand the API fake device pointers: on a machine with a GPU a test that passes
// validation would launch on them, so the suite runs only where no GPU exists (CI); the GPU tests cover
// the API there.
class KvCacheApiValidation : public ::testing::Test {
 protected:
  void SetUp() override {
    int n = 0;
    if (cudaGetDeviceCount(&n) == cudaSuccess && n > 0) GTEST_SKIP() << "a GPU is present: fake pointers would fault";
  }
};

TEST_F(KvCacheApiValidation, ValidArgumentsPassValidation) {
  // With valid fake pointers the call gets past validation to the launch, which then fails (no GPU) or, on a GPU,
  // faults: so only check that the error, if any, is not a validation error. Skipped where a GPU exists.
  int n = 0;
  if (cudaGetDeviceCount(&n) == cudaSuccess && n > 0) GTEST_SKIP() << "a GPU is present: fake pointers would fault";
  const Status st = quantize(bf16_pages(4, 64, 576), fp8_pages(4, 64, 656));
  EXPECT_NE(st.code(), StatusCode::kInvalidArgument) << st.message();
}

TEST_F(KvCacheApiValidation, WrongFormat) {
  expect_invalid(quantize(bf16_pages(2, 64, 576), fp8_pages(2, 64, 656), KVCacheFormat::kBFloat16),
                 {"argument 'format'", "fp8_v32", "fp8_model1"});
  expect_invalid(dequantize(fp8_pages(2, 64, 656), bf16_pages(2, 64, 576), KVCacheFormat::kFloat16), {"'format'"});
}

TEST_F(KvCacheApiValidation, WrongSrcDtype) {
  TensorRef src = bf16_pages(2, 64, 576);
  src.dtype = DType::kFloat16;
  expect_invalid(quantize(src, fp8_pages(2, 64, 656)), {"argument 'src'", "float16", "expected bfloat16"});
  src.dtype = DType::kFloat32;
  expect_invalid(quantize(src, fp8_pages(2, 64, 656)), {"argument 'src'", "float32"});
}

TEST_F(KvCacheApiValidation, WrongDstDtype) {
  TensorRef dst = fp8_pages(2, 64, 656);
  dst.dtype = DType::kInt32;
  expect_invalid(quantize(bf16_pages(2, 64, 576), dst), {"argument 'dst'", "int32", "uint8"});
  for (DType ok : {DType::kInt8, DType::kFloat8E4M3}) {  // byte dtypes are all accepted
    dst.dtype = ok;
    const Status st = quantize(bf16_pages(2, 64, 576), dst);
    EXPECT_EQ(st.message().find("has dtype"), std::string::npos) << st.message();
  }
}

TEST_F(KvCacheApiValidation, WrongLastDimension) {
  expect_invalid(quantize(bf16_pages(2, 64, 575), fp8_pages(2, 64, 656)),
                 {"argument 'src'", "size 575 in dimension 3", "expected 576"});
  expect_invalid(quantize(bf16_pages(2, 64, 576), fp8_pages(2, 64, 656), KVCacheFormat::kFp8Model1),
                 {"argument 'src'", "size 576", "expected 512"});
  expect_invalid(quantize(bf16_pages(2, 64, 576), fp8_pages(2, 64, 600)),
                 {"argument 'dst'", "size 600 in dimension 3", "expected 656", "fp8_v32"});
  expect_invalid(quantize(bf16_pages(2, 64, 512), fp8_pages(2, 64, 656), KVCacheFormat::kFp8Model1),
                 {"argument 'dst'", "expected 584"});
  expect_invalid(dequantize(fp8_pages(2, 64, 600), bf16_pages(2, 64, 576)), {"argument 'src'", "expected 656"});
  expect_invalid(dequantize(fp8_pages(2, 64, 656), bf16_pages(2, 64, 575)), {"argument 'dst'", "expected 576"});
}

TEST_F(KvCacheApiValidation, WrongRankAndHeads) {
  TensorRef src = make_tensor(fake_device_ptr(), DType::kBFloat16, {128, 576});
  expect_invalid(quantize(src, fp8_pages(2, 64, 656)), {"argument 'src'", "4 dimensions"});
  expect_invalid(quantize(bf16_pages(2, 64, 576), make_tensor(fake_device_ptr(2), DType::kUInt8, {2, 64, 2, 656})),
                 {"argument 'dst'", "dimension 2", "KV heads"});
}

TEST_F(KvCacheApiValidation, MisalignedBf16Strides) {
  // Page stride 4 elements short of a 16-byte multiple (a padded page of 64*576 + 4 elements).
  TensorRef src = make_tensor(fake_device_ptr(), DType::kBFloat16, {2, 64, 1, 576}, {64 * 576 + 4, 576, 576, 1});
  expect_invalid(quantize(src, fp8_pages(2, 64, 656)), {"argument 'src'", "stride", "multiple of 8 elements"});
  TensorRef rows = make_tensor(fake_device_ptr(), DType::kBFloat16, {2, 64, 1, 576}, {64 * 580, 580, 580, 1});
  expect_invalid(quantize(rows, fp8_pages(2, 64, 656)), {"argument 'src'", "stride 580 in dimension 1"});
  TensorRef last = make_tensor(fake_device_ptr(), DType::kBFloat16, {2, 64, 1, 576}, {64 * 576 * 2, 576 * 2, 576, 2});
  expect_invalid(quantize(last, fp8_pages(2, 64, 656)), {"argument 'src'", "contiguous in its last dimension"});
  TensorRef misaligned_ptr = bf16_pages(2, 64, 576);
  misaligned_ptr.data = static_cast<char*>(misaligned_ptr.data) + 2;
  expect_invalid(quantize(misaligned_ptr, fp8_pages(2, 64, 656)), {"argument 'src'", "16-byte aligned"});
}

TEST_F(KvCacheApiValidation, MisalignedOrOverlappingPageStride) {
  TensorRef dst = make_tensor(fake_device_ptr(2), DType::kUInt8, {2, 64, 1, 656}, {64 * 656 + 8, 656, 656, 1});
  expect_invalid(quantize(bf16_pages(2, 64, 576), dst), {"argument 'dst'", "page stride", "multiple of 16 bytes"});
  dst = make_tensor(fake_device_ptr(2), DType::kUInt8, {2, 64, 1, 656}, {63 * 656, 656, 656, 1});
  expect_invalid(quantize(bf16_pages(2, 64, 576), dst), {"argument 'dst'", "smaller than a page"});
  dst = make_tensor(fake_device_ptr(2), DType::kUInt8, {2, 64, 1, 584}, {64 * 600, 600, 600, 1});
  expect_invalid(quantize(bf16_pages(2, 64, 512), dst, KVCacheFormat::kFp8Model1),
                 {"argument 'dst'", "584 bytes apart"});
  TensorRef src = make_tensor(fake_device_ptr(2), DType::kUInt8, {2, 64, 1, 656}, {64 * 656 + 8, 656, 656, 1});
  expect_invalid(dequantize(src, bf16_pages(2, 64, 576)), {"argument 'src'", "multiple of 16 bytes"});
  dst = fp8_pages(2, 64, 656);
  dst.data = static_cast<char*>(dst.data) + 8;
  expect_invalid(quantize(bf16_pages(2, 64, 576), dst), {"argument 'dst'", "16-byte aligned"});
}

TEST_F(KvCacheApiValidation, NonContiguousPagesThatMeetTheRulesAreAccepted) {
  int n = 0;
  if (cudaGetDeviceCount(&n) == cudaSuccess && n > 0) GTEST_SKIP() << "a GPU is present: fake pointers would fault";
  // MODEL1 reference allocator stride (ceil(B*584/576)*576) and a padded bf16 source.
  TensorRef dst = make_tensor(fake_device_ptr(2), DType::kUInt8, {3, 64, 1, 584}, {37440, 584, 584, 1});
  TensorRef src = make_tensor(fake_device_ptr(1), DType::kBFloat16, {3, 64, 1, 512}, {64 * 520 + 8, 520, 520, 1});
  const Status st = quantize(src, dst, KVCacheFormat::kFp8Model1);
  EXPECT_NE(st.code(), StatusCode::kInvalidArgument) << st.message();
}

TEST_F(KvCacheApiValidation, MismatchedPages) {
  expect_invalid(quantize(bf16_pages(3, 64, 576), fp8_pages(2, 64, 656)),
                 {"argument 'dst'", "num_blocks = 2", "argument 'src'", "num_blocks = 3"});
  expect_invalid(quantize(bf16_pages(2, 64, 576), fp8_pages(2, 32, 656)), {"argument 'dst'", "page_size = 32"});
  expect_invalid(dequantize(fp8_pages(2, 64, 656), bf16_pages(2, 63, 576)), {"argument 'dst'", "page_size = 63"});
}

TEST_F(KvCacheApiValidation, HostTensors) {
  TensorRef src = bf16_pages(2, 64, 576);
  src.device = DeviceType::kCPU;
  expect_invalid(quantize(src, fp8_pages(2, 64, 656)), {"argument 'src'", "CUDA tensor", "CPU (host)"});
  TensorRef dst = fp8_pages(2, 64, 656);
  dst.device = DeviceType::kCPU;
  expect_invalid(quantize(bf16_pages(2, 64, 576), dst), {"argument 'dst'", "CPU (host)"});
  expect_invalid(dequantize(dst, bf16_pages(2, 64, 576)), {"argument 'src'", "CPU (host)"});
  TensorRef other = fp8_pages(2, 64, 656);
  other.device_id = 1;
  expect_invalid(quantize(bf16_pages(2, 64, 576), other), {"argument 'dst'", "cuda:1", "same device"});
}

TEST_F(KvCacheApiValidation, MissingTensors) {
  expect_invalid(quantize(TensorRef{}, fp8_pages(2, 64, 656)), {"argument 'src'", "required"});
  expect_invalid(dequantize(fp8_pages(2, 64, 656), TensorRef{}), {"argument 'dst'", "required"});
}

// A call with nothing to launch succeeds without a CUDA call; a build without the codec kernels answers "not built"
// (tests/cpp/test_build_options.cpp checks the message).
void expect_no_op(const Status& st) {
#if defined(OPENMLA_HAS_KV_CACHE)
  EXPECT_TRUE(st.is_ok()) << st.message();
#else
  EXPECT_EQ(st.code(), StatusCode::kUnsupported) << st.message();
#endif
}

TEST_F(KvCacheApiValidation, EmptyCacheIsANoOp) {
  // Zero pages: nothing to launch, no CUDA call, even with null pointers.
  TensorRef src = make_tensor(nullptr, DType::kBFloat16, {0, 64, 1, 576});
  TensorRef dst = make_tensor(nullptr, DType::kUInt8, {0, 64, 1, 656});
  expect_no_op(quantize(src, dst));
  expect_no_op(dequantize(dst, src));
}

// ---------------------------------------------------------------------------------------------------------------
// append_kv_cache validation
// ---------------------------------------------------------------------------------------------------------------
Status append(const TensorRef& kv, const TensorRef& slots, const TensorRef& cache,
              KVCacheFormat f = KVCacheFormat::kFp8V32) {
  return openmla::append_kv_cache(kv, slots, cache, f, nullptr);
}
TensorRef new_rows(int64_t n, int64_t d) { return make_tensor(fake_device_ptr(3), DType::kBFloat16, {n, d}); }
TensorRef slot_vec(int64_t n, DType dt = DType::kInt32) { return make_tensor(fake_device_ptr(4), dt, {n}); }

TEST_F(KvCacheApiValidation, AppendErrors) {
  const TensorRef cache = fp8_pages(4, 64, 656);
  TensorRef kv = new_rows(10, 576);
  kv.dtype = DType::kFloat32;
  expect_invalid(append(kv, slot_vec(10), cache), {"argument 'new_kv'", "float32", "bfloat16"});
  expect_invalid(append(new_rows(10, 575), slot_vec(10), cache), {"argument 'new_kv'", "size 575", "expected 576"});
  expect_invalid(append(make_tensor(fake_device_ptr(3), DType::kBFloat16, {10, 2, 576}), slot_vec(10), cache),
                 {"argument 'new_kv'", "KV heads"});
  expect_invalid(append(make_tensor(fake_device_ptr(3), DType::kBFloat16, {2, 5, 1, 576}), slot_vec(10), cache),
                 {"argument 'new_kv'", "(n, d_qk) or (n, 1, d_qk)"});
  expect_invalid(append(make_tensor(fake_device_ptr(3), DType::kBFloat16, {10, 576}, {580, 1}), slot_vec(10), cache),
                 {"argument 'new_kv'", "stride 580", "multiple of 8"});
  expect_invalid(append(new_rows(10, 576), slot_vec(10, DType::kFloat32), cache),
                 {"argument 'slots'", "float32", "int32 or int64"});
  expect_invalid(append(new_rows(10, 576), slot_vec(9), cache), {"argument 'slots'", "size 9", "expected 10"});
  expect_invalid(append(new_rows(10, 576), make_tensor(fake_device_ptr(4), DType::kInt64, {10}, {2}), cache),
                 {"argument 'slots'", "contiguous"});
  expect_invalid(append(new_rows(10, 576), slot_vec(10), fp8_pages(4, 64, 600)), {"argument 'cache'", "expected 656"});
  expect_invalid(append(new_rows(10, 512), slot_vec(10), cache, KVCacheFormat::kFp8Model1),
                 {"argument 'cache'", "expected 584"});
  expect_invalid(append(new_rows(10, 576), slot_vec(10), cache, KVCacheFormat::kBFloat16), {"argument 'format'"});
  TensorRef host_kv = new_rows(10, 576);
  host_kv.device = DeviceType::kCPU;
  expect_invalid(append(host_kv, slot_vec(10), cache), {"argument 'new_kv'", "CPU (host)"});
  TensorRef host_slots = slot_vec(10, DType::kInt64);
  host_slots.device = DeviceType::kCPU;
  expect_invalid(append(new_rows(10, 576), host_slots, cache), {"argument 'slots'", "CPU (host)"});
  TensorRef host_cache = cache;
  host_cache.device = DeviceType::kCPU;
  expect_invalid(append(new_rows(10, 576), slot_vec(10), host_cache), {"argument 'cache'", "CPU (host)"});
}

TEST_F(KvCacheApiValidation, AppendNothingIsANoOp) {
  expect_no_op(append(make_tensor(nullptr, DType::kBFloat16, {0, 576}), make_tensor(nullptr, DType::kInt32, {0}),
                      fp8_pages(4, 64, 656)));
}

// ---------------------------------------------------------------------------------------------------------------
// GPU: a small round trip against the CPU codec (the exhaustive GPU checks live in tests/python/test_kv_cache.py).
// ---------------------------------------------------------------------------------------------------------------
class KvCacheApiGpu : public ::testing::TestWithParam<KVCacheFormat> {};

TEST_P(KvCacheApiGpu, QuantizeDequantizeAppendMatchCpuCodec) {
  // The capability, not only a device: in a build without the codec (OPENMLA_ENABLE_KV_CACHE=OFF) it says so.
  if (const openmla::Capability cap = openmla::query_capability(openmla::Feature::kKVCacheQuantize); !cap.supported)
    GTEST_SKIP() << "GPU test skipped: " << cap.reason;
  const KVCacheFormat format = GetParam();
  const auto layout =
      format == KVCacheFormat::kFp8V32 ? openmla::ref::Fp8Layout::kV32 : openmla::ref::Fp8Layout::kModel1;
  const int64_t d = openmla::kv_cache_fp8_head_dim(format), bpt = openmla::kv_cache_bytes_per_token(format, d);
  const int64_t nb = 3, ps = 53, page_stride = ((ps * bpt + 15) / 16) * 16 + 32;  // padded pages
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint16_t> host_src(nb * ps * d);
  for (size_t i = 0; i < host_src.size(); ++i)
    host_src[i] =
        openmla::ref::float_to_bf16(normal(rng) * std::exp2(static_cast<float>(static_cast<int>(i / 64) % 40 - 20)));
  for (int64_t i = 0; i < d; ++i) host_src[5 * d + i] = 0;  // an all-zero token

  std::vector<uint8_t> expect(nb * page_stride, 0xEE);
  for (int64_t p = 0; p < nb; ++p)
    openmla::ref::fp8_encode_page(layout, host_src.data() + p * ps * d, d, expect.data() + p * page_stride, ps);

  void *d_src = nullptr, *d_cache = nullptr, *d_back = nullptr, *d_slots = nullptr;
  ASSERT_EQ(cudaMalloc(&d_src, host_src.size() * 2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_cache, expect.size()), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_back, host_src.size() * 2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_slots, nb * ps * sizeof(int64_t)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d_src, host_src.data(), host_src.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemset(d_cache, 0xEE, expect.size()), cudaSuccess);
  ASSERT_EQ(cudaMemset(d_back, 0xFF, host_src.size() * 2), cudaSuccess);

  const TensorRef src = make_tensor(d_src, DType::kBFloat16, {nb, ps, 1, d});
  const TensorRef cache = make_tensor(d_cache, DType::kUInt8, {nb, ps, 1, bpt}, {page_stride, bpt, bpt, 1});
  const TensorRef back = make_tensor(d_back, DType::kBFloat16, {nb, ps, 1, d});
  ASSERT_TRUE(openmla::quantize_kv_cache(src, cache, format, nullptr).is_ok());
  ASSERT_TRUE(openmla::dequantize_kv_cache(cache, back, format, nullptr).is_ok());
  std::vector<uint8_t> got(expect.size());
  std::vector<uint16_t> got_back(host_src.size());
  ASSERT_EQ(cudaMemcpy(got.data(), d_cache, got.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(got_back.data(), d_back, got_back.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(got, expect);
  for (int64_t p = 0; p < nb; ++p) {
    std::vector<uint16_t> want(ps * d);
    openmla::ref::fp8_decode_page_bf16(layout, expect.data() + p * page_stride, ps, want.data(), d);
    for (int64_t i = 0; i < ps * d; ++i) ASSERT_EQ(got_back[p * ps * d + i], want[i]) << "page " << p << " elem " << i;
  }

  // Append every token in reverse slot order, with every third slot skipped (-1): skipped tokens keep 0xEE.
  std::vector<int64_t> slots(nb * ps);
  for (int64_t i = 0; i < nb * ps; ++i) slots[i] = (i % 3 == 0) ? -1 : nb * ps - 1 - i;
  ASSERT_EQ(cudaMemcpy(d_slots, slots.data(), slots.size() * 8, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemset(d_cache, 0xEE, expect.size()), cudaSuccess);
  const TensorRef kv = make_tensor(d_src, DType::kBFloat16, {nb * ps, d});
  const TensorRef sl = make_tensor(d_slots, DType::kInt64, {nb * ps});
  ASSERT_TRUE(openmla::append_kv_cache(kv, sl, cache, format, nullptr).is_ok());
  ASSERT_EQ(cudaMemcpy(got.data(), d_cache, got.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  std::vector<uint8_t> want(expect.size(), 0xEE);
  for (int64_t i = 0; i < nb * ps; ++i) {
    if (slots[i] < 0) continue;
    const int64_t p = slots[i] / ps, r = slots[i] % ps;
    openmla::ref::fp8_encode_token(layout, host_src.data() + i * d, want.data() + p * page_stride, ps, r);
  }
  EXPECT_EQ(got, want);
  cudaFree(d_src);
  cudaFree(d_cache);
  cudaFree(d_back);
  cudaFree(d_slots);
}

INSTANTIATE_TEST_SUITE_P(Formats, KvCacheApiGpu, ::testing::Values(KVCacheFormat::kFp8V32, KVCacheFormat::kFp8Model1),
                         [](const ::testing::TestParamInfo<KVCacheFormat>& info) {
                           return info.param == KVCacheFormat::kFp8V32 ? std::string("V32") : std::string("Model1");
                         });

}  // namespace
