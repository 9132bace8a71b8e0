// What the per-call host path keeps between calls instead of redoing it (docs/integration.md, "Host cost"), checked
// against doing it every time: the TMA descriptors a thread encoded before (common/tensor_map.h), the dynamic
// shared-memory limit set once per device (common/dynamic_smem.h, also after the device's context was reset), and
// the stream the Python binding vouches for (api/validate.h, ScopedKnownStream). GPU tests: they skip without one.
#include <gtest/gtest.h>

#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "api/validate.h"
#include "common/tensor_map.h"
#include "openmla/capability.h"
#include "openmla/decode.h"

namespace openmla {
namespace {

bool have_gpu(std::string* why) {
  const Capability cap = query_capability(Feature::kDenseDecode);
  if (!cap.supported) *why = cap.reason;
  return cap.supported;
}

#define SKIP_WITHOUT_GPU()                                            \
  do {                                                                \
    std::string why;                                                  \
    if (!have_gpu(&why)) GTEST_SKIP() << "GPU test skipped: " << why; \
  } while (0)

// ---- TMA descriptors -----------------------------------------------------------------------------------------------

PFN_cuTensorMapEncodeTiled_v12000 driver_encode() {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult qres;
  if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &qres) != cudaSuccess)
    return nullptr;
  return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
}

// A 5-D map like dense decode's k_cache map, varied by `i` (pages, strides, box, base address).
detail::TensorMapSpec spec_of(int i) {
  detail::TensorMapSpec s{};
  s.dtype = i % 2 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  s.rank = 5;
  const uint64_t dims[5] = {64, 64, 9, static_cast<uint64_t>(1 + i % 3), static_cast<uint64_t>(100 + i)};
  const uint64_t row = 576 * 2 * static_cast<uint64_t>(1 + i % 3);
  const uint64_t strides[4] = {row, 128, 576 * 2, row * 64 + 16 * static_cast<uint64_t>(i % 5)};
  const uint32_t box[5] = {64, 64, i % 4 == 0 ? 1u : 4u, 1, 1};
  std::memcpy(s.dims, dims, sizeof(dims));
  std::memcpy(s.byte_strides, strides, sizeof(strides));
  std::memcpy(s.box, box, sizeof(box));
  s.swizzle = CU_TENSOR_MAP_SWIZZLE_128B;
  s.l2_promotion = CU_TENSOR_MAP_L2_PROMOTION_L2_256B;
  return s;
}

void* base_of(int i) { return reinterpret_cast<void*>(uintptr_t{0x7f0000000000} + (uintptr_t(i % 37) << 20)); }

// Every descriptor the library hands out, cached or not, is the one the driver encodes for that base and spec: over
// 600 requests of 300 distinct maps (more than the cache holds, so entries are replaced), in two threads at once.
TEST(HostPathGpu, CachedTensorMapsEqualTheDriversEncoding) {
  SKIP_WITHOUT_GPU();
  const PFN_cuTensorMapEncodeTiled_v12000 encode = driver_encode();
  ASSERT_NE(encode, nullptr);
  // The second thread makes no CUDA runtime call before its first encode (no current context there): the library's
  // first encode makes the device's primary context current, as a thread's first launch does.
  std::string first_error_b;
  auto run = [&](int seed, int* mismatches) {
    std::mt19937 rng(seed);
    for (int n = 0; n < 600; ++n) {
      const int i = static_cast<int>(rng() % 300);
      const detail::TensorMapSpec s = spec_of(i);
      CUtensorMap got, want;
      const Status st = detail::encode_tensor_map(&got, base_of(i), s, "test");
      if (!st.is_ok()) {
        if (seed == 2 && first_error_b.empty()) first_error_b = st.message();
        ++*mismatches;
        continue;
      }
      uint32_t elem_strides[5] = {1, 1, 1, 1, 1};
      if (encode(&want, s.dtype, static_cast<cuuint32_t>(s.rank), base_of(i), s.dims, s.byte_strides, s.box,
                 elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, s.swizzle, s.l2_promotion,
                 CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS ||
          std::memcmp(&got, &want, sizeof(CUtensorMap)) != 0)
        ++*mismatches;
    }
  };
  int mismatches_a = 0, mismatches_b = 0;
  std::thread other(run, 2, &mismatches_b);
  run(1, &mismatches_a);
  other.join();
  EXPECT_EQ(mismatches_a, 0);
  EXPECT_EQ(mismatches_b, 0) << first_error_b;
}

// A spec the driver refuses is refused every time (a failed encoding is not remembered as a descriptor).
TEST(HostPathGpu, RefusedTensorMapStaysRefused) {
  SKIP_WITHOUT_GPU();
  detail::TensorMapSpec s = spec_of(0);
  s.byte_strides[0] = 100;  // not a multiple of 16
  CUtensorMap map;
  for (int i = 0; i < 3; ++i) {
    const Status st = detail::encode_tensor_map(&map, base_of(0), s, "refused map");
    EXPECT_FALSE(st.is_ok());
    EXPECT_NE(st.message().find("refused map: cuTensorMapEncodeTiled failed"), std::string::npos) << st.message();
  }
}

// ---- The stream the binding vouches for -------------------------------------------------------------------------

// A ScopedKnownStream vouches for its stream on its device only: another device with the same stream, or the same
// device once the scope has ended, is asked of the driver as before (and named when wrong).
TEST(HostPathGpu, KnownStreamVouchesOnlyForItsStreamAndDevice) {
  SKIP_WITHOUT_GPU();
  cudaStream_t stream = nullptr, other = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking), cudaSuccess);
  auto wrong_device = [&](cudaStream_t s) { return detail::check_stream_device(s, 1, "q"); };
  EXPECT_NE(wrong_device(stream).message().find("argument 'stream' belongs to cuda:0"), std::string::npos);
  {
    detail::ScopedKnownStream known(stream, 0);
    EXPECT_TRUE(detail::check_stream_device(stream, 0, "q").is_ok());
    EXPECT_NE(wrong_device(stream).message().find("argument 'stream' belongs to cuda:0"), std::string::npos);
    {
      detail::ScopedKnownStream inner(other, 1);  // a false promise is taken for its own stream and device only
      EXPECT_TRUE(wrong_device(other).is_ok());
      EXPECT_NE(wrong_device(stream).message().find("belongs to cuda:0"), std::string::npos);
    }
    EXPECT_NE(wrong_device(other).message().find("belongs to cuda:0"), std::string::npos);  // the inner scope ended
  }
  EXPECT_NE(wrong_device(stream).message().find("belongs to cuda:0"), std::string::npos);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  cudaStreamDestroy(stream);
  cudaStreamDestroy(other);
}

