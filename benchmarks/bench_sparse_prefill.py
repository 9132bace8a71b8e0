"""Sparse top-k MLA prefill (openmla.flash_mla_sparse_fwd): FlashMLA's performance rows beside its H100 figures.

Rows (s_q = 4096 query tokens, attention sink on, bf16, sm_scale = d_qk ** -0.5; docs/targets.md):
  - V3.2 (d_qk 576, topk 2048): h_q 128 at s_kv 8K / 32K / 64K / 128K; h_q 64 at 8K and 128K;
  - MODEL1 (d_qk 512): h_q 64 with topk 512 and h_q 128 with topk 1024, at s_kv 8K / 32K / 64K;
  - h_q 16 (a TP8 shard), V3.2 topk 2048 at s_kv 32K, beside the same call with the heads padded to 64 (what
    engines do today): the padded row is the h_q 16 row's target, so its ratio is the gain of not padding.

Inputs as FlashMLA's prefill test: q, kv ~ N(0, 1) / 10 (bf16), per token `topk` distinct random rows of kv in
random order (no topk_length), attn_sink ~ N(0, 1) per head.

time_us is the kernel's CUPTI span with an 8 GB flush before every call (harness.time_cupti), median of 50 (20
with --quick); FLOPs = 2 s_q topk h_q (d_qk + d_v) (formulas.sparse_prefill_flops), bytes = 2 d_qk x valid slots +
2 s_q h_q (d_qk + d_v).

Where flash_mla is importable (tools/peer_flashmla.sh), FlashMLA's flash_mla_sparse_fwd on the same tensors is timed in
the same run by the same method (benchmarks/peer.py): flashmla_us, ratio_to_flashmla (= flashmla_us / time_us),
peer_max_abs_diff / peer_agrees. MODEL1 (d_qk 512) rows are served by FlashMLA's SM90 prefill; the h_q 16 row is not
(h_q 64 and 128 only: its padded twin is FlashMLA's answer) and records why. Without it flashmla_us is the
docs/targets.md figure (flashmla_source says which).
"""
from __future__ import annotations

SUITE = "sparse_prefill"
DEFAULT = True

S_Q = 4096
D_V = 512
SEED = 0
K = 1024

# FlashMLA's sparse prefill kernel time in microseconds on the lent H100 (docs/targets.md), by (d_qk, h_q, topk, s_kv).
_FLASHMLA_US_H100 = {
    (576, 128, 2048, 8 * K): 3423, (576, 128, 2048, 32 * K): 3736, (576, 128, 2048, 64 * K): 4023,
    (576, 128, 2048, 128 * K): 4263,
    (576, 64, 2048, 8 * K): 1760, (576, 64, 2048, 128 * K): 3125,
    (512, 64, 512, 8 * K): 529, (512, 64, 512, 32 * K): 594, (512, 64, 512, 64 * K): 699,
    (512, 128, 1024, 8 * K): 1760, (512, 128, 1024, 32 * K): 1904, (512, 128, 1024, 64 * K): 2014,
}


def _name(d_qk, h_q, topk, s_kv, padded=False):
    layout = "v32" if d_qk == 576 else "model1"
    return f"{layout}_hq{h_q}_topk{topk}_skv{s_kv // K}k_sq{S_Q}_sink" + ("_padded64" if padded else "")


def _case(d_qk, h_q, topk, s_kv, padded=False):
    key = (d_qk, h_q, topk, s_kv)
    target = {"h100": {"time_us": _FLASHMLA_US_H100[key]}} if key in _FLASHMLA_US_H100 and not padded else None
    return dict(name=_name(d_qk, h_q, topk, s_kv, padded), s_q=S_Q, s_kv=s_kv, topk=topk, h_q=h_q, d_qk=d_qk,
                attn_sink=True, padded_to=64 if padded else None, target=target)


def _all_cases():
    cases = [_case(576, 128, 2048, s * K) for s in (8, 32, 64, 128)]
    cases += [_case(576, 64, 2048, s * K) for s in (8, 128)]
    cases += [_case(512, 64, 512, s * K) for s in (8, 32, 64)]
    cases += [_case(512, 128, 1024, s * K) for s in (8, 32, 64)]
    cases += [_case(576, 16, 2048, 32 * K), _case(576, 16, 2048, 32 * K, padded=True)]
    return cases


TARGETS = {c["name"]: c["target"] for c in _all_cases() if c["target"]}


def cases(quick=False):
    del quick
    return _all_cases()


def _resolve_target(target, device):
    dev = (device or "").lower()
    return next((v for k, v in (target or {}).items() if k in dev), None)


