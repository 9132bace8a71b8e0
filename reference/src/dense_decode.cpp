// Dense paged MLA decode, CPU reference (docs/contracts.md section 2).
#include <algorithm>
#include <vector>

#include "attention_row.h"

namespace openmla::ref {

template <class Real>
void dense_decode(const DenseDecodeArgs& a, Real* out, Real* lse) {
  using namespace detail;
  require(a.batch >= 0 && a.s_q >= 1 && a.h_q >= 1, "q", "needs batch >= 0, s_q >= 1, h_q >= 1");
  require(a.h_kv >= 1 && a.h_q % a.h_kv == 0, "h_kv", "must be >= 1 and divide h_q");
  require(a.d_v >= 1 && a.d_v <= a.d_qk, "d_v", "must be in [1, d_qk] (V is the first d_v dims of K)");
  require(a.page_size >= 1, "page_size", "must be >= 1");
  require_view(a.q, "q");
  require_view(a.k_cache, "k_cache");
  require(a.block_table.defined(), "block_table", "must not be null");
  require(a.cache_seqlens != nullptr, "cache_seqlens", "must not be null");

  const int64_t heads_per_kv = a.h_q / a.h_kv;
  const bool causal = a.causal && a.s_q > 1;  // docs/contracts.md section 2: no causal mask for a single query
  std::vector<double> keys, logits, row(a.d_v);
  for (int64_t b = 0; b < a.batch; ++b) {
    const int64_t len = a.cache_seqlens[b];
    require(len >= 0, "cache_seqlens", "request " + std::to_string(b) + " has a negative length");
    const int64_t pages = (len + a.page_size - 1) / a.page_size;
    require(pages <= a.max_blocks_per_seq, "block_table",
            "request " + std::to_string(b) + " needs " + std::to_string(pages) + " pages, the table has " +
                std::to_string(a.max_blocks_per_seq));
    // Only block-table entries [0, pages) are looked at: later ones may be garbage.
    for (int64_t p = 0; p < pages; ++p) {
      const int32_t page = a.block_table.at(b, p);
      require(page >= 0 && page < a.num_blocks, "block_table",
              "entry (" + std::to_string(b) + ", " + std::to_string(p) + ") = " + std::to_string(page) +
                  " is not a page id in [0, " + std::to_string(a.num_blocks) + ")");
    }
    for (int64_t g = 0; g < a.h_kv; ++g) {
      // Gather this request's first `len` keys of kv head g (rows past len are never read).
      keys.assign(static_cast<size_t>(len * a.d_qk), 0.0);
      for (int64_t j = 0; j < len; ++j) {
        const int64_t page = a.block_table.at(b, j / a.page_size);
        for (int64_t c = 0; c < a.d_qk; ++c) keys[j * a.d_qk + c] = a.k_cache.at(page, j % a.page_size, g, c);
      }
      for (int64_t hh = 0; hh < heads_per_kv; ++hh) {
        const int64_t h = g * heads_per_kv + hh;
        for (int64_t i = 0; i < a.s_q; ++i) {
          const int64_t visible = causal ? std::clamp<int64_t>(len - a.s_q + i + 1, 0, len) : len;
          logits.assign(static_cast<size_t>(visible), 0.0);
          for (int64_t j = 0; j < visible; ++j) {
            double dot = 0.0;
            for (int64_t c = 0; c < a.d_qk; ++c) dot += a.q.at(b, i, h, c) * keys[j * a.d_qk + c];
            logits[j] = dot * a.softmax_scale;
          }
          const RowStats st = softmax_attend(logits.data(), visible, keys.data(), a.d_qk, a.d_v, nullptr, row.data());
          Real* o = out + ((b * a.s_q + i) * a.h_q + h) * a.d_v;
          for (int64_t c = 0; c < a.d_v; ++c) o[c] = static_cast<Real>(row[c]);
          lse[(b * a.h_q + h) * a.s_q + i] = static_cast<Real>(st.lse);
        }
      }
    }
  }
}

template void dense_decode<float>(const DenseDecodeArgs&, float*, float*);
template void dense_decode<double>(const DenseDecodeArgs&, double*, double*);

}  // namespace openmla::ref
