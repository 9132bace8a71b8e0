// Sparse decode over an FP8 (or already dequantised) paged token cache, CPU reference (docs/contracts.md
// section 3). Tokens are gathered through the indices, main selection then extra selection, and
// attended under one softmax.
#include <algorithm>
#include <vector>

#include "attention_row.h"

namespace openmla::ref {
namespace {

using detail::require;

void check_cache(const PagedTokenCache& c, int64_t d_qk, const std::string& name) {
  require(c.page_size >= 1 && c.num_blocks >= 0, name, "needs page_size >= 1 and num_blocks >= 0");
  if (c.fp8 != nullptr) {
    require(fp8_head_dim(c.layout) == d_qk, name,
            "its FP8 layout holds d_qk = " + std::to_string(fp8_head_dim(c.layout)) + " but q has d_qk = " +
                std::to_string(d_qk));
    require(c.page_stride_bytes >= c.page_size * fp8_bytes_per_token(c.layout), name,
            "page stride " + std::to_string(c.page_stride_bytes) + " bytes is smaller than one page (" +
                std::to_string(c.page_size * fp8_bytes_per_token(c.layout)) + " bytes)");
  } else {
    require(c.values.defined(), name, "needs either FP8 bytes or dequantised values");
  }
}

// Appends the d_qk dims of token `index` of cache `c` to `dst`.
void append_token(const PagedTokenCache& c, int64_t index, int64_t d_qk, std::vector<double>& dst) {
  const int64_t page = index / c.page_size, row = index % c.page_size;
  const size_t base = dst.size();
  dst.resize(base + static_cast<size_t>(d_qk));
  if (c.fp8 != nullptr) {
    std::vector<float> tmp(static_cast<size_t>(d_qk));
    fp8_decode_token(c.layout, c.fp8 + page * c.page_stride_bytes, c.page_size, row, tmp.data());
    for (int64_t k = 0; k < d_qk; ++k) dst[base + k] = tmp[k];
  } else {
    for (int64_t k = 0; k < d_qk; ++k) dst[base + k] = c.values.at(page, row, k);
  }
}

// Gathers the valid tokens of one (request, position) row of an index tensor.
void gather(const PagedTokenCache& c, const IndexView& indices, int64_t topk, const int32_t* topk_length,
            int64_t b, int64_t s, int64_t d_qk, const std::string& name, std::vector<double>& dst) {
  // Slots >= topk_length are never read (they may hold garbage); lengths outside [0, topk] clamp.
  const int64_t used = topk_length ? std::clamp<int64_t>(topk_length[b], 0, topk) : topk;
  const int64_t capacity = c.num_blocks * c.page_size;
  for (int64_t t = 0; t < used; ++t) {
    const int32_t index = indices.at(b, s, t);
    if (index == -1) continue;  // flash_mla's only invalid value in decode (docs/contracts.md section 3)
    require(index >= 0 && index < capacity, name,
            "slot (" + std::to_string(b) + ", " + std::to_string(s) + ", " + std::to_string(t) + ") = " +
                std::to_string(index) + " is neither -1 nor a token in [0, " + std::to_string(capacity) + ")");
    append_token(c, index, d_qk, dst);
  }
}

}  // namespace

template <class Real>
void sparse_decode(const SparseDecodeArgs& a, Real* out, Real* lse) {
  using namespace detail;
  require(a.batch >= 0 && a.s_q >= 1 && a.h_q >= 1, "q", "needs batch >= 0, s_q >= 1, h_q >= 1");
  require(a.d_v >= 1 && a.d_v <= a.d_qk, "d_v", "must be in [1, d_qk] (V is the first d_v dims of K)");
  require_view(a.q, "q");
  require(a.topk >= 0, "indices", "topk must be >= 0");
  require(a.topk == 0 || a.indices.defined(), "indices", "must not be null");
  check_cache(a.cache, a.d_qk, "k_cache");
  if (a.has_extra) {
    check_cache(a.extra_cache, a.d_qk, "extra_k_cache");
    require(a.extra_topk >= 0, "extra_indices", "extra_topk must be >= 0");
    require(a.extra_topk == 0 || a.extra_indices.defined(), "extra_indices", "must not be null");
  }

  std::vector<double> keys, logits, row(a.d_v);
  for (int64_t b = 0; b < a.batch; ++b) {
    for (int64_t s = 0; s < a.s_q; ++s) {
      keys.clear();
      gather(a.cache, a.indices, a.topk, a.topk_length, b, s, a.d_qk, "indices", keys);
      if (a.has_extra)
        gather(a.extra_cache, a.extra_indices, a.extra_topk, a.extra_topk_length, b, s, a.d_qk, "extra_indices",
               keys);
      const int64_t n = static_cast<int64_t>(keys.size()) / a.d_qk;
      logits.assign(static_cast<size_t>(n), 0.0);
      for (int64_t h = 0; h < a.h_q; ++h) {
        for (int64_t j = 0; j < n; ++j) {
          double dot = 0.0;
          for (int64_t c = 0; c < a.d_qk; ++c) dot += a.q.at(b, s, h, c) * keys[j * a.d_qk + c];
          logits[j] = dot * a.softmax_scale;
        }
        const float* sink = a.attn_sink ? a.attn_sink + h : nullptr;
        const RowStats st = softmax_attend(logits.data(), n, keys.data(), a.d_qk, a.d_v, sink, row.data());
        Real* o = out + ((b * a.s_q + s) * a.h_q + h) * a.d_v;
        for (int64_t c = 0; c < a.d_v; ++c) o[c] = static_cast<Real>(row[c]);
        lse[(b * a.h_q + h) * a.s_q + s] = static_cast<Real>(st.lse);
      }
    }
  }
}

template void sparse_decode<float>(const SparseDecodeArgs&, float*, float*);
template void sparse_decode<double>(const SparseDecodeArgs&, double*, double*);

}  // namespace openmla::ref