def make_inputs(s_q, s_kv, topk, h_q, d_qk, seed=SEED, device="cuda"):
    """q (s_q, h_q, d_qk), kv (s_kv, 1, d_qk), indices (s_q, 1, topk): distinct random rows per token, sink."""
    import torch

    g = torch.Generator(device=device).manual_seed(seed)
    q = (torch.randn((s_q, h_q, d_qk), generator=g, device=device) / 10).to(torch.bfloat16)
    kv = (torch.randn((s_kv, 1, d_qk), generator=g, device=device) / 10).to(torch.bfloat16)
    indices = torch.empty((s_q, 1, topk), dtype=torch.int32, device=device)
    chunk = max(1, (1 << 28) // (4 * s_kv))  # rows of random keys per chunk (~256 MB)
    for t0 in range(0, s_q, chunk):
        t1 = min(s_q, t0 + chunk)
        keys = torch.rand((t1 - t0, s_kv), generator=g, device=device)
        indices[t0:t1, 0] = keys.topk(topk, dim=1).indices.to(torch.int32)  # distinct, random order
        del keys
    sink = torch.randn((h_q,), generator=g, device=device, dtype=torch.float32)
    return q, kv, indices, sink


def run(case, harness):
    import torch

    import openmla
    import peer  # benchmarks/peer.py: FlashMLA in the same run, when importable

    s_q, s_kv, topk, h_q, d_qk = case["s_q"], case["s_kv"], case["topk"], case["h_q"], case["d_qk"]
    q, kv, indices, sink = make_inputs(s_q, s_kv, topk, h_q, d_qk)
    if case.get("padded_to"):
        # What engines do for a shard of fewer than 64 heads today: zero-pad q (and the sink) to 64 heads.
        pad = case["padded_to"]
        q64 = torch.zeros((s_q, pad, d_qk), dtype=q.dtype, device=q.device)
        q64[:, :h_q] = q
        sink64 = torch.zeros((pad,), dtype=torch.float32, device=q.device)
        sink64[:h_q] = sink
        q, sink = q64, sink64
    heads = q.shape[1]
    out = torch.empty((s_q, heads, D_V), dtype=torch.bfloat16, device=q.device)
    mx = torch.empty((s_q, heads), dtype=torch.float32, device=q.device)
    lse = torch.empty((s_q, heads), dtype=torch.float32, device=q.device)
    scale = d_qk ** -0.5

    def call():
        openmla.flash_mla_sparse_fwd(q, kv, indices, scale, attn_sink=sink, out=out, max_logits=mx, lse=lse)

    harness.rest_before_timing(call)
    t = harness.time_cupti(call)
    time_us = t.span_us if t.method == "cupti" else t.median_us
    f = harness.formulas
    # FLOPs of the call as asked (h_q heads; the padded row does the work of 64 but is credited with h_q's).
    flops = f.sparse_prefill_flops(s_q, topk, h_q, d_qk, D_V)
    nbytes = f.sparse_prefill_bytes(s_q, h_q, s_q * topk, d_qk, D_V)
    record = {
        "params": {k: v for k, v in case.items() if k not in ("name", "target")},
        "time_us": time_us,
        "flops": flops,
        "bytes": nbytes,
        "timing_method": t.method,
        "kernels": [[n, us] for n, us in t.kernels] if t.method == "cupti" else [],
        "out_finite": bool(torch.isfinite(out.float()).all()),
    }
    target = _resolve_target(case.get("target"), getattr(harness, "device", ""))
    if target is not None:
        record["target"] = target
        record["ratio"] = target["time_us"] / time_us
    if t.note:
        record["timing_note"] = t.note

    # FlashMLA on the same tensors (the padded row: the same padded q and sink), timed the same way
    # (benchmarks/peer.py). Prefill has no schedule; FlashMLA allocates its outputs in the call (no kernel).
    def peer_call(fm):
        def call():
            o, m, l = fm.flash_mla_sparse_fwd(q, kv, indices, scale, d_v=D_V, attn_sink=sink)
            return {"out": o, "max_logits": m, "lse": l}

        return call

    record.update(peer.measure(
        harness, SUITE, time_us, ours={"out": out, "max_logits": mx, "lse": lse}, make_call=peer_call,
        unsupported=peer.unsupported_reason(SUITE, h_q=heads, d_qk=d_qk, topk=topk, h_kv=kv.shape[1], d_v=D_V),
        fallback_us=peer.target_as_us(target)))
    del q, kv, indices, sink, out, mx, lse
    torch.cuda.empty_cache()
    return record


def cpu_reference() -> int:
    """A tiny sparse-prefill case on the CPU reference (numpy); returns 0 on success."""
    try:
        import numpy as np

        import openmla
    except Exception as err:
        print(f"CPU reference not available: {type(err).__name__}: {err}")
        return 1
    rng = np.random.default_rng(SEED)
    s_q, s_kv, topk, h_q, d_qk = 8, 300, 130, 16, 576
    q = (rng.standard_normal((s_q, h_q, d_qk)) / 10).astype(np.float32)
    kv = (rng.standard_normal((s_kv, 1, d_qk)) / 10).astype(np.float32)
    indices = np.stack([rng.permutation(s_kv)[:topk] for _ in range(s_q)]).astype(np.int32)[:, None, :]
    sink = rng.standard_normal(h_q).astype(np.float32)
    out, mx, lse = openmla.reference.sparse_prefill(q, kv, indices, d_qk ** -0.5, attn_sink=sink)
    print(f"sparse prefill on the CPU reference: s_q={s_q} s_kv={s_kv} topk={topk} h_q={h_q} d_qk={d_qk}: "
          f"mean |out| = {np.abs(out).mean():.4f}, lse in [{lse.min():.3f}, {lse.max():.3f}]")
    return 0 if np.isfinite(out).all() and np.isfinite(lse).all() else 1
