#!/usr/bin/env python3
"""Diagnostic (perf-notes, session 6): is the sparse b = 2 call bound by the page-table walks of the freshly
flushed KV cache? Times the benchmark's b = 2 call (its inputs, CUDA events around the eager call, median of 50)
after three preparations:

  flush        the benchmark's 8 GB memset (L2 full of dirty lines, cold TLBs for the cache);
  flush+touch  the same memset, then a read of one 4-byte word per 64 KB of the cache (every page's translation
               cached again; 1/16384 of the cache's bytes in L2);
  warm         the call right after the previous call (no memset).

If flush+touch lands near warm, the head waits on address translation, not on DRAM bandwidth. (First run, H100,
session 6, before the warm mode kept the GPU busy while Python enqueued: flush 27.7 us, flush+touch 33.5 us: the
touch did not help; the warm figure of that run timed the launch and is void.)

    PYTHONPATH=python:.deps/py python3 tools/diag_tlb_b2.py
"""
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))


def main():
    import torch

    import bench_sparse_decode as bsd
    import openmla

    q, k_cache, indices, sink, _, _ = bsd.make_inputs(2, 2, 128, 2048, bsd.S_K)
    meta, _ = openmla.get_mla_metadata()
    out = torch.empty((2, 2, 128, 512), dtype=torch.bfloat16, device="cuda")
    lse = torch.empty((2, 128, 2), dtype=torch.float32, device="cuda")

    def call():
        openmla.flash_mla_with_kvcache(q, k_cache, None, None, 512, meta, is_fp8_kvcache=True, indices=indices,
                                       attn_sink=sink, out=out, lse=lse)

    flush = torch.empty(8 << 30, dtype=torch.uint8, device="cuda")
    words = k_cache.view(torch.uint8).reshape(-1)
    stride = 64 << 10
    touch_idx = torch.arange(0, words.numel(), stride, device="cuda")
    sink_buf = torch.empty(touch_idx.numel(), dtype=torch.uint8, device="cuda")
    call()
    torch.cuda.synchronize()
    results = {}
    for mode in ("flush", "flush+touch", "warm", "flush", "flush+touch", "warm"):
        times = []
        for _ in range(50):
            if mode != "warm":
                flush.zero_()
            if mode == "flush+touch":
                torch.index_select(words, 0, touch_idx, out=sink_buf)
            if mode == "warm":
                call()
                # Keep the GPU busy while Python enqueues the timed call (else the events time the launch).
                torch.cuda._sleep(2_000_000)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            call()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1000.0)
        results.setdefault(mode, []).append(statistics.median(times))
    print(f"cache {k_cache.numel() / 2**20:.1f} MiB, {touch_idx.numel()} words touched")
    for mode, med in results.items():
        print(f"{mode:12s} median us per call (two passes): " + " / ".join(f"{m:.2f}" for m in med))


if __name__ == "__main__":
    main()
