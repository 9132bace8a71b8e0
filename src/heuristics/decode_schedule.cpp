#include "heuristics/decode_schedule.h"

#include <algorithm>

namespace openmla::heuristics {

using kernels::DecodeScheduleRecord;
using kernels::kDecodeBlockTokens;
using kernels::kDecodeRequestOverheadBlocks;

namespace {
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int clamp_parts(int64_t parts) {
  return static_cast<int>(std::clamp<int64_t>(parts, 1, kMaxDecodeSmParts));
}
}  // namespace

int dense_num_sm_parts(int64_t s_q, int64_t h_q, int64_t h_kv, int num_sms) {
  if (num_sms <= 0 || s_q <= 0 || h_q <= 0 || h_kv <= 0) return 1;
  const int64_t m_blocks = ceil_div(s_q * (h_q / h_kv), 64);  // 64 packed rows per CTA
  return clamp_parts(static_cast<int64_t>(num_sms) / h_kv / std::max<int64_t>(m_blocks, 1));
}

int sparse_num_sm_parts(int64_t s_q, int64_t h_q, int num_sms) {
  if (num_sms <= 0 || s_q <= 0 || h_q <= 0) return 1;
  return clamp_parts(static_cast<int64_t>(num_sms) / s_q / ceil_div(h_q, 64));
}

int decode_num_sm_parts(const DecodeProblem& problem, int num_sms) {
  return problem.sparse ? sparse_num_sm_parts(problem.s_q, problem.h_q, num_sms)
                        : dense_num_sm_parts(problem.s_q, problem.h_q, problem.h_kv, num_sms);
}

int64_t decode_merge_counter_count(const DecodeProblem& problem) {
  constexpr int64_t kTileRows = 64;
  if (problem.sparse) return problem.batch * problem.s_q * ceil_div(problem.h_q, kTileRows);
  const int64_t h_kv = std::max<int64_t>(problem.h_kv, 1);
  return problem.batch * h_kv * ceil_div(problem.s_q * (problem.h_q / h_kv), kTileRows);
}

int32_t dense_request_blocks(int32_t seqlen) {
  if (seqlen <= 0) return 1;
  return static_cast<int32_t>(ceil_div(seqlen, kDecodeBlockTokens));
}

int32_t sparse_request_blocks(int64_t topk, const int32_t* topk_length, int64_t extra_topk,
                              const int32_t* extra_topk_length) {
  int64_t t = topk_length ? std::clamp<int64_t>(*topk_length, 0, topk) : topk;
  t = std::max<int64_t>(t, 1);
  if (extra_topk > 0) {
    const int64_t extra = extra_topk_length ? std::clamp<int64_t>(*extra_topk_length, 0, extra_topk) : extra_topk;
    t = ceil_div(t, kDecodeBlockTokens) * kDecodeBlockTokens + extra;
  }
  return static_cast<int32_t>(ceil_div(t, kDecodeBlockTokens));
}

bool sparse_use_crossover(int num_head_blocks, int64_t partition_blocks) {
  const bool few_blocks = partition_blocks > 0 && partition_blocks <= kSparsePlainMaxBlocks;
  return num_head_blocks % 2 == 0 && !few_blocks;
}

int64_t decode_total_work(const std::vector<int32_t>& blocks) {
  int64_t total = 0;
  for (int32_t n : blocks) total += static_cast<int64_t>(n) + kDecodeRequestOverheadBlocks;
  return total;
}

int64_t decode_payload(int64_t total_work, int num_sm_parts) {
  return ceil_div(total_work, num_sm_parts) + kDecodeRequestOverheadBlocks;
}

// The partition-major form of the greedy pass (the GPU walks it request-major; both must agree).
DecodeScheduleHost build_decode_schedule(const std::vector<int32_t>& blocks, const std::vector<bool>& empty,
                                         int num_sm_parts, int64_t payload_override) {
  constexpr int64_t kOverhead = kDecodeRequestOverheadBlocks;
  const int32_t batch = static_cast<int32_t>(blocks.size());
  DecodeScheduleHost out;
  out.records.assign(num_sm_parts, DecodeScheduleRecord{});
  out.num_splits.assign(batch + 1, 0);

  const int64_t payload =
      payload_override > 0 ? payload_override : decode_payload(decode_total_work(blocks), num_sm_parts);
  const auto is_empty = [&](int32_t r) { return !empty.empty() && empty[r]; };

  int32_t req = 0;    // cursor: current request
  int64_t block = 0;  // first block of `req` not yet assigned
  int32_t split = 0;  // split ordinal of the next chunk of `req`
  int32_t prefix = 0;
  for (int p = 0; p < num_sm_parts; ++p) {
    DecodeScheduleRecord& rec = out.records[p];
    if (req >= batch) {  // idle partition: an inclusive [begin, end] loop over it is empty
      rec = DecodeScheduleRecord{batch, batch - 1, 0, 0, 0, 0, 0, 0};
      continue;
    }
    rec.begin_req = req;
    rec.begin_block = static_cast<int32_t>(block);
    rec.begin_split = split;
    const bool first_partial = block > 0;
    bool last_partial = false;
    int64_t budget = payload;
    while (req < batch) {
      const int64_t remaining = blocks[req] - block;
      if (budget >= remaining + kOverhead) {  // the rest of `req` fits: finish it here
        budget -= remaining + kOverhead;
        prefix += split + 1;
        out.num_splits[req + 1] = prefix;
        rec.end_req = req;
        rec.end_block = is_empty(req) ? 0 : blocks[req];
        last_partial = false;
        ++req;
        block = 0;
        split = 0;
      } else if (budget - kOverhead > 0) {  // take what fits and end the partition mid-request
        block += budget - kOverhead;
        rec.end_req = req;
        rec.end_block = static_cast<int32_t>(block);
        last_partial = true;
        ++split;
        break;
      } else {
        break;
      }
    }
    if (rec.begin_req == rec.end_req) {
      rec.is_first_req_split = rec.is_last_req_split = (first_partial || last_partial) ? 1 : 0;
    } else {
      rec.is_first_req_split = first_partial ? 1 : 0;
      rec.is_last_req_split = last_partial ? 1 : 0;
    }
    rec.pad = 0;
  }

  if (req < batch) {  // cannot happen with the computed payload; report it instead of half a schedule
    out.all_assigned = false;
    for (auto& rec : out.records) rec = DecodeScheduleRecord{batch, batch - 1, 0, 0, 0, 0, 0, 0};
    std::fill(out.num_splits.begin(), out.num_splits.end(), 0);
    out.num_splits[batch] = kDecodeScheduleFailed;
  }
  return out;
}

DecodeScheduleHost build_dense_decode_schedule(const std::vector<int32_t>& cache_seqlens, int num_sm_parts) {
  std::vector<int32_t> blocks(cache_seqlens.size());
  std::vector<bool> empty(cache_seqlens.size());
  for (size_t i = 0; i < cache_seqlens.size(); ++i) {
    blocks[i] = dense_request_blocks(cache_seqlens[i]);
    empty[i] = dense_request_empty(cache_seqlens[i]);
  }
  return build_decode_schedule(blocks, empty, num_sm_parts);
}

DecodeScheduleHost build_sparse_decode_schedule(int64_t batch, int64_t topk, const std::vector<int32_t>& topk_length,
                                                int64_t extra_topk, const std::vector<int32_t>& extra_topk_length,
                                                int num_sm_parts) {
  std::vector<int32_t> blocks(batch);
  for (int64_t i = 0; i < batch; ++i) {
    blocks[i] = sparse_request_blocks(topk, topk_length.empty() ? nullptr : &topk_length[i], extra_topk,
                                      extra_topk_length.empty() ? nullptr : &extra_topk_length[i]);
  }
  return build_decode_schedule(blocks, {}, num_sm_parts);
}

}  // namespace openmla::heuristics
