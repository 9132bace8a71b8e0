#include "common/tensor_map.h"

#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <mutex>
#include <string>

namespace openmla::detail {

namespace {

PFN_cuTensorMapEncodeTiled_v12000 lookup_encode_tiled(cudaError_t* err_out, cudaDriverEntryPointQueryResult* qres) {
  void* fn = nullptr;
  *err_out = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, qres);
  return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
}

}  // namespace

Status encode_tensor_map(CUtensorMap* map, const void* base, const TensorMapSpec& spec, const char* what) {
  static std::once_flag once;
  static PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
  static cudaError_t lookup_err = cudaSuccess;
  static cudaDriverEntryPointQueryResult qres = cudaDriverEntryPointSuccess;
  std::call_once(once, [] { encode = lookup_encode_tiled(&lookup_err, &qres); });
  if (lookup_err != cudaSuccess || encode == nullptr || qres != cudaDriverEntryPointSuccess)
    return Status::cuda_error(std::string(what) + ": cannot find cuTensorMapEncodeTiled in the CUDA driver (" +
                              cudaGetErrorString(lookup_err) + ")");
  uint32_t elem_strides[5] = {1, 1, 1, 1, 1};
  CUresult r = encode(map, spec.dtype, static_cast<cuuint32_t>(spec.rank), const_cast<void*>(base), spec.dims,
                      spec.byte_strides, spec.box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, spec.swizzle,
                      spec.l2_promotion, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    return Status::internal(std::string(what) + ": cuTensorMapEncodeTiled failed with CUresult " + std::to_string(r));
  return Status::ok();
}

}  // namespace openmla::detail
