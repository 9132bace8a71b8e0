// Loading rows of one sequence of a packed varlen operand by TMA, through the ragged map of common/tensor_map.h
// (make_ragged_map): rows at or past the sequence's end are outside the map and arrive as zeros, so a neighbour's
// rows (NaN padding included) never reach shared memory. Device only; the layer: docs/architecture.md, "Device layer".
#pragma once

#include <cstdint>

#include "common/ptx.cuh"
#include "common/varlen.h"

namespace openmla::kernels {

// Issues the loads of rows [first, first + box rows) of a sequence whose rows are [begin, begin + len) of the tensor,
// `tiles` boxes of 64 columns each (tile g: columns 64 g ..) into dst[g], all completing on `bar` (the caller armed it
// with their bytes). Coordinates: (column, head, kMaxRows - len + first, begin + len, kMaxRows).
template <int kTileBytes>
__device__ __forceinline__ void load_ragged_rows(uint8_t (*dst)[kTileBytes], int tiles, const CUtensorMap* map,
                                                 uint64_t* bar, int head, int begin, int len, int first,
                                                 uint64_t policy) {
  constexpr int kTileCols = 64;
  const int window_row = static_cast<int>(varlen::kMaxRows) - len + first;
  const int window_end = begin + len;
  for (int g = 0; g < tiles; ++g)
    ptx::tma_load_5d(dst[g], map, bar, g * kTileCols, head, window_row, window_end, static_cast<int>(varlen::kMaxRows),
                     policy);
}

}  // namespace openmla::kernels
