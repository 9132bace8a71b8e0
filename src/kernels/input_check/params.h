// Checked mode (include/openmla/checked.h): the device-side checks of the inputs an entry cannot see from the host
// (block-table entries, lengths, indices, slots, the sink, the schedule), and the record of the first violation.
// Plain data, built by src/api/checked.cpp for each entry; the check kernel is kernel.cuh.
#pragma once

#include <cstdint>

#include "kernels/decode_scheduler/schedule_record.h"

namespace openmla::kernels {

// Which entry a violation was found in (the message names it).
enum class CheckedEntry : int32_t {
  kNone = 0,
  kPlanDecode = 1,
  kDenseDecode = 2,
  kSparseDecode = 3,
  kAppendKVCache = 4,
  kSparsePrefill = 5,
};

// Which argument broke its contract.
enum class CheckedArgument : int32_t {
  kNone = 0,
  kCacheSeqlens = 1,
  kBlockTable = 2,
  kIndices = 3,
  kTopkLength = 4,
  kAttnSink = 5,
  kExtraIndices = 6,
  kExtraTopkLength = 7,
  kSlots = 8,
  kSchedule = 9,
  kSequsedQ = 10,  // per-request query lengths (DenseDecodeProblem::varlen_q / SparseDecodeProblem::varlen_q)
};

// What one check verifies. The elements of a check are numbered 0 .. count - 1 (check_element_count); a violation is
// named by its element's coordinates.
enum class CheckKind : int32_t {
  // `rows` int32 values in [0, bound] (lengths: cache_seqlens, topk_length, extra_topk_length).
  kLengths = 0,
  // (rows, cols) int32, row stride `row_stride`: for row i, the entries [0, ceil(L_i / depth)) with
  // L_i = lengths[i] clamped to [0, lengths_cap] lie in [0, bound) (block-table pages a request uses; depth = the
  // page size).
  kBlockTable = 1,
  // (rows, cols, depth) int32, strides row_stride, col_stride, last dim contiguous: for (i, j), the slots
  // [0, L_i) with L_i = lengths[i] clamped to [0, depth] (depth when lengths is null) hold -1 or lie in [0, bound).
  kIndices = 2,
  // `rows` float32 values, none NaN (+-inf allowed).
  kNotNaN = 3,
  // `rows` int32 (or int64 when `wide`) slots, each < bound (negative values skip a row: allowed).
  kSlots = 4,
  // A decode schedule (rows = num_sm_parts records at `data`, num_splits at `num_splits`, cols = batch) matches the
  // call's work model: every record inside the batch and ending each request where its length ends, the split
  // prefix sums increasing by at least one per request and within `bound` (b + num_sm_parts) slots.
  kSchedule = 5,
};

struct InputCheck {
  CheckKind kind = CheckKind::kLengths;
  CheckedArgument argument = CheckedArgument::kNone;
  const void* data = nullptr;
  int64_t rows = 0, cols = 0, depth = 0;   // extents (see CheckKind)
  int64_t row_stride = 0, col_stride = 0;  // elements
  int64_t bound = 0;                       // see CheckKind
  const int32_t* lengths = nullptr;        // kBlockTable: cache_seqlens; kIndices: per-row lengths (may be null)
  int64_t lengths_cap = 0;                 // kBlockTable: the block table's capacity in tokens
  bool wide = false;                       // kSlots: int64 values
  // kSchedule: the call's work model (schedule_record.h: dense_request_blocks_signed, sparse_request_blocks_of).
  const int32_t* num_splits = nullptr;
  bool sparse = false;
  int32_t max_seqlen = 0;                // dense: lengths in `lengths`, clamped to max_seqlen (0: no limit)
  int64_t topk = 0, extra_topk = 0;      // sparse
  const int32_t* topk_length = nullptr;  // sparse, may be null
  const int32_t* extra_topk_length = nullptr;
};

inline constexpr int kMaxInputChecks = 8;

struct InputCheckParams {
  CheckedEntry entry = CheckedEntry::kNone;
  uint64_t epoch = 0;  // the call's number (per process): the record keeps the violation of the earliest call
  int num_checks = 0;
  InputCheck checks[kMaxInputChecks] = {};
};

// The first violation found on a device (one per device: a __device__ variable of the check kernel's unit). `found`
// 0: none. Among the violations of one call the first check (argument order) and, inside it, the lowest element
// wins; among calls, the one with the lowest epoch.
struct InputCheckRecord {
  int32_t lock;
  int32_t found;
  uint64_t epoch;
  CheckedEntry entry;
  CheckedArgument argument;
  CheckKind kind;
  int32_t check;      // index of the check in its call
  int64_t element;    // element number inside the check
  int64_t coords[3];  // the element's coordinates (kSchedule: partition or -1, request, what; see detail)
  int64_t value;      // the offending value (kNotNaN: the float's bits)
  int64_t bound;      // the limit it broke
  int32_t detail;     // kSchedule: which rule (ScheduleRule)
  int32_t pad;
};

// The rules of a schedule check (InputCheckRecord::detail).
enum class ScheduleRule : int32_t {
  kRecordRange = 0,  // a record's requests outside [0, batch) or begin > end
  kEndBlock = 1,     // a record ends its last request elsewhere than the request's length ends
  kBeginBlock = 2,   // a record starts a request past its length
  kSplitCount = 3,   // num_splits not increasing by >= 1 per request, or past the split buffers
};

// Elements of one check: what its grid-stride loop walks.
OPENMLA_HOST_DEVICE int64_t check_element_count(const InputCheck& c) {
  switch (c.kind) {
    case CheckKind::kBlockTable: return c.rows * c.cols;
    case CheckKind::kIndices: return c.rows * c.cols * c.depth;
    case CheckKind::kSchedule: return c.rows + c.cols + 1;
    default: return c.rows;
  }
}

}  // namespace openmla::kernels
