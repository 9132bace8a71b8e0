#!/usr/bin/env python3
"""Runs OpenMLA's benchmarks: prints a table and writes JSON records.

Benchmark modules are the files benchmarks/bench_*.py. Each defines:

    SUITE = "dense_decode"              # the name --suite selects
    DEFAULT = True                      # optional: part of the default run (True if absent)
    def cases(): -> list[dict]          # each case a dict with a unique "name" and its parameters;
                                        #   cases(quick) is called with harness.quick if it takes an argument
    def run(case, harness): -> dict     # times the case and returns a record (or raises harness.SkipCase(reason):
                                        #   the case is listed as skipped, not as an error):
        {"time_us": ..., "flops": ..., "bytes": ...}   (flops/bytes from formulas.py; either may be absent)
        optional: "tflops"/"gbps" (if it computes them itself), "name", "params", "target", anything else
        (the decode suites add timing_method, graph_event_time_us, eager_time_us, main_kernel_us, kernels:
        harness.time_decode_call; the table shows graph_event_time_us as graph_us)
    TARGETS = {...}                     # optional: case name -> {"tflops"|"gbps"|"time_us": value}, or
                                        #   case name -> {"h100": {...}, "h200": {...}} per device
    def cpu_reference(): -> int         # optional: a tiny case on the CPU reference, for machines without
                                        #   a GPU (--cpu-reference); returns 0 on success

run.py adds tflops/gbps, the percentage of the measured ceilings, the target and ratio (> 1 is
better than the target), the device, the git commit and the time stamp. The dense decode, sparse decode and
sparse prefill suites also time FlashMLA in the same run when flash_mla is importable (benchmarks/peer.py;
tools/peer_flashmla.sh builds it on the GPU machine): flashmla_us and ratio_to_flashmla on every row, shown as
the fmla_us and fmla_x columns; the JSON's "peer" says whether it was found.

    python3 benchmarks/run.py                          # default suites
    python3 benchmarks/run.py --suite kv_cache --filter 'v32.*1M' --json out.json
    python3 benchmarks/run.py --list                   # suites and cases, without running
    python3 benchmarks/run.py --suite dcp_decode       # not in the default run: merge_attn_states and the two-rank
                                                       #   DCP decode step (bench_dcp.py; the step needs 2 GPUs)
    python3 benchmarks/run.py --cpu-reference          # no GPU: small dense- and sparse-decode cases on the CPU reference
    python3 benchmarks/run.py --cpu-reference --suite sparse_decode   # only the sparse one

Without a visible CUDA device the GPU suites are skipped with the reason (exit status 0) and the CPU-reference
cases of the selected suites run instead; --json then records no records and the reason under "skipped".
"""
from __future__ import annotations

import argparse
import gc
import glob
import importlib
import inspect
import json
import os
import re
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.join(ROOT, "python"))

import harness as harness_mod  # noqa: E402
import peer as peer_mod  # noqa: E402

TARGET_METRICS = ("tflops", "gbps", "time_us")


# ------------------------------------------------------------------------------------------------
# Discovery
# ------------------------------------------------------------------------------------------------
def discover():
    """Imports every benchmarks/bench_*.py. Returns ({suite: module}, [(file, error)])."""
    suites, errors = {}, []
    for path in sorted(glob.glob(os.path.join(HERE, "bench_*.py"))):
        stem = os.path.splitext(os.path.basename(path))[0]
        try:
            mod = importlib.import_module(stem)
        except Exception:
            errors.append((stem[len("bench_"):], f"import of {os.path.basename(path)} failed:\n{traceback.format_exc()}"))
            continue
        suite = getattr(mod, "SUITE", stem[len("bench_"):])
        suites[suite] = mod
    return suites, errors


def module_cases(mod, quick: bool):
    fn = mod.cases
    try:
        takes_arg = len(inspect.signature(fn).parameters) > 0
    except (TypeError, ValueError):
        takes_arg = False
    return list(fn(quick) if takes_arg else fn())


