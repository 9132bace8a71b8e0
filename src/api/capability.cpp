#include "openmla/capability.h"

#include <cuda_runtime.h>

#include <string>

#include "api/families.h"

namespace openmla {

const char* feature_name(Feature feature) {
  switch (feature) {
    case Feature::kKVCacheQuantize: return "kv_cache_quantize";
    case Feature::kDenseDecode: return "dense_decode";
    case Feature::kSparseDecode: return "sparse_decode";
    case Feature::kSparsePrefill: return "sparse_prefill";
    case Feature::kDensePrefill: return "dense_prefill";
    case Feature::kMergeStates: return "merge_attn_states";
    case Feature::kDecodeBatchInvariant: return "decode_batch_invariant";
    case Feature::kDenseDecodeFp8: return "dense_decode_fp8";
    case Feature::kDensePrefillFp8: return "dense_prefill_fp8";
    case Feature::kDenseDecodeAnyPageSize: return "dense_decode_any_page_size";
    case Feature::kDecodeVarlenQ: return "decode_varlen_q";
    case Feature::kSparsePrefillFp8: return "sparse_prefill_fp8";
  }
  return "unknown";
}

Capability query_capability(Feature feature, int device_id) {
  Capability cap;
  // The family first: an entry point of a family this build left out answers "not built" (api/families.h) whatever
  // the device.
  if (const detail::KernelFamily family = detail::family_of(feature); !detail::family_built(family)) {
    cap.reason = std::string(feature_name(feature)) + ": compiled out (" + detail::family_option(family) + "=OFF)";
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
