// The varlen layer's tile arithmetic (src/common/varlen.h), shared by the varlen kernels and the host, against brute
// force: the rows of each sequence for any cumulative lengths, what a query row sees under the bottom-right causal
// mask, a query block's key blocks (the forward) and a key block's query blocks (the backward's dk / dv pass), the
// masks, and the order of a sequence's tiles; for the dense MHA prefill's tile (128 x 128) and other shapes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <set>
#include <tuple>
#include <vector>

#include "common/varlen.h"
#include "heuristics/mha_prefill_launch.h"
#include "kernels/mha_prefill/config.h"

namespace openmla {
namespace {

namespace vl = kernels::varlen;

TEST(Varlen, ClampRows) {
  EXPECT_EQ(vl::clamp_rows(10, 20, 100).begin, 10);
  EXPECT_EQ(vl::clamp_rows(10, 20, 100).len, 10);
  EXPECT_EQ(vl::clamp_rows(10, 5, 100).len, 0);         // out of order: empty
  EXPECT_EQ(vl::clamp_rows(-7, 5, 100).begin, 0);       // negative start clamps to 0
  EXPECT_EQ(vl::clamp_rows(90, 1 << 30, 100).len, 10);  // past the tensor clamps to its end
  EXPECT_EQ(vl::clamp_rows(200, 300, 100).begin, 100);
  EXPECT_EQ(vl::clamp_rows(200, 300, 100).len, 0);
}

bool sees(int s_q, int s_k, int row, int key, bool causal) {
  return key >= 0 && key < s_k && (!causal || key <= row + s_k - s_q);
}

const int kLens[] = {0, 1, 2, 63, 64, 65, 127, 128, 129, 200, 255, 256, 257, 300, 383, 384, 385, 640};

TEST(Varlen, RowLimitsMatchBruteForce) {
  for (bool causal : {false, true})
    for (int s_q : kLens)
      for (int s_k : kLens) {
        for (int r = 0; r < s_q; ++r) {  // the last key a row sees
          int last = -1;
          for (int c = 0; c < s_k; ++c)
            if (sees(s_q, s_k, r, c, causal)) last = c;
          ASSERT_EQ(std::max(vl::row_key_limit(s_q, s_k, r, causal), -1), last) << s_q << " " << s_k << " row " << r;
        }
        for (int c = 0; c < s_k; ++c) {  // the first row that sees a key
          int first = s_q;
          for (int r = s_q - 1; r >= 0; --r)
            if (sees(s_q, s_k, r, c, causal)) first = r;
          ASSERT_EQ(std::min(vl::key_first_row(s_q, s_k, c, causal), s_q), first) << s_q << " " << s_k << " key " << c;
        }
      }
}

// Every shape a varlen kernel uses or may use: the MHA forward's, and the backward's candidates.
template <class T>
class VarlenTiling : public ::testing::Test {};
using Shapes = ::testing::Types<kernels::mha_prefill::Tiles, vl::Tiling<64, 128>, vl::Tiling<128, 64>,
                                vl::Tiling<64, 64>>;
TYPED_TEST_SUITE(VarlenTiling, Shapes);

template <class Tiles>
struct BlockShape;
template <int kM, int kN>
struct BlockShape<vl::Tiling<kM, kN>> {
  static constexpr int kBlockM = kM, kBlockN = kN;
};

// Whether any / every (valid row, key) pair of query block mb and key block n is visible.
template <class Tiles>
void block_visibility(int s_q, int s_k, int mb, int n, bool causal, bool& any, bool& all) {
  constexpr int M = BlockShape<Tiles>::kBlockM, N = BlockShape<Tiles>::kBlockN;
  any = false;
  all = true;
  const int r1 = std::min(mb * M + M, s_q);
  for (int r = mb * M; r < r1; ++r)
    for (int c = n * N; c < (n + 1) * N; ++c) {
      const bool v = sees(s_q, s_k, r, c, causal);
      any |= v;
      all &= v;
    }
}

TYPED_TEST(VarlenTiling, KeyBlocksOfAQueryBlockMatchBruteForce) {
  using Tiles = TypeParam;
  for (bool causal : {false, true})
    for (int s_q : kLens)
      for (int s_k : kLens)
        for (int mb = 0; mb < Tiles::num_m_blocks(s_q); ++mb) {
          const int n_end = Tiles::key_block_end(s_q, s_k, mb, causal);
          ASSERT_GE(n_end, 0);
          ASSERT_LE(n_end, Tiles::num_n_blocks(s_k));
          for (int n = 0; n < Tiles::num_n_blocks(s_k); ++n) {
            bool any, all;
            block_visibility<Tiles>(s_q, s_k, mb, n, causal, any, all);
            // Every block holding a visible key is visited; the blocks past n_end hold none.
            if (any) ASSERT_LT(n, n_end) << "s_q " << s_q << " s_k " << s_k << " mb " << mb << " n " << n;
            // A block visited without a mask must be entirely visible to every valid row.
            if (n < n_end && !Tiles::block_needs_mask(s_q, s_k, mb, n, causal))
              ASSERT_TRUE(all) << "s_q " << s_q << " s_k " << s_k << " mb " << mb << " n " << n << " causal " << causal;
          }
        }
}

TYPED_TEST(VarlenTiling, QueryBlocksOfAKeyBlockMatchBruteForce) {
  using Tiles = TypeParam;
  for (bool causal : {false, true})
    for (int s_q : kLens)
      for (int s_k : kLens)
        for (int n = 0; n < Tiles::num_n_blocks(s_k); ++n) {
          const int m_begin = Tiles::query_block_begin(s_q, s_k, n, causal);
          ASSERT_GE(m_begin, 0);
          ASSERT_LE(m_begin, Tiles::num_m_blocks(s_q));
          for (int mb = 0; mb < Tiles::num_m_blocks(s_q); ++mb) {
            bool any, all;
            block_visibility<Tiles>(s_q, s_k, mb, n, causal, any, all);
            // Every query block seeing a key of the block is visited; those before m_begin see none ...
            if (any) ASSERT_GE(mb, m_begin) << "s_q " << s_q << " s_k " << s_k << " n " << n << " mb " << mb;
            // ... and, under causal, every block from m_begin on sees some key (the range is tight).
            if (causal && mb >= m_begin) ASSERT_TRUE(any) << "s_q " << s_q << " s_k " << s_k << " n " << n;
            // Both directions agree on the pairs visited and on their masks.
            const bool visited_fwd = n < Tiles::key_block_end(s_q, s_k, mb, causal);
            if (any) ASSERT_TRUE(visited_fwd);
            if (mb >= m_begin && visited_fwd && !Tiles::block_needs_mask(s_q, s_k, mb, n, causal)) ASSERT_TRUE(all);
          }
        }
}

TYPED_TEST(VarlenTiling, MaskedBlocksComeFirst) {
  // The forward visits blocks last first, so the masked ones must be a suffix of [0, n_end): at most
  // ceil(kBlockM / kBlockN) + 1 under causal (the diagonal), 1 without (the sequence end).
  using Tiles = TypeParam;
  constexpr int M = BlockShape<Tiles>::kBlockM, N = BlockShape<Tiles>::kBlockN;
  for (int s_q : {1, 100, 128, 1000, 4097})
    for (int s_k : {1, 100, 128, 1000, 4097, 8192})
      for (bool causal : {false, true})
        for (int mb = 0; mb < Tiles::num_m_blocks(s_q); ++mb) {
          const int n_end = Tiles::key_block_end(s_q, s_k, mb, causal);
          if (n_end == 0) continue;
          int masked = 0;
          bool seen_unmasked = false;
          for (int n = n_end - 1; n >= 0; --n) {
            if (Tiles::block_needs_mask(s_q, s_k, mb, n, causal)) {
              ASSERT_FALSE(seen_unmasked) << "s_q " << s_q << " s_k " << s_k << " mb " << mb;
              ++masked;
            } else {
              seen_unmasked = true;
            }
          }
          if (vl::row_key_limit(s_q, s_k, mb * M, causal) >= 0) EXPECT_LE(masked, causal ? (M + N - 1) / N + 1 : 1);
        }
}

TEST(Varlen, TileOrderIsABijectionLongestFirst) {
  for (bool reverse : {false, true}) {
    for (int blocks : {1, 2, 7, 32}) {
      const int heads = 3;
      std::set<std::pair<int, int>> seen;
      int prev_head = 0, prev_block = reverse ? blocks : -1;
      for (int local = 0; local < heads * blocks; ++local) {
        const vl::TileCoord c = vl::tile_coord(local, blocks, reverse);
        ASSERT_GE(c.head, 0);
        ASSERT_LT(c.head, heads);
        ASSERT_GE(c.block, 0);
        ASSERT_LT(c.block, blocks);
        ASSERT_TRUE(seen.insert({c.head, c.block}).second);
        if (c.head == prev_head) {
          if (reverse)
            ASSERT_LT(c.block, prev_block);  // the block with the most keys first
          else
            ASSERT_GT(c.block, prev_block);
        } else {
          ASSERT_EQ(c.head, prev_head + 1);  // heads in order: heads of one kv head are neighbours
        }
        prev_head = c.head;
        prev_block = c.block;
      }
      EXPECT_EQ(static_cast<int>(seen.size()), heads * blocks);
    }
  }
}

// The rows of each sequence under the walk's rule (varlen.h, next_row_end), sequentially.
std::vector<vl::RowRange> walked_rows(const std::vector<int>& cu, int total) {
  std::vector<vl::RowRange> rows;
  int end = vl::first_row_end(cu[0], total);
  for (size_t i = 0; i + 1 < cu.size(); ++i) {
    const int next = vl::next_row_end(end, cu[i + 1], total);
    rows.push_back({end, next - end});
    end = next;
  }
  return rows;
}

TEST(Varlen, WalkedRowsAreDisjointForAnyCumulativeLengths) {
  // Valid lengths: exactly [cu[i], cu[i + 1]).
  const std::vector<int> good = {0, 5, 5, 300, 301, 1000};
  std::vector<vl::RowRange> r = walked_rows(good, 1000);
  for (size_t i = 0; i < r.size(); ++i) {
    EXPECT_EQ(r[i].begin, good[i]);
    EXPECT_EQ(r[i].len, good[i + 1] - good[i]);
  }
  // Garbage: negative, decreasing, past the tensor. Sequences stay disjoint, in order, inside [0, total).
  const std::vector<int> bad = {-50, 40, 10, 900, 2000000000, -3, 1200, 700};
  r = walked_rows(bad, 1000);
  int end = 0;
  for (const vl::RowRange& x : r) {
    EXPECT_GE(x.len, 0);
    EXPECT_EQ(x.begin, end);
    end = x.begin + x.len;
    EXPECT_LE(end, 1000);
  }
  EXPECT_EQ(r[0].begin, 0);
  EXPECT_EQ(r[0].len, 40);
  EXPECT_EQ(r[1].len, 0);    // 10 < 40: empty
  EXPECT_EQ(r[2].len, 860);  // up to 900
  EXPECT_EQ(r[3].len, 100);  // clamped to the tensor
  EXPECT_EQ(r[4].len, 0);
}

// The host model of the scheduling warp's walk (common/varlen_walk.cuh, TileWalk::find) for the forward's tiles: tile
// t of the call is tile t - first(i) of the sequence i whose tiles [first(i), first(i) + tiles(i)) contain t,
// sequences in order, empty ones skipped. Checks that every (sequence, head, query block) with a row is produced
// exactly once for a batch with empty sequences and out-of-order and out-of-range cumulative lengths across several
// 32-sequence windows, and that the count stays within the host's bound (which sizes the grid and guards the tile
// numbers against overflow).
TEST(Varlen, CallTileWalkCoversEverySequenceOnce) {
  using Tiles = kernels::mha_prefill::Tiles;
  std::vector<int> cu = {0};
  const int lens[] = {0, 1, 63, 64, 65, 127, 128, 129, 1000, 0, 0, 4097, 5};
  for (int i = 0; i < 70; ++i) cu.push_back(cu.back() + lens[i % 13]);
  cu[40] = cu[39] - 3;               // a decreasing entry
  const int total = cu.back() - 10;  // the last sequence runs past the tensor
  const int h_q = 2, batch = static_cast<int>(cu.size()) - 1;
  const std::vector<vl::RowRange> rows = walked_rows(cu, total);
  std::vector<int64_t> first(batch + 1, 0);
  for (int b = 0; b < batch; ++b) first[b + 1] = first[b] + int64_t{h_q} * Tiles::num_m_blocks(rows[b].len);
  std::set<std::tuple<int, int, int>> produced;
  for (int64_t t = 0; t < first[batch]; ++t) {
    int seq = 0;
    while (first[seq + 1] <= t) ++seq;
    const vl::TileCoord c = vl::tile_coord(static_cast<int>(t - first[seq]), Tiles::num_m_blocks(rows[seq].len), true);
    ASSERT_TRUE(produced.insert({seq, c.head, c.block}).second);
    ASSERT_LT(c.block * kernels::mha_prefill::kBlockM, rows[seq].len);
    ASSERT_LE(rows[seq].begin + rows[seq].len, total);
  }
  int64_t expected = 0;
  for (int b = 0; b < batch; ++b) expected += h_q * Tiles::num_m_blocks(rows[b].len);
  EXPECT_EQ(static_cast<int64_t>(produced.size()), expected);
  EXPECT_LE(expected, heuristics::mha_prefill_max_tiles(batch, total, h_q, 0));
}

}  // namespace
}  // namespace openmla
