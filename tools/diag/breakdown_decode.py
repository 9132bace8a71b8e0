"""Question: how long does each kernel of one decode call take, and what gaps lie between them?

Per-kernel breakdown of one decode call, from the CUDA activity trace (torch.profiler / CUPTI).

For each case the call runs eagerly `--reps` times with the benchmark's L2 flush before each call (`--flush read`
and `--flush none` replace it by a 256 MB read or by nothing, `--gap-us` idles the GPU between flush and call); the
profiler records every kernel's start and end on the GPU. Printed per case, as medians over the
calls: each kernel's duration, the gap between consecutive kernels of the call, and the span from the
first kernel's start to the last kernel's end (the part of the call the GPU sees; the benchmark's graph
replay adds the launch of the first node).

    PYTHONPATH=python python3 tools/diag/breakdown_decode.py --sparse "b=2,topk=2048" "b=2,topk=64" --dense "b=128,s_q=2,s_k=4096"

Case strings are comma-separated key=value pairs over b, s_q, h_q, topk, s_k (sparse) and b, s_q, h_q, s_k
(dense); missing keys take the benchmark's defaults. Inputs come from the benchmarks' own generators.
"""
import argparse
import json
import os
import statistics
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tools/diag/ -> the repository
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

SPARSE_DEFAULTS = dict(b=2, s_q=2, h_q=128, topk=2048, s_k=32768)
DENSE_DEFAULTS = dict(b=128, s_q=1, h_q=128, s_k=4096)


def parse_case(text, defaults):
    case = dict(defaults)
    for part in filter(None, text.split(",")):
        key, value = part.split("=")
        if key not in defaults:
            raise SystemExit(f"unknown key {key!r} in case {text!r} (known: {sorted(defaults)})")
        case[key] = int(value)
    return case


def sparse_call(case):
    import bench_sparse_decode as bsd
    import openmla

    q, k_cache, indices, sink, _, _ = bsd.make_inputs(case["b"], case["s_q"], case["h_q"], case["topk"], case["s_k"])
    meta, _ = openmla.get_mla_metadata()

    def call():
        return openmla.flash_mla_with_kvcache(q, k_cache, None, None, 512, meta, is_fp8_kvcache=True,
                                              indices=indices, attn_sink=sink)
    return call


def dense_call(case, contiguous_pages=False):
    import torch

    import bench_dense_decode as bdd
    import openmla

    randperm = torch.randperm
    if contiguous_pages:  # diagnostic: pages in order instead of the benchmark's random permutation
        torch.randperm = lambda n, generator=None, **kw: torch.arange(n, **kw)
    try:
        q, blocked_k, block_table, cache_seqlens, _ = bdd.make_inputs(case["b"], case["s_q"], case["h_q"], 1,
                                                                      case["s_k"], varlen=True)
    finally:
        torch.randperm = randperm
    meta, _ = openmla.get_mla_metadata()

    def call():
        return openmla.flash_mla_with_kvcache(q, blocked_k, block_table, cache_seqlens, 512, meta, causal=False)
    return call


def profile(call, reps, flush_mode="zero", gap_us=0.0):
    """flush_mode: "zero" (the benchmark's: the 8 GB memset, which leaves the L2 full of dirty lines), "read" (a
    256 MB read instead, which evicts our data and leaves clean lines), "none". gap_us: a sleep kernel of about that
    long between the flush and the call (to see what the memset's aftermath costs the call)."""
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as tprofile

    import harness

    flush = harness.flush_buffer()  # the benchmark's flush (size and "chill time" included)
    reader = torch.ones(64 << 20, dtype=torch.int32, device="cuda") if flush_mode == "read" else None
    clock_hz = torch.cuda.get_device_properties(0).clock_rate * 1e3  # kHz -> Hz (the SM clock the sleep counts)
    for _ in range(3):  # warm-up, and the schedule is planned on first use
        call()
    torch.cuda.synchronize()
    with tprofile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            if flush_mode == "zero":
                flush.zero_()
            elif flush_mode == "read":
                torch.amax(reader)
            if gap_us > 0:
                torch.cuda._sleep(int(gap_us * 1e-6 * clock_hz))
            elif flush_mode == "none":
                torch.cuda._sleep(1)  # a kernel between calls: the report splits the stream at it
            call()
        torch.cuda.synchronize()
    path = os.path.join(tempfile.mkdtemp(), "trace.json")
    prof.export_chrome_trace(path)
    events = json.load(open(path))["traceEvents"]
    kernels = sorted((e for e in events if e.get("cat") == "kernel"), key=lambda e: e["ts"])
    # Split the kernel stream into calls at each flush kernel (the fill kernel of flush.zero_()).
    calls, cur = [], None
    for e in kernels:
        name = e["name"]
        if "openmla" not in name and "decode" not in name and "combine" not in name:
            if cur:
                calls.append(cur)
            cur = []
            continue
        if cur is not None:
            cur.append(e)
    if cur:
        calls.append(cur)
    return [c for c in calls if c]


def short(name):
    for key in ("sparse_decode_kernel", "dense_decode_kernel", "combine_kernel", "decode_scheduler_kernel"):
        if key in name:
            return key
    return name[:40]


def report(label, calls):
    if not calls:
        print(f"{label}: no kernels recorded")
        return
    n = len(calls[0])
    calls = [c for c in calls if len(c) == n]
    names = [short(e["name"]) for e in calls[0]]
    print(f"\n{label}: {len(calls)} calls, kernels per call: {' -> '.join(names)}")
    for i, name in enumerate(names):
        d = [c[i]["dur"] for c in calls]
        print(f"  {name:26s} median {statistics.median(d):8.2f} us   min {min(d):8.2f}   max {max(d):8.2f}")
        if i + 1 < n:
            g = [c[i + 1]["ts"] - (c[i]["ts"] + c[i]["dur"]) for c in calls]
            print(f"  {'  gap to next':26s} median {statistics.median(g):8.2f} us   (negative: overlapped by PDL)")
    span = [c[-1]["ts"] + c[-1]["dur"] - c[0]["ts"] for c in calls]
    print(f"  {'span first start..last end':26s} median {statistics.median(span):8.2f} us")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sparse", nargs="*", default=[], help="sparse FP8 (V3.2, sink on) cases")
    ap.add_argument("--dense", nargs="*", default=[], help="dense BF16 cases")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--flush", choices=["zero", "read", "none"], default="zero",
                    help="before each call: the benchmark's 8 GB memset (zero), a 256 MB read (read), or nothing")
    ap.add_argument("--gap-us", type=float, default=0.0, help="sleep this long between the flush and the call")
    ap.add_argument("--contiguous-pages", action="store_true",
                    help="dense: also time each case with its pages in order (not the benchmark's random permutation)")
    args = ap.parse_args()
    tag = lambda case: ",".join(f"{k}={v}" for k, v in case.items()) + f" flush={args.flush} gap={args.gap_us:g}us"
    run = lambda call: profile(call, args.reps, args.flush, args.gap_us)
    for text in args.sparse:
        case = parse_case(text, SPARSE_DEFAULTS)
        report("sparse " + tag(case), run(sparse_call(case)))
    for text in args.dense:
        case = parse_case(text, DENSE_DEFAULTS)
        report("dense " + tag(case), run(dense_call(case)))
        if args.contiguous_pages:
            report("dense, pages in order, " + tag(case), run(dense_call(case, contiguous_pages=True)))


if __name__ == "__main__":
    main()