def target_for(mod, name: str, device: str, record: dict):
    """(metric, value) of the target for this case on this device, or (None, None)."""
    entry = record.get("target")
    if entry is None:
        entry = getattr(mod, "TARGETS", {}).get(name)
    if not entry:
        return None, None
    if not any(k in entry for k in TARGET_METRICS):  # per device: pick the one named in the device name
        dev = device.lower()
        entry = next((v for k, v in entry.items() if k.lower() in dev), None)
        if not entry:
            return None, None
    for metric in TARGET_METRICS:
        if metric in entry:
            return metric, float(entry[metric])
    return None, None


# ------------------------------------------------------------------------------------------------
# Running
# ------------------------------------------------------------------------------------------------
def complete_record(mod, suite, case, rec, ceilings, device, commit, stamp):
    params = {k: v for k, v in case.items() if k != "name"}
    out = {"suite": suite, "name": rec.get("name", case["name"]), "params": rec.get("params", params)}
    t = float(rec["time_us"])
    out["time_us"] = t
    tflops = rec.get("tflops")
    if tflops is None and rec.get("flops"):
        tflops = rec["flops"] / (t * 1e-6) / 1e12
    gbps = rec.get("gbps")
    if gbps is None and rec.get("bytes"):
        gbps = rec["bytes"] / (t * 1e-6) / 1e9
    out["tflops"] = tflops
    out["gbps"] = gbps
    out["pct_matmul_ceiling"] = 100.0 * tflops / ceilings["matmul_tflops"] if tflops and ceilings else None
    out["pct_copy_ceiling"] = 100.0 * gbps / ceilings["copy_gbps"] if gbps and ceilings else None
    metric, value = target_for(mod, out["name"], device, rec)
    ratio = None
    if metric == "time_us":
        ratio = value / t
    elif metric is not None and out.get(metric):
        ratio = out[metric] / value
    out["target"] = {"metric": metric, "value": value} if metric else None
    out["ratio"] = ratio
    out.update(device=device, git_commit=commit, timestamp=stamp)
    for k, v in rec.items():  # anything else the module reports (kernel-only time, splits, ...)
        if k not in out and k not in ("flops", "bytes"):
            out[k] = v
    for k in ("flops", "bytes"):
        if rec.get(k) is not None:
            out[k] = rec[k]
    return out


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def target_text(v: float) -> str:
    """A target value: whole numbers from 100 up (534, 2940), three significant digits below (21.4)."""
    return f"{v:.0f}" if abs(v) >= 100 else f"{v:.3g}"


def params_text(params: dict, width: int = 46) -> str:
    s = " ".join(f"{k}={v}" for k, v in params.items())
    return s if len(s) <= width else s[: width - 1] + "…"


def peer_columns(r: dict) -> tuple[str, str]:
    """(fmla_us, fmla_x) of a record: FlashMLA's same-run time and flashmla_us / time_us, '!' after the ratio when
    the outputs disagreed beyond the tests' tolerances; '-' where FlashMLA was not timed in this run (the target and
    ratio columns show the docs/targets.md figure then)."""
    if r.get("flashmla_source") != "same_run" or r.get("flashmla_us") is None:
        return "-", "-"
    mark = "!" if r.get("peer_agrees") is False else ""
    return f"{r['flashmla_us']:.2f}", fmt(r.get("ratio_to_flashmla"), ".3f") + mark


