// Question: what does each CUDA runtime / driver call of the per-call host path cost on this machine, and how
// much of one OpenMLA call is validation, launch set-up and the launches themselves?
//
// Build and run on the GPU machine (after tools/gpu_check.sh built build-gpu/, or any configured build folder):
//   cmake --build build-gpu --target openmla_host_costs && build-gpu/openmla_host_costs [--quick]
// (the target is EXCLUDE_FROM_ALL: nothing else builds it). Under 60 s; prints one table.
//
// Method. Every row times `kPerBatch` calls of one thing back to back with std::chrono::steady_clock and divides by
// the count; `batches` such batches give the median and the 10th / 90th percentile of the per-call time (ns).
// Three modes:
//   host   calls that never touch the GPU (queries, TMA encoding, the API's validation)
//   idle   launches into an idle GPU, synchronised after each batch
//   busy   launches queued behind a spin kernel that waits for the host (a flag in mapped host memory, with a
//          2-second safety timeout), as an engine enqueues while the GPU still runs the previous layer; this is
//          how benchmarks/bench_host_overhead.py measures (behind torch.cuda._sleep)
// The OpenMLA rows call the public C++ API with real device buffers (the problems of the host_overhead suite) and
// the internal validation entries (api/decode_internal.h), so the table splits one call into its parts.
#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "api/decode_internal.h"
#include "api/sparse_prefill_internal.h"
#include "api/validate.h"
#include "common/tensor_map.h"
#include "kernels/combine/params.h"
#include "kernels/dense_decode/params.h"
#include "kernels/sparse_decode/params.h"
#include "kernels/sparse_prefill/params.h"
#include "openmla/decode.h"
#include "openmla/kv_cache.h"
#include "openmla/prefill.h"

namespace {

using openmla::DType;
using openmla::KVCacheFormat;
using openmla::Status;
using openmla::TensorRef;

constexpr int kPerBatch = 32;  // calls per timed batch (launch rows: well under the driver's pending-launch limit)

// ---------------------------------------------------------------------------------------------------------------
// Kernels: nothing but their launch cost matters
// ---------------------------------------------------------------------------------------------------------------
__global__ void empty_kernel(int) {}

template <int kBytes>
struct Blob {
  unsigned char bytes[kBytes];
};
__global__ void blob_kernel(Blob<1024>) {}

// The parameter lists of OpenMLA's kernels, byte for byte (what a launch copies), with empty bodies.
__global__ void dense_like_kernel(openmla::kernels::DenseDecodeParams, const __grid_constant__ CUtensorMap,
                                  const __grid_constant__ CUtensorMap, const __grid_constant__ CUtensorMap) {}
__global__ void sparse_like_kernel(openmla::kernels::SparseDecodeParams) {}
__global__ void combine_like_kernel(openmla::kernels::CombineParams) {}
__global__ void prefill_like_kernel(openmla::kernels::SparsePrefillParams, const __grid_constant__ CUtensorMap) {}

__global__ void dynamic_smem_kernel(int flag) {
  extern __shared__ unsigned char smem[];
  if (flag == 12345) smem[threadIdx.x] = 1;  // never true: keeps the buffer
}

// Spins until the host sets *flag (mapped host memory) or `timeout_ns` pass (a measured call that synchronised by
// mistake would otherwise wait for ever).
__global__ void spin_kernel(volatile int* flag, unsigned long long timeout_ns) {
  unsigned long long start;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  while (*flag == 0) {
    unsigned long long now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    if (now - start > timeout_ns) break;
    __nanosleep(2000);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Timing
// ---------------------------------------------------------------------------------------------------------------
enum class Mode { kHost, kIdle, kBusy };

const char* mode_name(Mode m) { return m == Mode::kHost ? "host" : m == Mode::kIdle ? "idle" : "busy"; }

struct Row {
  std::string name;
  Mode mode;
  double median_ns, p10_ns, p90_ns;
  std::string note;
};

std::vector<Row> g_rows;
int g_batches = 200;
cudaStream_t g_stream = nullptr;  // the stream every launch row uses (spin kernel included)
volatile int* g_flag_host = nullptr;
int* g_flag_device = nullptr;
bool g_failed = false;

bool check(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return true;
  std::printf("FAILED: %s: %s\n", what, cudaGetErrorString(err));
  g_failed = true;
  return false;
}

bool check(const Status& st, const char* what) {
  if (st.is_ok()) return true;
  std::printf("FAILED: %s: %s\n", what, st.message().c_str());
  g_failed = true;
  return false;
}

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5));
  return v[i];
}

