"""Question: how fast can this card read cache rows at random token indices, and so what can a gathering decode reach?

The sparse decode and the dense decode over small pages read whole token rows at scattered positions (V3.2 FP8 rows
of 656 bytes; bf16 rows of 1,152 bytes for dense pages of 1 token). The benchmarks state their speed as a fraction
of the copy ceiling (a sequential device-to-device copy), which a random gather may not reach at all. This measures
the gather itself, with nothing else in the kernel: a Triton kernel loads R rows at the given indices (16-byte loads,
all R rows in flight at once), XOR-reduces them and stores one row per program (written bytes negligible), timed by
CUDA events after a warm-up, median of --reps, the L2 flushed (a 256 MB memset) before every run.

Cases (bytes counted: rows x row bytes, reads only):
  sparse_v32_random   the sparse_decode benchmark's own indices (b = 128, s_q = 2, topk 2048, s_k 32768 varlen,
                      bench_sparse_decode.make_inputs): every (request, position) row's 2048 slots, -1 skipped
  sparse_v32_sorted   the same slots, sorted within each row (the locality a sorted top-k would give)
  sparse_v32_seq      the same number of rows, consecutive from row 0 (this kernel's sequential ceiling)
  dense_p1_random     bf16 576-dim rows (1,152 bytes) of page-1 caches: b = 128 requests x 4096 tokens, every token
                      its own random page (the decode_page_size benchmark's page-1 shape)
  dense_p1_seq        the same rows in order

Printed: GB/s, and the fraction of this run's copy ceiling (1 GiB copy, read + written bytes, as benchmarks/run.py
counts it: harness.measure_ceilings). Run on the GPU machine with the extension built (tools/gpu_check.sh), e.g.
    PYTHONPATH=python:benchmarks python3 tools/diag/gather_ceiling.py --json $OUT/gather_ceiling.json
"""
import argparse
import json
import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))


try:  # the GPU machine has Triton; elsewhere the script only prints why it cannot run
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None

if triton is not None:
    @triton.jit
    def _xor(a, b):
        return a ^ b

    @triton.jit
    def gather_rows(cache_ptr, idx_ptr, out_ptr, n_rows, ROW_WORDS: tl.constexpr, BLOCK_W: tl.constexpr,
                    ROWS: tl.constexpr):
        """ROWS rows of ROW_WORDS int32 words at idx (-1: skipped), all loads in flight at once, XOR-reduced."""
        pid = tl.program_id(0)
        rows = pid * ROWS + tl.arange(0, ROWS)
        live = rows < n_rows
        idx = tl.load(idx_ptr + rows, mask=live, other=-1)
        ok = live & (idx >= 0)
        base = tl.where(ok, idx, 0).to(tl.int64) * ROW_WORDS
        cols = tl.arange(0, BLOCK_W)
        v = tl.load(cache_ptr + base[:, None] + cols[None, :], mask=ok[:, None] & (cols[None, :] < ROW_WORDS),
                    other=0)
        tl.store(out_ptr + pid * BLOCK_W + cols, tl.reduce(v, 0, _xor))


def time_gather(torch, kernel, cache_words, idx, row_words, reps, rows_per_prog):
    block_w = triton.next_power_of_2(row_words)
    n = idx.numel()
    progs = triton.cdiv(n, rows_per_prog)
    out = torch.empty((progs, block_w), dtype=torch.int32, device="cuda")
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    times = []
    for i in range(reps + 2):
        flush.zero_()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        kernel[(progs,)](cache_words, idx, out, n, ROW_WORDS=row_words, BLOCK_W=block_w, ROWS=rows_per_prog,
                         num_warps=4)
        b.record()
        torch.cuda.synchronize()
        if i >= 2:
            times.append(a.elapsed_time(b) * 1e-3)
    rows = int((idx >= 0).sum())
    return statistics.median(times), rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--rows-per-prog", type=int, default=16)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if triton is None:
        print("gather_ceiling: Triton is not installed here (it runs on the GPU machine)")
        return 0
    import torch

    import bench_sparse_decode as bsd
    import harness

    kernel = gather_rows
    copy = harness.measure_ceilings()["copy_gbps"]  # the benchmarks' own ceiling
    results = []

    def report(name, t, rows, row_bytes):
        gbps = rows * row_bytes / t / 1e9
        results.append({"name": name, "time_us": t * 1e6, "rows": rows, "row_bytes": row_bytes, "gbps": gbps,
                        "pct_copy_ceiling": 100 * gbps / copy})
        print(f"{name:22s} {rows:9d} rows x {row_bytes:5d} B  {t * 1e6:9.1f} us  {gbps:7.0f} GB/s  "
              f"{100 * gbps / copy:5.1f} % of copy ({copy:.0f} GB/s)", flush=True)

    # Sparse V3.2: the benchmark's own cache and indices (656-byte rows; the cache as int32 words).
    _, k_cache, indices, _, _, _ = bsd.make_inputs(128, 2, 16, 2048, 32768)
    flat = k_cache.reshape(-1).view(torch.int32)
    row_words = 656 // 4
    idx = indices.reshape(-1).contiguous()
    t, rows = time_gather(torch, kernel, flat, idx, row_words, args.reps, args.rows_per_prog)
    report("sparse_v32_random", t, rows, 656)
    # Sorted within each (request, position) row; the invalid slots (-1) moved to the row's end first.
    big = 1 << 40
    srt = indices.reshape(indices.shape[0] * indices.shape[1], -1).to(torch.int64)
    srt = torch.sort(torch.where(srt < 0, torch.full_like(srt, big), srt), dim=1).values
    srt = torch.where(srt >= big, torch.full_like(srt, -1), srt).to(torch.int32).reshape(-1).contiguous()
    t, rows = time_gather(torch, kernel, flat, srt, row_words, args.reps, args.rows_per_prog)
    report("sparse_v32_sorted", t, rows, 656)
    seq = torch.arange(int((idx >= 0).sum()), dtype=torch.int32, device="cuda")
    t, rows = time_gather(torch, kernel, flat, seq, row_words, args.reps, args.rows_per_prog)
    report("sparse_v32_seq", t, rows, 656)
    del k_cache, indices, flat, idx, srt, seq

    # Dense bf16 rows of 1,152 bytes, page size 1: b = 128 x 4096 tokens, each its own random page.
    n_tok = 128 * 4096
    cache = torch.empty((n_tok, 576), dtype=torch.bfloat16, device="cuda").normal_()
    words = cache.view(torch.int32).reshape(-1)
    perm = torch.randperm(n_tok, device="cuda").to(torch.int32)
    t, rows = time_gather(torch, kernel, words, perm, 288, args.reps, args.rows_per_prog)
    report("dense_p1_random", t, rows, 1152)
    t, rows = time_gather(torch, kernel, words, torch.arange(n_tok, dtype=torch.int32, device="cuda"), 288,
                          args.reps, args.rows_per_prog)
    report("dense_p1_seq", t, rows, 1152)

    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "copy_gbps": copy, "cases": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
