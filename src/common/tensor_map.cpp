#include "common/tensor_map.h"

#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <cstring>
#include <memory>
#include <mutex>
#include <string>

#include "common/varlen.h"

namespace openmla::detail {

namespace {

PFN_cuTensorMapEncodeTiled_v12000 lookup_encode_tiled(cudaError_t* err_out, cudaDriverEntryPointQueryResult* qres) {
  void* fn = nullptr;
  *err_out = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, qres);
  return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
}

// ---- The descriptors encoded last, per host thread ------------------------------------------------------------
// A descriptor is a pure function of its base address and spec (no device or context goes into it), and an engine
// passes the same caches (one per layer) and often the same q address every step, so most calls ask for a
// descriptor they asked for before. A direct-mapped table per thread answers those without the driver (thread-
// local: no lock, nothing shared); a miss encodes and replaces the entry.
constexpr int kKeyWords = 15;  // base, packed flags, 5 dims, 4 strides, 3 words of box
constexpr int kEntries = 128;  // two maps per layer of a 61-layer model fit

struct Key {
  uint64_t words[kKeyWords];
};

Key key_of(const void* base, const TensorMapSpec& s) {
  Key k{};
  k.words[0] = reinterpret_cast<uintptr_t>(base);
  k.words[1] = static_cast<uint64_t>(s.dtype) | static_cast<uint64_t>(static_cast<uint32_t>(s.rank)) << 16 |
               static_cast<uint64_t>(s.swizzle) << 32 | static_cast<uint64_t>(s.l2_promotion) << 48;
  for (int i = 0; i < 5; ++i) k.words[2 + i] = s.dims[i];
  for (int i = 0; i < 4; ++i) k.words[7 + i] = s.byte_strides[i];
  k.words[11] = static_cast<uint64_t>(s.box[0]) | static_cast<uint64_t>(s.box[1]) << 32;
  k.words[12] = static_cast<uint64_t>(s.box[2]) | static_cast<uint64_t>(s.box[3]) << 32;
  k.words[13] = s.box[4];
  k.words[14] = 0;
  return k;
}

uint32_t slot_of(const Key& k) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a over the words
  for (uint64_t w : k.words) h = (h ^ w) * 0x100000001b3ull;
  return static_cast<uint32_t>((h ^ (h >> 29)) % kEntries);
}

struct Entry {
  CUtensorMap map;
  Key key;
  bool valid;
};

struct Table {
  Entry entries[kEntries];
};

// Allocated on a thread's first encode (32 KB), so threads that never launch a TMA kernel carry none of it.
Entry& entry_for(const Key& key) {
  thread_local std::unique_ptr<Table> table;
  if (!table) table = std::make_unique<Table>();
  return table->entries[slot_of(key)];
}

}  // namespace

Status encode_tensor_map(CUtensorMap* map, const void* base, const TensorMapSpec& spec, const char* what) {
  const Key key = key_of(base, spec);
  Entry& entry = entry_for(key);
  if (entry.valid && std::memcmp(&entry.key, &key, sizeof(Key)) == 0) {
    *map = entry.map;
    return Status::ok();
  }
  static std::once_flag once;
  static PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
  static cudaError_t lookup_err = cudaSuccess;
  static cudaDriverEntryPointQueryResult qres = cudaDriverEntryPointSuccess;
  std::call_once(once, [] { encode = lookup_encode_tiled(&lookup_err, &qres); });
  if (lookup_err != cudaSuccess || encode == nullptr || qres != cudaDriverEntryPointSuccess)
    return Status::cuda_error(std::string(what) + ": cannot find cuTensorMapEncodeTiled in the CUDA driver (" +
                              cudaGetErrorString(lookup_err) + ")");
  uint32_t elem_strides[5] = {1, 1, 1, 1, 1};
  auto encode_once = [&] {
    return encode(map, spec.dtype, static_cast<cuuint32_t>(spec.rank), const_cast<void*>(base), spec.dims,
                  spec.byte_strides, spec.box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, spec.swizzle,
                  spec.l2_promotion, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  };
  CUresult r = encode_once();
  if (r == CUDA_ERROR_INVALID_CONTEXT) {
    // A host thread that has made no CUDA runtime call yet has no current context: make the current device's primary
    // context current (what the runtime does on a thread's first launch) and encode again.
    int device = 0;
    if (cudaGetDevice(&device) == cudaSuccess && cudaSetDevice(device) == cudaSuccess) r = encode_once();
  }
  if (r != CUDA_SUCCESS)
    return Status::internal(std::string(what) + ": cuTensorMapEncodeTiled failed with CUresult " + std::to_string(r));
  entry.map = *map;
  entry.key = key;
  entry.valid = true;
  return Status::ok();
}

// ---- Ragged maps (varlen kernels) ----------------------------------------------------------------------------
// Sequences are packed along the token dimension, and a box of rows starting inside one sequence would run into the
// next (or past the tensor). The map therefore addresses rows through a window that ends where the sequence ends:
//
//   dims (innermost first): column (cols), head (heads), window row r (kMaxRows), window end w, shift u
//   byte strides:                         stride_h,      stride_t,             stride_t,     2^34 - stride_t
//
// Loading rows [first, first + box_rows) of a sequence occupying rows [begin, begin + len) uses r = kMaxRows - len + first,
// w = begin + len, u = kMaxRows. The address is base + (r + w) stride_t + u (2^34 - stride_t) = base + (r + w -
// kMaxRows) stride_t (mod 2^64, as the TMA unit computes addresses: kMaxRows = 2^30, so u (2^34 - stride_t) =
// 2^64 - 2^30 stride_t) = base + (begin + first) stride_t: the rows wanted. A row at or past the sequence's end has
// r >= kMaxRows, outside dimension 2, and the TMA unit writes zeros for it without reading memory. Every coordinate
// is below 2^31 because sequences and tensors have at most kMaxRows rows (checked by the API).
Status make_ragged_map(const RaggedOperand& op, CUtensorMap* map, const char* what) {
  using kernels::varlen::kMaxRows;
  constexpr uint64_t kFar = 0x7fff0000u;  // extent of the w and u dimensions: beyond any coordinate they take
  const uint64_t elem_bytes = op.e4m3 ? 1 : 2;
  const uint64_t row_bytes = static_cast<uint64_t>(op.stride_t) * elem_bytes;
  TensorMapSpec spec{};
  spec.dtype = op.e4m3 ? CU_TENSOR_MAP_DATA_TYPE_UINT8
                       : (op.fp16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16);
  spec.rank = 5;
  spec.dims[0] = static_cast<uint64_t>(op.cols);
  spec.dims[1] = static_cast<uint64_t>(op.heads);
  spec.dims[2] = static_cast<uint64_t>(kMaxRows);
  spec.dims[3] = kFar;
  spec.dims[4] = kFar;
  spec.byte_strides[0] = static_cast<uint64_t>(op.stride_h) * elem_bytes;
  spec.byte_strides[1] = row_bytes;
  spec.byte_strides[2] = row_bytes;
  spec.byte_strides[3] = (uint64_t{1} << 34) - row_bytes;
  spec.box[0] = op.e4m3 ? 128 : 64;  // 128 bytes either way
  spec.box[1] = 1;
  spec.box[2] = static_cast<uint32_t>(op.box_rows);
  spec.box[3] = 1;
  spec.box[4] = 1;
  spec.swizzle = CU_TENSOR_MAP_SWIZZLE_128B;
  spec.l2_promotion = CU_TENSOR_MAP_L2_PROMOTION_L2_256B;
  return encode_tensor_map(map, op.base, spec, what);
}

}  // namespace openmla::detail
