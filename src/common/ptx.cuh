// Thin wrappers over the sm_90a PTX the kernels use: mbarriers, TMA, wgmma bookkeeping, named barriers,
// proxy fences, fast math and programmatic dependent launch. Each wrapper is one instruction (or a tiny
// fixed sequence) so the kernels read like the algorithm, and the PTX can be checked against the ISA.
#pragma once

#include <cuda.h>  // CUtensorMap (type only; no driver library is linked)
#include <cstdint>

#include "common/wgmma_ops.cuh"

namespace openmla::ptx {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ---------------------------------------------------------------------------------------------------
// mbarrier
// ---------------------------------------------------------------------------------------------------
__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t arrive_count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(arrive_count) : "memory");
}

// Makes mbarrier.init visible to the async proxy (TMA) and the other threads.
__device__ __forceinline__ void fence_mbarrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
}

// Plain arrival (release semantics at CTA scope: this thread's earlier memory accesses, reads included,
// happen before anything a thread does after observing the phase complete).
__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}

__device__ __forceinline__ bool mbarrier_try_wait_parity(uint64_t* bar, uint32_t parity) {
  uint32_t ok;
  asm volatile(
      "{\n.reg .pred p;\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(ok)
      : "r"(smem_addr(bar)), "r"(parity)
      : "memory");
  return ok != 0;
}

// Blocks until the phase with the given parity has completed.
__device__ __forceinline__ void mbarrier_wait_parity(uint64_t* bar, uint32_t parity) {
  while (!mbarrier_try_wait_parity(bar, parity)) {
  }
}

// Arrival on the barrier at `remote_bar`, an address in a peer CTA's shared memory (see map_to_peer). Release
// at CTA scope, as CUTLASS's cluster pipelines do: the .cluster-scope forms compile to MEMBAR.ALL.GPU before
// the arrive (and acquire.cluster waits to an L1 invalidation after it), which cost the sparse kernel ~20 % on
// its h_q = 128 rows (docs/sparse-decode.md, decision sparse-v5). Cross-CTA data hand-offs go through st.async /
// TMA complete_tx instead.
__device__ __forceinline__ void mbarrier_arrive_remote(uint32_t remote_bar) {
  asm volatile("mbarrier.arrive.release.cta.shared::cluster.b64 _, [%0];" ::"r"(remote_bar) : "memory");
}

// ---------------------------------------------------------------------------------------------------
// Clusters and distributed shared memory
// ---------------------------------------------------------------------------------------------------
__device__ __forceinline__ uint32_t cluster_cta_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
// The shared::cluster address of the same byte in CTA `rank` of the cluster.
__device__ __forceinline__ uint32_t map_to_peer(uint32_t local_smem_addr, uint32_t rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(local_smem_addr), "r"(rank));
  return r;
}
__device__ __forceinline__ void st_shared_v4(uint32_t addr, uint4 v) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}
__device__ __forceinline__ void st_shared_u32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.u32 [%0], %1;" ::"r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ void st_cluster_v4(uint32_t addr, uint4 v) {
  asm volatile("st.shared::cluster.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(v.x), "r"(v.y), "r"(v.z),
               "r"(v.w)
               : "memory");
}
// Asynchronous stores into a peer CTA's shared memory that complete their byte count on the peer's mbarrier
// (`remote_bar`, also a shared::cluster address); the completion has release semantics at cluster scope, so
// no fence is needed on the writer's side.
__device__ __forceinline__ void st_async_v4(uint32_t remote_addr, uint4 v, uint32_t remote_bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, [%5];" ::"r"(
                   remote_addr),
               "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w), "r"(remote_bar)
               : "memory");
}
__device__ __forceinline__ void st_async_b32(uint32_t remote_addr, uint32_t v, uint32_t remote_bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];" ::"r"(remote_addr), "r"(v),
               "r"(remote_bar)
               : "memory");
}
// Every thread of every CTA of the cluster arrives, then waits (release / acquire).
// Bulk copy (TMA engine) of `bytes` (multiple of 16, 16-byte aligned) from our shared memory to a peer CTA's,
// completing the bytes on the peer's transaction mbarrier `remote_bar` (both shared::cluster addresses). The
// source must be made visible to the async proxy first (fence.proxy.async by every writer, then a barrier).
__device__ __forceinline__ void bulk_copy_to_peer(uint32_t remote_dst, uint32_t local_src, uint32_t bytes,
                                                  uint32_t remote_bar) {
  asm volatile("cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               ::"r"(remote_dst), "r"(local_src), "r"(bytes), "r"(remote_bar) : "memory");
}

__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
// The same barrier for a thread with nothing to publish: its arrival does not wait for its own outstanding
// memory operations (a release arrival waits for earlier loads still in flight).
__device__ __forceinline__ void cluster_sync_relaxed_arrive() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// Orders this thread's generic-proxy writes to shared memory (own CTA and peers) before later async-proxy
// (wgmma) reads of them by whoever synchronises with this thread afterwards.
__device__ __forceinline__ void fence_proxy_async_all() { asm volatile("fence.proxy.async;" ::: "memory"); }

// Warpgroup-wide register reallocation (all 128 threads execute it).
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kRegs));
}

