// Checked mode's rules (params.h, CheckKind): whether one element of one check breaks its contract. Host and device
// code: the check kernel (kernel.cuh) runs them on the GPU, the C++ tests run the same code on host arrays.
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/input_check/params.h"

namespace openmla::kernels::input_check {

struct Violation {
  int64_t coords[3];
  int64_t value;
  int64_t bound;
  int32_t detail;
};

OPENMLA_HOST_DEVICE int64_t clamp64(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : (v > hi ? hi : v); }

// The call's work (blocks) of request r, as the scheduler budgets it and the kernels run it; negative: empty.
OPENMLA_HOST_DEVICE int32_t request_blocks(const InputCheck& c, int64_t r) {
  if (!c.sparse) return dense_request_blocks_signed(c.lengths[r], c.max_seqlen);
  return sparse_request_blocks_of(c.topk, c.topk_length != nullptr ? c.topk_length + r : nullptr, c.extra_topk,
                                  c.extra_topk_length != nullptr ? c.extra_topk_length + r : nullptr);
}

OPENMLA_HOST_DEVICE bool set(Violation* v, int64_t c0, int64_t c1, int64_t c2, int64_t value, int64_t bound,
                             ScheduleRule rule = ScheduleRule::kRecordRange) {
  v->coords[0] = c0;
  v->coords[1] = c1;
  v->coords[2] = c2;
  v->value = value;
  v->bound = bound;
  v->detail = static_cast<int32_t>(rule);
  return true;
}

// One schedule record against the call's work model (ScheduleRule).
OPENMLA_HOST_DEVICE bool record_violates(const InputCheck& c, int64_t part, Violation* v) {
  const DecodeScheduleRecord r = static_cast<const DecodeScheduleRecord*>(c.data)[part];
  const int64_t batch = c.cols;
  if (r.begin_req == batch) return false;  // idle
  if (r.begin_req < 0 || r.begin_req > batch || r.end_req < r.begin_req || r.end_req >= batch)
    return set(v, part, r.begin_req, r.end_req, r.begin_req < 0 || r.begin_req > batch ? r.begin_req : r.end_req,
               batch);
  const int32_t begin_n = request_blocks(c, r.begin_req);
  if (r.begin_block < 0 || (r.begin_block > 0 && r.begin_block >= (begin_n < 0 ? -begin_n : begin_n)))
    return set(v, part, r.begin_req, 0, r.begin_block, begin_n < 0 ? -begin_n : begin_n, ScheduleRule::kBeginBlock);
  const int32_t n = request_blocks(c, r.end_req);
  const int32_t blocks = n < 0 ? -n : n, end = n < 0 ? 0 : n;  // an empty request's record ends at block 0
  const bool split =
      r.begin_req == r.end_req ? (r.is_first_req_split != 0 || r.is_last_req_split != 0) : r.is_last_req_split != 0;
  const bool partial_end = r.begin_req == r.end_req ? split && r.end_block < end : split;
  const bool ok = partial_end ? (r.end_block > (r.begin_req == r.end_req ? r.begin_block : 0) && r.end_block < blocks)
                              : r.end_block == end;
  if (!ok) return set(v, part, r.end_req, 0, r.end_block, end, ScheduleRule::kEndBlock);
  return false;
}

// Element `e` of check `c`: true (and *v filled) when it breaks the check's rule (CheckKind).
OPENMLA_HOST_DEVICE bool element_violates(const InputCheck& c, int64_t e, Violation* v) {
  switch (c.kind) {
    case CheckKind::kLengths: {
      const int32_t x = static_cast<const int32_t*>(c.data)[e];
      return (x < 0 || x > c.bound) && set(v, e, 0, 0, x, c.bound);
    }
    case CheckKind::kBlockTable: {
      const int64_t i = e / c.cols, j = e - i * c.cols;
      const int64_t len = clamp64(c.lengths[i], 0, c.lengths_cap);
      if (j >= (len + c.depth - 1) / c.depth) return false;  // a page the request never reads (depth: page size)
      const int32_t x = static_cast<const int32_t*>(c.data)[i * c.row_stride + j];
      return (x < 0 || x >= c.bound) && set(v, i, j, 0, x, c.bound);
    }
    case CheckKind::kIndices: {
      const int64_t per_row = c.cols * c.depth;
      const int64_t i = e / per_row, rem = e - i * per_row, j = rem / c.depth, k = rem - j * c.depth;
      const int64_t len = c.lengths != nullptr ? clamp64(c.lengths[i], 0, c.depth) : c.depth;
      if (k >= len) return false;  // a slot past the row's length is never read
      const int32_t x = static_cast<const int32_t*>(c.data)[i * c.row_stride + j * c.col_stride + k];
      return x != -1 && (x < 0 || x >= c.bound) && set(v, i, j, k, x, c.bound);
    }
    case CheckKind::kNotNaN: {
      const float x = static_cast<const float*>(c.data)[e];
      uint32_t bits = 0;
      memcpy(&bits, &x, sizeof(bits));
      return x != x && set(v, e, 0, 0, static_cast<int64_t>(bits), 0);
    }
    case CheckKind::kSlots: {
      const int64_t x = c.wide ? static_cast<const int64_t*>(c.data)[e] : static_cast<const int32_t*>(c.data)[e];
      return x >= c.bound && set(v, e, 0, 0, x, c.bound);
    }
    case CheckKind::kSchedule: {
      if (e < c.rows) return record_violates(c, e, v);
      const int64_t i = e - c.rows;  // num_splits[i], i in [0, batch]
      const int32_t x = c.num_splits[i];
      if (i == 0) return x != 0 && set(v, -1, 0, 0, x, 0, ScheduleRule::kSplitCount);
      const int32_t prev = c.num_splits[i - 1];
      if (x < prev + 1) return set(v, -1, i - 1, 0, x - prev, 1, ScheduleRule::kSplitCount);
      return x > c.bound && set(v, -1, i - 1, 1, x, c.bound, ScheduleRule::kSplitCount);
    }
  }
  return false;
}

// What the check kernel records for one call whose inputs are host arrays (tests): the first check with a violation
// and its lowest element. False when nothing breaks a rule.
inline bool first_violation(const InputCheckParams& p, int* check, int64_t* element, Violation* v) {
  for (int c = 0; c < p.num_checks; ++c) {
    const int64_t count = check_element_count(p.checks[c]);
    for (int64_t e = 0; e < count; ++e) {
      if (element_violates(p.checks[c], e, v)) {
        *check = c;
        *element = e;
        return true;
      }
    }
  }
  return false;
}

}  // namespace openmla::kernels::input_check