// Times `call` (one call per invocation) in `mode` and records a row. `after_batch` runs untimed after each batch
// (e.g. to drain what the calls left).
void measure(const std::string& name, Mode mode, const std::function<void()>& call, const std::string& note = "",
             int batches = -1) {
  if (batches < 0) batches = g_batches;
  for (int i = 0; i < kPerBatch; ++i) call();  // warm-up
  check(cudaDeviceSynchronize(), "warm-up synchronisation");
  std::vector<double> per_call;
  per_call.reserve(static_cast<size_t>(batches));
  for (int b = 0; b < batches; ++b) {
    if (mode == Mode::kBusy) {
      *g_flag_host = 0;
      spin_kernel<<<1, 1, 0, g_stream>>>(g_flag_device, 2'000'000'000ull);
    }
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kPerBatch; ++i) call();
    const auto t1 = std::chrono::steady_clock::now();
    per_call.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() / kPerBatch);
    if (mode == Mode::kBusy) *g_flag_host = 1;
    if (mode != Mode::kHost) check(cudaStreamSynchronize(g_stream), "batch synchronisation");
  }
  if (mode == Mode::kHost) check(cudaDeviceSynchronize(), "synchronisation");
  g_rows.push_back({name, mode, percentile(per_call, 0.5), percentile(per_call, 0.1), percentile(per_call, 0.9), note});
  const Row& r = g_rows.back();
  std::printf("  %-58s %-4s %9.0f %9.0f %9.0f  %s\n", r.name.c_str(), mode_name(r.mode), r.median_ns, r.p10_ns,
              r.p90_ns, r.note.c_str());
  std::fflush(stdout);
}

void section(const char* title) { std::printf("\n-- %s\n", title); }

