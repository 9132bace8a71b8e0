// Checked mode (include/openmla/checked.h): the process-wide switch, each entry's device-side checks, the launch, and
// the message of the first violation.
#include "api/checked.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "api/validate.h"
#include "kernels/decode_scheduler/schedule_record.h"
#include "kernels/input_check/launch.h"

namespace openmla {

namespace detail {

namespace {

using kernels::CheckedArgument;
using kernels::CheckedEntry;
using kernels::CheckKind;
using kernels::InputCheck;
using kernels::InputCheckParams;

// -1: not read yet; 0 off; 1 on.
std::atomic<int> g_checked_mode{-1};
std::atomic<uint64_t> g_epoch{0};

const int32_t* int_data(const TensorRef& t) { return t.defined() ? static_cast<const int32_t*>(t.data) : nullptr; }

void add(InputCheckParams& p, const InputCheck& c) {
  if (p.num_checks < kernels::kMaxInputChecks) p.checks[p.num_checks++] = c;
}

InputCheck lengths_check(CheckedArgument argument, const TensorRef& t, int64_t max_value) {
  return InputCheck{
      .kind = CheckKind::kLengths, .argument = argument, .data = t.data, .rows = t.shape[0], .bound = max_value};
}

// (rows, cols, depth) index rows; `lengths` (rows,) or undefined; valid values: -1 or [0, capacity).
InputCheck indices_check(CheckedArgument argument, const TensorRef& idx, const TensorRef& lengths, int64_t capacity) {
  return InputCheck{.kind = CheckKind::kIndices,
                    .argument = argument,
                    .data = idx.data,
                    .rows = idx.shape[0],
                    .cols = idx.shape[1],
                    .depth = idx.shape[2],
                    .row_stride = idx.stride[0],
                    .col_stride = idx.stride[1],
                    .bound = capacity,
                    .lengths = int_data(lengths)};
}

InputCheck sink_check(const TensorRef& sink) {
  return InputCheck{
      .kind = CheckKind::kNotNaN, .argument = CheckedArgument::kAttnSink, .data = sink.data, .rows = sink.shape[0]};
}

InputCheck schedule_check(const DecodeSchedule& schedule, int64_t batch, int num_sm_parts) {
  return InputCheck{.kind = CheckKind::kSchedule,
                    .argument = CheckedArgument::kSchedule,
                    .data = schedule.metadata.data,
                    .rows = num_sm_parts,
                    .cols = batch,
                    .bound = batch + num_sm_parts,
                    .num_splits = int_data(schedule.num_splits)};
}

const char* entry_name(CheckedEntry e) {
  switch (e) {
    case CheckedEntry::kPlanDecode: return "plan_decode";
    case CheckedEntry::kDenseDecode: return "dense_decode";
    case CheckedEntry::kSparseDecode: return "sparse_decode";
    case CheckedEntry::kAppendKVCache: return "append_kv_cache";
    case CheckedEntry::kSparsePrefill: return "sparse_prefill";
    default: return "unknown entry";
  }
}

const char* argument_name(CheckedArgument a) {
  switch (a) {
    case CheckedArgument::kCacheSeqlens: return "cache_seqlens";
    case CheckedArgument::kBlockTable: return "block_table";
    case CheckedArgument::kIndices: return "indices";
    case CheckedArgument::kTopkLength: return "topk_length";
    case CheckedArgument::kAttnSink: return "attn_sink";
    case CheckedArgument::kExtraIndices: return "extra_indices";
    case CheckedArgument::kExtraTopkLength: return "extra_topk_length";
    case CheckedArgument::kSlots: return "slots";
    case CheckedArgument::kSchedule: return "schedule";
    case CheckedArgument::kSequsedQ: return "seqused_q";
    default: return "unknown argument";
  }
}

}  // namespace

bool checked_mode_from_environment() {
  const char* v = std::getenv("OPENMLA_CHECK");
  return v != nullptr && v[0] != '\0' && std::strcmp(v, "0") != 0;
}

bool checked_mode_enabled() {
  int mode = g_checked_mode.load(std::memory_order_relaxed);
  if (mode < 0) {
    int expected = -1;
    g_checked_mode.compare_exchange_strong(expected, checked_mode_from_environment() ? 1 : 0,
                                           std::memory_order_relaxed);
    mode = g_checked_mode.load(std::memory_order_relaxed);
  }
  return mode != 0;
}

InputCheckParams plan_decode_checks(const DenseDecodeProblem& problem, const TensorRef& cache_seqlens) {
  InputCheckParams p{};
  const int64_t cap =
      problem.max_blocks_per_seq > 0 ? problem.max_blocks_per_seq * problem.page_block_size : kInt32Max;
  add(p, lengths_check(CheckedArgument::kCacheSeqlens, cache_seqlens, cap));
  return p;
}

InputCheckParams seqused_q_checks(const TensorRef& seqused_q, int64_t s_q) {
  InputCheckParams p{};
  add(p, lengths_check(CheckedArgument::kSequsedQ, seqused_q, s_q));
  return p;
}

InputCheckParams plan_decode_checks(const SparseDecodeProblem& problem, const TensorRef& topk_length,
                                    const TensorRef& extra_topk_length) {
  InputCheckParams p{};
  if (topk_length.defined()) add(p, lengths_check(CheckedArgument::kTopkLength, topk_length, problem.topk));
  if (extra_topk_length.defined())
    add(p, lengths_check(CheckedArgument::kExtraTopkLength, extra_topk_length, problem.extra_topk));
  return p;
}

InputCheckParams dense_decode_checks(const DenseDecodeProblem& problem, const DenseDecodeArgs& a, int num_sm_parts) {
  InputCheckParams p{};
  const TensorRef& bt = a.block_table;
  const int64_t capacity = bt.shape[1] * problem.page_block_size;
  add(p, InputCheck{.kind = CheckKind::kBlockTable,
                    .argument = CheckedArgument::kBlockTable,
                    .data = bt.data,
                    .rows = bt.shape[0],
                    .cols = bt.shape[1],
                    .depth = problem.page_block_size,
                    .row_stride = bt.stride[0],
                    .bound = a.k_cache.shape[0],
                    .lengths = int_data(a.cache_seqlens),
                    .lengths_cap = capacity});
  add(p, lengths_check(CheckedArgument::kCacheSeqlens, a.cache_seqlens, capacity));
  if (problem.varlen_q) add(p, lengths_check(CheckedArgument::kSequsedQ, a.seqused_q, problem.s_q));
  // A varlen schedule was planned from schedule.varlen_lengths (0 for a request without query rows): checked against
  // those when the call passes them, else not checked.
  if (problem.varlen_q && !a.schedule.varlen_lengths.defined()) return p;
  // The schedule rules (ScheduleRule) are the default pass's: a batch-invariant schedule (chunks: more split slots
  // than batch + num_sm_parts) is not checked against them.
  if (problem.batch_invariant) return p;
  InputCheck s = schedule_check(a.schedule, problem.batch, num_sm_parts);
  s.lengths = problem.varlen_q ? int_data(a.schedule.varlen_lengths) : int_data(a.cache_seqlens);
  s.max_seqlen = static_cast<int32_t>(problem.max_blocks_per_seq * problem.page_block_size);
  add(p, s);
  return p;
}

InputCheckParams sparse_decode_checks(const SparseDecodeProblem& problem, const SparseDecodeArgs& a, int num_sm_parts,
                                      bool schedule_read) {
  InputCheckParams p{};
  const bool has_extra = a.extra_k_cache.defined();
  add(p, indices_check(CheckedArgument::kIndices, a.indices, a.topk_length, a.k_cache.shape[0] * a.k_cache.shape[1]));
  if (a.topk_length.defined()) add(p, lengths_check(CheckedArgument::kTopkLength, a.topk_length, problem.topk));
  if (a.attn_sink.defined()) add(p, sink_check(a.attn_sink));
  if (has_extra) {
    add(p, indices_check(CheckedArgument::kExtraIndices, a.extra_indices, a.extra_topk_length,
                         a.extra_k_cache.shape[0] * a.extra_k_cache.shape[1]));
    if (a.extra_topk_length.defined())
      add(p, lengths_check(CheckedArgument::kExtraTopkLength, a.extra_topk_length, problem.extra_topk));
  }
  if (schedule_read && !problem.batch_invariant) {  // (the default pass's rules, as for dense decode)
    InputCheck s = schedule_check(a.schedule, problem.batch, num_sm_parts);
    s.sparse = true;
    s.topk = problem.topk;
    s.topk_length = int_data(a.topk_length);
    s.extra_topk = has_extra ? problem.extra_topk : 0;
    s.extra_topk_length = has_extra ? int_data(a.extra_topk_length) : nullptr;
    add(p, s);
  }
  return p;
}

InputCheckParams append_kv_cache_checks(const TensorRef& slots, const TensorRef& cache) {
  InputCheckParams p{};
  add(p, InputCheck{.kind = CheckKind::kSlots,
                    .argument = CheckedArgument::kSlots,
                    .data = slots.data,
                    .rows = slots.shape[0],
                    .bound = cache.shape[0] * cache.shape[1],
                    .wide = slots.dtype == DType::kInt64});
  return p;
}

InputCheckParams sparse_prefill_checks(const SparsePrefillArgs& a) {
  InputCheckParams p{};
  add(p, indices_check(CheckedArgument::kIndices, a.indices, a.topk_length, a.kv.shape[0]));
  if (a.topk_length.defined()) add(p, lengths_check(CheckedArgument::kTopkLength, a.topk_length, a.indices.shape[2]));
  if (a.attn_sink.defined()) add(p, sink_check(a.attn_sink));
  return p;
}

Status run_input_checks(CheckedEntry entry, InputCheckParams params, cudaStream_t stream) {
  params.entry = entry;
  params.epoch = g_epoch.fetch_add(1, std::memory_order_relaxed) + 1;
  return kernels::launch_input_checks(params, stream);
}

std::string describe_violation(const kernels::InputCheckRecord& r) {
  MessageStream os;
  os << "checked mode: " << entry_name(r.entry) << ": argument '" << argument_name(r.argument) << "'";
  const bool prefill = r.entry == CheckedEntry::kSparsePrefill;
  switch (r.kind) {
    case CheckKind::kLengths:
      os << "[" << r.coords[0] << "] is " << r.value;
      if (r.value < 0) {
        os << ", negative (the kernels count it as 0)";
      } else if (r.argument == CheckedArgument::kSequsedQ) {
        os << ", past s_q = " << r.bound << ", the largest query length of the problem (the kernels clamp it to s_q)";
      } else if (r.argument == CheckedArgument::kCacheSeqlens) {
        os << ", past the block table's capacity max_blocks_per_seq * page_block_size = " << r.bound
           << " (the kernel clamps it to that)";
      } else {
        os << ", outside [0, " << (r.argument == CheckedArgument::kExtraTopkLength ? "extra_topk" : "topk") << " = "
           << r.bound << "] (the kernels clamp it)";
      }
      os << (prefill ? "; query token " : "; request ") << r.coords[0];
      break;
    case CheckKind::kBlockTable:
      os << "[" << r.coords[0] << ", " << r.coords[1] << "] is " << r.value << ", outside [0, num_blocks = " << r.bound
         << "): request " << r.coords[0] << " reads page " << r.coords[1]
         << " of its cache_seqlens (the kernel reads zeros for it)";
      break;
    case CheckKind::kIndices:
      os << "[" << r.coords[0] << ", " << r.coords[1] << ", " << r.coords[2] << "] is " << r.value;
      if (prefill) {
        os << ", neither -1 nor a row of kv [0, s_kv = " << r.bound << "): query token " << r.coords[0] << ", slot "
           << r.coords[2];
      } else {
        os << ", neither -1 nor a token of the cache [0, num_blocks * page_block_size = " << r.bound << "): request "
           << r.coords[0] << ", query token " << r.coords[1] << ", slot " << r.coords[2];
      }
      os << " (only -1 marks an unused slot; the kernel skips this one too)";
      break;
    case CheckKind::kNotNaN:
      os << "[" << r.coords[0] << "] is NaN (finite values and +-inf are allowed); head " << r.coords[0];
      break;
    case CheckKind::kSlots:
      os << "[" << r.coords[0] << "] is " << r.value << ", at or past the cache's num_blocks * page_size = " << r.bound
         << " (the kernel skips that row; negative slots mark padding)";
      break;
    case CheckKind::kSchedule:
      switch (static_cast<kernels::ScheduleRule>(r.detail)) {
        case kernels::ScheduleRule::kRecordRange:
          os << " was not planned for this call: partition " << r.coords[0] << " covers requests [" << r.coords[1]
             << ", " << r.coords[2] << "] of a batch of " << r.bound << " (never planned, or planned for another "
             << "problem)";
          break;
        case kernels::ScheduleRule::kEndBlock:
          os << " was planned for other lengths than this call's: partition " << r.coords[0] << " ends request "
             << r.coords[1] << " at block " << r.value << ", but this call's length of request " << r.coords[1]
             << " ends it at block " << r.bound << " (plan_decode with the lengths of the call; a schedule holds only "
             << "for the length values it was planned with)";
          break;
        case kernels::ScheduleRule::kBeginBlock:
          os << " was planned for other lengths than this call's: partition " << r.coords[0] << " starts request "
             << r.coords[1] << " at block " << r.value << ", but this call's length of request " << r.coords[1]
             << " has only " << r.bound << " blocks (plan_decode with the lengths of the call)";
          break;
        case kernels::ScheduleRule::kSplitCount:
          os << " has inconsistent split counts: num_splits";
          if (r.coords[2] == 1)
            os << "[" << r.coords[1] + 1 << "] is " << r.value << ", past the split buffers' " << r.bound << " slots";
          else if (r.coords[0] == -1 && r.bound == 0)
            os << "[0] is " << r.value << ", expected 0";
          else
            os << " gives request " << r.coords[1] << " " << r.value << " chunks, expected at least 1";
          os << " (never planned, or planned for another problem)";
          break;
      }
      break;
  }
  return os.str();
}

}  // namespace detail

void set_checked_mode(bool enabled) { detail::g_checked_mode.store(enabled ? 1 : 0, std::memory_order_relaxed); }

bool checked_mode() { return detail::checked_mode_enabled(); }

Status checked_mode_status(int device_id) {
  int current = -1;
  OPENMLA_CUDA_RETURN_IF_ERROR(cudaGetDevice(&current), "checked mode: cudaGetDevice");
  const int device = device_id < 0 ? current : device_id;
  if (device != current) OPENMLA_CUDA_RETURN_IF_ERROR(cudaSetDevice(device), "checked mode: cudaSetDevice");
  kernels::InputCheckRecord record{};
  const Status taken = kernels::take_input_check_record(&record);
  if (device != current) OPENMLA_CUDA_RETURN_IF_ERROR(cudaSetDevice(current), "checked mode: restoring the device");
  OPENMLA_RETURN_IF_ERROR(taken);
  if (record.found == 0) return Status::ok();
  return Status::invalid_argument(detail::describe_violation(record));
}

}  // namespace openmla
