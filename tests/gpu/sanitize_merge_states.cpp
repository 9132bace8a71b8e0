// Sanitizer cases of the merge_attn_states kernel (run by openmla_sanitize under compute-sanitizer memcheck,
// racecheck, synccheck): every path of a row (one partial, several, more than 32, empty partials of both signs, all
// empty, a d_v that leaves lanes idle, a d_v of several warp steps) through the public C++ API, with buffers
// cudaMalloc'ed to the exact size the views need, so any out-of-bounds access is a memcheck error. Results are also
// compared with the CPU reference (reference/src/merge.cpp).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <vector>

#include "device_buffer.h"
#include "openmla/merge.h"
#include "openmla_ref/attention.h"
#include "openmla_ref/numeric.h"

namespace {

using openmla::DType;
using openmla::make_tensor;
using openmla_sanitize::DeviceBuffer;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// One case: bf16 partials (P, T, H, d_v) into an fp32 out and lse_out. Returns true when it ran and matched.
bool run_case(int64_t num_partials, int64_t tokens, int64_t heads, int64_t d_v) {
  const int64_t rows = tokens * heads;
  std::vector<uint16_t> outs(num_partials * rows * d_v);
  std::vector<float> lses(num_partials * rows);
  uint32_t state = 777u + static_cast<uint32_t>(num_partials * 131 + d_v);
  auto next = [&] {
    state = state * 1664525u + 1013904223u;
    return static_cast<float>(state >> 8) / 16777216.0f;  // [0, 1)
  };
  for (int64_t i = 0; i < num_partials; ++i) {
    for (int64_t r = 0; r < rows; ++r) {
      float& l = lses[i * rows + r];
      const float pick = next();
      // Row 0 of every case: all partials empty. Otherwise about 1 in 5 partials empty, +inf and -inf alike.
      l = r == 0 ? (i % 2 ? kInf : -kInf) : pick < 0.1f ? kInf : pick < 0.2f ? -kInf : 8.f * next() - 4.f;
      const bool empty = std::isinf(l);
      for (int64_t c = 0; c < d_v; ++c)
        outs[(i * rows + r) * d_v + c] = openmla::ref::float_to_bf16(empty ? kNaN : 2.f * next() - 1.f);
    }
  }

  DeviceBuffer d_outs(outs.size() * 2), d_lses(lses.size() * 4), d_out(rows * d_v * 4), d_lse(rows * 4);
  if (!d_outs.ptr || !d_lses.ptr || !d_out.ptr || !d_lse.ptr) return false;
  if (cudaMemcpy(d_outs.ptr, outs.data(), outs.size() * 2, cudaMemcpyHostToDevice) != cudaSuccess ||
      cudaMemcpy(d_lses.ptr, lses.data(), lses.size() * 4, cudaMemcpyHostToDevice) != cudaSuccess)
    return false;
  openmla::MergeStatesArgs args;
  args.outs = make_tensor(d_outs.ptr, DType::kBFloat16, {num_partials, tokens, heads, d_v});
  args.lses = make_tensor(d_lses.ptr, DType::kFloat32, {num_partials, tokens, heads});
  args.out = make_tensor(d_out.ptr, DType::kFloat32, {tokens, heads, d_v});
  args.lse_out = make_tensor(d_lse.ptr, DType::kFloat32, {tokens, heads});
  const openmla::Status st = openmla::merge_attn_states(args, nullptr);
  if (!st.is_ok()) {
    std::printf("  merge_states: %s\n", st.message().c_str());
    return false;
  }
  std::vector<float> out(rows * d_v), lse(rows);
  if (cudaMemcpy(out.data(), d_out.ptr, out.size() * 4, cudaMemcpyDeviceToHost) != cudaSuccess ||
      cudaMemcpy(lse.data(), d_lse.ptr, lse.size() * 4, cudaMemcpyDeviceToHost) != cudaSuccess)
    return false;

  std::vector<double> ref_out(d_v);
  double ref_lse = 0.0;
  for (int64_t r = 0; r < rows; ++r) {
    namespace ref = openmla::ref;
    const ref::MergeArgs m{
        .num_partials = num_partials,
        .d_v = d_v,
        .o = {.data = outs.data() + r * d_v, .type = ref::ElemType::kBFloat16, .stride = {rows * d_v, 1}},
        .lse = {.data = lses.data() + r, .type = ref::ElemType::kFloat32, .stride = {rows}},
        .lse_base = ref::LseBase::kNatural};
    ref::merge_partials(m, ref_out.data(), &ref_lse);
    const bool lse_ok = std::isinf(ref_lse) ? lse[r] == ref_lse : std::fabs(lse[r] - ref_lse) < 1e-4;
    bool out_ok = true;
    for (int64_t c = 0; c < d_v; ++c) out_ok = out_ok && std::fabs(out[r * d_v + c] - ref_out[c]) < 1e-5;
    if (!lse_ok || !out_ok) {
      std::printf("  merge_states P=%lld T=%lld H=%lld d_v=%lld: row %lld differs from the CPU reference (lse %g vs %g)\n",
                  static_cast<long long>(num_partials), static_cast<long long>(tokens), static_cast<long long>(heads),
                  static_cast<long long>(d_v), static_cast<long long>(r), lse[r], ref_lse);
      return false;
    }
  }
  return true;
}

}  // namespace

int run_merge_states_sanitize_cases() {
  int failed = 0;
  const int64_t cases[][4] = {
      {1, 3, 5, 512},   // one partial
      {2, 4, 16, 512},  // the DCP world-size-2 case
      {5, 2, 3, 136},   // a partial group of 4 and a tail of 1; lanes 17..31 idle
      {37, 2, 2, 8},    // more than 32 partials: the lse values past lane 31 come from memory; d_v of one lane
      {3, 1, 7, 1032},  // five warp steps, the last one partial
  };
  for (const auto& c : cases) failed += run_case(c[0], c[1], c[2], c[3]) ? 0 : 1;
  return failed;
}
