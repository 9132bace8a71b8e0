"""Dense MHA prefill forward (openmla.flash_attn_varlen_func) against torch's cuDNN SDPA, measured in the same process.

Rows (bf16, h_q = h_kv = 128 unless stated; docs/targets.md, "Dense MHA prefill"):
  - b = 2, s = 4096, d_qk 192 / d_v 128, causal and non-causal; b = 1, s = 8192 and 32768, 192/128, causal;
    b = 2, s = 4096, 128/128, causal; b = 16, s = 1024, 192/128, causal;
  - a varlen batch of 16 sequences of 512-8192 tokens (seeded), causal: cuDNN runs the batch padded to its longest
    sequence (the FLOPs are counted on the real tokens for both);
  - h_q = 16 (a TP8 shard of 128 heads): b = 2, s = 4096; b = 1, s = 32768; b = 16, s = 1024; 192/128, causal.

The target of each row is cuDNN's time on the same inputs in the same run (cuDNN varied by ~5 % between two H100s,
docs/targets.md), so `ratio` = cuDNN time / our time (> 1: faster). The peers' figures of docs/targets.md are recorded
beside it (`peer_h100_tflops`). Both are timed with CUDA events around the call, an 8 GB flush before each
(harness.time_cuda), median of 50; FLOPs = 2 sum_i s_q,i s_k,i h_q (d_qk + d_v), halved under causal
(formulas.dense_prefill_fwd_flops). `max_abs_diff_vs_cudnn` compares the two outputs on the rows both compute.

The suite lists no case (printing the reason) when the family is compiled out of this build (CMake
OPENMLA_ENABLE_MHA_PREFILL=OFF); a missing or non-Hopper GPU is run.py's to report. Before the first case one tiny call
runs in a child process with a time limit, so a kernel that hangs or faults turns every row into an error instead of
eating the benchmark's time.
"""
from __future__ import annotations

import os
import random
import subprocess
import sys

SUITE = "mha_prefill_fwd"
DEFAULT = True
SEED = 0
K = 1024
SMOKE_TIMEOUT_S = 90

# docs/targets.md: cuDNN SDPA and FlashAttention-4's Hopper path on one H100 (2026-11-25), forward TFLOP/s.
_PEERS_H100 = {
    (2, 4096, 192, True): {"cudnn": 582, "fa4": 625},
    (2, 4096, 192, False): {"cudnn": 655, "fa4": 717},
    (1, 8192, 192, True): {"cudnn": 620, "fa4": 693},
    (2, 4096, 128, True): {"cudnn": 572, "fa4": 553},
    (1, 32768, 192, True): {"cudnn": 598, "fa4": 696},
    (16, 1024, 192, True): {"cudnn": 429, "fa4": 366},
}


def _case(b, s, d_qk, causal, h=128, varlen=False):
    name = f"{'varlen16' if varlen else f'b{b}_s{s // K}k'}_d{d_qk}_{'causal' if causal else 'full'}_h{h}"
    peer = None if varlen or h != 128 else _PEERS_H100.get((b, s, d_qk, causal))
    return dict(name=name, b=b, s_q=s, s_k=s, h_q=h, h_kv=h, d_qk=d_qk, d_v=128, causal=causal, varlen=varlen,
                peer=peer)


def _all_cases():
    cases = [
        _case(2, 4 * K, 192, True), _case(2, 4 * K, 192, False), _case(1, 8 * K, 192, True),
        _case(1, 32 * K, 192, True), _case(2, 4 * K, 128, True), _case(16, 1 * K, 192, True),
        _case(16, 8 * K, 192, True, varlen=True),
        _case(2, 4 * K, 192, True, h=16), _case(1, 32 * K, 192, True, h=16), _case(16, 1 * K, 192, True, h=16),
    ]
    return cases


def _build_gap():
    """Why the family does not run, when the reason is this build (compiled out); else None."""
    try:
        import openmla

        ok, why = openmla.query_capability("dense_prefill")
    except Exception:
        return None
    return why if not ok and "compiled out" in why else None