// ---------------------------------------------------------------------------------------------------------------
// Device buffers
// ---------------------------------------------------------------------------------------------------------------
struct Buffer {
  void* ptr = nullptr;
  explicit Buffer(size_t bytes) {
    if (check(cudaMalloc(&ptr, bytes == 0 ? 16 : bytes), "cudaMalloc"))
      check(cudaMemset(ptr, 0, bytes == 0 ? 16 : bytes), "cudaMemset");
  }
  ~Buffer() { cudaFree(ptr); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
};

void upload_i32(void* dst, const std::vector<int32_t>& v) {
  check(cudaMemcpy(dst, v.data(), v.size() * sizeof(int32_t), cudaMemcpyHostToDevice), "cudaMemcpy");
}

TensorRef cuda_tensor(void* p, DType dt, std::initializer_list<int64_t> shape, int device) {
  return openmla::make_tensor(p, dt, shape, openmla::DeviceType::kCUDA, device);
}

TensorRef cuda_tensor(void* p, DType dt, std::initializer_list<int64_t> shape, std::initializer_list<int64_t> stride,
                      int device) {
  return openmla::make_tensor(p, dt, shape, stride, openmla::DeviceType::kCUDA, device);
}

// ---------------------------------------------------------------------------------------------------------------
// The rows
// ---------------------------------------------------------------------------------------------------------------
// The 5-D k_cache map of dense decode (kernels/dense_decode/launch_variant.cuh), on `base`.
openmla::detail::TensorMapSpec dense_k_map_spec(int64_t pages) {
  openmla::detail::TensorMapSpec spec{};
  spec.dtype = CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  spec.rank = 5;
  const uint64_t dims[5] = {64, 64, 9, 1, static_cast<uint64_t>(pages)};
  const uint64_t strides[4] = {576 * 2, 64 * 2, 576 * 2, 64 * 576 * 2};
  const uint32_t box[5] = {64, 64, 4, 1, 1};
  std::memcpy(spec.dims, dims, sizeof(dims));
  std::memcpy(spec.byte_strides, strides, sizeof(strides));
  std::memcpy(spec.box, box, sizeof(box));
  spec.swizzle = CU_TENSOR_MAP_SWIZZLE_128B;
  spec.l2_promotion = CU_TENSOR_MAP_L2_PROMOTION_L2_256B;
  return spec;
}

void runtime_rows(int device, void* some_device_memory) {
  section("CUDA runtime / driver calls (no GPU work)");
  cudaStream_t legacy = nullptr;
  measure("cudaGetDevice", Mode::kHost, [] {
    int d;
    cudaGetDevice(&d);
  });
  measure("cudaSetDevice (the current device)", Mode::kHost, [device] { cudaSetDevice(device); });
  measure("cudaPeekAtLastError", Mode::kHost, [] { (void)cudaPeekAtLastError(); });
  measure("cudaGetLastError", Mode::kHost, [] { (void)cudaGetLastError(); });
  measure("cudaDeviceGetAttribute(MultiProcessorCount)", Mode::kHost, [device] {
    int n;
    cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device);
  });
  measure("cudaStreamIsCapturing (legacy stream)", Mode::kHost, [legacy] {
    cudaStreamCaptureStatus s;
    cudaStreamIsCapturing(legacy, &s);
  });
  measure("cudaStreamIsCapturing (created stream)", Mode::kHost, [] {
    cudaStreamCaptureStatus s;
    cudaStreamIsCapturing(g_stream, &s);
  });
#if CUDART_VERSION >= 12080
  measure("cudaStreamGetDevice (legacy stream)", Mode::kHost, [legacy] {
    int d;
    cudaStreamGetDevice(legacy, &d);
  });
  measure("cudaStreamGetDevice (created stream)", Mode::kHost, [] {
    int d;
    cudaStreamGetDevice(g_stream, &d);
  });
#endif
  measure("cudaPointerGetAttributes (device memory)", Mode::kHost, [some_device_memory] {
    cudaPointerAttributes a;
    cudaPointerGetAttributes(&a, some_device_memory);
  });
  measure("cudaFuncSetAttribute(MaxDynamicSharedMemorySize, 200 KB)", Mode::kHost, [] {
    cudaFuncSetAttribute(dynamic_smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024);
  });
  measure("cudaFuncGetAttributes", Mode::kHost, [] {
    cudaFuncAttributes a;
    cudaFuncGetAttributes(&a, dynamic_smem_kernel);
  });

  void* encode_fn = nullptr;
  cudaDriverEntryPointQueryResult qres;
  check(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &encode_fn, 12000, cudaEnableDefault, &qres),
        "cuTensorMapEncodeTiled lookup");
  auto encode = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(encode_fn);
  const openmla::detail::TensorMapSpec spec = dense_k_map_spec(4096);
  if (encode != nullptr) {
    measure("cuTensorMapEncodeTiled (dense decode's 5-D k_cache map)", Mode::kHost, [&] {
      CUtensorMap map;
      uint32_t elem_strides[5] = {1, 1, 1, 1, 1};
      encode(&map, spec.dtype, spec.rank, some_device_memory, spec.dims, spec.byte_strides, spec.box, elem_strides,
             CU_TENSOR_MAP_INTERLEAVE_NONE, spec.swizzle, spec.l2_promotion, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    });
  }
  measure("detail::encode_tensor_map (the library's entry, same map)", Mode::kHost, [&] {
    CUtensorMap map;
    (void)openmla::detail::encode_tensor_map(&map, some_device_memory, spec, "host_costs");
  });
  void* ctx_fn = nullptr;
  check(cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", &ctx_fn, 12000, cudaEnableDefault, &qres),
        "cuCtxGetCurrent lookup");
  if (ctx_fn != nullptr) {
    auto get_ctx = reinterpret_cast<PFN_cuCtxGetCurrent_v4000>(ctx_fn);
    measure("cuCtxGetCurrent", Mode::kHost, [get_ctx] {
      CUcontext c;
      get_ctx(&c);
    });
  }
  cudaEvent_t event;
  check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate");
  measure("cudaEventRecord + cudaStreamWaitEvent (same stream)", Mode::kIdle, [event] {
    cudaEventRecord(event, g_stream);
    cudaStreamWaitEvent(g_stream, event, 0);
  });
  cudaEventDestroy(event);
}

