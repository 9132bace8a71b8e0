// Sparse decode at few heads (h_q <= 32): the consumer warpgroups of sparse_decode_small_heads_kernel, with the GEMM
// operands swapped. Included by kernel.cuh only (it uses that file's helpers); not a header of its own.
//
// The default kernel gives its 64 wgmma rows to 64 heads: with 16 heads, 48 of them are zero rows whose Q K^T,
// softmax and P V cost as much as live ones, and whose Q and P tiles are read from shared memory all the same. Here
// the 64 rows are the block's 64 tokens and the heads are the N dimension (N = kSmallHeadsN = 32):
//   S^T (64 tokens x 32 heads) = K (64 x d_qk, the K buffer, K-major) . Q^T (the Q tile's first 32 rows, K-major)
//   O^T (512 dims x 32 heads) += V^T (the K buffer's V view, MN-major A) . P^T (32 heads x 64 tokens, K-major)
// so one block costs 36 m64n32k16 for S^T and 8 x 4 for O^T instead of 36 m64n64k16 and 2 x 4 m64n256k16. The
// softmax runs down the columns: each thread holds 2 tokens of 8 heads; the block's column maxima are reduced over the
// warp by shuffles and over WG0's four warps through shared memory (one named barrier per block); the row sums stay
// per-thread partials (every thread rescales its own by the same factor) and are reduced once, in the epilogue. The
// built kernel (kAllDims, kProducerWgs = 2) has WG0 as its only consumer (all 512 dims of O^T) and WG1 + WG2 as
// producers; the kAllDims = false path (WG0 dims 0-255, WG1 dims 256-511, one producer) is compiled only as that
// kernel's unreachable WG1 consumer branch: the variant that used it is not built (racecheck flagged its out_scale
// hand-over; docs/sparse-decode.md, "Few heads"). The buffers, the Q tiles and the schedule are the plain kernel's.
#pragma once

