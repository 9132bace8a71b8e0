"""Dense BF16 MLA decode: the rows of docs/targets.md, beside FlashMLA's figures.

Each case builds its inputs once (page 64, bf16, seqlens ~ N(s_k, s_k/2) clipped at s_q with a fixed
seed, pages in a random order), plans the schedule once (the scheduler is excluded from the time, as for
the peer's figures), then times the whole call: main kernel + combine (harness.time_decode_call).

Timing like the reference harness (FlashMLA's own, which took the figures of docs/targets.md):
CUPTI kernel activity (torch.profiler) of the eager call, an 8 GB flush before every call, and time_us =
the median over 50 calls (20 with --quick) of the span of the call's kernels (first kernel start to last
kernel end).
CUDA-event timing of a CUDA-graph replay adds a few microseconds of launch/event overhead that CUPTI's
kernel times do not contain; it is still recorded as graph_event_time_us (the eager call's event time as
eager_time_us). FlashMLA's dense figures are its main kernel alone; time_us is the whole call (the stricter
comparison), and the main kernel alone is recorded as main_kernel_us, every kernel's median in `kernels`.

Where flash_mla is importable (tools/peer_flashmla.sh), FlashMLA's whole call on the same tensors is timed in the
same run by the same method (benchmarks/peer.py): flashmla_us, ratio_to_flashmla (= flashmla_us / time_us) and
peer_max_abs_diff / peer_agrees on every row; without it flashmla_us is the docs/targets.md figure as a time
(flashmla_source says which).

FLOPs and bytes come from formulas.py (the peer's counting, docs/perf-method.md: no causal discount).
"""
from __future__ import annotations

SUITE = "dense_decode"
DEFAULT = True

D_QK, D_V, PAGE = 576, 512, 64
SEED = 0
SK = (4096, 8192, 16384, 32768)

# FlashMLA's dense decode (b = 128, h_q = 128, h_kv = 1, varlen), TFLOPS, by s_q then s_k (docs/targets.md).
_FLASHMLA_TFLOPS = {
    "h100": {1: {4096: 534, 8192: 580, 16384: 608, 32768: 622}, 2: {4096: 677, 8192: 709, 16384: 728, 32768: 737}},
    "h200": {1: {4096: 608, 8192: 653, 16384: 677, 32768: 688}, 2: {4096: 686, 8192: 717, 16384: 732, 32768: 741}},
}
# Memory-bound rows (h_q = 16, s_q = 1, b = 128), GB/s.
_FLASHMLA_GBPS = {"h100": {4096: 2580, 32768: 2940}, "h200": {4096: 3647, 32768: 4289}}


def _name(b, s_q, h_q, s_k, varlen, causal):
    return f"b{b}_hq{h_q}_sq{s_q}_sk{s_k}{'_varlen' if varlen else '_fixed'}{'_causal' if causal else ''}"


def _all_cases():
    cases = []
    for s_q in (1, 2):
        for s_k in SK:
            for causal in (False, True):
                # causal=True: FlashMLA's figures are the same within 1% (docs/targets.md).
                cases.append(dict(name=_name(128, s_q, 128, s_k, True, causal), b=128, s_q=s_q, h_q=128, h_kv=1,
                                  s_k=s_k, varlen=True, causal=causal,
                                  target={dev: {"tflops": t[s_q][s_k]} for dev, t in _FLASHMLA_TFLOPS.items()}))
    cases.append(dict(name=_name(132, 1, 128, 32768, False, False), b=132, s_q=1, h_q=128, h_kv=1, s_k=32768,
                      varlen=False, causal=False, target={"h100": {"tflops": 634}}))
    # Small batches at a short fixed context (FlashMLA in the same run through benchmarks/peer.py; no docs/targets.md
    # figure): the call is the head, a few blocks per CTA, the split partials and the combine.
    for b in (1, 8, 32):
        cases.append(dict(name=_name(b, 1, 128, 4096, False, False), b=b, s_q=1, h_q=128, h_kv=1, s_k=4096,
                          varlen=False, causal=False, target=None))
    for s_k in (4096, 32768):
        cases.append(dict(name=_name(128, 1, 16, s_k, True, False), b=128, s_q=1, h_q=16, h_kv=1, s_k=s_k,
                          varlen=True, causal=False,
                          target={dev: {"gbps": g[s_k]} for dev, g in _FLASHMLA_GBPS.items()}))
    return cases


TARGETS = {c["name"]: c["target"] for c in _all_cases() if c["target"]}


def cases(quick=False):
    """The rows of docs/targets.md; `quick` keeps the shortest and longest context of each kind, causal off."""
    all_cases = _all_cases()
    if not quick:
        return all_cases
    return [c for c in all_cases if not c["causal"] and c["s_k"] in (4096, 32768)]


def _resolve_target(target, device):
    """The target entry of this device ({"tflops": v} or {"gbps": v}), or None."""
    dev = (device or "").lower()
    return next((v for k, v in (target or {}).items() if k in dev), None)