// ---- The shared-memory limit, set once per device ----------------------------------------------------------------

// A small dense decode (b 2, s_q 1, h_q 16, 128 cached tokens, two pages per request) run from scratch: its out.
std::vector<uint16_t> small_dense_decode(Status* status) {
  const int64_t b = 2, h_q = 16, pages = 2;
  DenseDecodeProblem p{.batch = b, .s_q = 1, .h_q = h_q, .h_kv = 1, .causal = true};
  DecodeWorkspaceSizes ws;
  *status = get_decode_workspace_sizes(p, &ws);
  if (!status->is_ok()) return {};
  std::vector<uint16_t> q(b * h_q * 576), k(b * pages * 64 * 576);
  for (size_t i = 0; i < q.size(); ++i) q[i] = static_cast<uint16_t>(0x3c00 + (i * 7919) % 1024);  // bf16 ~1..2
  for (size_t i = 0; i < k.size(); ++i) k[i] = static_cast<uint16_t>(0x3a00 + (i * 104729) % 1024);
  const std::vector<int32_t> table = {0, 1, 2, 3}, lengths = {128, 100};
  std::vector<void*> owned;
  auto upload = [&](const void* host, size_t bytes) {
    void* d = nullptr;
    if (cudaMalloc(&d, bytes) != cudaSuccess) return static_cast<void*>(nullptr);
    owned.push_back(d);
    if (host != nullptr) cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice);
    return d;
  };
  void* dq = upload(q.data(), q.size() * 2);
  void* dk = upload(k.data(), k.size() * 2);
  void* dbt = upload(table.data(), table.size() * 4);
  void* dlen = upload(lengths.data(), lengths.size() * 4);
  const int64_t counters = std::max<int64_t>(ws.merge_counter_ints, 1);
  void* meta = upload(nullptr, ws.metadata_ints * 4);
  void* splits = upload(nullptr, ws.num_splits_ints * 4);
  void* cnt = upload(nullptr, counters * 4);
  void* po = upload(nullptr, ws.partial_o_bytes);
  void* pl = upload(nullptr, ws.partial_lse_bytes);
  void* out = upload(nullptr, b * h_q * 512 * 2);
  void* lse = upload(nullptr, b * h_q * 4);
  std::vector<uint16_t> result(b * h_q * 512);
  const DecodeSchedule sched{make_tensor(meta, DType::kInt32, {ws.num_sm_parts, kDecodeScheduleRecordInts}),
                             make_tensor(splits, DType::kInt32, {b + 1}), make_tensor(cnt, DType::kInt32, {counters})};
  const TensorRef lens = make_tensor(dlen, DType::kInt32, {b});
  const DenseDecodeArgs a{.q = make_tensor(dq, DType::kBFloat16, {b, 1, h_q, 576}),
                          .k_cache = make_tensor(dk, DType::kBFloat16, {b * pages, 64, 1, 576}),
                          .block_table = make_tensor(dbt, DType::kInt32, {b, pages}),
                          .cache_seqlens = lens,
                          .schedule = sched,
                          .split = {make_tensor(po, DType::kFloat32, {ws.partial_rows, 512}),
                                    make_tensor(pl, DType::kFloat32, {ws.partial_rows})},
                          .out = make_tensor(out, DType::kBFloat16, {b, 1, h_q, 512}),
                          .lse = make_tensor(lse, DType::kFloat32, {b, h_q, 1})};
  *status = plan_decode(p, lens, sched, nullptr);
  if (status->is_ok()) *status = dense_decode(p, a, nullptr);
  if (status->is_ok()) {
    const cudaError_t err = cudaMemcpy(result.data(), out, result.size() * 2, cudaMemcpyDeviceToHost);
    if (err != cudaSuccess) *status = Status::cuda_error(cudaGetErrorString(err));
  }
  for (void* d : owned) cudaFree(d);
  return result;
}

// The launchers set a kernel's shared-memory limit once per device and remember it; a device reset takes it with the
// context. The next launch must still work (the launcher sets it again), with the same result.
TEST(HostPathGpu, DenseDecodeLaunchesAgainAfterADeviceReset) {
  SKIP_WITHOUT_GPU();
  Status st;
  const std::vector<uint16_t> before = small_dense_decode(&st);
  ASSERT_TRUE(st.is_ok()) << st.message();
  const std::vector<uint16_t> again = small_dense_decode(&st);  // the limit is remembered: no attribute call
  ASSERT_TRUE(st.is_ok()) << st.message();
  EXPECT_EQ(before, again);
  ASSERT_EQ(cudaDeviceReset(), cudaSuccess);
  const std::vector<uint16_t> after = small_dense_decode(&st);
  ASSERT_TRUE(st.is_ok()) << st.message();
  EXPECT_EQ(before, after);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

}  // namespace
}  // namespace openmla