def cases(quick=False):
    del quick
    why = _build_gap()
    if why:
        print(f"[{SUITE}] skipped: {why}", flush=True)
        return []
    return _all_cases()


def varlen_lengths(n=16, lo=512, hi=8 * K, seed=SEED):
    rng = random.Random(seed)
    return [rng.randint(lo, hi) for _ in range(n)]


_SMOKE = r"""
import torch, openmla
cu = torch.tensor([0, 100, 300], dtype=torch.int32, device="cuda")
q = torch.randn((300, 4, 192), device="cuda").bfloat16()
k = torch.randn((300, 2, 192), device="cuda").bfloat16()
v = torch.randn((300, 2, 128), device="cuda").bfloat16()
out, lse = openmla.flash_attn_varlen_func(q, k, v, cu, cu, 200, 200, causal=True)
torch.cuda.synchronize()
assert bool(torch.isfinite(out).all()) and bool(torch.isfinite(lse).all())
print("smoke ok")
"""
_smoke_result = None


def _smoke():
    """(ok, report) of one tiny call in a child process (cached for the run)."""
    global _smoke_result
    if _smoke_result is None:
        here = os.path.dirname(os.path.abspath(__file__))
        root = os.path.dirname(here)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(root, "python"), os.path.join(root, ".deps", "py"),
                                                           os.environ.get("PYTHONPATH", "")]))
        try:
            proc = subprocess.run([sys.executable, "-c", _SMOKE], env=env, capture_output=True, text=True,
                                  timeout=SMOKE_TIMEOUT_S)
            _smoke_result = (proc.returncode == 0, (proc.stdout + proc.stderr)[-2000:])
        except subprocess.TimeoutExpired:
            _smoke_result = (False, f"no answer within {SMOKE_TIMEOUT_S} s (a hang?)")
    return _smoke_result


def make_inputs(lengths, h_q, h_kv, d_qk, d_v, device="cuda", seed=SEED):
    """Packed q (total, h_q, d_qk), k, v and int32 cumulative lengths for sequences of `lengths` (s_q = s_k)."""
    import torch

    g = torch.Generator(device=device).manual_seed(seed)
    total = sum(lengths)
    q = torch.randn((total, h_q, d_qk), generator=g, device=device, dtype=torch.bfloat16)
    k = torch.randn((total, h_kv, d_qk), generator=g, device=device, dtype=torch.bfloat16)
    v = torch.randn((total, h_kv, d_v), generator=g, device=device, dtype=torch.bfloat16)
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    return q, k, v, torch.tensor(cu, dtype=torch.int32, device=device)


