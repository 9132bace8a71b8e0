#!/usr/bin/env python3
"""Question: is the sparse b = 2 call slowed by fetching its own code from DRAM after the benchmark's flush?

Diagnostic (docs/sparse-decode.md, "Where the time goes"): is the call slowed by fetching its code (and other
read-only state) from DRAM after the flush? The 8 GB memset evicts the kernels' instructions from
L2 as well as the data; under the head's DRAM load every new code line then costs a loaded-DRAM round trip, and
all SMs would wait for the same line (the timeline's GPU-wide 11.04 us event). Times the benchmark's b = 2 call
(CUDA events around the eager call, median of 40) after:

  flush        the benchmark's 8 GB memset;
  flush+tiny   the memset, then a small call of the same kernels (b = 1, s_k 4096: ~3 MB of cache, split, so
               the main kernel's partial path and the combine run): their code is in L2 again;
  flush+copy   the memset, then a device copy of 8 MB (control: DRAM / L2 traffic of the tiny call's size
               without running our code);
  flush+pg2M   the memset, then a read of one word per 2 MB of the KV cache (every large page's translation
               used once; 27 lines of L2): is the head waiting on page-table walks?
  flush+pg64K  the same with one word per 64 KB (the "flush+touch" mode of the earlier tools/diag_tlb_b2.py,
               which this script replaces);
  warm         right after the previous call (no memset).

If flush+tiny lands well below flush while flush+copy does not, the head waits on code fetches.

    PYTHONPATH=python:.deps/py python3 tools/diag/diag_code_b2.py
"""
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))


def main():
    import torch

    import bench_sparse_decode as bsd
    import openmla

    def make_call(b, s_k):
        q, k_cache, indices, sink, _, _ = bsd.make_inputs(b, 2, 128, 2048, s_k)
        meta, _ = openmla.get_mla_metadata()
        out = torch.empty((b, 2, 128, 512), dtype=torch.bfloat16, device="cuda")
        lse = torch.empty((b, 128, 2), dtype=torch.float32, device="cuda")

        def call():
            openmla.flash_mla_with_kvcache(q, k_cache, None, None, 512, meta, is_fp8_kvcache=True, indices=indices,
                                           attn_sink=sink, out=out, lse=lse)
        return call, k_cache

    call, k_cache = make_call(2, bsd.S_K)
    words = k_cache.view(torch.uint8).reshape(-1)
    touch = {m: torch.arange(0, words.numel(), stride, device="cuda") for m, stride in
             (("flush+pg2M", 2 << 20), ("flush+pg64K", 64 << 10))}
    sink_buf = torch.empty(words.numel() // (64 << 10) + 1, dtype=torch.uint8, device="cuda")
    tiny, _ = make_call(1, 4096)
    flush = torch.empty(8 << 30, dtype=torch.uint8, device="cuda")
    src = torch.empty(8 << 20, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    call()
    tiny()
    torch.cuda.synchronize()
    results = {}
    for mode in ("flush", "flush+tiny", "flush+copy", "flush+pg2M", "flush+pg64K", "warm") * 2:
        times = []
        for _ in range(40):
            if mode != "warm":
                flush.zero_()
            if mode == "flush+tiny":
                tiny()
            if mode == "flush+copy":
                dst.copy_(src)
            if mode in touch:
                idx = touch[mode]
                torch.index_select(words, 0, idx, out=sink_buf[:idx.numel()])
            if mode == "warm":
                call()
            # Keep the GPU busy while Python enqueues the timed call (else the events time the launch).
            torch.cuda._sleep(1_000_000)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            call()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1000.0)
        results.setdefault(mode, []).append(statistics.median(times))
    for mode, med in results.items():
        print(f"diag_code_b2 {mode:12s} median us per call (two passes): " + " / ".join(f"{m:.2f}" for m in med))


if __name__ == "__main__":
    main()
