// Question: how long does the sparse-decode head's chain of dependent loads take on its own after the flush?
// Micro-benchmark (docs/sparse-decode.md, decision sparse-v27), after the benchmark's flush: 88 CTAs (one per SM,
// as b = 2) each read a schedule word, then one 64-slot index row, then gather the 64 tokens (656 bytes each,
// V3.2 layout) of that block from a 43 MB FP8 cache into registers.
// No shared-memory pipeline, no tensor work: only the chain of dependent loads that starts every CTA.
// Per-CTA %globaltimer stamps (entry, index landed, first token landed, all tokens landed) give the times
// from the earliest entry; medians over 35 launches, after the benchmark's 8 GB memset and warm. CTAs of 384
// threads (the kernel's shape): 128 gather (4 threads per token, 2 rounds of 32 tokens: the plain producer).
//   gathers (kMode): 0 = ld.global.nc.L1::no_allocate.L2::256B (the kernel's before sparse v27),
//            1 = ld.global.nc.L1::evict_last.L2::256B, 2 = plain ld.global
//   span:    tokens drawn from the whole 43 MB cache, or from its first 2.6 MB
//   kRecords: the record from the parameter bank by dynamic index (as the kernel), not a global word
//   kBloat:  ~16 KB / 64 KB of straight-line code run once after the gathers (cold code after the flush)
//   kExtra:  the kernel's other head traffic (Q tile by the other 256 threads, next index rows and the L2 prefetch
//            two blocks ahead), or the block's tokens prefetched into L2 before the gathers
// Build: nvcc -O3 -arch=sm_90a -std=c++17 -o /tmp/hgb tools/diag/micro/head_gather_bench.cu && /tmp/hgb [smem bytes]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

constexpr int kTokenBytes = 656, kBlock = 64, kRows = 4, kTopk = 2048, kCtas = 88;

__device__ __forceinline__ uint64_t gtime() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