namespace openmla::kernels::sparse_decode {

inline constexpr int kSmallHeadsN = 32;  // heads per CTA (wgmma N); the launch plan sends h_q <= 32 here
// Two-producer variant: WG0, the only consumer, holds all of O^T (8 x 16 floats); WG1 and WG2 both produce.
inline constexpr int kRegsSmallHeadsConsumer = 232;
static_assert(kRegsSmallHeadsConsumer + 2 * Common::kRegsProducer <= 3 * Common::kLaunchRegs,
              "setmaxnreg only redistributes the CTA's registers");

// D(64 x 32, f32) (+)= A(64 x 16) . B(32 x 16), both from shared memory, bf16. kTransA = 1: A is MN-major (the V^T
// view of the K buffer); B is K-major.
template <int kTransA>
__device__ __forceinline__ void wgmma_m64n32k16_ss_bf16(float (&d)[16], uint64_t desc_a, uint64_t desc_b,
                                                        int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
      "%16, %17, p, 1, 1, %19, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(kTransA));
}

// Shared-memory scratch of the column reductions (floats): per K buffer, the four WG0 warps' column maxima of the
// block, then the four warps' partial row sums of the epilogue. It lives where the plan has an unused tile: V3.2's
// `p` tile (its P is in the RoPE tile), MODEL1's second P tile past the 32 rows P^T uses.
struct SmallHeadsScratch {
  static constexpr int kWarps = 4;
  static constexpr int kMaxFloats = 2 * kWarps * kSmallHeadsN;
  static constexpr int kFloats = kMaxFloats + kWarps * kSmallHeadsN;
  static constexpr int kPTileBytes = kSmallHeadsN * Common::kRowBytes;  // P^T: 32 rows (heads) x 64 tokens bf16
};

template <Layout L>
__device__ __forceinline__ float* small_heads_scratch(SharedStorage<L>& smem) {
  using S = SharedStorage<L>;
  static_assert(SmallHeadsScratch::kFloats * 4 <= Common::kTileBytes - SmallHeadsScratch::kPTileBytes,
                "the scratch fits the unused part of a P tile");
  if constexpr (S::kNumPBuffers == 1) return reinterpret_cast<float*>(smem.p[0]);
  else return reinterpret_cast<float*>(smem.p[S::kNumPBuffers - 1] + SmallHeadsScratch::kPTileBytes);
}

// WG0's four warps (NamedBarrier::kSmallHeadsWg0): the column maxima of a block, the row sums of the epilogue.
__device__ __forceinline__ void small_heads_wg0_barrier() {
  ptx::named_barrier_sync(static_cast<int>(NamedBarrier::kSmallHeadsWg0), Common::kWarpgroupThreads);
}

// The consumers of the few-heads kernel: kWg = 0 (S^T, softmax, O^T dims 0-255) or 1 (O^T dims 256-511); with kAllDims
// (the two-producer variant) WG0 alone, O^T over all 512 dims, and nothing is handed to WG1 (no scale, no out_scale). Fragment of
// an m64n32 accumulator (mma_tile.cuh, make_fragment): element j * 4 + i * 2 + e is row frag.row[i] (a token of S^T,
// a dim of O^T's 64-row block) and column 8 j + frag.col + e (a head); c = j * 2 + e numbers the thread's 8 heads.
template <Layout L, int kWg, bool kAllDims, typename InitSync>
__device__ __forceinline__ void consume_small_heads(const SparseDecodeParams& p, SharedStorage<L>& smem,
                                                    const DecodeScheduleRecord& rec, int tid, InitSync&& init_sync) {
  using T = Traits<L>;
  constexpr int wg = kWg;
  constexpr int kN = kSmallHeadsN;
  constexpr int kCols = kN / 4;  // heads per thread (8)
  constexpr int kMBlocks = T::kHeadDimV / (kAllDims ? 1 : 2) / 64;  // 64-dim row blocks of O^T per warpgroup
  static_assert(!kAllDims || kWg == 0, "one consumer: WG0");
  constexpr int kConsumerThreads = (kAllDims ? 1 : 2) * T::kWarpgroupThreads;
  // The consumers' own barrier (the first Q landed; the epilogue's scale): WG0 + WG1, or WG0 alone.
  auto consumers_sync = [] {
    if constexpr (kAllDims) small_heads_wg0_barrier();
    else consumer_barrier();
  };
  const int lane = tid % 32;
  const int warp = (tid % T::kWarpgroupThreads) / 32;
  const int s_idx = blockIdx.y;
  float* const scratch = small_heads_scratch<L>(smem);

  auto release_buffer = [&](int buf) {
    __syncwarp();
    if (lane == 0) {
#pragma unroll
      for (int half = wg == 0 ? 0 : 1; half < 2; ++half) ptx::mbarrier_arrive(&smem.free_[buf][half]);
    }
  };
  // The first Q tile as the plain kernel loads it (consume(): after the setup with host records, else before).
  auto load_first_q = [&] {
    load_q_tile<L>(p, smem, rec.begin_req, tid, kConsumerThreads);
    ptx::cp_async_commit();
  };
  const bool q_after_setup = p.uniform_blocks > 0;
  if (!q_after_setup) load_first_q();
  init_sync(true);
  if (q_after_setup) load_first_q();

  uint32_t it = 0;
  uint32_t q_gen = 0;
  for (int req = rec.begin_req; req <= rec.end_req; ++req) {
    RequestWork w = request_work<false>(p, rec, req, 0);
    item_split<false>(p, rec, req, w);
    const bool has_blocks = w.blk_end > w.blk_begin;
    const bool first_item = req == rec.begin_req;
    const bool last_item = req == rec.end_req;

    if (first_item) {
      ptx::cp_async_wait_all();
    } else if (wg == 0 && has_blocks) {
      ++q_gen;
      ptx::mbarrier_wait_parity(&smem.q_full, QRing::parity(q_gen - 1));
    }
    ptx::fence_proxy_async_shared();
    consumers_sync();

    float o[kMBlocks][16];
#pragma unroll
    for (int mb = 0; mb < kMBlocks; ++mb)
#pragma unroll
      for (int i = 0; i < 16; ++i) o[mb][i] = 0.f;
    float m_run[kCols], l_run[kCols];
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      m_run[c] = T::kMaxInit;
      l_run[c] = 0.f;
    }

    for (int blk = w.blk_begin; blk < w.blk_end; ++blk, ++it) {
      const int buf = KRing::slot(it);
      const uint32_t phase = KRing::parity(it);
      const Fragment frag = make_fragment(ptx::launder32(tid) % T::kWarpgroupThreads);
      uint8_t* p_tile = T::kPInRopeTile ? smem.k[buf] + Co::kGroupBytes : smem.p[T::kPInRopeTile ? 0 : buf];
      float a[kCols];
      if constexpr (wg == 0) {
        ptx::mbarrier_wait_parity(&smem.full[buf], phase);
        // S^T = K Q^T.
        float s[16];
        const uint64_t q_desc = ptx::launder(desc_k_major(smem.q[0]));
        const uint64_t k_desc = ptx::launder(desc_k_group(smem.k[buf]));
        const uint64_t r_desc =
            T::kNumTiles > Co::kGroupTiles ? ptx::launder(desc_k_major(smem.k[buf] + Co::kGroupBytes)) : 0;
        ptx::wgmma_fence();
#pragma unroll
        for (int t = 0; t < T::kNumTiles; ++t) {
#pragma unroll
          for (int kk = 0; kk < T::kTileCols / 16; ++kk) {
            const uint64_t kd = t < Co::kGroupTiles
                                    ? desc_advance(k_desc, (t / Co::kHalfTiles) * Co::kHalfBytes +
                                                               (t % Co::kHalfTiles) * Co::kSwizzleAtomBytes + kk * 32)
                                    : desc_advance(r_desc, (t - Co::kGroupTiles) * T::kTileBytes + kk * 32);
            wgmma_m64n32k16_ss_bf16<0>(s, kd, desc_advance(q_desc, t * T::kTileBytes + kk * 32), (t | kk) != 0);
          }
        }
        ptx::wgmma_commit();
        ptx::wgmma_wait<0>();
        ptx::fence_registers(s);
        if (blk == w.blk_end - 1) {  // the request's last Q K^T: its Q tile may be overwritten
          __syncwarp();
          if (lane == 0) ptx::mbarrier_arrive(&smem.q_free);
        }
        // Skipped slots (rows of S^T): -inf.
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          if (smem.valid[buf][frag.row[i]] == 0) {
#pragma unroll
            for (int j = 0; j < kN / 8; ++j) s[j * 4 + i * 2] = s[j * 4 + i * 2 + 1] = -INFINITY;
          }
        }
        // Column maxima: the thread's two tokens, the warp's 16 (lanes of one lane % 4), then WG0's 64.
        float mx[kCols];
#pragma unroll
        for (int j = 0; j < kN / 8; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e) mx[j * 2 + e] = fmaxf(s[j * 4 + e], s[j * 4 + 2 + e]);
#pragma unroll
        for (int off = 4; off < 32; off *= 2)
#pragma unroll
          for (int c = 0; c < kCols; ++c) mx[c] = fmaxf(mx[c], __shfl_xor_sync(0xffffffff, mx[c], off));
        float* red = scratch + buf * SmallHeadsScratch::kWarps * kN;
        if (lane < 4) {
#pragma unroll
          for (int j = 0; j < kN / 8; ++j)
            *reinterpret_cast<float2*>(red + warp * kN + j * 8 + frag.col) = make_float2(mx[j * 2], mx[j * 2 + 1]);
        }
        small_heads_wg0_barrier();
#pragma unroll
        for (int w2 = 0; w2 < SmallHeadsScratch::kWarps; ++w2) {
#pragma unroll
          for (int j = 0; j < kN / 8; ++j) {
            const float2 v = *reinterpret_cast<const float2*>(red + w2 * kN + j * 8 + frag.col);
            mx[j * 2] = fmaxf(mx[j * 2], v.x);
            mx[j * 2 + 1] = fmaxf(mx[j * 2 + 1], v.y);
          }
        }
#pragma unroll
        for (int c = 0; c < kCols; ++c) {
          const float m_new = softmax::new_max(m_run[c], mx[c], p.scale_log2);
          a[c] = softmax::rescale_factor(m_run[c], m_new);
          m_run[c] = m_new;
        }
        // P = 2^(s scale - m); per-thread partial row sums; P^T (bf16) to its tile: row = head, column = token.
#pragma unroll
        for (int j = 0; j < kN / 8; ++j) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int c = j * 2 + e;
            const float p0 = ptx::exp2_approx(fmaf(s[j * 4 + e], p.scale_log2, -m_run[c]));
            const float p1 = ptx::exp2_approx(fmaf(s[j * 4 + 2 + e], p.scale_log2, -m_run[c]));
            l_run[c] = l_run[c] * a[c] + (p0 + p1);
            const int head = j * 8 + frag.col + e;
            const float pv[2] = {p0, p1};
#pragma unroll
            for (int i = 0; i < 2; ++i) {
              const int tok = frag.row[i];
              *reinterpret_cast<__nv_bfloat16*>(p_tile + swizzled_chunk(head, tok >> 3) + (tok & 7) * 2) =
                  __float2bfloat16_rn(pv[i]);
            }
          }
        }
        if constexpr (!kAllDims) {
          // WG1 has read scale[buf] of block it - 2 (as in consume()).
          ptx::mbarrier_wait_parity(&smem.scale_free[buf], KRing::free_parity(it));
          if (warp == 0 && lane < 4) {
#pragma unroll
            for (int j = 0; j < kN / 8; ++j)
              *reinterpret_cast<float2*>(&smem.scale[buf][j * 8 + frag.col]) = make_float2(a[j * 2], a[j * 2 + 1]);
          }
        }
        ptx::fence_proxy_async_shared();
        ptx::mbarrier_arrive(&smem.p_ready[buf]);
        // Every WG0 thread's P^T stores are in before WG0's own wgmma reads the tile (unlike consume(), where P V_L
        // takes P from registers).
        ptx::mbarrier_wait_parity(&smem.p_ready[buf], phase);
      } else {
        ptx::mbarrier_wait_parity(&smem.p_ready[buf], phase);
        ptx::mbarrier_wait_parity(&smem.full[buf], phase);
#pragma unroll
        for (int j = 0; j < kN / 8; ++j) {
          const float2 v = *reinterpret_cast<const float2*>(&smem.scale[buf][j * 8 + frag.col]);
          a[j * 2] = v.x;
          a[j * 2 + 1] = v.y;
        }
        ptx::mbarrier_arrive(&smem.scale_free[buf]);  // every WG1 thread (each read its own columns)
      }
      // O^T = a O^T + V^T P^T over this warpgroup's 256 dims (V_L: WG0, V_R: WG1).