def print_table(records, errors, ceilings, device, commit, peer_info=None):
    print()
    print(f"device: {device}   commit: {commit}")
    if ceilings:
        print(f"ceilings: copy {ceilings['copy_gbps']:.0f} GB/s (read+write), bf16 matmul {ceilings['matmul_tflops']:.0f} TFLOP/s")
    print("time_us: the span of the eager call's kernels by CUPTI where timing_method is 'cupti' (the decode suites, "
          "as the reference harness), else CUDA events; graph_us: CUDA events around a graph replay, where recorded")
    if peer_info is not None:
        if peer_info.get("available"):
            print(f"fmla_us: FlashMLA's whole call timed in this run on the same inputs, same method ({peer_info['module']}"
                  f" from {peer_info.get('file')}); fmla_x = fmla_us / time_us (> 1: faster than FlashMLA), '!': the "
                  "outputs disagree beyond the tests' tolerances (peer_check); target / ratio: docs/targets.md")
        else:
            print(f"fmla_us / fmla_x: FlashMLA not timed in this run ({peer_info.get('why')}); target / ratio: the "
                  "fixed docs/targets.md figures")
    head = (f"{'name':<34} {'params':<46} {'time_us':>10} {'graph_us':>10} {'TFLOP/s':>8} {'GB/s':>7} {'%ceil':>8} "
            f"{'target':>12} {'ratio':>6} {'fmla_us':>10} {'fmla_x':>7}")
    print(head)
    print("-" * len(head))
    for r in records:
        pm, pc = r.get("pct_matmul_ceiling"), r.get("pct_copy_ceiling")
        if pm is None and pc is None:
            ceil = "-"
        elif pc is None or (pm is not None and pm >= pc):
            ceil = f"{pm:.0f}% mm"
        else:
            ceil = f"{pc:.0f}% bw"
        tgt = r.get("target")
        tgt_s = f"{target_text(tgt['value'])} {'us' if tgt['metric'] == 'time_us' else tgt['metric']}" if tgt else "-"
        fmla_us, fmla_x = peer_columns(r)
        print(f"{r['name'][:34]:<34} {params_text(r['params']):<46} {r['time_us']:>10.2f} "
              f"{fmt(r.get('graph_event_time_us'), '.2f'):>10} {fmt(r['tflops'], '.1f'):>8} "
              f"{fmt(r['gbps'], '.0f'):>7} {ceil:>8} {tgt_s:>12} {fmt(r['ratio'], '.3f'):>6} {fmla_us:>10} "
              f"{fmla_x:>7}")
        if r.get("timing_note"):
            print(f"{'':<34} note: {r['timing_note']}")
        if peer_info and peer_info.get("available") and r.get("flashmla_note"):
            print(f"{'':<34} FlashMLA: {r['flashmla_note']}")  # the peer is here but did not run this row
        if r.get("peer_check"):
            print(f"{'':<34} FlashMLA outputs differ: {r['peer_check']}")
    for name, err in errors:
        print(f"{name[:34]:<34} ERROR: {err.strip().splitlines()[-1][:120]}")


