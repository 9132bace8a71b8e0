#include "heuristics/mha_prefill_launch.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "kernels/mha_prefill/config.h"

namespace openmla::heuristics {

int64_t mha_prefill_max_tiles(int64_t batch, int64_t total_q, int64_t h_q, int64_t max_seqlen_qo) {
  using kernels::mha_prefill::kBlockM;
  if (batch <= 0 || total_q <= 0 || h_q <= 0) return 0;
  int64_t blocks = (total_q + (kBlockM - 1) * batch) / kBlockM;
  if (max_seqlen_qo > 0) blocks = std::min(blocks, batch * ((max_seqlen_qo + kBlockM - 1) / kBlockM));
  return blocks * h_q;
}

MhaPrefillLaunchPlan plan_mha_prefill_launch(const MhaPrefillProblem& problem, int64_t total_q, int num_sms) {
  MhaPrefillLaunchPlan plan;
  plan.max_tiles = mha_prefill_max_tiles(problem.batch, total_q, problem.h_q, problem.max_seqlen_qo);
  plan.grid = static_cast<int>(std::min<int64_t>(std::max(num_sms, 0), plan.max_tiles));
  plan.dynamic_tiles = problem.causal || problem.batch > 1;
  plan.staged_out = problem.epilogue == MhaPrefillEpilogue::kStaged ||
                    (problem.epilogue == MhaPrefillEpilogue::kAuto && total_q <= kMhaPrefillStagedRows * problem.batch);
  return plan;
}

int parse_mha_prefill_fp8_block_n(const char* env) {
  if (env == nullptr || env[0] == '\0') return kMhaPrefillFp8BlockN;
  if (std::strcmp(env, "128") == 0) return 128;
  if (std::strcmp(env, "192") == 0) return 192;
  return 0;
}

namespace {
std::atomic<int> g_fp8_block_n_override{0};  // 0: none
int fp8_block_n_from_env() {
  static const int value = parse_mha_prefill_fp8_block_n(std::getenv(kMhaPrefillFp8BlockNEnv));  // read once
  return value;
}
}  // namespace

int mha_prefill_fp8_block_n() {
  const int o = g_fp8_block_n_override.load(std::memory_order_relaxed);
  return o != 0 ? o : fp8_block_n_from_env();
}

void set_mha_prefill_fp8_block_n(int block_n) {
  g_fp8_block_n_override.store(block_n == 128 || block_n == 192 ? block_n : 0, std::memory_order_relaxed);
}

}  // namespace openmla::heuristics