#pragma unroll
      for (int mb = 0; mb < kMBlocks; ++mb)
#pragma unroll
        for (int j = 0; j < kN / 8; ++j)
#pragma unroll
          for (int i = 0; i < 2; ++i)
#pragma unroll
            for (int e = 0; e < 2; ++e) o[mb][j * 4 + i * 2 + e] *= a[j * 2 + e];
      const uint64_t p_desc = ptx::launder(desc_k_major(p_tile));
      const uint64_t v_desc = ptx::launder(desc_v_group(smem.k[buf] + (kAllDims ? 0 : wg * Co::kHalfBytes)));
#pragma unroll
      for (int mb = 0; mb < kMBlocks; ++mb) ptx::fence_registers(o[mb]);  // the rescale before the fence
      ptx::wgmma_fence();
#pragma unroll
      for (int mb = 0; mb < kMBlocks; ++mb)
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)  // 16 tokens = two 8-token groups per step
          wgmma_m64n32k16_ss_bf16<1>(o[mb],
                                     desc_advance(v_desc, (mb / Co::kHalfTiles) * Co::kHalfBytes +
                                                              (mb % Co::kHalfTiles) * Co::kSwizzleAtomBytes +
                                                              kk * 2 * Co::kGroupStride),
                                     desc_advance(p_desc, kk * 32), 1);
      ptx::wgmma_commit();
      ptx::wgmma_wait<0>();