template <int kMode>
__device__ __forceinline__ uint4 gather16(const uint8_t* p) {
  uint4 v;
  if constexpr (kMode == 0) {
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  } else if constexpr (kMode == 1) {
    asm volatile("ld.global.nc.L1::evict_last.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  } else {
    asm volatile("ld.global.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  }
  return v;
}

// The kernel's parameter block, shaped like SparseDecodeParams: a flag, 160 packed records, pointers.
struct HeadParams {
  const int* sched;
  const int* indices;
  const uint8_t* cache;
  uint64_t* stamps;
  uint32_t* sink;
  const uint8_t* q;  // 8 Q tiles of 64 heads x 576 bf16 (kExtra & 1)
  int pad[58];
  int use_records;  // another line of the parameter bank
  uint64_t records[160];
};

// Straight-line code standing in for the dequantisation (kBloat x ~5 KB of distinct instructions, executed once).
template <int kBloat>
__device__ __forceinline__ uint32_t bloat(uint32_t x) {
  uint32_t a = x, b = x ^ 0x9e3779b9u, c = x + 7u, d = x * 3u;
#pragma unroll
  for (int i = 0; i < kBloat * 64; ++i) {
    a = a * (2u * i + 1u) + b;
    b = (b ^ (i * 0x01000193u)) + c;
    c = c + (d >> (i % 13 + 1));
    d = d * 0x2545f491u + static_cast<uint32_t>(i);
  }
  return a ^ b ^ c ^ d;
}

// stamps: per CTA 4 values (entry, index landed, first token landed, all landed (+ bloat code run)).
// kRecords: the record comes from the parameter bank (flag, then the record by dynamic index), as in the kernel.
// kExtra, the kernel's other head traffic: 1 = the other 256 threads load a 72 KB Q tile by 16-byte cp.async (11
// CTAs share each of 8 tiles), 2 = the producer threads also load the index rows of the next two blocks and prefetch
// the tokens of the block two ahead into L2 (prefetch.global.L2, 128 bytes each).
template <int kMode, bool kRecords, int kBloat, int kExtra = 0>
__global__ void __launch_bounds__(384, 1) head_kernel(const __grid_constant__ HeadParams p) {
  const uint64_t t0 = gtime();
  extern __shared__ __align__(1024) uint8_t qsm[];
  if (threadIdx.x >= 128) {
    if constexpr ((kExtra & 1) != 0) {
      const int tile = (blockIdx.x % 8);
      const uint8_t* src = p.q + static_cast<int64_t>(tile) * 64 * 1152;
      const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(qsm));
      for (int i = threadIdx.x - 128; i < 64 * 72; i += 256)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst + i * 16), "l"(src + i * 16) : "memory");
      asm volatile("cp.async.commit_group;\ncp.async.wait_all;" ::: "memory");
    }
    return;
  }
  const int* indices = p.indices;
  const uint8_t* cache = p.cache;
  const int t = threadIdx.x;
  const int cta = blockIdx.x;
  int word;
  if (kRecords && p.use_records) word = static_cast<int>(p.records[cta]);
  else word = p.sched[cta];  // the schedule record: (row, block)
  const int row = word & 0xffff, block = word >> 16;
  const int tok = t / 4, part = t % 4;  // 4 threads per token, 32 tokens per round
  const int* irow = indices + row * kTopk + block * kBlock;
  const int i0 = irow[tok], i1 = irow[32 + tok];
  int j0 = 0, j1 = 0;
  if constexpr ((kExtra & 2) != 0) {
    const int* irow1 = indices + row * kTopk + ((block + 1) % 32) * kBlock;
    const int* irow2 = indices + row * kTopk + ((block + 2) % 32) * kBlock;
    j0 = irow2[tok] + (irow1[tok] & 0);
    j1 = irow2[32 + tok] + (irow1[32 + tok] & 0);
  }
  uint64_t t1 = 0;
  if (t == 0) t1 = gtime() + (i0 & 0);  // index landed (i0 used)
  // 41 16-byte chunks per token: part p takes chunks p, p + 4, ... (11 or 10 each).
  if constexpr ((kExtra & 4) != 0) {  // both rounds' tokens into L2 first (no L1 line held while in flight)
    for (int k = part * 128; k < kTokenBytes; k += 512) {
      asm volatile("prefetch.global.L2 [%0];" ::"l"(cache + static_cast<int64_t>(i0) * kTokenBytes + k));
      asm volatile("prefetch.global.L2 [%0];" ::"l"(cache + static_cast<int64_t>(i1) * kTokenBytes + k));
    }
  }
  uint32_t acc = 0;
  uint64_t t2 = 0;
  uint4 a[11], b[11];
#pragma unroll
  for (int k = 0; k < 11; ++k) {
    const int c = part + 4 * k;
    if (c < 41) {
      a[k] = gather16<kMode>(cache + static_cast<int64_t>(i0) * kTokenBytes + c * 16);
      b[k] = gather16<kMode>(cache + static_cast<int64_t>(i1) * kTokenBytes + c * 16);
    }
  }
#pragma unroll
  for (int k = 0; k < 11; ++k) {
    const int c = part + 4 * k;
    if (c < 41) {
      acc += a[k].x ^ a[k].y ^ a[k].z ^ a[k].w;
      if (k == 0 && t == 0) t2 = gtime() + (acc & 0);
    }
  }
#pragma unroll
  for (int k = 0; k < 11; ++k) {
    const int c = part + 4 * k;
    if (c < 41) acc += b[k].x ^ b[k].y ^ b[k].z ^ b[k].w;
  }
  if constexpr (kBloat > 0) acc = bloat<kBloat>(acc);
  if constexpr ((kExtra & 2) != 0) {
    for (int k = part * 128; k < kTokenBytes; k += 512) {
      asm volatile("prefetch.global.L2 [%0];" ::"l"(cache + static_cast<int64_t>(j0) * kTokenBytes + k));
      asm volatile("prefetch.global.L2 [%0];" ::"l"(cache + static_cast<int64_t>(j1) * kTokenBytes + k));
    }
  }
  // All 128 threads' tokens landed.
  acc = __reduce_add_sync(0xffffffffu, acc);
  __shared__ uint32_t red[4];
  if (t % 32 == 0) red[t / 32] = acc;
  asm volatile("bar.sync 1, 128;" ::: "memory");
  if (t == 0) {
    const uint64_t t3 = gtime();
    p.sink[cta] = red[0] + red[1] + red[2] + red[3];
    p.stamps[cta * 4 + 0] = t0;
    p.stamps[cta * 4 + 1] = t1;
    p.stamps[cta * 4 + 2] = t2;
    p.stamps[cta * 4 + 3] = t3;
  }
}

