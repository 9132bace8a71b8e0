// Merging split-KV partials into the final row, CPU reference of the combine step (docs/contracts.md
// section 5, docs/decode-schedule.md section 6).
#include <cmath>
#include <limits>
#include <vector>

#include "attention_row.h"

namespace openmla::ref {

template <class Real>
void merge_partials(const MergeArgs& a, Real* out, Real* lse_out) {
  using namespace detail;
  require(a.num_partials >= 0 && a.d_v >= 1, "o", "needs num_partials >= 0 and d_v >= 1");
  require(a.num_partials == 0 || (a.o.defined() && a.lse.defined()), "lse", "o and lse must not be null");
  constexpr double kLn2 = 0.69314718055994530942;
  // Work in natural units: a base-2 partial lse l means ln(sum) = l * ln 2.
  // An empty partial has lse -inf (log of an empty sum: split-KV chunks) or +inf (an attention row without keys,
  // as the decode functions return it: the state DCP merges); a NaN lse poisons the row.
  std::vector<double> lse(static_cast<size_t>(a.num_partials));
  double m = -kInf;
  bool any = false, nan = false;
  for (int64_t i = 0; i < a.num_partials; ++i) {
    const double l = a.lse.at(i);
    lse[i] = a.lse_base == LseBase::kTwo ? l * kLn2 : l;
    if (std::isinf(lse[i])) {
      lse[i] = -kInf;  // empty either way: weight 0, O never read
      continue;
    }
    any = true;
    if (std::isnan(lse[i])) nan = true;
    else m = std::fmax(m, lse[i]);
  }
  for (int64_t c = 0; c < a.d_v; ++c) out[c] = Real(0);
  if (!any) {  // every partial empty (or none): out 0, lse +inf, whatever the sink
    *lse_out = static_cast<Real>(kInf);
    return;
  }
  if (nan) {
    for (int64_t c = 0; c < a.d_v; ++c) out[c] = static_cast<Real>(std::numeric_limits<double>::quiet_NaN());
    *lse_out = static_cast<Real>(std::numeric_limits<double>::quiet_NaN());
    return;
  }
  double sum = 0.0;
  for (int64_t i = 0; i < a.num_partials; ++i) sum += std::exp(lse[i] - m);
  const double total = m + std::log(sum);
  // The sink enlarges the denominator only: out *= 1 / (1 + exp(sink - lse)); lse is reported unchanged.
  const double sink_factor = a.attn_sink ? 1.0 / (1.0 + std::exp(static_cast<double>(*a.attn_sink) - total)) : 1.0;
  std::vector<double> acc(static_cast<size_t>(a.d_v), 0.0);
  for (int64_t i = 0; i < a.num_partials; ++i) {
    if (lse[i] == -kInf) continue;  // an empty partial's O is never read (weight exactly 0)
    const double w = std::exp(lse[i] - total);
    for (int64_t c = 0; c < a.d_v; ++c) acc[c] += w * a.o.at(i, c);
  }
  for (int64_t c = 0; c < a.d_v; ++c) out[c] = static_cast<Real>(acc[c] * sink_factor);
  *lse_out = static_cast<Real>(total);
}

template void merge_partials<float>(const MergeArgs&, float*, float*);
template void merge_partials<double>(const MergeArgs&, double*, double*);

}  // namespace openmla::ref
