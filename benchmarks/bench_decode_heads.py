"""Decode at every head count an engine hands over unpadded: dense and sparse, h_q in HEAD_COUNTS.

Tensor parallelism and decode context parallelism leave a rank with few heads (Kimi-K3's 96: 12 per GPU at TP8, 6
at TP16, 96 or 99 after an all-gather); engines pad 8-32 heads to 64 today. Rows (h_kv 1, page 64, a fixed seed):

  - dense bf16, b 128, s_q 1, cache_seqlens ~ N(32768, 16384) clipped at s_q (the dense_decode suite's recipe);
  - sparse V3.2 (656 B/token FP8), b 128, s_q 2, topk 2048, attention sink on (the sparse_decode suite's recipe);

each at every h_q of HEAD_COUNTS, the largest first. The cache, block table, lengths and indices are built once per
kind and shared by its rows; only q (and the sink) follow the head count.

Recorded beside time_us / gbps (run.py adds pct_copy_ceiling, the percentage of this run's copy ceiling):
  ratio_to_h128   time_us / the same kind's h_q = 128 time in this run (a proportional cost above 64 heads would be
                  h_q / 128; the aim for h_q = 96 is <= 0.80)
  target / ratio  rows with h_q <= 32 are memory-bound: target = this run's copy ceiling in GB/s, so ratio is the
                  fraction of it reached (aim >= 0.80, goal 0.95); the h_q = 96 rows: target = 0.80 x the h_q = 128
                  time, so ratio >= 1 meets the aim; other rows have none
  flashmla_us     FlashMLA's whole call timed in the same run where it serves the shape (benchmarks/peer.py: dense
                  decode at any h_q, sparse decode at h_q 64 and 128), ratio_to_flashmla = flashmla_us / time_us

Timing as the decode suites (harness.time_decode_call: CUPTI span of the eager call, main kernel + combine, an 8 GB
flush before every call; the schedule planned once outside the timed region). Not in the default run:
    python3 benchmarks/run.py --suite decode_heads
"""
from __future__ import annotations

SUITE = "decode_heads"
DEFAULT = False

HEAD_COUNTS = (1, 6, 8, 12, 16, 32, 64, 96, 99, 128)
D_QK, D_V, PAGE = 576, 512, 64
SEED = 0
DENSE = dict(b=128, s_q=1, s_k=32768)
SPARSE = dict(b=128, s_q=2, s_k=32768, topk=2048)
MEMORY_BOUND_MAX_HEADS = 32
H96_AIM = 0.80  # the h_q = 96 time against the h_q = 128 time

# Per kind: the shared inputs of the rows (one kind held at a time) and the h_q = 128 time of this run.
_inputs: dict = {}
_h128_us: dict = {}


def _name(kind, h_q):
    if kind == "dense":
        return f"dense_b{DENSE['b']}_hq{h_q}_sq{DENSE['s_q']}_sk{DENSE['s_k']}_varlen"
    return f"sparse_v32_b{SPARSE['b']}_hq{h_q}_sq{SPARSE['s_q']}_topk{SPARSE['topk']}_sink"


def cases(quick=False):
    """Every row (each is well under a second of GPU time), h_q = 128 first in each kind: the others' ratio_to_h128
    needs its time."""
    del quick
    out = []
    for kind, shape in (("dense", DENSE), ("sparse", SPARSE)):
        for h_q in sorted(HEAD_COUNTS, reverse=True):
            out.append(dict(name=_name(kind, h_q), kind=kind, h_q=h_q, h_kv=1, page=PAGE, varlen=True, **shape))
    return out


def _shared_inputs(kind):
    """The inputs of one kind that do not depend on h_q, built on first use (the other kind's are dropped)."""
    import torch

    if kind not in _inputs:
        _inputs.clear()
        torch.cuda.empty_cache()
        if kind == "dense":
            import bench_dense_decode as bd

            _, k_cache, block_table, seqlens, mean_sk = bd.make_inputs(DENSE["b"], DENSE["s_q"], 1, 1, DENSE["s_k"],
                                                                       True, seed=SEED)
            _inputs[kind] = dict(k_cache=k_cache, block_table=block_table, seqlens=seqlens, mean_sk=mean_sk)
        else:
            import bench_sparse_decode as bs

            _, k_cache, indices, _, _, stats = bs.make_inputs(SPARSE["b"], SPARSE["s_q"], 1, SPARSE["topk"],
                                                              SPARSE["s_k"], True, seed=SEED)
            _inputs[kind] = dict(k_cache=k_cache, indices=indices, stats=stats)
    return _inputs[kind]


def _query(b, s_q, h_q, scale, seed):
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed * 1000 + h_q)
    q = torch.randn((b, s_q, h_q, D_QK), generator=g, device="cuda", dtype=torch.bfloat16)
    return (q * scale).clamp_(-1, 1), torch.randn((h_q,), generator=g, device="cuda", dtype=torch.float32)