def _cudnn_call(q, k, v, lengths, causal, scale, copy=False):
    """A callable running cuDNN SDPA on (b, h, s, d) views of the same packed inputs (equal lengths; contiguous copies
    with `copy`), or on copies padded to the longest sequence (varlen), and the dict its output lands in."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    b, s = len(lengths), max(lengths)
    if all(n == s for n in lengths):
        qb, kb, vb = (t.view(b, s, t.shape[1], t.shape[2]).transpose(1, 2) for t in (q, k, v))
        if copy:
            qb, kb, vb = (t.contiguous() for t in (qb, kb, vb))
    else:
        def pad(t):
            out = torch.zeros((b, s, t.shape[1], t.shape[2]), dtype=t.dtype, device=t.device)
            start = 0
            for i, n in enumerate(lengths):
                out[i, :n] = t[start:start + n]
                start += n
            return out.transpose(1, 2)

        qb, kb, vb = pad(q), pad(k), pad(v)
    result = {}

    def call():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            result["out"] = torch.nn.functional.scaled_dot_product_attention(qb, kb, vb, is_causal=causal, scale=scale)

    return call, result


def run(case, harness):
    import torch

    import openmla

    ok, report = _smoke()
    if not ok:
        raise RuntimeError(f"dense MHA prefill smoke call failed, not timing: {report}")
    b, s, h_q, h_kv, d_qk, d_v, causal = (case[k] for k in ("b", "s_q", "h_q", "h_kv", "d_qk", "d_v", "causal"))
    lengths = varlen_lengths(b, 512, s) if case["varlen"] else [s] * b
    q, k, v, cu = make_inputs(lengths, h_q, h_kv, d_qk, d_v)
    total = q.shape[0]
    out = torch.empty((total, h_q, d_v), dtype=q.dtype, device=q.device)
    lse = torch.empty((h_q, total), dtype=torch.float32, device=q.device).t()
    scale = d_qk ** -0.5

    def ours():
        openmla.flash_attn_varlen_func(q, k, v, cu, cu, max(lengths), max(lengths), causal=causal, out=out, lse=lse)

    harness.rest_before_timing(ours)
    t = harness.time_cuda(ours)
    flops = harness.formulas.dense_prefill_fwd_flops(lengths, lengths, h_q, d_qk, d_v, causal)
    record = {
        "params": {k: case[k] for k in ("b", "s_q", "s_k", "h_q", "h_kv", "d_qk", "d_v", "causal")},
        "time_us": t.median_us,
        "flops": flops,
        "timing_method": "events",
        "out_finite": bool(torch.isfinite(out.float()).all()),
    }
    if case["varlen"]:
        record["params"]["lengths"] = lengths
    if case.get("peer"):
        record["peer_h100_tflops"] = case["peer"]

    try:
        call, result = _cudnn_call(q, k, v, lengths, causal, scale)
        try:
            call()
        except RuntimeError:  # cuDNN may want the (b, h, s, d) layout itself: the same values, copied
            call, result = _cudnn_call(q, k, v, lengths, causal, scale, copy=True)
            record["cudnn_inputs"] = "contiguous copies"
        harness.rest_before_timing(call)
        tc = harness.time_cuda(call)
        record["cudnn_time_us"] = tc.median_us
        record["cudnn_tflops"] = flops / (tc.median_us * 1e-6) / 1e12
        record["target"] = {"time_us": tc.median_us}  # run.py: ratio = cuDNN time / ours
        ref = result["out"].transpose(1, 2)  # (b, s, h, d_v)
        start, diff = 0, 0.0
        for i, n in enumerate(lengths):
            diff = max(diff, float((out[start:start + n].float() - ref[i, :n].float()).abs().max()))
            start += n
        record["max_abs_diff_vs_cudnn"] = diff
    except Exception as err:  # no cuDNN attention in this torch build, or it refuses the shape
        record["timing_note"] = f"cuDNN SDPA not measured: {type(err).__name__}: {str(err)[:200]}"
    del q, k, v, cu, out, lse
    torch.cuda.empty_cache()
    return record


def cpu_reference() -> int:
    """A tiny dense MHA prefill case on the CPU reference (numpy); returns 0 on success."""
    try:
        import numpy as np

        import openmla
    except Exception as err:
        print(f"CPU reference not available: {type(err).__name__}: {err}")
        return 1
    rng = np.random.default_rng(SEED)
    lengths, h_q, h_kv, d_qk, d_v = [5, 40, 17], 4, 2, 192, 128
    total = sum(lengths)
    q = rng.standard_normal((total, h_q, d_qk)).astype(np.float32)
    k = rng.standard_normal((total, h_kv, d_qk)).astype(np.float32)
    v = rng.standard_normal((total, h_kv, d_v)).astype(np.float32)
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    out, lse = openmla.reference.mha_forward(q, k, v, cu, cu, causal=True)
    print(f"dense MHA prefill on the CPU reference: lengths={lengths} h_q={h_q} h_kv={h_kv} d_qk={d_qk} d_v={d_v} "
          f"causal: mean |out| = {np.abs(out).mean():.4f}, lse in [{lse.min():.3f}, {lse.max():.3f}]")
    return 0 if np.isfinite(out).all() and np.isfinite(lse).all() else 1
