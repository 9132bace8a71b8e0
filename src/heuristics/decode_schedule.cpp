#include "heuristics/decode_schedule.h"

#include <algorithm>

#include "kernels/decode_scheduler/partition_walk.h"

namespace openmla::heuristics {

using kernels::DecodeScheduleRecord;
using kernels::kDecodeBlockTokens;
using kernels::kDecodeRequestOverheadBlocks;

namespace {
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int clamp_parts(int64_t parts) { return static_cast<int>(std::clamp<int64_t>(parts, 1, kMaxDecodeSmParts)); }
constexpr int64_t kTileRows = 64;  // query rows (dense) or heads (sparse) of one main-kernel CTA
}  // namespace

int dense_num_sm_parts(int64_t s_q, int64_t h_q, int64_t h_kv, int num_sms) {
  if (num_sms <= 0 || s_q <= 0 || h_q <= 0 || h_kv <= 0) return 1;
  const int64_t m_blocks = ceil_div(s_q * (h_q / h_kv), kTileRows);
  return clamp_parts(static_cast<int64_t>(num_sms) / h_kv / std::max<int64_t>(m_blocks, 1));
}

int sparse_num_sm_parts(int64_t s_q, int64_t h_q, int num_sms) {
  if (num_sms <= 0 || s_q <= 0 || h_q <= 0) return 1;
  return clamp_parts(static_cast<int64_t>(num_sms) / s_q / ceil_div(h_q, kTileRows));
}

int decode_num_sm_parts(const DenseDecodeProblem& problem, int num_sms) {
  // Per-request query lengths: as many partitions as a one-position problem has, so the m-block CTAs of positions
  // past a request's length, which finish early, free their SMs for the next partitions' CTAs (docs/dense-decode.md,
  // "Per-request query lengths"); the same count when all positions share one m-block.
  if (problem.varlen_q) return dense_num_sm_parts(1, problem.h_q, problem.h_kv, num_sms);
  return dense_num_sm_parts(problem.s_q, problem.h_q, problem.h_kv, num_sms);
}

int decode_num_sm_parts(const SparseDecodeProblem& problem, int num_sms) {
  return sparse_num_sm_parts(problem.s_q, problem.h_q, num_sms);
}

int64_t decode_merge_counter_count(const DenseDecodeProblem& problem) {
  const int64_t h_kv = std::max<int64_t>(problem.h_kv, 1);
  return problem.batch * h_kv * ceil_div(problem.s_q * (problem.h_q / h_kv), kTileRows);
}

int64_t decode_merge_counter_count(const SparseDecodeProblem& problem) {
  return problem.batch * problem.s_q * ceil_div(problem.h_q, kTileRows);
}

int64_t decode_merge_counter_ints(const DenseDecodeProblem& problem) {
  return decode_merge_counter_count(problem) + (problem.batch_invariant ? problem.batch : 0);
}

int64_t decode_merge_counter_ints(const SparseDecodeProblem& problem) { return decode_merge_counter_count(problem); }

int32_t dense_request_blocks(int32_t seqlen, int32_t max_seqlen) {
  const int32_t n = kernels::dense_request_blocks_signed(seqlen, max_seqlen);
  return n < 0 ? -n : n;
}

bool dense_request_empty(int32_t seqlen, int32_t max_seqlen) {
  return kernels::dense_request_blocks_signed(seqlen, max_seqlen) < 0;
}

int32_t sparse_request_blocks(int64_t topk, const int32_t* topk_length, int64_t extra_topk,
                              const int32_t* extra_topk_length) {
  return kernels::sparse_request_blocks_of(topk, topk_length, extra_topk, extra_topk_length);
}

int64_t decode_total_work(const std::vector<int32_t>& blocks) {
  int64_t total = 0;
  for (int32_t n : blocks) total += static_cast<int64_t>(n) + kDecodeRequestOverheadBlocks;
  return total;
}

int64_t decode_payload(int64_t total_work, int num_sm_parts) {
  return ceil_div(total_work, num_sm_parts) + kDecodeRequestOverheadBlocks;
}

int64_t decode_schedule_payload(const std::vector<int32_t>& blocks, int num_sm_parts) {
  const int64_t fallback = decode_payload(decode_total_work(blocks), num_sm_parts);
  if (!kernels::tight_payload_applies(static_cast<int64_t>(blocks.size()), num_sm_parts)) return fallback;
  for (int c = 0; c < kernels::kTightPayloadCandidates; ++c) {  // the smallest that fits, as the kernel picks it
    const int64_t candidate = kernels::tight_payload_candidate(fallback, c);
    if (candidate <= 0) continue;
    kernels::PartitionCount count(candidate);
    for (int32_t n : blocks) count.add(n < 0 ? -static_cast<int64_t>(n) : n);
    if (count.fits(num_sm_parts)) return candidate;
  }
  return fallback;
}

DecodeScheduleHost walk_decode_schedule(const std::vector<int32_t>& blocks, const std::vector<bool>& empty,
                                        int num_sm_parts, int64_t payload) {
  const int32_t batch = static_cast<int32_t>(blocks.size());
  DecodeScheduleHost out;
  out.records.assign(num_sm_parts, DecodeScheduleRecord{});
  out.num_splits.assign(batch + 1, 0);
  kernels::PartitionWalk walk;
  walk.begin(batch, num_sm_parts, payload, out.records.data(), out.num_splits.data());
  for (int32_t i = 0; i < batch; ++i) {
    if (!walk.add_request(i, blocks[i], !empty.empty() && empty[i])) {
      out.all_assigned = false;
      break;
    }
  }
  if (out.all_assigned) {
    walk.finish();
    return out;
  }
  // The scheduler kernel's failure epilogue (kernels/decode_scheduler/kernel.cuh).
  for (auto& rec : out.records) rec = kernels::PartitionWalk::idle_record(batch);
  std::fill(out.num_splits.begin(), out.num_splits.end(), 0);
  out.num_splits[batch] = kDecodeScheduleFailed;
  return out;
}

int32_t decode_chunk_blocks(const DenseDecodeProblem& problem) {
  return problem.batch_invariant ? static_cast<int32_t>(kDecodeInvariantChunkTokens / kDecodeBlockTokens) : 0;
}

int32_t decode_chunk_blocks(const SparseDecodeProblem& problem) {
  return problem.batch_invariant ? static_cast<int32_t>(kDecodeInvariantChunkTokens / kDecodeBlockTokens) : 0;
}

int64_t decode_split_slots(const DenseDecodeProblem& problem, int num_sm_parts) {
  const int32_t chunk = decode_chunk_blocks(problem);
  if (chunk == 0) return problem.batch + num_sm_parts;
  // max_blocks_per_seq counts pages of page_block_size tokens; chunks count 64-token blocks.
  const int64_t page = problem.page_block_size > 0 ? problem.page_block_size : kDecodeBlockTokens;
  const int64_t blocks = ceil_div(problem.max_blocks_per_seq * page, static_cast<int64_t>(kDecodeBlockTokens));
  return problem.batch * std::max<int64_t>(ceil_div(blocks, chunk), 1);
}

int64_t decode_split_slots(const SparseDecodeProblem& problem, int num_sm_parts) {
  const int32_t chunk = decode_chunk_blocks(problem);
  if (chunk == 0) return problem.batch + num_sm_parts;
  const int64_t blocks = sparse_request_blocks(problem.topk, nullptr, problem.extra_topk, nullptr);
  return problem.batch * ceil_div(blocks, chunk);
}

std::vector<int32_t> invariant_walk_order(const std::vector<int32_t>& blocks, bool alternate) {
  const int32_t batch = static_cast<int32_t>(blocks.size());
  std::vector<int32_t> order(batch);
  for (int32_t i = 0; i < batch; ++i) order[i] = i;
  if (!alternate || batch > kernels::kInvariantOrderMaxBatch) return order;
  std::vector<int32_t> by_rank = order;  // most blocks first, ties by request index
  std::stable_sort(by_rank.begin(), by_rank.end(), [&](int32_t x, int32_t y) { return blocks[x] > blocks[y]; });
  for (int32_t k = 0; k < batch; ++k) order[kernels::alternating_position(k, batch)] = by_rank[k];
  return order;
}

int64_t invariant_schedule_load(const std::vector<int32_t>& blocks, int num_sm_parts, int32_t chunk_blocks,
                                bool alternate) {
  const std::vector<int32_t> order = invariant_walk_order(blocks, alternate);
  int64_t total = 0;
  for (int32_t n : blocks) total += kernels::ChunkWalk::request_work(n, chunk_blocks);
  const int32_t candidates = kernels::invariant_cut_candidates(chunk_blocks);
  for (int32_t j = 0; j < candidates; ++j) {  // the smallest that fits, as the GPU scheduler picks it
    const int64_t load = kernels::invariant_cut_candidate(total, num_sm_parts, j);
    kernels::ChunkCount count(load, chunk_blocks);
    for (int32_t i : order) count.add(blocks[i]);
    if (count.fits(num_sm_parts)) return load;
  }
  return kernels::invariant_cut_candidate(total, num_sm_parts, candidates - 1);  // always fits (partition_walk.h)
}

DecodeScheduleHost walk_invariant_schedule(const std::vector<int32_t>& blocks, const std::vector<bool>& empty,
                                           int num_sm_parts, int32_t chunk_blocks, bool alternate) {
  const int32_t batch = static_cast<int32_t>(blocks.size());
  const std::vector<int32_t> order = invariant_walk_order(blocks, alternate);
  DecodeScheduleHost out;
  out.records.assign(num_sm_parts, DecodeScheduleRecord{});
  out.num_splits.assign(batch + 1, 0);
  kernels::ChunkWalk walk;
  walk.begin(batch, num_sm_parts, chunk_blocks, invariant_schedule_load(blocks, num_sm_parts, chunk_blocks, alternate),
             out.records.data(), out.num_splits.data(), alternate);
  for (int32_t i : order) walk.add_request(i, blocks[i], !empty.empty() && empty[i]);
  walk.finish();
  kernels::ChunkWalk::split_counts_to_prefix(out.num_splits.data(), batch);
  if (alternate) {
    out.walk_next.assign(batch, -1);
    for (int32_t k = 0; k + 1 < batch; ++k) out.walk_next[order[k]] = order[k + 1];
  }
  return out;
}

}  // namespace openmla::heuristics
