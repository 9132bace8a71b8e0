"""Question: where do the small-batch decode calls lose to FlashMLA's, kernel by kernel?

For each case (sparse V3.2 h_q 128 s_q 2 topk 2048 at small b; dense h_q 128 s_q 1 fixed 4K at small b), both our
call and FlashMLA's (when `flash_mla` is importable) run eagerly `--reps` times, each after the benchmark's 8 GB
memset; the CUDA activity trace (torch.profiler / CUPTI) gives every kernel's start and end. Printed per call kind,
as medians over the calls: each kernel's duration, the start of each kernel after the first's start, the gap between
the end of one kernel and the end of the next (the "tail"), and the span (first start .. last end: the benchmark's
time_us).

`--variants` lists NAME=ENV=VALUE[;ENV=VALUE] items timed after the base in the same process: environment variables
that a build under test reads at planning or launch time (the library itself reads none on these paths; session 19's
experiment build read OPENMLA_EXP_* ones: the schedule's payload, the combine's slices, occupancy and PDL). Each
variant gets a fresh schedule object, planned under its environment; its outputs are compared with the base's.

    PYTHONPATH=python python3 tools/diag/small_batch.py --preset rows
"""
import argparse
import json
import os
import statistics
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

SEPARATOR_TOKENS = ("elementwise", "fill", "memset", "sleep")


def sparse_calls(b):
    import bench_sparse_decode as bsd
    import openmla

    q, k_cache, indices, sink, _, _ = bsd.make_inputs(b, 2, 128, 2048, 32768)

    def ours():  # a fresh schedule object: planned by its first call, under the variant's environment
        meta, _ = openmla.get_mla_metadata()
        return lambda: openmla.flash_mla_with_kvcache(q, k_cache, None, None, 512, meta, is_fp8_kvcache=True,
                                                      indices=indices, attn_sink=sink)

    def peer(fm):
        sched, _ = fm.get_mla_metadata()
        return lambda: fm.flash_mla_with_kvcache(q, k_cache, None, None, 512, sched, is_fp8_kvcache=True,
                                                 indices=indices, attn_sink=sink)
    return ours, peer


def dense_calls(b, s_k=4096):
    import bench_dense_decode as bdd
    import openmla

    q, k_cache, block_table, seqlens, _ = bdd.make_inputs(b, 1, 128, 1, s_k, varlen=False)

    def ours():
        meta, _ = openmla.get_mla_metadata()
        return lambda: openmla.flash_mla_with_kvcache(q, k_cache, block_table, seqlens, 512, meta, causal=False)

    def peer(fm):
        sched, _ = fm.get_mla_metadata()
        return lambda: fm.flash_mla_with_kvcache(q, k_cache, block_table, seqlens, 512, sched, causal=False)
    return ours, peer


def per_batch(value, b):
    """"B:V|B:V" -> the V of this batch ("" when none); anything else as it is, with {b} replaced."""
    if "|" not in value and ":" not in value:
        return value.replace("{b}", str(b))
    table = dict(item.split(":", 1) for item in value.split("|") if item)
    return table.get(str(b), "")


def profile(call, reps):
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as tprofile

    import harness

    flush = harness.flush_buffer()
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    with tprofile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            flush.zero_()
            call()
        torch.cuda.synchronize()
    path = os.path.join(tempfile.mkdtemp(), "trace.json")
    prof.export_chrome_trace(path)
    events = json.load(open(path))["traceEvents"]
    kernels = sorted((e for e in events if e.get("cat") == "kernel"), key=lambda e: e["ts"])
    calls, cur = [], None
    for e in kernels:
        if any(t in e["name"].lower() for t in SEPARATOR_TOKENS):
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
    for key in ("sparse_decode_kernel", "dense_decode_kernel", "combine_kernel", "decode_scheduler_kernel",
                "flash_fwd_mla_combine_kernel", "flash_fwd_splitkv_mla_kernel", "sparse_attn_fwd_kernel"):
        if key in name:
            return key
    return name.split("(")[0][-48:]


