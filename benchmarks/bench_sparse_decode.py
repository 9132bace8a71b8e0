"""Sparse FP8 MLA decode (DeepSeek-V3.2 top-k attention): the rows of docs/targets.md beside FlashMLA.

Rows (V3.2 layout: d_qk 576, 656 B/token FP8 cache, page 64, h_kv 1, s_q 2, attention sink on, default softmax
scale; cache_seqlens ~ N(32768, 16384) clipped at s_q, a fixed seed):
  - h_q 128, topk 2048, b in {2, 64, 74, 128}             (FlashMLA: 21.4 / 189 / 231 / 369 us on the H100)
  - h_q 128 and 64, topk 16384, b 148                     (FlashMLA: 3023 / 1899 us on the H100)
  - h_q 16, topk 2048, b 128: memory-bound, no FlashMLA figure (it serves h_q 64 and 128 only); its target is
    this run's copy ceiling, so its ratio is the fraction of the copy bandwidth reached.

Inputs follow FlashMLA's sparse-decode test (docs/contracts.md section 10): q ~ N(0, 1) clamped to [-1, 1];
KV ~ N(0, 1)/10 clamped to [-1, 1] in bf16, quantised on the GPU with openmla.quantize_kv_cache; every request's
pages are scattered through a random permutation of all pages; per (request, query position) `topk` distinct random
token positions below the request's length, in random order, padded with -1 when the length is below topk,
mapped to index = page * 64 + offset; attn_sink ~ N(0, 1) float32 per head.

Timing as bench_dense_decode.py (harness.time_decode_call): the schedule is planned once, outside the timed
region (the scheduler is excluded, as for the peer's figures); time_us is the whole call (main kernel + combine)
timed like FlashMLA's harness, which took the "end-to-end" figures of docs/targets.md: CUPTI kernel activity
of the eager call, an 8 GB flush before every call, the span from the first kernel's start to the last kernel's
end, median of 50 (20 with --quick) calls. The CUDA-event time of a CUDA-graph replay is recorded beside it as
graph_event_time_us (it includes a few us of launch/event overhead that CUPTI's figures do not: b = 2, 28.6 us
event-timed replay vs 25.3 us CUPTI span of the same kernels), the eager call's event time as eager_time_us,
the attention kernel alone as main_kernel_us, every kernel's median in `kernels`.

Where flash_mla is importable (tools/peer_flashmla.sh), FlashMLA's whole call (main kernel + combine) on the same
tensors is timed in the same run by the same method (benchmarks/peer.py): flashmla_us, ratio_to_flashmla
(= flashmla_us / time_us), peer_max_abs_diff / peer_agrees; the h_q = 16 row records why FlashMLA has no figure (its
SM90 sparse decode serves h_q 64 and 128). Without it flashmla_us is the docs/targets.md figure (flashmla_source).

FLOPs and bytes come from formulas.py: FLOPs = 2 b s_q h_q topk (d_qk + d_v) (invalid slots counted, as FlashMLA
counts them), bytes = 2 b s_q h_q d_qk + U * 656 + 2 b s_q h_q d_v with U the distinct index values (-1 once).

Without a GPU: benchmarks/run.py --cpu-reference --suite sparse_decode runs cpu_reference() below, a tiny case on
the CPU reference (the same input recipe in numpy).
"""
from __future__ import annotations

SUITE = "sparse_decode"
DEFAULT = True

D_QK, D_V, PAGE = 576, 512, 64
CACHE_FORMAT = "v32"  # openmla.quantize_kv_cache's name of the V3.2 layout (656 B/token)
S_K = 32768  # mean cache length per request (varlen)
S_Q = 2
SEED = 0

