// The dense MHA backward's deterministic dq order, non-causal (kernels/mha_prefill_bwd/config.h: walk_start,
// rotated_rank): for every query block the ranks of the N key blocks are a permutation of 0 .. N - 1, they follow the
// step at which each key block's rotated walk reaches the query block, and a simulation of N CTAs started together
// (each waiting, before its addition to a query block, for every key block ranked before it) finishes in M steps
// plus at most a few steps of waiting: no CTA waits long, none forever.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "kernels/mha_prefill_bwd/config.h"

namespace {

using openmla::kernels::mha_prefill_bwd::rotated_rank;
using openmla::kernels::mha_prefill_bwd::walk_start;

struct Shape {
  int num_n, num_m;
};
const Shape kShapes[] = {{1, 1}, {1, 7}, {2, 4}, {32, 64}, {31, 64}, {32, 1}, {7, 3}, {128, 256}, {5, 17}, {64, 64}};

TEST(MhaBwdOrder, RanksArePermutationsInVisitOrder) {
  for (const Shape& s : kShapes) {
    for (int m = 0; m < s.num_m; ++m) {
      std::vector<int> seen(s.num_n, 0);
      for (int n = 0; n < s.num_n; ++n) {
        const int r = rotated_rank(n, m, s.num_n, s.num_m);
        ASSERT_GE(r, 0);
        ASSERT_LT(r, s.num_n);
        ++seen[r];
      }
      for (int r = 0; r < s.num_n; ++r) ASSERT_EQ(seen[r], 1) << "N " << s.num_n << " M " << s.num_m << " m " << m;
      // The step at which key block n reaches m: (m - walk_start(n)) mod M; an earlier step never ranks later.
      for (int a = 0; a < s.num_n; ++a)
        for (int b = 0; b < s.num_n; ++b) {
          const int da = ((m - walk_start(a, s.num_n, s.num_m)) % s.num_m + s.num_m) % s.num_m;
          const int db = ((m - walk_start(b, s.num_n, s.num_m)) % s.num_m + s.num_m) % s.num_m;
          if (da < db) EXPECT_LT(rotated_rank(a, m, s.num_n, s.num_m), rotated_rank(b, m, s.num_n, s.num_m));
        }
    }
  }
}

// N CTAs, one step per time unit, started together: CTA n's step j reaches query block (walk_start(n) + j) mod M and
// may finish it only once every key block ranked before n has finished it.
TEST(MhaBwdOrder, SimulatedCtasNeverWaitLong) {
  for (const Shape& s : kShapes) {
    std::vector<std::vector<int>> done(s.num_m, std::vector<int>(s.num_n, -1));  // time a key block added to m
    std::vector<int> step(s.num_n, 0), busy_until(s.num_n, 0);
    int time = 0, finished = 0;
    while (finished < s.num_n) {
      ASSERT_LT(time, 4 * s.num_m + 4 * s.num_n) << "deadlock or long waits, N " << s.num_n << " M " << s.num_m;
      for (int n = 0; n < s.num_n; ++n) {
        if (step[n] == s.num_m || busy_until[n] > time) continue;
        const int m = (walk_start(n, s.num_n, s.num_m) + step[n]) % s.num_m;
        const int r = rotated_rank(n, m, s.num_n, s.num_m);
        bool ready = true;
        for (int o = 0; o < s.num_n; ++o)
          if (rotated_rank(o, m, s.num_n, s.num_m) < r && (done[m][o] < 0 || done[m][o] >= time)) ready = false;
        if (!ready) continue;
        done[m][n] = time;
        busy_until[n] = time + 1;
        if (++step[n] == s.num_m) ++finished;
      }
      ++time;
    }
    // Equal visit steps (M < N) serialise in rank order; otherwise no waiting at all.
    const int slack = s.num_m >= s.num_n ? 1 : s.num_n;
    EXPECT_LE(time, s.num_m + slack) << "N " << s.num_n << " M " << s.num_m;
  }
}

}  // namespace