def make_inputs(b, s_q, h_q, h_kv, s_k, varlen, seed=SEED, device="cuda"):
    """q, k_cache, block_table, cache_seqlens; each request owns exactly its pages, scattered at random."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    if varlen:
        lens = torch.normal(float(s_k), s_k / 2, (b,), generator=gen).clamp(min=s_q).to(torch.int64)
    else:
        lens = torch.full((b,), s_k, dtype=torch.int64)
    pages = (lens + PAGE - 1) // PAGE
    total_pages = int(pages.sum())
    max_pages = int(pages.max())
    order = torch.randperm(total_pages, generator=gen).to(torch.int32)
    block_table = torch.zeros((b, max_pages), dtype=torch.int32)  # unused entries: page 0, never read
    start = 0
    for i, n in enumerate(pages.tolist()):
        block_table[i, :n] = order[start:start + n]
        start += n
    g = torch.Generator(device=device).manual_seed(seed)
    q = (torch.randn((b, s_q, h_q, D_QK), generator=g, device=device, dtype=torch.bfloat16) / 10).clamp_(-1, 1)
    k_cache = (torch.randn((total_pages, PAGE, h_kv, D_QK), generator=g, device=device, dtype=torch.bfloat16)
               / 10).clamp_(-1, 1)
    return q, k_cache, block_table.to(device), lens.to(device=device, dtype=torch.int32), float(lens.double().mean())


def run(case, harness):
    import torch

    import openmla
    import peer  # benchmarks/peer.py: FlashMLA in the same run, when importable

    b, s_q, h_q, h_kv, s_k = case["b"], case["s_q"], case["h_q"], case["h_kv"], case["s_k"]
    causal = case["causal"]
    q, k_cache, block_table, seqlens, mean_sk = make_inputs(b, s_q, h_q, h_kv, s_k, case["varlen"])
    out = torch.empty((b, s_q, h_q, D_V), dtype=q.dtype, device=q.device)
    lse = torch.empty((b, s_q, h_q), dtype=torch.float32, device=q.device).transpose(1, 2)

    # Plan once, outside the timed region (the scheduler is excluded); later calls reuse the schedule.
    meta, _ = openmla.get_mla_metadata()

    def call():
        openmla.flash_mla_with_kvcache(q, k_cache, block_table, seqlens, D_V, meta, causal=causal, out=out, lse=lse)

    # The first call fills the schedule; then CUPTI span of the eager call (main kernel + combine) as time_us,
    # and the event-timed graph replay and eager call beside it.
    timing = harness.time_decode_call(call)
    time_us = timing["time_us"]

    f = harness.formulas
    flops = f.decode_flops(b, s_q, h_q, mean_sk, D_QK, D_V)
    nbytes = f.dense_decode_bytes(b, s_q, h_q, h_kv, mean_sk, D_QK, D_V)
    tflops = flops / (time_us * 1e-6) / 1e12
    gbps = nbytes / (time_us * 1e-6) / 1e9
    target = _resolve_target(case.get("target"), getattr(harness, "device", ""))
    ratio = None
    if target:
        ratio = tflops / target["tflops"] if "tflops" in target else gbps / target["gbps"]
    record = {
        "params": {k: v for k, v in case.items() if k not in ("name", "target")},
        "time_us": time_us,
        "flops": flops,
        "bytes": nbytes,
        "tflops": tflops,
        "gbps": gbps,
        "target": target,
        "ratio": ratio,
        **{k: v for k, v in timing.items() if k != "time_us"},
        "mean_sk": mean_sk,
        "num_sm_parts": int(meta.tile_scheduler_metadata.shape[0]),
        "total_splits": int(meta.num_splits[-1]),
    }

    # FlashMLA on the same tensors, timed the same way (benchmarks/peer.py): its schedule object is filled by its
    # first call, outside the timed region, as ours; the docs/targets.md figure stays the fallback.
    def peer_call(fm):
        sched, _ = fm.get_mla_metadata()

        def call():
            o, l = fm.flash_mla_with_kvcache(q, k_cache, block_table, seqlens, D_V, sched, causal=causal)
            return {"out": o, "lse": l}

        return call

    record.update(peer.measure(
        harness, SUITE, time_us, ours={"out": out, "lse": lse}, make_call=peer_call,
        unsupported=peer.unsupported_reason(SUITE, h_q=h_q, d_qk=D_QK, h_kv=h_kv, page=PAGE, d_v=D_V,
                                            dtype={torch.bfloat16: "bf16", torch.float16: "fp16"}.get(q.dtype)),
        fallback_us=peer.target_as_us(target, flops, nbytes)))
    del q, k_cache, block_table, seqlens, out, lse, meta
    torch.cuda.empty_cache()
    return record


if __name__ == "__main__":  # standalone: python3 benchmarks/bench_dense_decode.py [--quick]
    import os
    import sys

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(1, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))
    import harness as harness_mod

    quick = "--quick" in sys.argv
    h = harness_mod.Harness({}, quick=quick, reps=20 if quick else 50)
    print(f"device: {h.device}")
    print("time_us: CUPTI span of the eager call's kernels; main_us: main kernel alone; graph_us / eager_us: CUDA "
          "events around a graph replay / the eager call")
    print(f"{'case':<40} {'time_us':>9} {'main_us':>9} {'TFLOP/s':>8} {'GB/s':>7} {'target':>10} {'ratio':>6} "
          f"{'graph_us':>9} {'eager_us':>9}")
    for c in cases(quick):
        r = run(c, h)
        t = r["target"]
        t_text = "-" if not t else (f"{t['tflops']:.0f} TF" if "tflops" in t else f"{t['gbps']:.0f} GB/s")
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.3f}"
        main = "-" if r["main_kernel_us"] is None else f"{r['main_kernel_us']:.1f}"
        print(f"{c['name']:<40} {r['time_us']:9.1f} {main:>9} {r['tflops']:8.1f} {r['gbps']:7.0f} {t_text:>10} "
              f"{ratio:>6} {r['graph_event_time_us']:9.1f} {r['eager_time_us']:9.1f}")
        if r.get("timing_note"):
            print(f"  note: {r['timing_note']}")