def run_benchmarks(args) -> int:
    suites, import_errors = discover()
    if args.list:
        for suite, mod in sorted(suites.items()):
            default = "" if getattr(mod, "DEFAULT", True) else "  (not in the default run)"
            print(f"{suite}{default}")
            for c in module_cases(mod, args.quick):
                print(f"  {c['name']}")
        for name, err in import_errors:
            print(f"{name}: {err.strip().splitlines()[-1]}")
        return 1 if import_errors else 0

    wanted = [s for arg in (args.suite or []) for s in arg.split(",") if s]
    if wanted and wanted != ["all"]:
        unknown = [s for s in wanted if s not in suites and s not in dict(import_errors)]
        if unknown:
            print(f"run.py: unknown suite(s) {unknown}; available: {sorted(suites)}", file=sys.stderr)
            return 2
        selected = [s for s in dict.fromkeys(wanted) if s in suites]   # the order asked for
        import_errors = [e for e in import_errors if e[0] in wanted]
    else:
        selected = [s for s in sorted(suites) if wanted == ["all"] or getattr(suites[s], "DEFAULT", True)]
    pattern = re.compile(args.filter) if args.filter else None

    device = harness_mod.device_name()
    commit = harness_mod.git_commit()
    stamp = harness_mod.timestamp()
    no_gpu = gpu_unavailable_reason()
    if no_gpu:
        print(f"run.py: {no_gpu}: the GPU benchmarks ({', '.join(selected) or 'none selected'}) are skipped; "
              "running the CPU reference on small cases instead", flush=True)
        rc = run_cpu_reference(selected, suites)
        if args.json:
            doc = {"schema": 1, "device": device, "git_commit": commit, "timestamp": stamp, "ceilings": None,
                   "suites": selected, "filter": args.filter, "records": [], "errors": [], "skipped": no_gpu}
            os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
            with open(args.json, "w") as f:
                json.dump(doc, f, indent=1)
            print(f"wrote {args.json}")
        return rc
    t0 = time.time()
    print(f"measuring ceilings on {device} ...", flush=True)
    ceilings = harness_mod.measure_ceilings()
    print(f"  copy {ceilings['copy_gbps']:.0f} GB/s, bf16 matmul {ceilings['matmul_tflops']:.0f} TFLOP/s; "
          f"L2 flush before each timed call: {harness_mod.flush_bytes_requested() / 1e9:.2f} GB requested", flush=True)
    h = harness_mod.Harness(ceilings, warmup=args.warmup, reps=args.reps, quick=args.quick)
    peer_info = peer_mod.describe_peer()
    print("FlashMLA (the peer): " + (f"timed in the same run ({peer_info['file']})" if peer_info["available"]
                                     else f"not timed: {peer_info['why']}; the docs/targets.md figures are used"),
          flush=True)

    records, errors, skipped = [], list(import_errors), []

    def make_doc(partial: bool) -> dict:
        doc = {
            "schema": 1,
            "device": device,
            "git_commit": commit,
            "timestamp": stamp,
            "ceilings": ceilings,
            "flush_bytes": harness_mod.flush_bytes_requested(),
            "peer": peer_info,
            "suites": selected,
            "filter": args.filter,
            "records": records,
            "errors": [{"name": n, "error": e} for n, e in errors],
            "skipped_cases": [{"name": n, "reason": r} for n, r in skipped],
        }
        if partial:
            doc["partial"] = True  # written after each case: a run cut short keeps what it measured
        return doc

    def write_json(path: str, doc: dict) -> None:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(tmp, path)

    for suite in selected:
        mod = suites[suite]
        try:
            cases = module_cases(mod, args.quick)
        except Exception:
            errors.append((suite, traceback.format_exc()))
            continue
        for case in cases:
            if pattern and not pattern.search(case["name"]):
                continue
            print(f"[{suite}] {case['name']} ...", flush=True)
            try:
                rec = mod.run(case, h)
                records.append(complete_record(mod, suite, case, rec, ceilings, device, commit, stamp))
                r = records[-1]
                peer_x = r.get("ratio_to_flashmla")
                print(f"  time_us {r.get('time_us', float('nan')):.2f}"
                      + (f", ratio_to_flashmla {peer_x:.3f}" if isinstance(peer_x, (int, float)) else ""), flush=True)
            except harness_mod.SkipCase as why:
                print(f"  skipped: {why}", flush=True)
                skipped.append((case["name"], str(why)))
            except Exception:
                tb = traceback.format_exc()
                print(tb, file=sys.stderr)
                errors.append((case["name"], tb))
            if args.json:
                write_json(args.json, make_doc(partial=True))
            gc.collect()
            try:
                import torch

                torch.cuda.empty_cache()
            except Exception:
                pass

    print_table(records, errors, ceilings, device, commit, peer_info)
    print(f"\n{len(records)} case(s) in {time.time() - t0:.0f} s, {len(errors)} error(s)"
          + (f", {len(skipped)} skipped" if skipped else ""))

    doc = make_doc(partial=False)
    if args.json:
        write_json(args.json, doc)
        print(f"wrote {args.json}")
    if args.history_dir and records:
        name = f"{stamp[:10]}_{harness_mod.device_slug(device)}_{commit}.json"
        path = os.path.join(args.history_dir, name)
        os.makedirs(args.history_dir, exist_ok=True)
        with open(path, "w") as f:
            json.dump(doc, f, indent=1)
        print(f"wrote {path}")
    return 1 if errors else 0


# ------------------------------------------------------------------------------------------------
# No GPU: small cases through the CPU reference
# ------------------------------------------------------------------------------------------------
def gpu_unavailable_reason():
    """None when torch sees a CUDA device, else why the GPU benchmarks cannot run."""
    try:
        import torch
    except Exception as err:
        return f"no GPU benchmarks without PyTorch ({type(err).__name__}: {err})"
    try:
        if not torch.cuda.is_available():
            return "PyTorch sees no CUDA device"
    except Exception as err:  # pragma: no cover - depends on the machine
        return f"CUDA is not usable ({type(err).__name__}: {err})"
    return None