void launch_rows() {
  section("kernel launches (empty kernels; the OpenMLA-like rows pass the real params structs)");
  std::printf("  params bytes: dense decode %zu (+ 3 x 128 B tensor maps), sparse decode %zu, combine %zu, "
              "sparse prefill %zu (+ 128 B map)\n",
              sizeof(openmla::kernels::DenseDecodeParams), sizeof(openmla::kernels::SparseDecodeParams),
              sizeof(openmla::kernels::CombineParams), sizeof(openmla::kernels::SparsePrefillParams));
  check(cudaFuncSetAttribute(dynamic_smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024),
        "cudaFuncSetAttribute");
  static openmla::kernels::DenseDecodeParams dense{};
  static openmla::kernels::SparseDecodeParams sparse{};
  static openmla::kernels::CombineParams combine{};
  static openmla::kernels::SparsePrefillParams prefill{};
  static CUtensorMap map{};
  static Blob<1024> blob{};
  for (Mode mode : {Mode::kIdle, Mode::kBusy}) {
    measure("<<<>>> empty kernel (4 B params)", mode, [] { empty_kernel<<<1, 32, 0, g_stream>>>(0); });
    measure("cudaLaunchKernel empty kernel (4 B params)", mode, [] {
      int arg = 0;
      void* args[] = {&arg};
      cudaLaunchKernel(reinterpret_cast<const void*>(empty_kernel), dim3(1), dim3(32), args, 0, g_stream);
    });
    measure("<<<>>> 1 KB params", mode, [] { blob_kernel<<<1, 32, 0, g_stream>>>(blob); });
    measure("<<<>>> dense decode's params + 3 tensor maps", mode,
            [] { dense_like_kernel<<<dim3(2, 1, 132), 384, 0, g_stream>>>(dense, map, map, map); });
    measure("<<<>>> 200 KB dynamic smem (attribute set before)", mode,
            [] { dynamic_smem_kernel<<<132, 384, 200 * 1024, g_stream>>>(0); });
    measure("cudaLaunchKernelEx sparse decode's params, cluster 2", mode, [] {
      cudaLaunchConfig_t config{};
      config.gridDim = dim3(2, 2, 66);
      config.blockDim = dim3(384);
      config.stream = g_stream;
      cudaLaunchAttribute attrs[1];
      attrs[0].id = cudaLaunchAttributeClusterDimension;
      attrs[0].val.clusterDim = {2, 1, 1};
      config.attrs = attrs;
      config.numAttrs = 1;
      cudaLaunchKernelEx(&config, sparse_like_kernel, sparse);
    });
    measure("cudaLaunchKernelEx combine's params, PDL", mode, [] {
      cudaLaunchConfig_t config{};
      config.gridDim = dim3(64, 16, 1);
      config.blockDim = dim3(256);
      config.stream = g_stream;
      cudaLaunchAttribute attrs[1];
      attrs[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      attrs[0].val.programmaticStreamSerializationAllowed = 1;
      config.attrs = attrs;
      config.numAttrs = 1;
      cudaLaunchKernelEx(&config, combine_like_kernel, combine);
    });
    measure("<<<>>> sparse prefill's params + 1 tensor map", mode,
            [] { prefill_like_kernel<<<132, 384, 0, g_stream>>>(prefill, map); });
  }
  // torch's default stream is the legacy one: do launches into it cost more?
  const cudaStream_t created = g_stream;
  g_stream = nullptr;
  measure("<<<>>> empty kernel, legacy default stream", Mode::kBusy, [] { empty_kernel<<<1, 32, 0, nullptr>>>(0); });
  measure("<<<>>> dense decode's params + 3 maps, legacy default stream", Mode::kBusy,
          [] { dense_like_kernel<<<dim3(2, 1, 132), 384, 0, nullptr>>>(dense, map, map, map); });
  g_stream = created;
}

// Does a launch cost more when many launches are already queued (the host_overhead suite queues 300 calls, 600+
// launches, behind its sleep)? Per-call ns of batch i of 32 launches, with i * 32 launches pending before it, over
// kSweepRepeats sweeps (median per depth).
void queue_depth_rows() {
  section("launch cost against the launches already queued behind the spin kernel (median of 7 sweeps)");
  constexpr int kBatches = 40, kSweepRepeats = 7;  // up to 1280 launches pending
  static openmla::kernels::DenseDecodeParams dense{};
  static CUtensorMap map{};
  for (int kind = 0; kind < 2; ++kind) {
    std::vector<std::vector<double>> per_depth(kBatches);
    for (int r = 0; r < kSweepRepeats; ++r) {
      *g_flag_host = 0;
      spin_kernel<<<1, 1, 0, g_stream>>>(g_flag_device, 2'000'000'000ull);
      for (int b = 0; b < kBatches; ++b) {
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < kPerBatch; ++i) {
          if (kind == 0)
            empty_kernel<<<1, 32, 0, g_stream>>>(0);
          else
            dense_like_kernel<<<dim3(2, 1, 132), 384, 0, g_stream>>>(dense, map, map, map);
        }
        const auto t1 = std::chrono::steady_clock::now();
        per_depth[b].push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() / kPerBatch);
      }
      *g_flag_host = 1;
      check(cudaStreamSynchronize(g_stream), "sweep synchronisation");
    }
    std::printf("  %s, per-call ns by launches already queued:\n   ",
                kind == 0 ? "<<<>>> empty kernel" : "<<<>>> dense decode's params + 3 maps");
    for (int b = 0; b < kBatches; b += 4) std::printf(" %5d:%6.0f", b * kPerBatch, percentile(per_depth[b], 0.5));
    std::printf("\n");
  }
}

