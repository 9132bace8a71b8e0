"""Batch-invariant decode (get_mla_metadata(batch_invariant=True); docs/decode-schedule.md, "Batch invariance")
against the default schedule, both timed in the same process on the same inputs.

Rows: the compute-bound dense rows (b = 128, h_q = 128, s_q 1 and 2, s_k 4K-32K varlen), the memory-bound h_q = 16
rows, small dense batches (b = 1 / 8 / 32, fixed lengths 8K and 32K), and sparse V3.2 FP8 decode (h_q = 128, s_q = 2,
topk 2048, b = 2 / 64 / 128, sink on). Inputs come from bench_dense_decode.make_inputs and
bench_sparse_decode.make_inputs (the default suites' own rows), timed with harness.time_decode_call (CUPTI span of
the whole call: main kernel + combine, 8 GB flush before each call, median), the schedule planned outside the timed
region for both modes.

Each case gives one record, for the invariant mode: time_us (invariant), default_time_us, and ratio_to_default =
default time / invariant time (1.0: the mode costs nothing; 0.9: 10 % slower). Not part of the default run:
python3 benchmarks/run.py --suite decode_batch_invariant.
"""
from __future__ import annotations

SUITE = "decode_batch_invariant"
DEFAULT = False

D_V = 512


def _dense_cases():
    cases = []
    for s_q in (1, 2):
        for s_k in (4096, 8192, 16384, 32768):
            cases.append(dict(kind="dense", b=128, s_q=s_q, h_q=128, s_k=s_k, varlen=True, causal=s_q > 1))
    for s_k in (4096, 32768):
        cases.append(dict(kind="dense", b=128, s_q=1, h_q=16, s_k=s_k, varlen=True, causal=False))
    for b in (1, 8, 32):
        for s_k in (8192, 32768):
            cases.append(dict(kind="dense", b=b, s_q=1, h_q=128, s_k=s_k, varlen=False, causal=False))
    return cases


def _sparse_cases():
    return [dict(kind="sparse", b=b, s_q=2, h_q=128, topk=2048, s_k=32768, varlen=True) for b in (2, 64, 128)]


def _name(c):
    if c["kind"] == "dense":
        return (f"dense_b{c['b']}_hq{c['h_q']}_sq{c['s_q']}_sk{c['s_k']}{'_varlen' if c['varlen'] else '_fixed'}"
                f"{'_causal' if c['causal'] else ''}")
    return f"sparse_v32_b{c['b']}_hq{c['h_q']}_sq{c['s_q']}_topk{c['topk']}"


def cases(quick=False):
    all_cases = [dict(c, name=_name(c)) for c in _dense_cases() + _sparse_cases()]
    if quick:
        return [c for c in all_cases if c.get("s_k") in (4096, 32768) and c["b"] in (1, 2, 128)]
    return all_cases


def _time_both(harness, make_call):
    """(default timing, invariant timing): each mode's schedule planned by its first call, then timed."""
    timings = {}
    for invariant in (False, True):
        call = make_call(invariant)
        timings[invariant] = harness.time_decode_call(call)
    return timings[False], timings[True]


def run(case, harness):
    import torch

    import openmla

    f = harness.formulas
    if case["kind"] == "dense":
        import bench_dense_decode as dense

        b, s_q, h_q, s_k = case["b"], case["s_q"], case["h_q"], case["s_k"]
        q, k_cache, block_table, seqlens, mean_sk = dense.make_inputs(b, s_q, h_q, 1, s_k, case["varlen"])
        out = torch.empty((b, s_q, h_q, D_V), dtype=q.dtype, device=q.device)
        lse = torch.empty((b, s_q, h_q), dtype=torch.float32, device=q.device).transpose(1, 2)

        def make_call(invariant):
            meta, _ = openmla.get_mla_metadata(batch_invariant=invariant)
            return lambda: openmla.flash_mla_with_kvcache(q, k_cache, block_table, seqlens, D_V, meta,
                                                          causal=case["causal"], out=out, lse=lse)

        default, inv = _time_both(harness, make_call)
        flops = f.decode_flops(b, s_q, h_q, mean_sk, dense.D_QK, D_V)
        nbytes = f.dense_decode_bytes(b, s_q, h_q, 1, mean_sk, dense.D_QK, D_V)
        del q, k_cache, block_table, seqlens
    else:
        import bench_sparse_decode as sparse

        b, s_q, h_q, topk, s_k = case["b"], case["s_q"], case["h_q"], case["topk"], case["s_k"]
        q, k_cache, indices, attn_sink, _, stats = sparse.make_inputs(b, s_q, h_q, topk, s_k, case["varlen"])
        out = torch.empty((b, s_q, h_q, D_V), dtype=q.dtype, device=q.device)
        lse = torch.empty((b, s_q, h_q), dtype=torch.float32, device=q.device).transpose(1, 2)

        def make_call(invariant):
            meta, _ = openmla.get_mla_metadata(batch_invariant=invariant)
            return lambda: openmla.flash_mla_with_kvcache(q, k_cache, None, None, D_V, meta, is_fp8_kvcache=True,
                                                          indices=indices, attn_sink=attn_sink, out=out, lse=lse)

        default, inv = _time_both(harness, make_call)
        mean_topk = f.sparse_decode_mean_attended(topk)
        flops = f.sparse_decode_flops(b, s_q, h_q, mean_topk, sparse.D_QK, D_V)
        nbytes = f.sparse_decode_bytes(b, s_q, h_q, stats["unique_tokens"], sparse.D_QK, D_V)
        del q, k_cache, indices
    time_us = inv["time_us"]
    record = {
        "params": {k: v for k, v in case.items() if k != "name"},
        "time_us": time_us,
        "flops": flops,
        "bytes": nbytes,
        "tflops": flops / (time_us * 1e-6) / 1e12,
        "gbps": nbytes / (time_us * 1e-6) / 1e9,
        "default_time_us": default["time_us"],
        "ratio_to_default": default["time_us"] / time_us,
        "main_kernel_us": inv.get("main_kernel_us"),
        "default_main_kernel_us": default.get("main_kernel_us"),
        "kernels": inv.get("kernels"),
        "timing_method": inv.get("timing_method"),
    }
    del out, lse
    torch.cuda.empty_cache()
    return record


if __name__ == "__main__":  # standalone: python3 benchmarks/bench_batch_invariant.py [--quick]
    import os
    import sys

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(1, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))
    import harness as harness_mod

    quick = "--quick" in sys.argv
    h = harness_mod.Harness({}, quick=quick, reps=20 if quick else 50)
    print(f"device: {h.device}")
    print(f"{'case':<48} {'default_us':>10} {'invariant_us':>12} {'ratio':>6}")
    for c in cases(quick):
        r = run(c, h)
        print(f"{c['name']:<48} {r['default_time_us']:10.1f} {r['time_us']:12.1f} {r['ratio_to_default']:6.3f}")