def run(case, harness):
    import torch

    import openmla
    import peer  # benchmarks/peer.py: FlashMLA in the same run, when importable

    kind, h_q, b, s_q = case["kind"], case["h_q"], case["b"], case["s_q"]
    shared = _shared_inputs(kind)
    f = harness.formulas
    # q as the kind's own suite draws it (dense N(0,1)/10, sparse N(0,1), clamped); the sink N(0,1) per head.
    q, sink = _query(b, s_q, h_q, 0.1 if kind == "dense" else 1.0, SEED)
    out = torch.empty((b, s_q, h_q, D_V), dtype=q.dtype, device=q.device)
    lse = torch.empty((b, s_q, h_q), dtype=torch.float32, device=q.device).transpose(1, 2)
    meta, _ = openmla.get_mla_metadata()  # planned by the first call, outside the timed region

    if kind == "dense":
        k_cache, block_table, seqlens = shared["k_cache"], shared["block_table"], shared["seqlens"]

        def call():
            openmla.flash_mla_with_kvcache(q, k_cache, block_table, seqlens, D_V, meta, out=out, lse=lse)

        def peer_call(fm):
            sched, _ = fm.get_mla_metadata()

            def c():
                o, l = fm.flash_mla_with_kvcache(q, k_cache, block_table, seqlens, D_V, sched)
                return {"out": o, "lse": l}

            return c

        flops = f.decode_flops(b, s_q, h_q, shared["mean_sk"], D_QK, D_V)
        nbytes = f.dense_decode_bytes(b, s_q, h_q, 1, shared["mean_sk"], D_QK, D_V)
        peer_suite = "dense_decode"
        unsupported = peer.unsupported_reason(peer_suite, h_q=h_q, d_qk=D_QK, h_kv=1, page=PAGE, d_v=D_V)
    else:
        k_cache, indices = shared["k_cache"], shared["indices"]

        def call():
            openmla.flash_mla_with_kvcache(q, k_cache, None, None, D_V, meta, is_fp8_kvcache=True, indices=indices,
                                           attn_sink=sink, out=out, lse=lse)

        def peer_call(fm):
            sched, _ = fm.get_mla_metadata()

            def c():
                o, l = fm.flash_mla_with_kvcache(q, k_cache, None, None, D_V, sched, is_fp8_kvcache=True,
                                                 indices=indices, attn_sink=sink)
                return {"out": o, "lse": l}

            return c

        topk = case["topk"]
        flops = f.sparse_decode_flops(b, s_q, h_q, f.sparse_decode_mean_attended(topk), D_QK, D_V)
        nbytes = f.sparse_decode_bytes(b, s_q, h_q, shared["stats"]["unique_tokens"], D_QK, D_V)
        peer_suite = "sparse_decode"
        unsupported = peer.unsupported_reason(peer_suite, h_q=h_q, d_qk=D_QK, topk=topk, h_kv=1, page=PAGE, d_v=D_V)

    timing = harness.time_decode_call(call)
    time_us = timing["time_us"]
    gbps = nbytes / (time_us * 1e-6) / 1e9
    if h_q == 128:
        _h128_us[kind] = time_us
    h128 = _h128_us.get(kind)
    copy_gbps = (getattr(harness, "ceilings", None) or {}).get("copy_gbps")
    target = None
    if h_q <= MEMORY_BOUND_MAX_HEADS and copy_gbps:
        target = {"gbps": float(copy_gbps)}
    elif h_q == 96 and h128:
        target = {"time_us": H96_AIM * h128}
    record = {
        "params": {k: v for k, v in case.items() if k != "name"},
        "time_us": time_us,
        "flops": flops,
        "bytes": nbytes,
        "tflops": flops / (time_us * 1e-6) / 1e12,
        "gbps": gbps,
        "target": target,
        "ratio_to_h128": time_us / h128 if h128 else None,
        "proportional_to_h128": h_q / 128,
        **{k: v for k, v in timing.items() if k != "time_us"},
        "out_finite": bool(torch.isfinite(out.float()).all()),
        "num_sm_parts": int(meta.tile_scheduler_metadata.shape[0]),
        "total_splits": int(meta.num_splits[-1]),
    }
    record.update(peer.measure(harness, peer_suite, time_us, ours={"out": out, "lse": lse}, make_call=peer_call,
                               unsupported=unsupported))
    del q, sink, out, lse, meta
    torch.cuda.empty_cache()
    if kind == "sparse" and h_q == min(HEAD_COUNTS):
        _inputs.clear()  # the suite's last row: free the shared inputs for the suites after it
    return record


if __name__ == "__main__":  # standalone: python3 benchmarks/bench_decode_heads.py
    import os
    import sys

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(1, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))
    import harness as harness_mod

    h = harness_mod.Harness(harness_mod.measure_ceilings(), reps=20)
    print(f"device: {h.device}, copy ceiling {h.ceilings['copy_gbps']:.0f} GB/s")
    print(f"{'case':<44} {'time_us':>9} {'GB/s':>7} {'%copy':>6} {'x h128':>7} {'fmla_us':>9}")
    for c in cases():
        r = run(c, h)
        pct = 100.0 * r["gbps"] / h.ceilings["copy_gbps"]
        x = "-" if r["ratio_to_h128"] is None else f"{r['ratio_to_h128']:.3f}"
        fm = "-" if r.get("flashmla_us") is None else f"{r['flashmla_us']:.1f}"
        print(f"{c['name']:<44} {r['time_us']:9.1f} {r['gbps']:7.0f} {pct:6.1f} {x:>7} {fm:>9}")