// The API rows: the host_overhead suite's problems (dense: b 64, s_q 1, h_q 128, 4K-token cache, causal; sparse:
// V3.2 FP8 cache, b 64, s_q 2, h_q 128, topk 2048, attention sink; prefill: s_q 256, h_q 128, topk 2048, 16K kv rows;
// append: 64 tokens into a V3.2 cache).
void api_rows(int device, int num_sms) {
  using namespace openmla;
  section("OpenMLA C++ API (real buffers; busy: queued behind the spin kernel; num_sms given as the binding does)");
  // ---- dense decode
  const int64_t b = 64, s_k = 4096, pages = s_k / 64, h_q = 128;
  DenseDecodeProblem dp{.batch = b, .s_q = 1, .h_q = h_q, .h_kv = 1, .causal = true, .num_sms = num_sms};
  DecodeWorkspaceSizes dws;
  if (!check(get_decode_workspace_sizes(dp, &dws), "dense workspace sizes")) return;
  dp.max_blocks_per_seq = pages;
  Buffer q(b * h_q * 576 * 2), kv(b * pages * 64 * 576 * 2), bt(b * pages * 4), lens(b * 4);
  Buffer meta(dws.metadata_ints * 4), splits(dws.num_splits_ints * 4), counters(std::max<int64_t>(dws.merge_counter_ints, 1) * 4);
  Buffer po(dws.partial_o_bytes), pl(dws.partial_lse_bytes), out(b * h_q * 512 * 2), lse(b * h_q * 4);
  {
    std::vector<int32_t> table(static_cast<size_t>(b * pages)), lengths(static_cast<size_t>(b), static_cast<int32_t>(s_k));
    for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>(i);
    upload_i32(bt.ptr, table);
    upload_i32(lens.ptr, lengths);
  }
  DecodeSchedule sched{cuda_tensor(meta.ptr, DType::kInt32, {dws.num_sm_parts, kDecodeScheduleRecordInts}, device),
                       cuda_tensor(splits.ptr, DType::kInt32, {b + 1}, device),
                       cuda_tensor(counters.ptr, DType::kInt32, {std::max<int64_t>(dws.merge_counter_ints, 1)}, device)};
  const TensorRef lens_ref = cuda_tensor(lens.ptr, DType::kInt32, {b}, device);
  DenseDecodeArgs da{.q = cuda_tensor(q.ptr, DType::kBFloat16, {b, 1, h_q, 576}, device),
                     .k_cache = cuda_tensor(kv.ptr, DType::kBFloat16, {b * pages, 64, 1, 576}, device),
                     .block_table = cuda_tensor(bt.ptr, DType::kInt32, {b, pages}, device),
                     .cache_seqlens = lens_ref,
                     .schedule = sched,
                     .split = {cuda_tensor(po.ptr, DType::kFloat32, {dws.partial_rows, 512}, device),
                               cuda_tensor(pl.ptr, DType::kFloat32, {dws.partial_rows}, device)},
                     .out = cuda_tensor(out.ptr, DType::kBFloat16, {b, 1, h_q, 512}, device),
                     // flash_mla's lse: a transposed view of (b, s_q, h_q) storage
                     .lse = cuda_tensor(lse.ptr, DType::kFloat32, {b, h_q, 1}, {h_q, 1, h_q}, device)};
  if (!check(plan_decode(dp, lens_ref, sched, g_stream), "dense plan_decode")) return;
  if (!check(dense_decode(dp, da, g_stream), "dense_decode")) return;
  check(cudaStreamSynchronize(g_stream), "dense_decode run");
  measure("detail::validate_dense_decode", Mode::kHost, [&] {
    int parts;
    (void)detail::validate_dense_decode(dp, da, &parts);
  });
  measure("detail::validate_dense_decode + prepare_dense_decode", Mode::kHost, [&] {
    int parts = 0;
    (void)detail::validate_dense_decode(dp, da, &parts);
    (void)detail::prepare_dense_decode(dp, da, parts);
  });
  measure("detail::check_launch_context (created stream)", Mode::kHost,
          [&] { (void)detail::check_launch_context(device, "q", g_stream, "host_costs"); });
  measure("detail::check_launch_context (legacy stream)", Mode::kHost,
          [&] { (void)detail::check_launch_context(device, "q", nullptr, "host_costs"); });
  measure("dense_decode (whole call: 2 launches)", Mode::kBusy, [&] { (void)dense_decode(dp, da, g_stream); });
  {
    const cudaStream_t created = g_stream;
    g_stream = nullptr;  // the spin kernel and the synchronisation follow
    measure("dense_decode on the legacy default stream (torch's default)", Mode::kBusy,
            [&] { (void)dense_decode(dp, da, nullptr); });
    {
      detail::ScopedKnownStream known(nullptr, device);  // as the Python binding calls it
      measure("dense_decode, legacy stream vouched for (the binding's call)", Mode::kBusy,
              [&] { (void)dense_decode(dp, da, nullptr); });
    }
    g_stream = created;
  }
  measure("plan_decode (dense, first call of a step: 1 launch)", Mode::kBusy,
          [&] { (void)plan_decode(dp, lens_ref, sched, g_stream); });

  // ---- sparse decode
  const int64_t sb = 64, s_q = 2, topk = 2048, blocks = 1024;
  SparseDecodeProblem sp{.batch = sb, .s_q = s_q, .h_q = h_q, .topk = topk, .num_sms = num_sms};
  DecodeWorkspaceSizes sws;
  if (!check(get_decode_workspace_sizes(sp, &sws), "sparse workspace sizes")) return;
  Buffer sq(sb * s_q * h_q * 576 * 2), cache(blocks * 64 * 656), idx(sb * s_q * topk * 4), sink(h_q * 4);
  Buffer smeta(sws.metadata_ints * 4), ssplits(sws.num_splits_ints * 4);
  Buffer spo(sws.partial_o_bytes), spl(sws.partial_lse_bytes), sout(sb * s_q * h_q * 512 * 2), slse(sb * s_q * h_q * 4);
  DecodeSchedule ssched{cuda_tensor(smeta.ptr, DType::kInt32, {sws.num_sm_parts, kDecodeScheduleRecordInts}, device),
                        cuda_tensor(ssplits.ptr, DType::kInt32, {sb + 1}, device), TensorRef{}};
  SparseDecodeArgs sa{.q = cuda_tensor(sq.ptr, DType::kBFloat16, {sb, s_q, h_q, 576}, device),
                      .k_cache = cuda_tensor(cache.ptr, DType::kUInt8, {blocks, 64, 1, 656}, device),
                      .indices = cuda_tensor(idx.ptr, DType::kInt32, {sb, s_q, topk}, device),
                      .attn_sink = cuda_tensor(sink.ptr, DType::kFloat32, {h_q}, device),
                      .schedule = ssched,
                      .split = {cuda_tensor(spo.ptr, DType::kFloat32, {sws.partial_rows, 512}, device),
                                cuda_tensor(spl.ptr, DType::kFloat32, {sws.partial_rows}, device)},
                      .out = cuda_tensor(sout.ptr, DType::kBFloat16, {sb, s_q, h_q, 512}, device),
                      .lse = cuda_tensor(slse.ptr, DType::kFloat32, {sb, h_q, s_q}, {s_q * h_q, 1, h_q}, device)};
  if (!check(plan_decode(sp, TensorRef{}, TensorRef{}, ssched, g_stream), "sparse plan_decode")) return;
  if (!check(sparse_decode(sp, sa, g_stream), "sparse_decode")) return;
  check(cudaStreamSynchronize(g_stream), "sparse_decode run");
  measure("detail::validate_sparse_decode", Mode::kHost, [&] {
    int parts;
    (void)detail::validate_sparse_decode(sp, sa, &parts);
  });
  measure("detail::validate_sparse_decode + prepare_sparse_decode", Mode::kHost, [&] {
    int parts = 0;
    (void)detail::validate_sparse_decode(sp, sa, &parts);
    (void)detail::prepare_sparse_decode(sp, sa, parts);
  });
  measure("sparse_decode (whole call: 2 launches)", Mode::kBusy, [&] { (void)sparse_decode(sp, sa, g_stream); });

  // ---- sparse prefill
  const int64_t ps_q = 256, s_kv = 16384, ptopk = 2048;
  Buffer pq(ps_q * h_q * 576 * 2), pkv(s_kv * 576 * 2), pidx(ps_q * ptopk * 4), pout(ps_q * h_q * 512 * 2),
      pmax(ps_q * h_q * 4), plse(ps_q * h_q * 4);
  SparsePrefillArgs pa{.q = cuda_tensor(pq.ptr, DType::kBFloat16, {ps_q, h_q, 576}, device),
                       .kv = cuda_tensor(pkv.ptr, DType::kBFloat16, {s_kv, 1, 576}, device),
                       .indices = cuda_tensor(pidx.ptr, DType::kInt32, {ps_q, 1, ptopk}, device),
                       .softmax_scale = 0.0416667f,
                       .out = cuda_tensor(pout.ptr, DType::kBFloat16, {ps_q, h_q, 512}, device),
                       .max_logits = cuda_tensor(pmax.ptr, DType::kFloat32, {ps_q, h_q}, device),
                       .lse = cuda_tensor(plse.ptr, DType::kFloat32, {ps_q, h_q}, device),
                       .num_sms = num_sms};
  if (check(sparse_prefill(pa, g_stream), "sparse_prefill")) {
    check(cudaStreamSynchronize(g_stream), "sparse_prefill run");
    measure("detail::validate_sparse_prefill", Mode::kHost, [&] {
      kernels::SparsePrefillParams params;
      (void)detail::validate_sparse_prefill(pa, &params);
    });
    measure("sparse_prefill (whole call: 1 launch)", Mode::kBusy, [&] { (void)sparse_prefill(pa, g_stream); });
    SparsePrefillArgs pa0 = pa;
    pa0.num_sms = 0;
    measure("sparse_prefill, num_sms = 0 (queries the SM count)", Mode::kBusy,
            [&] { (void)sparse_prefill(pa0, g_stream); });
  }

  // ---- append_kv_cache
  const int64_t n = 64;
  Buffer nkv(n * 576 * 2), slots(n * 8);
  {
    std::vector<int32_t> s(static_cast<size_t>(2 * n), 0);  // int64 slots 0..n-1 (little endian)
    for (int64_t i = 0; i < n; ++i) s[static_cast<size_t>(2 * i)] = static_cast<int32_t>(i);
    upload_i32(slots.ptr, s);
  }
  const TensorRef new_ref = cuda_tensor(nkv.ptr, DType::kBFloat16, {n, 576}, device);
  const TensorRef slots_ref = cuda_tensor(slots.ptr, DType::kInt64, {n}, device);
  const TensorRef cache_ref = cuda_tensor(cache.ptr, DType::kUInt8, {blocks, 64, 1, 656}, device);
  if (check(append_kv_cache(new_ref, slots_ref, cache_ref, KVCacheFormat::kFp8V32, g_stream), "append_kv_cache"))
    measure("append_kv_cache (whole call: 1 launch)", Mode::kBusy,
            [&] { (void)append_kv_cache(new_ref, slots_ref, cache_ref, KVCacheFormat::kFp8V32, g_stream); });
  check(cudaStreamSynchronize(g_stream), "API rows");
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      g_batches = 40;
    } else {
      std::printf("usage: %s [--quick]\n", argv[0]);
      return 2;
    }
  }
  int device = 0, num_sms = 0;
  if (!check(cudaGetDevice(&device), "cudaGetDevice") || !check(cudaFree(nullptr), "context creation")) return 1;
  cudaDeviceProp prop;
  check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  num_sms = prop.multiProcessorCount;
  int runtime = 0, driver = 0;
  cudaRuntimeGetVersion(&runtime);
  cudaDriverGetVersion(&driver);
  std::printf("host_costs: %s (%d SMs), CUDA runtime %d, driver %d; %d batches of %d calls per row\n", prop.name,
              num_sms, runtime, driver, g_batches, kPerBatch);
  std::printf("  %-58s %-4s %9s %9s %9s\n", "what (per call)", "mode", "median_ns", "p10_ns", "p90_ns");
  const auto t0 = std::chrono::steady_clock::now();
  check(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking), "cudaStreamCreate");
  int* flag = nullptr;
  check(cudaHostAlloc(&flag, sizeof(int), cudaHostAllocMapped), "cudaHostAlloc");
  g_flag_host = flag;
  check(cudaHostGetDevicePointer(&g_flag_device, flag, 0), "cudaHostGetDevicePointer");
  {
    Buffer scratch(1 << 20);
    runtime_rows(device, scratch.ptr);
  }
  launch_rows();
  queue_depth_rows();
  api_rows(device, num_sms);
  check(cudaStreamSynchronize(g_stream), "final synchronisation");
  cudaFreeHost(flag);
  cudaStreamDestroy(g_stream);
  std::printf("\nhost_costs: %zu rows in %.1f s%s\n", g_rows.size(),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
              g_failed ? " (SOME STEPS FAILED: see above)" : "");
  return g_failed ? 1 : 0;
}
