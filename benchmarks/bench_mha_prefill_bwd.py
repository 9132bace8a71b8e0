"""Dense MHA prefill backward (openmla._openmla.mha_prefill_bwd, the kernels behind flash_attn_varlen_func's autograd)
against torch's cuDNN SDPA backward, measured in the same process.

Rows (bf16, h_q = h_kv = 128 unless stated; the forward suite's rows, bench_mha_prefill_fwd.py), each twice: with the
default dq order and with deterministic=True (suffix `_det`):
  - b = 2, s = 4096, d_qk 192 / d_v 128, causal and non-causal; b = 1, s = 8192 and 32768, 192/128, causal;
    b = 2, s = 4096, 128/128, causal; b = 16, s = 1024, 192/128, causal;
  - the varlen batch of 16 sequences of 512-8192 tokens (seeded, the forward's), causal: cuDNN runs it padded to the
    longest sequence (the FLOPs are counted on the real tokens for both), so its ratio is not like for like;
  - h_q = 16 (a TP8 shard of 128 heads): b = 2, s = 4096; b = 1, s = 32768; b = 16, s = 1024; 192/128, causal;
  - GQA: h_q 128, h_kv 16, b = 2, s = 4096, causal (cuDNN with enable_gqa when it accepts it, else the kv heads
    repeated: `cudnn_inputs` says which).

Ours: one call of the binding's backward (workspace reset, preprocess, main kernel, dq conversion) on the forward's out
and lse, caller-owned dq, dk, dv. cuDNN: its forward runs once with inputs requiring grad, then only
torch.autograd.grad(out, (q, k, v), dout, retain_graph=True) is timed. Both with CUDA events around the call, an 8 GB
flush before each (harness.time_cuda), median of 10 (REPS). FLOPs = 2.5 x the forward's (formulas.dense_prefill_bwd_flops:
causal halves). `ratio_to_cudnn` (= run.py's ratio) is cuDNN's time / ours (> 1: faster); a deterministic row reuses
the cuDNN time of its default row (cuDNN's backward does not change with our flag). `max_abs_diff_vs_cudnn` compares dq,
dk and dv with cuDNN's on the rows both compute.

The suite lists no case (printing the reason) when the family is compiled out of this build; a call that answers
NotImplementedError (a build whose backward is not there) skips every case with that reason (harness.SkipCase). Before
the first case one tiny forward + backward runs in a child process with a time limit, so a kernel that hangs or faults
turns every row into an error instead of eating the benchmark's time.
"""
from __future__ import annotations

import os
import subprocess
import sys

import bench_mha_prefill_fwd as fwd  # the forward suite's inputs, lengths and cuDNN layout

SUITE = "mha_prefill_bwd"
DEFAULT = True
K = 1024
SMOKE_TIMEOUT_S = 120


def _case(b, s, d_qk, causal, h=128, h_kv=None, varlen=False, deterministic=False):
    h_kv = h if h_kv is None else h_kv
    name = f"{'varlen16' if varlen else f'b{b}_s{s // K}k'}_d{d_qk}_{'causal' if causal else 'full'}_h{h}"
    if h_kv != h:
        name += f"_kv{h_kv}"
    if deterministic:
        name += "_det"
    return dict(name=name, b=b, s_q=s, s_k=s, h_q=h, h_kv=h_kv, d_qk=d_qk, d_v=128, causal=causal,
                deterministic=deterministic, varlen=varlen)


def _all_cases():
    rows = [
        dict(b=2, s=4 * K, d_qk=192, causal=True), dict(b=2, s=4 * K, d_qk=192, causal=False),
        dict(b=1, s=8 * K, d_qk=192, causal=True), dict(b=1, s=32 * K, d_qk=192, causal=True),
        dict(b=2, s=4 * K, d_qk=128, causal=True), dict(b=16, s=1 * K, d_qk=192, causal=True),
        dict(b=16, s=8 * K, d_qk=192, causal=True, varlen=True),
        dict(b=2, s=4 * K, d_qk=192, causal=True, h=16), dict(b=1, s=32 * K, d_qk=192, causal=True, h=16),
        dict(b=16, s=1 * K, d_qk=192, causal=True, h=16),
        dict(b=2, s=4 * K, d_qk=192, causal=True, h=128, h_kv=16),
    ]
    return [_case(**row, deterministic=det) for row in rows for det in (False, True)]


def cases(quick=False):
    del quick
    why = fwd._build_gap()
    if why:
        print(f"[{SUITE}] skipped: {why}", flush=True)
        return []
    return _all_cases()


_SMOKE = r"""
import torch, openmla
cu = torch.tensor([0, 100, 300], dtype=torch.int32, device="cuda")
q = torch.randn((300, 4, 192), device="cuda").bfloat16().requires_grad_()
k = torch.randn((300, 2, 192), device="cuda").bfloat16().requires_grad_()
v = torch.randn((300, 2, 128), device="cuda").bfloat16().requires_grad_()
out, lse = openmla.flash_attn_varlen_func(q, k, v, cu, cu, 200, 200, causal=True)
out.backward(torch.randn_like(out))
torch.cuda.synchronize()
assert all(bool(torch.isfinite(t.grad).all()) for t in (q, k, v))
print("smoke ok")
"""
_smoke_result = None