// Read-only 16- and 8-byte global loads for the sparse gathers (4 threads read 64 contiguous bytes of a token per
// instruction, so two instructions share each 128-byte line): allocated in L1 with evict_last, 128-byte L2 prefetch
// (256 bytes read 0.2-0.9 % slower; docs/sparse-decode.md, decision sparse-v29). L1::no_allocate was 7-14 %
// slower on every sparse row (decision sparse-v27; tools/diag/micro/head_gather_bench.cu: a 64-token gather
// 2.2 -> 1.3 us with the L2 warm), presumably because each half line then went to L2 on its own.
__device__ __forceinline__ uint4 ld_nc_v4(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::evict_last.L2::128B.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}
__device__ __forceinline__ uint2 ld_nc_v2(const void* p) {
  uint2 v;
  asm volatile("ld.global.nc.L1::evict_last.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}

// ---------------------------------------------------------------------------------------------------
// TMA (bulk tensor copies)
// ---------------------------------------------------------------------------------------------------
__device__ __forceinline__ void prefetch_tensormap(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

__device__ __forceinline__ uint64_t make_l2_evict_last_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

__device__ __forceinline__ uint64_t make_l2_evict_first_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

// 5-D tiled load global -> shared, completing `bytes` on `bar`, with an L2 cache policy.
__device__ __forceinline__ void tma_load_5d(void* smem_dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1,
                                            int c2, int c3, int c4, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%2, %3, %4, %5, %6}], [%7], %8;" ::"r"(smem_addr(smem_dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4), "r"(smem_addr(bar)),
      "l"(policy)
      : "memory");
}

// 4-D tiled load global -> shared, completing `bytes` on `bar` (no cache policy).
__device__ __forceinline__ void tma_load_4d(void* smem_dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1,
                                            int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}],"
      " [%6];" ::"r"(smem_addr(smem_dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(smem_addr(bar))
      : "memory");
}

// 4-D tiled load global -> shared, completing `bytes` on `bar`, with an L2 cache policy.
__device__ __forceinline__ void tma_load_4d(void* smem_dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1,
                                            int c2, int c3, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%2, %3, %4, %5}], [%6], %7;" ::"r"(smem_addr(smem_dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(smem_addr(bar)), "l"(policy)
      : "memory");
}

