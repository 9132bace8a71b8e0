// Dense MHA prefill forward and backward, CPU reference (docs/contracts.md section 7): varlen batches through
// cumulative sequence lengths, GQA, d_qk != d_v, bottom-right causal mask.
#include <algorithm>
#include <vector>

#include "attention_row.h"

namespace openmla::ref {
namespace {

using detail::require;

struct Segment {
  int64_t q_begin, s_q, k_begin, s_k;
};

std::vector<Segment> segments(const MhaArgs& a) {
  using namespace detail;
  require(a.batch >= 0, "cu_seqlens_q", "batch must be >= 0");
  require(a.h_q >= 1 && a.h_kv >= 1 && a.h_q % a.h_kv == 0, "k", "h_kv must be >= 1 and divide h_q");
  require(a.d_qk >= 1 && a.d_v >= 1, "v", "d_qk and d_v must be >= 1");
  require(a.cu_seqlens_q != nullptr, "cu_seqlens_q", "must not be null");
  require(a.cu_seqlens_k != nullptr, "cu_seqlens_k", "must not be null");
  require_view(a.q, "q");
  require_view(a.k, "k");
  require_view(a.v, "v");
  require(a.cu_seqlens_q[0] == 0, "cu_seqlens_q", "must start at 0");
  require(a.cu_seqlens_k[0] == 0, "cu_seqlens_k", "must start at 0");
  std::vector<Segment> segs;
  for (int64_t b = 0; b < a.batch; ++b) {
    const int64_t s_q = a.cu_seqlens_q[b + 1] - a.cu_seqlens_q[b];
    const int64_t s_k = a.cu_seqlens_k[b + 1] - a.cu_seqlens_k[b];
    require(s_q >= 0, "cu_seqlens_q", "must be non-decreasing");
    require(s_k >= 0, "cu_seqlens_k", "must be non-decreasing");
    segs.push_back({a.cu_seqlens_q[b], s_q, a.cu_seqlens_k[b], s_k});
  }
  return segs;
}

// Number of keys query i of a segment sees (bottom-right causal: keys j <= i + s_k - s_q).
int64_t visible_keys(const MhaArgs& a, const Segment& sg, int64_t i) {
  return a.causal ? std::clamp<int64_t>(i + sg.s_k - sg.s_q + 1, 0, sg.s_k) : sg.s_k;
}

// Scaled logits of query row (token, head) over keys [k_begin, k_begin + n) of kv head g.
void row_logits(const MhaArgs& a, int64_t token, int64_t h, int64_t g, int64_t k_begin, int64_t n,
                std::vector<double>& logits) {
  logits.assign(static_cast<size_t>(n), 0.0);
  for (int64_t j = 0; j < n; ++j) {
    double dot = 0.0;
    for (int64_t c = 0; c < a.d_qk; ++c) dot += a.q.at(token, h, c) * a.k.at(k_begin + j, g, c);
    logits[j] = dot * a.softmax_scale;
  }
}

void gather_values(const MhaArgs& a, int64_t g, int64_t k_begin, int64_t n, std::vector<double>& values) {
  values.assign(static_cast<size_t>(n * a.d_v), 0.0);
  for (int64_t j = 0; j < n; ++j)
    for (int64_t c = 0; c < a.d_v; ++c) values[j * a.d_v + c] = a.v.at(k_begin + j, g, c);
}

}  // namespace

template <class Real>
void mha_forward(const MhaArgs& a, Real* out, Real* lse) {
  const int64_t heads_per_kv = a.h_q / std::max<int64_t>(a.h_kv, 1);
  std::vector<double> logits, values, row(a.d_v);
  for (const Segment& sg : segments(a)) {
    for (int64_t h = 0; h < a.h_q; ++h) {
      const int64_t g = h / heads_per_kv;
      gather_values(a, g, sg.k_begin, sg.s_k, values);
      for (int64_t i = 0; i < sg.s_q; ++i) {
        const int64_t token = sg.q_begin + i, n = visible_keys(a, sg, i);
        row_logits(a, token, h, g, sg.k_begin, n, logits);
        const detail::RowStats st = detail::softmax_attend(logits.data(), n, values.data(), a.d_v, a.d_v, nullptr,
                                                           row.data());
        for (int64_t c = 0; c < a.d_v; ++c) out[(token * a.h_q + h) * a.d_v + c] = static_cast<Real>(row[c]);
        lse[token * a.h_q + h] = static_cast<Real>(st.lse);
      }
    }
  }
}

// With P = softmax(z), out = P V and loss = sum(out * dout):
//   dV_j += P_j dout;  dP_j = dout . V_j;  dz_j = P_j (dP_j - dout . out);  dq += scale dz_j K_j;
//   dK_j += scale dz_j q.  Rows with no visible key contribute nothing.
template <class Real>
void mha_backward(const MhaArgs& a, const RealView& dout, Real* dq, Real* dk, Real* dv) {
  const std::vector<Segment> segs = segments(a);
  detail::require_view(dout, "dout");
  const int64_t heads_per_kv = a.h_q / a.h_kv;
  const int64_t total_q = a.cu_seqlens_q[a.batch], total_k = a.cu_seqlens_k[a.batch];
  std::vector<double> gq(static_cast<size_t>(total_q * a.h_q * a.d_qk), 0.0);
  std::vector<double> gk(static_cast<size_t>(total_k * a.h_kv * a.d_qk), 0.0);
  std::vector<double> gv(static_cast<size_t>(total_k * a.h_kv * a.d_v), 0.0);
  std::vector<double> logits, values, row(a.d_v), prob, dprob, dout_row(a.d_v);
  for (const Segment& sg : segs) {
    for (int64_t h = 0; h < a.h_q; ++h) {
      const int64_t g = h / heads_per_kv;
      gather_values(a, g, sg.k_begin, sg.s_k, values);
      for (int64_t i = 0; i < sg.s_q; ++i) {
        const int64_t token = sg.q_begin + i, n = visible_keys(a, sg, i);
        if (n == 0) continue;
        row_logits(a, token, h, g, sg.k_begin, n, logits);
        const detail::RowStats st = detail::softmax_attend(logits.data(), n, values.data(), a.d_v, a.d_v, nullptr,
                                                           row.data());
        for (int64_t c = 0; c < a.d_v; ++c) dout_row[c] = dout.at(token, h, c);
        double d_dot_o = 0.0;
        for (int64_t c = 0; c < a.d_v; ++c) d_dot_o += dout_row[c] * row[c];
        for (int64_t j = 0; j < n; ++j) {
          const double p = std::exp(logits[j] - st.lse);
          const int64_t key = sg.k_begin + j;
          double dp = 0.0;
          for (int64_t c = 0; c < a.d_v; ++c) {
            dp += dout_row[c] * values[j * a.d_v + c];
            gv[(key * a.h_kv + g) * a.d_v + c] += p * dout_row[c];
          }
          const double dz = p * (dp - d_dot_o) * a.softmax_scale;
          for (int64_t c = 0; c < a.d_qk; ++c) {
            gq[(token * a.h_q + h) * a.d_qk + c] += dz * a.k.at(key, g, c);
            gk[(key * a.h_kv + g) * a.d_qk + c] += dz * a.q.at(token, h, c);
          }
        }
      }
    }
  }
  for (size_t i = 0; i < gq.size(); ++i) dq[i] = static_cast<Real>(gq[i]);
  for (size_t i = 0; i < gk.size(); ++i) dk[i] = static_cast<Real>(gk[i]);
  for (size_t i = 0; i < gv.size(); ++i) dv[i] = static_cast<Real>(gv[i]);
}

template void mha_forward<float>(const MhaArgs&, float*, float*);
template void mha_forward<double>(const MhaArgs&, double*, double*);
template void mha_backward<float>(const MhaArgs&, const RealView&, float*, float*, float*);
template void mha_backward<double>(const MhaArgs&, const RealView&, double*, double*, double*);

}  // namespace openmla::ref