def _smoke():
    """(ok, report) of one tiny forward + backward in a child process (cached for the run)."""
    global _smoke_result
    if _smoke_result is None:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(root, "python"), os.path.join(root, ".deps", "py"),
                                                           os.environ.get("PYTHONPATH", "")]))
        try:
            proc = subprocess.run([sys.executable, "-c", _SMOKE], env=env, capture_output=True, text=True,
                                  timeout=SMOKE_TIMEOUT_S)
            _smoke_result = (proc.returncode == 0, (proc.stdout + proc.stderr)[-2000:])
        except subprocess.TimeoutExpired:
            _smoke_result = (False, f"no answer within {SMOKE_TIMEOUT_S} s (a hang?)")
    return _smoke_result


def _padded(t, lengths):
    """(b, h, s_max, d) copy of packed rows, zero past each sequence's end."""
    import torch

    b, s = len(lengths), max(lengths)
    out = torch.zeros((b, s, t.shape[1], t.shape[2]), dtype=t.dtype, device=t.device)
    start = 0
    for i, n in enumerate(lengths):
        out[i, :n] = t[start:start + n]
        start += n
    return out.transpose(1, 2)


def _cudnn_backward(q, k, v, dout, lengths, causal, scale):
    """(call, grads, note): a callable timing cuDNN's backward alone on (b, h, s, d) copies of the same inputs (padded
    for varlen; GQA through enable_gqa, else with the kv heads repeated), the gradients its first call returned, and a
    note on the inputs."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    group = q.shape[1] // k.shape[1]
    note = "padded to the longest sequence" if len(set(lengths)) > 1 else "contiguous (b, h, s, d) copies"
    qb, kb, vb, db = (_padded(t, lengths).contiguous() for t in (q, k, v, dout))
    qb, kb, vb = (t.requires_grad_(True) for t in (qb, kb, vb))
    out = None
    if group > 1:
        try:
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                out = torch.nn.functional.scaled_dot_product_attention(qb, kb, vb, is_causal=causal, scale=scale,
                                                                       enable_gqa=True)
            note += ", GQA by enable_gqa"
        except (RuntimeError, TypeError):
            kb, vb = (t.detach().repeat_interleave(group, dim=1).requires_grad_(True) for t in (kb, vb))
            note += ", GQA by repeating the kv heads (cuDNN refused enable_gqa)"
    if out is None:
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            out = torch.nn.functional.scaled_dot_product_attention(qb, kb, vb, is_causal=causal, scale=scale)
    leaves = (qb, kb, vb)
    grads = {}

    def call():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            grads["g"] = torch.autograd.grad(out, leaves, db, retain_graph=True)

    return call, grads, note


def _max_abs_diff(ours, theirs_bhsd, lengths, group=1):
    """Max |ours - theirs| over the rows both compute (theirs (b, h, s, d), padded; with repeated kv heads summed back
    into their kv head)."""
    theirs = theirs_bhsd.transpose(1, 2)  # (b, s, h, d)
    if theirs.shape[2] != ours.shape[1]:  # repeated kv heads: their gradient per query head, summed per kv head
        theirs = theirs.unflatten(2, (ours.shape[1], group)).sum(3)
    start, diff = 0, 0.0
    for i, n in enumerate(lengths):
        diff = max(diff, float((ours[start:start + n].float() - theirs[i, :n].float()).abs().max()) if n else 0.0)
        start += n
    return diff


# A backward call takes milliseconds to a second (s = 32K, deterministic): a median of 10 after 2 warm-up calls keeps
# the suite within a few minutes (MHA_BWD_BENCH_REPS overrides).
REPS = int(os.environ.get("MHA_BWD_BENCH_REPS", "10"))
WARMUP = 2

_cudnn_times = {}  # default row's name -> its cuDNN record fields (reused by the deterministic row)


def run(case, harness):
    import torch

    import openmla
    from harness import SkipCase

    ok, report = _smoke()
    if not ok:
        if "NotImplementedError" in report:
            raise SkipCase(f"the dense MHA backward is not available in this build: {report.strip().splitlines()[-1]}")
        raise RuntimeError(f"dense MHA prefill backward smoke call failed, not timing: {report}")
    C = openmla._openmla
    b, s, h_q, h_kv, d_qk, d_v, causal, det = (case[k] for k in ("b", "s_q", "h_q", "h_kv", "d_qk", "d_v", "causal",
                                                                   "deterministic"))
    lengths = fwd.varlen_lengths(b, 512, s) if case["varlen"] else [s] * b
    q, k, v, cu = fwd.make_inputs(lengths, h_q, h_kv, d_qk, d_v)
    total = q.shape[0]
    scale = d_qk ** -0.5
    with torch.no_grad():
        out, lse = openmla.flash_attn_varlen_func(q, k, v, cu, cu, max(lengths), max(lengths), causal=causal)
    dout = torch.randn(out.shape, generator=torch.Generator(device="cuda").manual_seed(fwd.SEED + 1), device="cuda",
                       dtype=out.dtype)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    problem = dict(batch=len(lengths), total_q=total, h_q=h_q, h_kv=h_kv, d_qk=d_qk, d_v=d_v, dtype="bfloat16",
                   causal=causal, deterministic=det)
    workspace = torch.empty(C.get_mha_prefill_bwd_workspace_size(**problem), dtype=torch.uint8, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream

    def ours():
        C.mha_prefill_bwd(q, k, v, out, dout, lse, cu, cu, workspace, dq, dk, dv, softmax_scale=0.0, stream=stream,
                          **problem)

    try:
        harness.rest_before_timing(ours)
    except NotImplementedError as err:
        raise SkipCase(f"mha_prefill_bwd: {err}") from err
    t = harness.time_cuda(ours, warmup=WARMUP, reps=REPS)
    flops = harness.formulas.dense_prefill_bwd_flops(lengths, lengths, h_q, d_qk, d_v, causal)
    record = {
        "params": {k: case[k] for k in ("b", "s_q", "s_k", "h_q", "h_kv", "d_qk", "d_v", "causal", "deterministic")},
        "time_us": t.median_us,
        "flops": flops,
        "timing_method": "events",
        "workspace_bytes": workspace.numel(),
        "grads_finite": all(bool(torch.isfinite(g.float()).all()) for g in (dq, dk, dv)),
    }
    if case["varlen"]:
        record["params"]["lengths"] = lengths

    default_name = case["name"][:-len("_det")] if det else case["name"]
    cached = _cudnn_times.get(default_name)
    if det and cached is not None:
        record.update(cached, cudnn_time_from=default_name)
    else:
        try:
            call, grads, note = _cudnn_backward(q, k, v, dout, lengths, causal, scale)
            harness.rest_before_timing(call)
            tc = harness.time_cuda(call, warmup=WARMUP, reps=REPS)
            fields = {"cudnn_us": tc.median_us, "cudnn_tflops": flops / (tc.median_us * 1e-6) / 1e12,
                      "cudnn_inputs": note}
            group = h_q // h_kv
            theirs = grads["g"]
            fields["max_abs_diff_vs_cudnn"] = {
                "dq": _max_abs_diff(dq, theirs[0], lengths),
                "dk": _max_abs_diff(dk, theirs[1], lengths, group if theirs[1].shape[1] != h_kv else 1),
                "dv": _max_abs_diff(dv, theirs[2], lengths, group if theirs[2].shape[1] != h_kv else 1)}
            _cudnn_times[default_name] = {k: fields[k] for k in ("cudnn_us", "cudnn_tflops", "cudnn_inputs")}
            record.update(fields)
            del call, grads
        except Exception as err:  # no cuDNN attention in this torch build, or it refuses the shape
            record["timing_note"] = f"cuDNN SDPA backward not measured: {type(err).__name__}: {str(err)[:200]}"
    if "cudnn_us" in record:
        record["ratio_to_cudnn"] = record["cudnn_us"] / t.median_us
        record["target"] = {"time_us": record["cudnn_us"]}  # run.py: ratio = cuDNN time / ours
    if case["varlen"] and "cudnn_us" in record:
        record["timing_note"] = "cuDNN ran the varlen batch padded to its longest sequence (not like for like)"
    del q, k, v, cu, out, lse, dout, dq, dk, dv, workspace
    torch.cuda.empty_cache()
    return record


def cpu_reference() -> int:
    """A tiny dense MHA backward case on the CPU reference (numpy); returns 0 on success."""
    try:
        import numpy as np

        import openmla
    except Exception as err:
        print(f"CPU reference not available: {type(err).__name__}: {err}")
        return 1
    rng = np.random.default_rng(fwd.SEED)
    lengths, h_q, h_kv, d_qk, d_v = [5, 40, 17], 4, 2, 192, 128
    total = sum(lengths)
    q = rng.standard_normal((total, h_q, d_qk)).astype(np.float32)
    k = rng.standard_normal((total, h_kv, d_qk)).astype(np.float32)
    v = rng.standard_normal((total, h_kv, d_v)).astype(np.float32)
    dout = rng.standard_normal((total, h_q, d_v)).astype(np.float32)
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    dq, dk, dv = openmla.reference.mha_backward(q, k, v, cu, cu, dout, causal=True)
    print(f"dense MHA prefill backward on the CPU reference: lengths={lengths} h_q={h_q} h_kv={h_kv} d_qk={d_qk} "
          f"d_v={d_v} causal: mean |dq| = {np.abs(dq).mean():.4f}, |dk| = {np.abs(dk).mean():.4f}, "
          f"|dv| = {np.abs(dv).mean():.4f}")
    return 0 if all(np.isfinite(g).all() for g in (dq, dk, dv)) else 1
