#include "openmla/capability.h"

#include <cuda_runtime.h>

#include <string>

namespace openmla {

const char* feature_name(Feature feature) {
  switch (feature) {
    case Feature::kKVCacheQuantize: return "kv_cache_quantize";
    case Feature::kDenseDecode: return "dense_decode";
    case Feature::kSparseDecode: return "sparse_decode";
    case Feature::kSparsePrefill: return "sparse_prefill";
    case Feature::kDensePrefill: return "dense_prefill";
  }
  return "unknown";
}

namespace {

// Why a feature is unavailable in this build, or nullptr when it is compiled in.
const char* build_gap(Feature feature) {
  switch (feature) {
    case Feature::kKVCacheQuantize:
#ifdef OPENMLA_HAS_KV_CACHE
      return nullptr;
#else
      return "compiled out (OPENMLA_ENABLE_KV_CACHE=OFF)";
#endif
    case Feature::kDenseDecode:
    case Feature::kSparseDecode:
#ifdef OPENMLA_HAS_DENSE_DECODE
      return nullptr;
#else
      return "compiled out (OPENMLA_ENABLE_DENSE_DECODE=OFF)";
#endif
    case Feature::kSparsePrefill:
#ifdef OPENMLA_HAS_SPARSE_PREFILL
      return nullptr;
#else
      return "compiled out (OPENMLA_ENABLE_SPARSE_PREFILL=OFF)";
#endif
    case Feature::kDensePrefill:  // the forward pass; the backward is not implemented yet
#ifdef OPENMLA_HAS_MHA_PREFILL
      return nullptr;
#else
      return "compiled out (OPENMLA_ENABLE_MHA_PREFILL=OFF)";
#endif
  }
  return "unknown feature";
}

}  // namespace

Capability query_capability(Feature feature, int device_id) {
  Capability cap;
  if (const char* gap = build_gap(feature)) {
    cap.reason = std::string(feature_name(feature)) + ": " + gap;
    return cap;
  }
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    cap.reason = std::string(feature_name(feature)) + ": no CUDA device is visible (" +
                 (err == cudaSuccess ? std::string("0 devices") : std::string(cudaGetErrorString(err))) + ")";
    return cap;
  }
  if (device_id < 0 || device_id >= count) {
    cap.reason = std::string(feature_name(feature)) + ": device " + std::to_string(device_id) +
                 " does not exist (" + std::to_string(count) + " visible)";
    return cap;
  }
  int major = 0, minor = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device_id);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device_id);
  if (major != 9 || minor != 0) {
    cap.reason = std::string(feature_name(feature)) + ": needs a Hopper GPU (compute capability 9.0, sm_90a), device " +
                 std::to_string(device_id) + " is " + std::to_string(major) + "." + std::to_string(minor);
    return cap;
  }
  cap.supported = true;
  return cap;
}

const char* version_string() { return OPENMLA_VERSION; }
const char* build_commit() { return OPENMLA_GIT_COMMIT; }

}  // namespace openmla