#pragma unroll
      for (int mb = 0; mb < kMBlocks; ++mb) ptx::fence_registers(o[mb]);
      release_buffer(buf);
    }

    // ---- epilogue: WG0 reduces the row sums over its warps and hands the output scale to WG1.
    if (wg == 0 && first_item && !has_blocks) {
      __syncwarp();
      if (lane == 0) ptx::mbarrier_arrive(&smem.q_free);
    }
    if (last_item) ptx::griddep_launch_dependents();
    const Fragment frag = make_fragment(ptx::launder32(tid) % T::kWarpgroupThreads);
    float total[kCols], inv_all[kCols];
#pragma unroll
    for (int c = 0; c < kCols; ++c) total[c] = inv_all[c] = 0.f;
    if (wg == 0) {
#pragma unroll
      for (int off = 4; off < 32; off *= 2)
#pragma unroll
        for (int c = 0; c < kCols; ++c) l_run[c] += __shfl_xor_sync(0xffffffff, l_run[c], off);
      float* red = scratch + SmallHeadsScratch::kMaxFloats;
      if (lane < 4) {
#pragma unroll
        for (int j = 0; j < kN / 8; ++j)
          *reinterpret_cast<float2*>(red + warp * kN + j * 8 + frag.col) = make_float2(l_run[j * 2], l_run[j * 2 + 1]);
      }
      small_heads_wg0_barrier();
#pragma unroll
      for (int w2 = 0; w2 < SmallHeadsScratch::kWarps; ++w2) {
#pragma unroll
        for (int j = 0; j < kN / 8; ++j) {
          const float2 v = *reinterpret_cast<const float2*>(red + w2 * kN + j * 8 + frag.col);
          total[j * 2] += v.x;
          total[j * 2 + 1] += v.y;
        }
      }
      if (kAllDims || (warp == 0 && lane < 4)) {
#pragma unroll
        for (int c = 0; c < kCols; ++c) {
          const int head = (c / 2) * 8 + frag.col + c % 2;
          float inv = 0.f;
          if (total[c] > 0.f) {
            float denom = total[c];
            // The sink joins the denominator only for final outputs (the combine applies it otherwise).
            if (!w.is_split && p.attn_sink != nullptr && head < p.h_q)
              denom += epilogue::sink_term(p.attn_sink[head], m_run[c]);
            inv = 1.f / denom;
          }
          if constexpr (kAllDims) inv_all[c] = inv;
          else smem.out_scale[head] = inv;
        }
      }
    }
    float inv[kCols];
    if constexpr (kAllDims) {
#pragma unroll
      for (int c = 0; c < kCols; ++c) inv[c] = inv_all[c];
    } else {
      consumer_barrier();
#pragma unroll
      for (int j = 0; j < kN / 8; ++j) {
        const float2 v = *reinterpret_cast<const float2*>(&smem.out_scale[j * 8 + frag.col]);
        inv[j * 2] = v.x;
        inv[j * 2 + 1] = v.y;
      }
    }
    const int col_base = kAllDims ? 0 : wg * (T::kHeadDimV / 2);
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      const int j = c / 2, e = c % 2;
      const int head = j * 8 + frag.col + e;
      if (head >= p.h_q) continue;
      if (!w.is_split) {
        auto* out = static_cast<__nv_bfloat16*>(p.output.out) + p.output.out_offset(req, s_idx, head) + col_base;
#pragma unroll
        for (int mb = 0; mb < kMBlocks; ++mb)
#pragma unroll
          for (int i = 0; i < 2; ++i)
            out[mb * 64 + frag.row[i]] = __float2bfloat16_rn(o[mb][j * 4 + i * 2 + e] * inv[c]);
      } else {
        const int64_t prow = (static_cast<int64_t>(w.split_slot) * p.s_q + s_idx) * p.h_q + head;
        float* po = p.partial_o + prow * T::kHeadDimV + col_base;
#pragma unroll
        for (int mb = 0; mb < kMBlocks; ++mb)
#pragma unroll
          for (int i = 0; i < 2; ++i) po[mb * 64 + frag.row[i]] = o[mb][j * 4 + i * 2 + e] * inv[c];
      }
      if (wg == 0 && warp == 0 && lane < 4) {
        const bool empty = epilogue::is_empty_row(total[c]);
        const float log2_sum = empty ? 0.f : epilogue::lse_log2(m_run[c], total[c]);
        if (!w.is_split)
          p.output.lse[p.output.lse_offset(req, s_idx, head)] = epilogue::final_lse(empty, log2_sum);
        else
          p.partial_lse[(static_cast<int64_t>(w.split_slot) * p.s_q + s_idx) * p.h_q + head] =
              empty ? -INFINITY : log2_sum;
      }
    }
  }
}

}  // namespace openmla::kernels::sparse_decode