def report(label, calls, out):
    if not calls:
        print(f"{label}: no kernels recorded", file=out)
        return None
    n = statistics.mode(len(c) for c in calls)
    calls = [c for c in calls if len(c) == n]
    names = [short(e["name"]) for e in calls[0]]
    med = lambda xs: statistics.median(xs)
    span = med([c[-1]["ts"] + c[-1]["dur"] - c[0]["ts"] for c in calls])
    print(f"{label}: {len(calls)} calls, span {span:7.2f} us; " + " -> ".join(names), file=out)
    for i, name in enumerate(names):
        d = med([c[i]["dur"] for c in calls])
        st = med([c[i]["ts"] - c[0]["ts"] for c in calls])
        line = f"    {name:32s} dur {d:7.2f}  start +{st:6.2f}"
        if i > 0:
            tail = med([(c[i]["ts"] + c[i]["dur"]) - (c[i - 1]["ts"] + c[i - 1]["dur"]) for c in calls])
            line += f"  end after previous end {tail:6.2f}"
        print(line, file=out)
    return span


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sparse", nargs="*", type=int, default=[])
    ap.add_argument("--dense", nargs="*", type=int, default=[])
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=2, help="base and variants alternate this many times")
    ap.add_argument("--variants", nargs="*", default=[],
                    help="NAME=ENV=VALUE[;ENV=VALUE]; a {b} in a value is the case's batch, 'B:V|B:V' picks V by batch, and a variant whose "
                         "name starts with sparse: / dense: applies to that kind only")
    ap.add_argument("--preset", choices=["rows"], help="rows: the benchmark's small-batch rows (sparse b 2 / 4 / 8 / 16, "
                    "dense b 1 / 8 / 32 at 4K)")
    args = ap.parse_args()
    if args.preset == "rows":
        args.sparse = args.sparse or [2, 4, 8, 16]
        args.dense = args.dense or [1, 8, 32]
    out = sys.stdout
    try:
        import flash_mla as fm
        if hasattr(fm, "build_commit"):
            fm = None
    except Exception as err:  # noqa: BLE001
        print(f"flash_mla not importable: {err}", file=out)
        fm = None
    variants = [("base", {})]
    for v in args.variants:
        name, _, rest = v.partition("=")
        env = dict(kv.split("=", 1) for kv in rest.split(";") if kv)
        variants.append((name, env))
    import torch
    cases = [("sparse", b) for b in args.sparse] + [("dense", b) for b in args.dense]
    for kind, b in cases:
        ours, peer = (sparse_calls if kind == "sparse" else dense_calls)(b)
        print(f"\n===== {kind} b={b}", file=out)
        results = {}
        ref = None
        for rnd in range(args.rounds):
            for name, env in variants:
                if ":" in name and not name.startswith(kind + ":"):
                    continue
                env = {k: per_batch(v, b) for k, v in env.items()}
                if any(v == "" for v in env.values()):
                    continue  # no value for this batch
                saved = {k: os.environ.get(k) for k in env}
                os.environ.update(env)
                try:
                    call = ours()
                    o = call()
                    torch.cuda.synchronize()
                    o = [t.float().clone() for t in o[:2]]
                    if ref is None:
                        ref = o
                    else:  # same outputs as the base (out within bf16 rounding of a different split, lse close)
                        d_out = float((o[0] - ref[0]).abs().max())
                        d_lse = float((o[1] - ref[1]).abs().max())
                        print(f"  ours[{name}] vs base: max |d out| {d_out:.3g}, max |d lse| {d_lse:.3g}, "
                              f"finite {bool(torch.isfinite(o[0]).all())}", file=out)
                    s = report(f"  ours[{name}] round {rnd}", profile(call, args.reps), out)
                finally:
                    for k, v in saved.items():
                        if v is None:
                            os.environ.pop(k, None)
                        else:
                            os.environ[k] = v
                results.setdefault(name, []).append(s)
            if fm is not None:
                s = report(f"  flashmla round {rnd}", profile(peer(fm), args.reps), out)
                results.setdefault("flashmla", []).append(s)
        print(f"  summary {kind} b={b}: " + ", ".join(
            f"{k} {min(x for x in v if x is not None):.2f}" for k, v in results.items() if any(v)), file=out)
        out.flush()


if __name__ == "__main__":
    main()