# FlashMLA's sparse FP8 decode, whole call, microseconds (docs/targets.md), by (b, h_q, topk).
_FLASHMLA_US = {
    "h100": {(2, 128, 2048): 21.4, (64, 128, 2048): 189, (74, 128, 2048): 231, (128, 128, 2048): 369,
             (148, 128, 16384): 3023, (148, 64, 16384): 1899},
    "h200": {(2, 128, 2048): 20.3, (64, 128, 2048): 186, (74, 128, 2048): 226, (128, 128, 2048): 364,
             (148, 128, 16384): 3037, (148, 64, 16384): 1864},
}
# The same rows in TFLOPS on the H100, as docs/targets.md lists them (recorded beside the time for reference).
_FLASHMLA_TFLOPS_H100 = {(2, 128, 2048): 107, (64, 128, 2048): 386, (74, 128, 2048): 366, (128, 128, 2048): 396,
                         (148, 128, 16384): 447, (148, 64, 16384): 356}


def _name(b, s_q, h_q, topk):
    return f"v32_b{b}_hq{h_q}_sq{s_q}_topk{topk}_sink"


def _case(b, h_q, topk):
    key = (b, h_q, topk)
    target = {dev: {"time_us": t[key]} for dev, t in _FLASHMLA_US.items() if key in t}
    return dict(name=_name(b, S_Q, h_q, topk), b=b, s_q=S_Q, h_q=h_q, topk=topk, s_k=S_K, varlen=True,
                page=PAGE, attn_sink=True, target=target or None)


def _all_cases():
    cases = [_case(b, 128, 2048) for b in (2, 64, 74, 128)]
    # Small batches between the b = 2 row and the large ones (no FlashMLA figure: reported, not compared). They
    # show where the kernel switches from the plain path to crossover pairs (heuristics, docs/sparse-decode.md).
    cases += [_case(b, 128, 2048) for b in (4, 8, 16)]
    cases += [_case(148, 128, 16384), _case(148, 64, 16384)]
    cases.append(_case(128, 16, 2048))  # memory-bound: target = this run's copy ceiling (set in run())
    return cases


# FlashMLA rows only; the h_q = 16 row gets its target (the copy ceiling) from the run.
TARGETS = {c["name"]: c["target"] for c in _all_cases() if c["target"]}


def cases(quick=False):
    """The rows of docs/targets.md. Every row takes well under a second of GPU time, so `quick` keeps them all."""
    del quick
    return _all_cases()


def _resolve_target(target, device):
    """The target entry of this device ({"time_us": v}), or None."""
    dev = (device or "").lower()
    return next((v for k, v in (target or {}).items() if k in dev), None)


