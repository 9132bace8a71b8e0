// Sparse prefill, CPU reference (docs/contracts.md section 6): every query token attends the kv rows its own
// index row selects.
#include <algorithm>
#include <vector>

#include "attention_row.h"

namespace openmla::ref {

template <class Real>
void sparse_prefill(const SparsePrefillArgs& a, Real* out, Real* max_logits, Real* lse) {
  using namespace detail;
  require(a.s_q >= 0 && a.h_q >= 1 && a.s_kv >= 0, "q", "needs s_q >= 0, h_q >= 1, s_kv >= 0");
  require(a.h_kv >= 1 && a.h_q % a.h_kv == 0, "kv", "h_kv must be >= 1 and divide h_q");
  require(a.d_v >= 1 && a.d_v <= a.d_qk, "d_v", "must be in [1, d_qk] (V is the first d_v dims of K)");
  require_view(a.q, "q");
  require_view(a.kv, "kv");
  require(a.topk >= 0, "indices", "topk must be >= 0");
  require(a.topk == 0 || a.indices.defined(), "indices", "must not be null");

  const int64_t heads_per_kv = a.h_q / a.h_kv;
  std::vector<double> keys, logits, row(a.d_v);
  for (int64_t t = 0; t < a.s_q; ++t) {
    // Slots >= topk_length[t] are invalid and never read (lengths outside [0, topk] clamp).
    const int64_t used = a.topk_length ? std::clamp<int64_t>(a.topk_length[t], 0, a.topk) : a.topk;
    for (int64_t g = 0; g < a.h_kv; ++g) {
      keys.clear();
      for (int64_t slot = 0; slot < used; ++slot) {
        const int64_t index = a.indices.at(t, g, slot);
        if (index < 0 || index >= a.s_kv) continue;  // any out-of-range value is "invalid" in prefill
        for (int64_t c = 0; c < a.d_qk; ++c) keys.push_back(a.kv.at(index, g, c));
      }
      const int64_t n = static_cast<int64_t>(keys.size()) / a.d_qk;
      logits.assign(static_cast<size_t>(n), 0.0);
      for (int64_t hh = 0; hh < heads_per_kv; ++hh) {
        const int64_t h = g * heads_per_kv + hh;
        for (int64_t j = 0; j < n; ++j) {
          double dot = 0.0;
          for (int64_t c = 0; c < a.d_qk; ++c) dot += a.q.at(t, h, c) * keys[j * a.d_qk + c];
          logits[j] = dot * a.softmax_scale;
        }
        const float* sink = a.attn_sink ? a.attn_sink + h : nullptr;
        const RowStats st = softmax_attend(logits.data(), n, keys.data(), a.d_qk, a.d_v, sink, row.data());
        Real* o = out + (t * a.h_q + h) * a.d_v;
        for (int64_t c = 0; c < a.d_v; ++c) o[c] = static_cast<Real>(row[c]);
        max_logits[t * a.h_q + h] = static_cast<Real>(st.max_logit);
        lse[t * a.h_q + h] = static_cast<Real>(st.lse);
      }
    }
  }
}

template void sparse_prefill<float>(const SparsePrefillArgs&, float*, float*, float*);
template void sparse_prefill<double>(const SparsePrefillArgs&, double*, double*, double*);

}  // namespace openmla::ref