int main(int argc, char** argv) {
  const int64_t cache_tokens = 65536;  // 43 MB
  uint8_t* cache;
  cudaMalloc(&cache, cache_tokens * kTokenBytes);
  cudaMemset(cache, 0x11, cache_tokens * kTokenBytes);
  int *indices_full, *indices_small, *sched;
  cudaMalloc(&indices_full, kRows * kTopk * sizeof(int));
  cudaMalloc(&indices_small, kRows * kTopk * sizeof(int));
  cudaMalloc(&sched, kCtas * sizeof(int));
  std::mt19937 rng(7);
  std::vector<int> h(kRows * kTopk), hs(kRows * kTopk), hsched(kCtas);
  for (int r = 0; r < kRows; ++r) {
    // Distinct tokens per row, as top-k selects.
    std::vector<int> perm(cache_tokens / 2);
    for (size_t i = 0; i < perm.size(); ++i) perm[i] = static_cast<int>(i);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int j = 0; j < kTopk; ++j) {
      h[r * kTopk + j] = (r / 2) * static_cast<int>(cache_tokens / 2) + perm[j];
      hs[r * kTopk + j] = j * 2 + (r & 1);  // the first 4096 tokens: 2.7 MB
    }
  }
  // b = 2: 22 partitions per (s, head tile) row pair; CTA c = (head tile, s) x partition: its first block.
  for (int c = 0; c < kCtas; ++c) {
    const int part = c / 4, s = (c / 2) % 2, req = part / 11;
    hsched[c] = (req * 2 + s) | (((part % 11) * 3 % 32) << 16);
  }
  cudaMemcpy(indices_full, h.data(), h.size() * sizeof(int), cudaMemcpyHostToDevice);
  cudaMemcpy(indices_small, hs.data(), hs.size() * sizeof(int), cudaMemcpyHostToDevice);
  cudaMemcpy(sched, hsched.data(), hsched.size() * sizeof(int), cudaMemcpyHostToDevice);
  uint64_t* stamps;
  uint32_t* sink;
  cudaMalloc(&stamps, kCtas * 4 * sizeof(uint64_t));
  cudaMalloc(&sink, kCtas * sizeof(uint32_t));
  uint8_t* flush;
  const size_t flush_bytes = size_t(8) << 30;
  if (cudaMalloc(&flush, flush_bytes) != cudaSuccess) { printf("no 8 GB flush buffer\n"); return 1; }
  // One CTA per SM, as the kernel. 200 KB already selects the 228 KB shared-memory carveout the kernel runs with
  // (231,424 B + 1 KB), so L1 is as small as the kernel's; larger sizes must leave room for the 16 static bytes.
  const int smem = argc > 1 ? atoi(argv[1]) : 200 * 1024;
  printf("dynamic shared memory %d B per CTA\n", smem);
  HeadParams hp{};
  hp.sched = sched;
  hp.cache = cache;
  hp.stamps = stamps;
  hp.sink = sink;
  hp.use_records = 1;
  for (int c = 0; c < kCtas; ++c) hp.records[c] = static_cast<uint64_t>(hsched[c]);
  std::vector<uint64_t> hst(kCtas * 4);
  // One launcher per (mode, records, bloat) instantiation.
  auto run = [&](auto kernel, const char* name, bool small, int flush_kind) {
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    hp.indices = small ? indices_small : indices_full;
    std::vector<double> idx, first, all, last;
    for (int rep = 0; rep < 40; ++rep) {
      if (flush_kind == 1) cudaMemsetAsync(flush, rep & 0xff, flush_bytes);
      kernel<<<kCtas, 384, smem>>>(hp);
      cudaMemcpy(hst.data(), stamps, hst.size() * sizeof(uint64_t), cudaMemcpyDeviceToHost);
      if (rep < 5) continue;
      uint64_t t0 = ~0ull;
      for (int c = 0; c < kCtas; ++c) t0 = std::min(t0, hst[c * 4]);
      std::vector<double> a, b, d;
      for (int c = 0; c < kCtas; ++c) {
        a.push_back((hst[c * 4 + 1] - t0) / 1e3);
        b.push_back((hst[c * 4 + 2] - t0) / 1e3);
        d.push_back((hst[c * 4 + 3] - t0) / 1e3);
      }
      std::sort(a.begin(), a.end()); std::sort(b.begin(), b.end()); std::sort(d.begin(), d.end());
      idx.push_back(a[kCtas / 2]); first.push_back(b[kCtas / 2]); all.push_back(d[kCtas / 2]); last.push_back(d.back());
    }
    auto med = [](std::vector<double> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; };
    printf("  %-26s %-6s %-6s index %5.2f  first token %5.2f  done (median CTA) %5.2f  last CTA %5.2f us\n", name,
           small ? "2.7MB" : "43MB", flush_kind ? "memset" : "warm", med(idx), med(first), med(all), med(last));
  };
  printf("sparse head micro-benchmark: %d CTAs, 64 tokens x 656 B each, stamps from the earliest CTA entry\n", kCtas);
  uint8_t* q;
  cudaMalloc(&q, 8 * 64 * 1152);
  cudaMemset(q, 0x3c, 8 * 64 * 1152);
  hp.q = q;
  for (int fk : {1, 0}) {
    run(head_kernel<1, false, 0, 0>, "evict_last", false, fk);
    run(head_kernel<1, false, 0, 1>, "evict_last + Q cp.async", false, fk);
    run(head_kernel<1, false, 0, 2>, "evict_last + idx/L2 prefetch", false, fk);
    run(head_kernel<1, false, 0, 3>, "evict_last + both", false, fk);
    run(head_kernel<1, true, 3, 3>, "+ records + 16 KB code", false, fk);
    run(head_kernel<0, false, 0, 0>, "no_allocate", false, fk);
    run(head_kernel<1, false, 0, 4>, "evict_last, L2 prefetch first", false, fk);
    run(head_kernel<1, false, 0, 5>, "evict_last, L2 pf first + Q", false, fk);
  }
  for (int fk : {1, 0}) {
    for (int small : {0, 1}) {
      run(head_kernel<0, false, 0>, "no_allocate", small, fk);
      run(head_kernel<1, false, 0>, "evict_last", small, fk);
      run(head_kernel<2, false, 0>, "plain ld", small, fk);
    }
    run(head_kernel<0, true, 0>, "no_allocate, param records", false, fk);
    run(head_kernel<0, false, 3>, "no_allocate, 16 KB code", false, fk);
    run(head_kernel<0, false, 12>, "no_allocate, 64 KB code", false, fk);
    run(head_kernel<0, true, 12>, "records + 64 KB code", false, fk);
  }
  cudaError_t err = cudaDeviceSynchronize();
  printf("status: %s\n", cudaGetErrorString(err));
  return 0;
}