// Streaming (.cs: written once, not read again soon) global stores of 16 bytes and of one float.
__device__ __forceinline__ void st_global_cs(void* dst, uint4 v) {
  asm volatile("st.global.cs.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(dst), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}
__device__ __forceinline__ void st_global_cs(float* dst, float v) {
  asm volatile("st.global.cs.f32 [%0], %1;" ::"l"(dst), "f"(v) : "memory");
}

// Pulls the box at the given coordinates of a tensor map into L2 (no shared memory, no barrier). Coordinates
// outside the tensor are ignored by the TMA unit.
__device__ __forceinline__ void tma_prefetch_l2_5d(const CUtensorMap* map, int c0, int c1, int c2, int c3, int c4) {
  asm volatile("cp.async.bulk.prefetch.tensor.5d.L2.global.tile [%0, {%1, %2, %3, %4, %5}];" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4)
               : "memory");
}

// Bulk copy shared -> global by the TMA engine (16-byte aligned, size a multiple of 16), in this thread's bulk
// async-group; bulk_wait_group_read0 returns once every committed group has finished READING shared memory
// (the global writes complete on their own; kernel completion makes them visible to the next grid).
__device__ __forceinline__ void bulk_store_global(void* gmem_dst, uint32_t smem_src, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(gmem_dst), "r"(smem_src),
               "r"(bytes)
               : "memory");
}
// 5-D tiled store shared -> global by the TMA engine, in this thread's bulk async-group (bulk_commit_group, then
// bulk_wait_group_read0 before the shared memory is rewritten). Elements outside the map's bounds are not written.
__device__ __forceinline__ void tma_store_5d(const CUtensorMap* map, uint32_t smem_src, int c0, int c1, int c2, int c3,
                                             int c4) {
  asm volatile("cp.async.bulk.tensor.5d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5, %6}], [%1];" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(smem_src), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4)
               : "memory");
}
__device__ __forceinline__ void bulk_commit_group() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
__device__ __forceinline__ void bulk_wait_group_read0() { asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory"); }
// Waits until every committed bulk group of this thread has COMPLETED (its global writes performed), not only
// read shared memory: needed before this thread publishes those writes to other CTAs.
__device__ __forceinline__ void bulk_wait_group0() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }
// Bulk copy global -> shared by the TMA engine (16-byte aligned, size a multiple of 16), completing `bytes` on the
// transaction mbarrier `bar` of this CTA.
__device__ __forceinline__ void bulk_load_shared(uint32_t smem_dst, const void* gmem_src, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(smem_dst),
               "l"(gmem_src), "r"(bytes), "r"(smem_addr(bar))
               : "memory");
}

// Bulk reduction shared -> global by the TMA engine: gmem[i] += smem[i] for `bytes` / 4 fp32 values (16-byte aligned,
// size a multiple of 16), in this thread's bulk async-group (commit, then wait_group.read before the shared memory is
// rewritten, wait_group before the sums are published to other CTAs). Each element's add is atomic; the order of
// adds from different CTAs is not fixed.
__device__ __forceinline__ void bulk_reduce_add_f32(void* gmem_dst, uint32_t smem_src, uint32_t bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;" ::"l"(gmem_dst),
               "r"(smem_src), "r"(bytes)
               : "memory");
}

// ---------------------------------------------------------------------------------------------------
// Inter-CTA publication through global memory (split-KV merge counters)
// ---------------------------------------------------------------------------------------------------
// Orders this thread's async-proxy accesses of global memory (bulk copies) with its generic-proxy ones: after a
// bulk store completed (bulk_wait_group0) and before a release that publishes it; after an acquire and before
// bulk loads of what it published.
__device__ __forceinline__ void fence_proxy_async_global() { asm volatile("fence.proxy.async.global;" ::: "memory"); }
__device__ __forceinline__ int ld_acquire_gpu(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
// Returns the old value; acquire-release at GPU scope.
// Relaxed atomic add (gpu scope) of `v` at `p + off` whose old value the caller reads later. ptxas turns an atomic add
// at an address it can prove warp-uniform into a warp-aggregated one (vote, elect, ATOMG, then a SHFL of the result
// that waits for the atomic at once); an offset it cannot prove uniform (the caller passes one read from shared
// memory) keeps the plain ATOMG, whose result is waited for only where it is used.
__device__ __forceinline__ int atomic_add_relaxed_gpu(int* p, int off, int v) {
  int old;
  asm volatile("atom.relaxed.gpu.global.add.s32 %0, [%1], %2;" : "=r"(old) : "l"(p + off), "r"(v) : "memory");
  return old;
}
__device__ __forceinline__ int atomic_add_acq_rel_gpu(int* p, int v) {
  int old;
  asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}
__device__ __forceinline__ void fence_acq_rel_gpu() { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }

// Diagnostics (trace builds): the GPU-wide nanosecond clock (one time base for all SMs) and the CTA's linear id.
__device__ __forceinline__ unsigned long long globaltimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ unsigned linear_cta_id() { return blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z); }

// ---------------------------------------------------------------------------------------------------
// Fences and barriers
// ---------------------------------------------------------------------------------------------------
// Orders this thread's generic-proxy shared-memory writes before later async-proxy (wgmma/TMA) accesses.
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// Consumer side of a hand-off of shared memory written in the generic proxy by other threads (cp.async, st.shared)
// and released through an mbarrier this thread has just waited on: orders those writes before this thread's later
// async-proxy reads (wgmma, TMA stores). The uni-directional acquire form, restricted to synchronisation through
// shared memory, which the PTX ISA provides for this pattern (8.6+); on sm_90a it compiles to no instruction,
// where the bidirectional fence_proxy_async_shared is MEMBAR.ALL.CTA + FENCE.VIEW.ASYNC.S.
__device__ __forceinline__ void fence_proxy_async_acquire_shared() {
  asm volatile("fence.proxy.async::generic.acquire.sync_restrict::shared::cluster.cluster;" ::: "memory");
}