# ------------------------------------------------------------------------------------------------
# Inputs
# ------------------------------------------------------------------------------------------------
def make_inputs(b, s_q, h_q, topk, s_k, varlen=True, seed=SEED, device="cuda"):
    """q, k_cache (FP8 V3.2 bytes), indices, attn_sink, cache_seqlens (host int64), stats.

    Each request owns ceil(L / 64) pages scattered through a random permutation of all pages; per (request,
    query position) `topk` distinct random positions < L in random order (-1 past L when L < topk), mapped to
    index = page * 64 + offset. stats: unique_tokens (distinct index values, -1 once), valid_slots, num_blocks.
    """
    import torch

    import openmla

    gen = torch.Generator().manual_seed(seed)
    if varlen:
        lens = torch.normal(float(s_k), s_k / 2, (b,), generator=gen).clamp(min=s_q).to(torch.int64)
    else:
        lens = torch.full((b,), s_k, dtype=torch.int64)
    pages = (lens + PAGE - 1) // PAGE
    total_pages = int(pages.sum())
    max_pages = int(pages.max())
    order = torch.randperm(total_pages, generator=gen).to(torch.int32)
    block_table = torch.zeros((b, max_pages), dtype=torch.int32)  # entries past a request's pages: never used
    start = 0
    for i, n in enumerate(pages.tolist()):
        block_table[i, :n] = order[start:start + n]
        start += n

    g = torch.Generator(device=device).manual_seed(seed)
    # Indices on the GPU: random keys per (request, position), positions >= L pushed past every valid key;
    # sorting the keys gives distinct positions in random order, the valid ones first.
    rows = b * s_q
    max_len = int(lens.max())
    lens_rows = lens.to(device).repeat_interleave(s_q)  # (rows,)
    keys = torch.rand((rows, max_len), generator=g, device=device)
    beyond = torch.arange(max_len, device=device)[None, :] >= lens_rows[:, None]
    keys.masked_fill_(beyond, 2.0)
    keys, pos = torch.sort(keys, dim=1)
    del beyond
    k = min(topk, max_len)
    pos = pos[:, :k]
    valid = keys[:, :k] < 1.5
    del keys
    bt_rows = block_table.to(device).repeat_interleave(s_q, dim=0)  # (rows, max_pages)
    phys = torch.gather(bt_rows, 1, torch.where(valid, pos // PAGE, 0)).to(torch.int64)
    idx = torch.where(valid, phys * PAGE + pos % PAGE, -1)
    if k < topk:  # every request shorter than topk: the missing slots are invalid
        idx = torch.cat([idx, torch.full((rows, topk - k), -1, dtype=idx.dtype, device=device)], dim=1)
    indices = idx.to(torch.int32).reshape(b, s_q, topk).contiguous()
    del pos, valid, bt_rows, phys, idx

    q = torch.randn((b, s_q, h_q, D_QK), generator=g, device=device, dtype=torch.bfloat16).clamp_(-1, 1)
    kv = torch.randn((total_pages, PAGE, 1, D_QK), generator=g, device=device, dtype=torch.bfloat16)
    kv.div_(10).clamp_(-1, 1)  # in place: the b = 148 case holds ~5 GB of bf16 before quantisation
    k_cache = openmla.quantize_kv_cache(kv, CACHE_FORMAT)
    del kv
    attn_sink = torch.randn((h_q,), generator=g, device=device, dtype=torch.float32)

    f = _formulas()
    stats = {
        "unique_tokens": f.count_unique_tokens(indices),
        "valid_slots": int((indices != -1).sum()),
        "num_blocks": total_pages,
        "mean_seqlen": float(lens.double().mean()),
    }
    return q, k_cache, indices, attn_sink, lens, stats


def _formulas():
    import formulas  # benchmarks/ is on sys.path under run.py and in the standalone entry point

    return formulas


# ------------------------------------------------------------------------------------------------
# GPU run
# ------------------------------------------------------------------------------------------------
def run(case, harness):
    import torch

    import openmla
    import peer  # benchmarks/peer.py: FlashMLA in the same run, when importable

    b, s_q, h_q, topk, s_k = case["b"], case["s_q"], case["h_q"], case["topk"], case["s_k"]
    q, k_cache, indices, attn_sink, _, stats = make_inputs(b, s_q, h_q, topk, s_k, case["varlen"])
    sink = attn_sink if case.get("attn_sink", True) else None
    out = torch.empty((b, s_q, h_q, D_V), dtype=q.dtype, device=q.device)
    lse = torch.empty((b, s_q, h_q), dtype=torch.float32, device=q.device).transpose(1, 2)

    # Plan once, outside the timed region (the scheduler is excluded); later calls reuse the schedule.
    meta, _ = openmla.get_mla_metadata()

    def call():
        openmla.flash_mla_with_kvcache(q, k_cache, None, None, D_V, meta, is_fp8_kvcache=True, indices=indices,
                                       attn_sink=sink, out=out, lse=lse)

    # The first call fills the schedule; then CUPTI span of the eager call (main kernel + combine) as time_us,
    # and the event-timed graph replay and eager call beside it.
    timing = harness.time_decode_call(call)
    time_us = timing["time_us"]

    f = harness.formulas
    mean_topk = f.sparse_decode_mean_attended(topk)  # no topk_length: every slot counted, -1 ones included
    flops = f.sparse_decode_flops(b, s_q, h_q, mean_topk, D_QK, D_V)
    nbytes = f.sparse_decode_bytes(b, s_q, h_q, stats["unique_tokens"], D_QK, D_V)
    tflops = flops / (time_us * 1e-6) / 1e12
    gbps = nbytes / (time_us * 1e-6) / 1e9
    device = getattr(harness, "device", "")
    target = _resolve_target(case.get("target"), device)
    copy_gbps = (getattr(harness, "ceilings", None) or {}).get("copy_gbps")
    if target is None and case["h_q"] < 64 and copy_gbps:
        target = {"gbps": float(copy_gbps)}  # memory-bound row: against the copy ceiling of this run
    ratio = None
    if target:
        if "time_us" in target:
            ratio = target["time_us"] / time_us
        elif "gbps" in target:
            ratio = gbps / target["gbps"]
        else:
            ratio = tflops / target["tflops"]
    key = (b, h_q, topk)
    out_finite = bool(torch.isfinite(out.float()).all())
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
        "mean_topk": mean_topk,
        "out_finite": out_finite,
        **stats,
    }
    if "h100" in device.lower() and key in _FLASHMLA_TFLOPS_H100:
        record["flashmla_tflops"] = _FLASHMLA_TFLOPS_H100[key]
    tsm = getattr(meta, "tile_scheduler_metadata", None)
    splits = getattr(meta, "num_splits", None)
    if tsm is not None:
        record["num_sm_parts"] = int(tsm.shape[0])
    if splits is not None:
        record["total_splits"] = int(splits[-1])

    # FlashMLA on the same tensors (the FP8 cache is the same 656-byte V3.2 layout, uint8), timed the same way
    # (benchmarks/peer.py); its schedule object is filled by its first call, outside the timed region, as ours.
    def peer_call(fm):
        sched, _ = fm.get_mla_metadata()

        def call():
            o, l = fm.flash_mla_with_kvcache(q, k_cache, None, None, D_V, sched, is_fp8_kvcache=True,
                                             indices=indices, attn_sink=sink)
            return {"out": o, "lse": l}

        return call

    flashmla_target = _resolve_target(case.get("target"), device)  # not the copy ceiling of the h_q = 16 row
    record.update(peer.measure(
        harness, SUITE, time_us, ours={"out": out, "lse": lse}, make_call=peer_call,
        unsupported=peer.unsupported_reason(SUITE, h_q=h_q, d_qk=D_QK, topk=topk, h_kv=1, page=PAGE, d_v=D_V),
        fallback_us=peer.target_as_us(flashmla_target, flops, nbytes)))
    del q, k_cache, indices, attn_sink, sink, out, lse, meta
    torch.cuda.empty_cache()
    return record


# ------------------------------------------------------------------------------------------------
# No GPU: a tiny case on the CPU reference (numpy), same recipe
# ------------------------------------------------------------------------------------------------
def cpu_reference() -> int:
    """Runs a small sparse-decode case through openmla.reference; returns 0 on success (prints what it did)."""
    import time

    try:
        import numpy as np

        import openmla
        ref = openmla.reference
    except Exception as err:
        print(f"CPU reference not available: {type(err).__name__}: {err}")
        return 1
    b, s_q, h_q, topk, s_k = 2, S_Q, 16, 128, 256
    rng = np.random.default_rng(SEED)
    lens = np.array([s_k, 100], dtype=np.int64)  # the second request is shorter than topk: -1 slots
    pages = (lens + PAGE - 1) // PAGE
    order = rng.permutation(int(pages.sum())).astype(np.int64)
    starts = np.concatenate([[0], np.cumsum(pages)[:-1]])
    indices = np.full((b, s_q, topk), -1, dtype=np.int32)
    for r in range(b):
        for s in range(s_q):
            pos = rng.permutation(int(lens[r]))[:topk]
            indices[r, s, :pos.size] = order[starts[r] + pos // PAGE] * PAGE + pos % PAGE
    q = np.clip(rng.standard_normal((b, s_q, h_q, D_QK), dtype=np.float32), -1, 1)
    kv = np.clip(rng.standard_normal((int(pages.sum()), PAGE, 1, D_QK), dtype=np.float32) / 10, -1, 1)
    try:
        import ml_dtypes

        kv_bf16 = kv.astype(ml_dtypes.bfloat16)
    except Exception:  # no ml_dtypes: bf16 bit patterns by truncation (fine for a demonstration)
        kv_bf16 = (kv.view(np.uint32) >> 16).astype(np.uint16)
    cache = ref.fp8_encode_pages(kv_bf16)  # (blocks, 64, 1, 656) V3.2 bytes
    sink = rng.standard_normal(h_q, dtype=np.float32)
    f = _formulas()
    unique = f.count_unique_tokens(indices)
    print(f"sparse decode on the CPU reference: b={b} s_q={s_q} h_q={h_q} topk={topk} d_qk={D_QK} d_v={D_V} "
          f"page={PAGE} V3.2 FP8 cache, seqlens={lens.tolist()}, attn_sink on")
    t0 = time.perf_counter()
    try:
        out, lse = ref.sparse_decode(q, cache, indices, attn_sink=sink, head_dim_v=D_V)
    except Exception as err:
        print(f"CPU reference sparse_decode failed: {type(err).__name__}: {err}")
        return 1
    dt = time.perf_counter() - t0
    out, lse = np.asarray(out, dtype=np.float64), np.asarray(lse, dtype=np.float64)
    mean_topk = f.sparse_decode_mean_attended(topk)  # no topk_length: every slot counted, -1 ones included
    flops = f.sparse_decode_flops(b, s_q, h_q, mean_topk, D_QK, D_V)
    nbytes = f.sparse_decode_bytes(b, s_q, h_q, unique, D_QK, D_V)
    print(f"  out {tuple(out.shape)}  mean |out| = {np.abs(out).mean():.4f}  finite: {bool(np.isfinite(out).all())}")
    print(f"  lse {tuple(lse.shape)}  range [{lse.min():.3f}, {lse.max():.3f}]")
    print(f"  {unique} distinct index values (-1 once), {int((indices != -1).sum())} valid slots of {indices.size}; "
          f"{flops / 1e6:.1f} MFLOP, {nbytes / 1e6:.2f} MB by the formulas")
    print(f"  {dt * 1e3:.1f} ms on the CPU ({flops / dt / 1e9:.2f} GFLOP/s; double accumulation, deliberately naive)")
    return 0 if np.isfinite(out).all() and np.isfinite(lse).all() else 1


if __name__ == "__main__":  # standalone: python3 benchmarks/bench_sparse_decode.py [--quick]
    import os
    import sys

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(1, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))
    import harness as harness_mod

    if harness_mod.device_name() == "cpu":
        print("no CUDA device visible to PyTorch: running the CPU reference on a tiny case instead")
        sys.exit(cpu_reference())
    quick = "--quick" in sys.argv
    h = harness_mod.Harness({}, quick=quick, reps=20 if quick else 50)
    print(f"device: {h.device}")
    print("time_us: CUPTI span of the eager call's kernels; main_us: main kernel alone; graph_us / eager_us: CUDA "
          "events around a graph replay / the eager call")
    print(f"{'case':<36} {'time_us':>9} {'main_us':>9} {'TFLOP/s':>8} {'GB/s':>7} {'target':>10} {'ratio':>6} "
          f"{'graph_us':>9} {'eager_us':>9}")
    for c in cases(quick):
        r = run(c, h)
        t = r["target"]
        t_text = "-" if not t else (f"{t['time_us']:g} us" if "time_us" in t else f"{t['gbps']:.0f} GB/s")
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.3f}"
        main = "-" if r["main_kernel_us"] is None else f"{r['main_kernel_us']:.1f}"
        print(f"{c['name']:<36} {r['time_us']:9.1f} {main:>9} {r['tflops']:8.1f} {r['gbps']:7.0f} {t_text:>10} "
              f"{ratio:>6} {r['graph_event_time_us']:9.1f} {r['eager_time_us']:9.1f}")
        if r.get("timing_note"):
            print(f"  note: {r['timing_note']}")
