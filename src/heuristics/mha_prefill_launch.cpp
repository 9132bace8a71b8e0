#include "heuristics/mha_prefill_launch.h"

#include <algorithm>

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

}  // namespace openmla::heuristics