def run_cpu_reference(selected=None, suites=None) -> int:
    """The CPU-reference cases of the selected suites (default: dense decode, then every module defining
    cpu_reference(), e.g. sparse_decode). Returns non-zero if one failed."""
    if suites is None:
        suites, _ = discover()
    names = list(selected) if selected else ["dense_decode"] + sorted(
        s for s, m in suites.items() if s != "dense_decode" and callable(getattr(m, "cpu_reference", None)))
    rc, ran, without = 0, 0, []
    for name in names:
        if name == "dense_decode":
            fn = run_dense_cpu_reference
        else:
            fn = getattr(suites.get(name), "cpu_reference", None)
        if not callable(fn):
            without.append(name)
            continue
        if ran:
            print()
        ran += 1
        rc |= 1 if fn() else 0
    if without:
        if ran:
            print()
        print(f"no CPU-reference case for: {', '.join(without)}")
    return rc


def run_dense_cpu_reference() -> int:
    b, s_q, h_q, h_kv, s_k, d_qk, d_v, page = 2, 1, 16, 1, 256, 576, 512, 64
    try:
        import numpy as np

        import openmla
        ref = openmla.reference
    except Exception as err:
        print(f"CPU reference not available: {type(err).__name__}: {err}")
        return 1
    rng = np.random.default_rng(0)
    blocks_per_seq = (s_k + page - 1) // page
    q = rng.standard_normal((b, s_q, h_q, d_qk), dtype=np.float32)
    k_cache = rng.standard_normal((b * blocks_per_seq, page, h_kv, d_qk), dtype=np.float32)
    block_table = rng.permutation(b * blocks_per_seq).astype(np.int32).reshape(b, blocks_per_seq)
    cache_seqlens = np.array([s_k, s_k // 2 + 3], dtype=np.int32)[:b]
    print(f"dense decode on the CPU reference: b={b} s_q={s_q} h_q={h_q} h_kv={h_kv} s_k<={s_k} "
          f"d_qk={d_qk} d_v={d_v} page={page}, seqlens={cache_seqlens.tolist()}")
    t0 = time.perf_counter()
    try:
        out, lse = ref.dense_decode(q, k_cache, block_table, cache_seqlens, head_dim_v=d_v, causal=False)
    except Exception as err:
        print(f"CPU reference dense_decode failed: {type(err).__name__}: {err}")
        return 1
    dt = time.perf_counter() - t0
    out, lse = np.asarray(out, dtype=np.float64), np.asarray(lse, dtype=np.float64)
    flops = harness_mod.formulas.decode_flops(b, s_q, h_q, float(cache_seqlens.mean()), d_qk, d_v)
    print(f"  out {tuple(out.shape)}  mean |out| = {np.abs(out).mean():.4f}  finite: {bool(np.isfinite(out).all())}")
    print(f"  lse {tuple(lse.shape)}  range [{lse.min():.3f}, {lse.max():.3f}]")
    print(f"  {dt * 1e3:.1f} ms on the CPU ({flops / dt / 1e9:.2f} GFLOP/s; double accumulation, deliberately naive)")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite", action="append", help="suite(s) to run (repeat or comma-separate; 'all' for every one)")
    p.add_argument("--filter", default=os.environ.get("BENCH_FILTER") or None, help="regex on case names ($BENCH_FILTER)")
    p.add_argument("--json", help="write the records here")
    p.add_argument("--history-dir", help="also write a copy named <date>_<device>_<commit>.json into this folder")
    p.add_argument("--quick", action="store_true", help="fewer repetitions; modules may shrink their case list")
    p.add_argument("--warmup", type=int, default=None)
    p.add_argument("--reps", type=int, default=None)
    p.add_argument("--list", action="store_true", help="list suites and cases without running them")
    p.add_argument("--cpu-reference", action="store_true",
                   help="no GPU: run small cases on the CPU reference (dense and sparse decode; --suite selects)")
    args = p.parse_args(argv)
    if args.warmup is None:
        args.warmup = 5 if args.quick else 10
    if args.reps is None:
        args.reps = 20 if args.quick else 50
    if os.environ.get("BENCH_SUITE") and not args.suite:
        args.suite = [os.environ["BENCH_SUITE"]]
    if args.cpu_reference:
        wanted = [s for arg in (args.suite or []) for s in arg.split(",") if s and s != "all"]
        return run_cpu_reference(wanted or None)
    return run_benchmarks(args)


if __name__ == "__main__":
    sys.exit(main())