// Non-aligned form: the participating warps may reach it from different code (e.g. two warpgroup roles).
__device__ __forceinline__ void named_barrier_sync_unaligned(int id, int threads) {
  asm volatile("barrier.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}


// Stores four 8 x 8 b16 matrices: lane l gives the address of row l % 8 of matrix l / 8 (16 contiguous bytes);
// register k holds this lane's pair of matrix k (row lane / 4, columns 2 (lane % 4) + {0, 1}), which is the pair of
// a wgmma accumulator fragment.
__device__ __forceinline__ void stmatrix_x4(uint32_t smem_dst, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(smem_dst), "r"(r0), "r"(r1),
               "r"(r2), "r"(r3)
               : "memory");
}

// ---------------------------------------------------------------------------------------------------
// wgmma bookkeeping
// ---------------------------------------------------------------------------------------------------
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(kPending) : "memory");
}

// Keeps the compiler from moving accumulator reads/writes across wgmma issue/wait points.
template <int N>
__device__ __forceinline__ void fence_registers(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
// The same for the A fragments of a register-A wgmma (kept alive and unmoved until the wgmma completed).
template <int M, int N>
__device__ __forceinline__ void fence_registers(uint32_t (&r)[M][N]) {
#pragma unroll
  for (int i = 0; i < M; ++i)
#pragma unroll
    for (int j = 0; j < N; ++j) asm volatile("" : "+r"(r[i][j])::"memory");
}

// Launders a value through a mov ptxas cannot see through, so that what the kernel derives from it is recomputed
// where it is used instead of being hoisted out of the loop (and kept live, i.e. spilled, across it): wgmma
// descriptors built once per block from a laundered base (sparse decode), thread-index-derived addresses and
// fragment rows (sparse decode, sparse prefill). 64-bit and 32-bit forms.
__device__ __forceinline__ uint64_t launder(uint64_t x) {
  asm volatile("mov.b64 %0, %0;" : "+l"(x));
  return x;
}
__device__ __forceinline__ int launder32(int x) {
  asm volatile("mov.b32 %0, %0;" : "+r"(x));
  return x;
}

// Shared-memory matrix descriptor for wgmma (PTX ISA "Matrix Descriptor Format").
//   swizzle 128B (layout type 1); start/LBO/SBO are byte values, encoded >> 4.
__device__ __forceinline__ uint64_t make_smem_desc_sw128(uint32_t smem_byte_addr, uint32_t lbo_bytes,
                                                         uint32_t sbo_bytes) {
  uint64_t desc = 0;
  desc |= static_cast<uint64_t>((smem_byte_addr & 0x3FFFF) >> 4);
  desc |= static_cast<uint64_t>((lbo_bytes & 0x3FFFF) >> 4) << 16;
  desc |= static_cast<uint64_t>((sbo_bytes & 0x3FFFF) >> 4) << 32;
  desc |= static_cast<uint64_t>(1) << 62;
  return desc;
}

// ---------------------------------------------------------------------------------------------------
// Math
// ---------------------------------------------------------------------------------------------------
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// ---------------------------------------------------------------------------------------------------
// cp.async (16 bytes, zero-filled when src_bytes == 0)
// ---------------------------------------------------------------------------------------------------
__device__ __forceinline__ void cp_async_16(void* smem_dst, const void* gmem_src, uint32_t src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_addr(smem_dst)), "l"(gmem_src),
               "r"(src_bytes)
               : "memory");
}
// Arrives on `bar` once all of this thread's earlier cp.async copies have landed (the barrier's expected
// count includes this arrival: .noinc).
__device__ __forceinline__ void cp_async_mbarrier_arrive_noinc(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(smem_addr(bar)) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }

// ---------------------------------------------------------------------------------------------------
// Programmatic dependent launch
// ---------------------------------------------------------------------------------------------------
__device__ __forceinline__ void griddep_launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}
__device__ __forceinline__ void griddep_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

}  // namespace openmla::ptx
