"""Tests of the FP8 (float8_e4m3fn) dense MHA prefill forward: openmla.flash_attn_varlen_func (and the packed
variants) with q_descale / k_descale / v_descale, against the fp32 reference on the dequantised inputs with the
per-element bound of mha_prefill_fp8_ref.py (P's e4m3 rounding, the FP8 tensor path's summation, out's rounding).

Inputs: q, k, v drawn N(0, 1) (x q_scale for q), quantised to e4m3 per (sequence, kv head) with random descales,
views into NaN-filled buffers (extra heads and columns, NaN rows past the last sequence), NaN-poisoned sequences
between the compared ones; outputs NaN-filled before the call (rows inside a sequence must be written, rows past the
last must not). The kernel runs before the reference allocates anything. Every GPU test prints its measured errors
(pytest -s shows them; the summary test prints the FP8 and the bf16 kernel's errors side by side).

Every GPU test runs for both key blocks of the kernel (decision fp8-d5: 128 and 192 keys, a kernel each), set through
openmla._openmla._set_mha_prefill_fp8_block_n by the `mha` fixture; the smoke call runs both;
test_fp8_block_n_from_the_environment checks the environment variable OPENMLA_FP8_BLOCK_N in child processes.

Without torch or a Hopper GPU the GPU tests are collected and skipped with their reason (conftest.py).
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass

import pytest

import openmla
from conftest import GPU_SKIP_REASON  # noqa: F401  (the marker's reason)

gpu = pytest.mark.gpu
DEVICE = "cuda"
LENGTHS = (0, 1, 63, 64, 65, 127, 128, 129, 1000, 4097)
# The kernel's key blocks (heuristics::mha_prefill_fp8_block_n): every GPU test runs with each.
BLOCK_NS = (128, 192)
# e4m3 N(0, 1) x 48: |x| < 5.3 sigma stays below 256 (no saturation), 3 mantissa bits either way.
QUANT = 48.0


def _torch():
    import torch

    return torch


def _ref():
    import mha_prefill_fp8_ref

    return mha_prefill_fp8_ref


@pytest.fixture(params=BLOCK_NS, ids=lambda n: f"bn{n}")
def mha(smoke, request):
    """openmla with the FP8 kernel of key block request.param (128 or 192) for the test's calls."""
    ok, report = smoke
    if not ok:
        pytest.fail(f"dense MHA prefill smoke test failed, not running the GPU case: {report}")
    from openmla import _openmla as C

    C._set_mha_prefill_fp8_block_n(request.param)
    assert C._mha_prefill_fp8_block_n() == request.param
    yield openmla
    C._set_mha_prefill_fp8_block_n(None)


_SMOKE_CODE = r"""
import torch, openmla
from openmla import _openmla as C
torch.backends.cuda.matmul.allow_tf32 = False
g = torch.Generator(device="cuda").manual_seed(0)
cu = torch.tensor([0, 70, 200], dtype=torch.int32, device="cuda")
q = (torch.randn((200, 4, 192), generator=g, device="cuda") * 48).to(torch.float8_e4m3fn)
k = (torch.randn((200, 2, 192), generator=g, device="cuda") * 48).to(torch.float8_e4m3fn)
v = (torch.randn((200, 2, 128), generator=g, device="cuda") * 48).to(torch.float8_e4m3fn)
d = torch.full((2, 2), 1 / 48, device="cuda")
qf, kf, vf = (t[70:].float() / 48 for t in (q, k, v))
z = torch.einsum("thd,shd->hts", qf, kf.repeat_interleave(2, dim=1)) * 192 ** -0.5
z = z.masked_fill(torch.ones(130, 130, device="cuda").triu(1).bool(), float("-inf"))
ref = torch.einsum("hts,shd->thd", z.softmax(-1), vf.repeat_interleave(2, dim=1))
pav = torch.einsum("hts,shd->thd", z.softmax(-1), vf.abs().repeat_interleave(2, dim=1))
for block_n in (192, 128):  # both kernels (decision fp8-d5)
    C._set_mha_prefill_fp8_block_n(block_n)
    out, lse = openmla.flash_attn_varlen_func(q, k, v, cu, cu, 130, 130, causal=True, q_descale=d, k_descale=d,
                                              v_descale=d)
    torch.cuda.synchronize()
    err = (out[70:].float() - ref).abs()
    print("block_n", block_n, "max error", err.max().item(), "max ref", ref.abs().max().item())
    assert bool((err <= 0.08 * pav + 1e-2).all()), \
        f"block_n {block_n}: max error {err.max().item()} (P's e4m3 rounding allows 2^-4 p|v|)"
    assert bool(torch.isfinite(lse[70:]).all())
    print("smoke ok", block_n, err.max().item())
"""


@pytest.fixture(scope="module")
def smoke():
    """One tiny FP8 call in a child process with a time limit: (ok, report); a hang or a fault fails the GPU tests
    of this module with the child's output instead of hanging the session."""
    import subprocess
    import sys

    from test_mha_prefill import SMOKE_TIMEOUT_S, _child_env

    try:
        proc = subprocess.run([sys.executable, "-c", _SMOKE_CODE], env=_child_env(), capture_output=True, text=True,
                              timeout=SMOKE_TIMEOUT_S)
    except subprocess.TimeoutExpired as err:
        return False, f"the FP8 smoke call did not finish within {SMOKE_TIMEOUT_S} s (a hang?): {err.stdout}{err.stderr}"
    if proc.returncode != 0:
        return False, f"the FP8 smoke call failed (rc {proc.returncode}):\n{proc.stdout}\n{proc.stderr[-3000:]}"
    return True, proc.stdout


@dataclass(frozen=True)
class Case:
    s_q: tuple
    s_k: tuple
    h_q: int = 16
    h_kv: int = 16
    d_qk: int = 192
    out_fp16: bool = False
    causal: bool = True
    q_scale: float = 1.0
    poison: tuple = ()
    pad: int = 3
    descale: str = "tensor"   # "tensor" (batch, h_kv), "strided" (a transposed view), "single", "number", "none"
    wide: bool = False        # descales over [2^-4, 2^4] x the base (else [0.5, 2])

    def __str__(self):
        s = f"d{self.d_qk}-{'fp16' if self.out_fp16 else 'bf16'}out-hq{self.h_q}-hkv{self.h_kv}-"
        s += f"{'causal' if self.causal else 'full'}-b{len(self.s_q)}-q{sum(self.s_q)}-k{sum(self.s_k)}-{self.descale}"
        if self.q_scale != 1.0:
            s += f"-qx{self.q_scale:g}"
        if self.poison:
            s += "-poison"
        if self.wide:
            s += "-wide"
        return s


def _cu(lengths):
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    return cu


def make_inputs(case: Case, seed=0):
    """q8, k8, v8 (float8_e4m3fn views into NaN-padded buffers), the descales as passed, the dequantised fp32 q, k, v,
    cu lists and tensors."""
    torch = _torch()
    f8 = torch.float8_e4m3fn
    g = torch.Generator(device=DEVICE).manual_seed(seed * 7919 + sum(case.s_q) * 31 + sum(case.s_k) + case.h_q)
    rng = random.Random(seed + 17 * len(case.s_q))
    b = len(case.s_q)
    cu_q, cu_k = _cu(case.s_q), _cu(case.s_k)
    tq, tk = cu_q[-1] + case.pad, cu_k[-1] + case.pad
    lo, hi = (-4.0, 4.0) if case.wide else (-1.0, 1.0)

    def descales():
        vals = [[2.0 ** rng.uniform(lo, hi) / QUANT for _ in range(case.h_kv)] for _ in range(b)]
        return torch.tensor(vals, dtype=torch.float32, device=DEVICE)

    def rows(total, heads, dim, cu, ds, scale=1.0):
        buf = torch.full((total, heads + 1, dim + 64), float("nan"), dtype=torch.float32, device=DEVICE).to(f8)
        view = buf[:, :heads, :dim]
        x = torch.randn((total - case.pad, heads, dim), generator=g, device=DEVICE) * scale
        # Quantise per (sequence, kv head): x8 = round(x / descale) (the caller's job; descale = base / QUANT).
        group = heads // case.h_kv
        x8 = torch.empty_like(x)
        for i in range(b):
            r0, r1 = cu[i], cu[i + 1]
            if r1 > r0:
                d = ds[i].repeat_interleave(group)[None, :, None]
                x8[r0:r1] = x[r0:r1] / d
        view[: total - case.pad] = x8.clamp(-448, 448).to(f8)
        return view

    dq, dk, dv = descales(), descales(), descales()
    if case.descale in ("single", "number", "none"):
        one = 1.0 / QUANT if case.descale != "none" else 1.0
        dq = torch.full((b, case.h_kv), one, device=DEVICE)
        dk, dv = dq.clone(), dq.clone()
    q = rows(tq, case.h_q, case.d_qk, cu_q, dq, case.q_scale)
    k = rows(tk, case.h_kv, case.d_qk, cu_k, dk)
    v = rows(tk, case.h_kv, 128, cu_k, dv)
    for i in case.poison:
        for t, cu in ((q, cu_q), (k, cu_k), (v, cu_k)):
            t[cu[i]:cu[i + 1]] = torch.full(t[cu[i]:cu[i + 1]].shape, float("nan"), device=DEVICE).to(f8)
    if case.descale == "tensor":
        passed = (dq, dk, dv)
    elif case.descale == "strided":
        passed = tuple(d.t().contiguous().t() for d in (dq, dk, dv))  # (b, h_kv) with strides (1, b)
    elif case.descale == "single":
        passed = tuple(d[:1, :1].reshape(1).clone() for d in (dq, dk, dv))
    elif case.descale == "number":
        passed = (1.0 / QUANT,) * 3
    else:
        passed = (None, None, None)
    R = _ref()
    deq = (R.dequantize(q, passed[0], cu_q, case.h_kv), R.dequantize(k, passed[1], cu_k, case.h_kv),
           R.dequantize(v, passed[2], cu_k, case.h_kv))
    cu_q_t = torch.tensor(cu_q, dtype=torch.int32, device=DEVICE)
    cu_k_t = torch.tensor(cu_k, dtype=torch.int32, device=DEVICE)
    return q, k, v, passed, deq, cu_q, cu_k, cu_q_t, cu_k_t


def _fmt(stats):
    return ", ".join(f"{k} {v:.3g}" for k, v in stats.items())


def _report(msg):
    """The measured errors, as a warning: pytest's warnings summary shows them without -s (the design note's numbers
    come from there)."""
    import warnings

    print("\n" + msg)
    warnings.warn(msg, UserWarning, stacklevel=2)


def nan_outputs(total_q, h_q, dtype):
    torch = _torch()
    out = torch.full((total_q, h_q, 128), float("nan"), dtype=dtype, device=DEVICE)
    lse = torch.full((h_q, total_q), float("nan"), dtype=torch.float32, device=DEVICE).t()
    return out, lse


def compared_rows(case, cu_q):
    return [t for i in range(len(case.s_q)) if i not in case.poison for t in range(cu_q[i], cu_q[i + 1])]


def run_and_check(mha, case: Case, seed=0, rows=None):
    torch = _torch()
    q, k, v, ds, deq, cu_q, cu_k, cu_q_t, cu_k_t = make_inputs(case, seed)
    out, lse = nan_outputs(q.shape[0], case.h_q, torch.float16 if case.out_fp16 else torch.bfloat16)
    res = mha.flash_attn_varlen_func(q, k, v, cu_q_t, cu_k_t, max(case.s_q), max(case.s_k), causal=case.causal,
                                     out=out, lse=lse, q_descale=ds[0], k_descale=ds[1], v_descale=ds[2])
    assert res[0] is out and res[1] is lse
    torch.cuda.synchronize()
    scale = case.d_qk ** -0.5
    wanted = compared_rows(case, cu_q) if rows is None else rows
    ref = _ref().fp8_ref(*deq, cu_q, cu_k, scale, case.causal, rows=wanted)
    stats = _ref().check_fp8(f" [{case}]", out, lse, ref)
    _report(f"FP8 errors [{case}]: {_fmt(stats)}")
    assert bool(out[cu_q[-1]:].isnan().all()) and bool(lse[cu_q[-1]:].isnan().all()), "rows past the last sequence"
    empty = [cu_q[i] + t for i in range(len(case.s_q)) if i not in case.poison for t in range(case.s_q[i])
             if case.s_k[i] == 0 or (case.causal and t + case.s_k[i] - case.s_q[i] < 0)]
    if empty:
        idx = torch.tensor(empty, device=DEVICE)
        assert bool((out[idx] == 0).all()) and bool(torch.isposinf(lse[idx]).all()), f"rows without keys [{case}]"
    return stats


def _matrix():
    rng = random.Random(23)
    cases = []
    for d_qk in (192, 128):
        for causal in (False, True):
            for h_q, h_kv in ((16, 16), (16, 2)):
                lens = tuple(rng.choice(LENGTHS) for _ in range(5))
                cases.append(Case(lens, lens, h_q=h_q, h_kv=h_kv, d_qk=d_qk, causal=causal,
                                  out_fp16=(h_kv == 2 and causal)))
    return cases


MATRIX = _matrix()
EACH_LENGTH = [Case((n,), (n,), h_q=4, h_kv=2, causal=c, d_qk=d) for n in LENGTHS for c in (False, True)
               for d in (192,)]
CHUNKED = [Case((1, 63, 129, 1000), (700, 64, 4097, 1000 + 129), h_q=8, h_kv=2, causal=c, d_qk=d)
           for c in (False, True) for d in (192, 128)]
DESCALE_FORMS = [Case((300, 129, 1000), (300, 500, 1000), h_q=8, h_kv=4, causal=True, descale=f)
                 for f in ("strided", "single", "number", "none")]
LARGE = [Case((1000, 129, 4097), (1000, 129, 4097), h_q=8, h_kv=4, q_scale=8.0, causal=c, d_qk=d)
         for c in (False, True) for d in (192, 128)]
WIDE = [Case((1000, 129, 2000), (1000, 129, 2000), h_q=8, h_kv=2, causal=c, wide=True) for c in (False, True)]
# Lengths at and around the 192-key block's edges (partial last blocks, two and three blocks, the causal diagonal
# crossing a block with s_q != s_k: bottom-right), for both kernels.
BLOCK_EDGES = [Case((191, 192, 193, 383, 1, 200), (191, 192, 193, 385, 385, 577), h_q=4, h_kv=2, causal=c, d_qk=d)
               for c in (False, True) for d in (192, 128)]
POISONED = [Case((65, 200, 1, 130, 64), (65, 200, 1, 130, 64), h_q=8, h_kv=2, causal=c, poison=(1, 3), pad=131,
                 d_qk=d) for c in (False, True) for d in (192, 128)]


# ---------------------------------------------------------------------------------------------------
# Without a GPU
# ---------------------------------------------------------------------------------------------------
def test_fp8_keywords_in_the_signatures():
    import inspect

    for f in (openmla.flash_attn_varlen_func, openmla.flash_attn_varlen_qkvpacked_func,
              openmla.flash_attn_varlen_kvpacked_func):
        params = inspect.signature(f).parameters
        for name in ("q_descale", "k_descale", "v_descale", "out_dtype"):
            assert name in params and params[name].kind == inspect.Parameter.KEYWORD_ONLY


# ---------------------------------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------------------------------
@gpu
@pytest.mark.parametrize("case", MATRIX, ids=str)
def test_fp8_matrix(mha, case):
    run_and_check(mha, case)


@gpu
@pytest.mark.parametrize("case", EACH_LENGTH, ids=str)
def test_fp8_each_length(mha, case):
    run_and_check(mha, case)


@gpu
@pytest.mark.parametrize("case", CHUNKED, ids=str)
def test_fp8_chunked(mha, case):
    run_and_check(mha, case)


@gpu
@pytest.mark.parametrize("case", BLOCK_EDGES, ids=str)
def test_fp8_block_edges(mha, case):
    run_and_check(mha, case)


@gpu
@pytest.mark.parametrize("case", DESCALE_FORMS, ids=str)
def test_fp8_descale_forms(mha, case):
    run_and_check(mha, case)


@gpu
@pytest.mark.parametrize("case", LARGE + WIDE, ids=str)
def test_fp8_large_logits_and_wide_descales(mha, case):
    run_and_check(mha, case)


@gpu
@pytest.mark.parametrize("case", POISONED, ids=str)
def test_fp8_nan_poisoned_neighbours_and_padding(mha, case):
    run_and_check(mha, case)


@gpu
def test_fp8_thousands_of_short_sequences(mha):
    rng = random.Random(7)
    s_q = tuple(rng.randint(0, 40) for _ in range(2000))
    s_k = tuple(q + rng.randint(0, 300) for q in s_q)
    case = Case(s_q, s_k, h_q=16, h_kv=2, causal=True, descale="single")
    rows = sorted(random.Random(8).sample(range(sum(s_q)), 3000))
    run_and_check(mha, case, rows=rows)


@gpu
@pytest.mark.parametrize("causal", (False, True))
def test_fp8_bitwise_identical_on_repeat(mha, causal):
    torch = _torch()
    case = Case((1000, 4097, 129, 0, 65), (1000, 4097, 300, 5, 65), h_q=16, h_kv=2, causal=causal)
    q, k, v, ds, _, _, _, cu_q, cu_k = make_inputs(case)
    n = sum(case.s_q)
    kw = dict(causal=causal, q_descale=ds[0], k_descale=ds[1], v_descale=ds[2])
    first = mha.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 4097, 4097, **kw)
    for _ in range(2):
        again = mha.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 4097, 4097, **kw)
        assert torch.equal(first[0][:n].view(torch.int16), again[0][:n].view(torch.int16))
        assert torch.equal(first[1][:n].view(torch.int32), again[1][:n].view(torch.int32))


@gpu
@pytest.mark.parametrize("case", POISONED, ids=str)
def test_fp8_nan_inf_positions_of_poisoned_sequences(mha, case):
    """On the rows of the NaN-poisoned sequences (which run_and_check leaves out: their values are NaN) the NaN and
    +-inf positions of out and lse are the reference's, element by element."""
    torch = _torch()
    q, k, v, ds, deq, cu_q, cu_k, cu_q_t, cu_k_t = make_inputs(case)
    out, lse = nan_outputs(q.shape[0], case.h_q, torch.float16 if case.out_fp16 else torch.bfloat16)
    mha.flash_attn_varlen_func(q, k, v, cu_q_t, cu_k_t, max(case.s_q), max(case.s_k), causal=case.causal, out=out,
                               lse=lse, q_descale=ds[0], k_descale=ds[1], v_descale=ds[2])
    torch.cuda.synchronize()
    poisoned = [t for i in case.poison for t in range(cu_q[i], cu_q[i + 1])]
    rows, r_out, r_lse, _, _ = _ref().fp8_ref(*deq, cu_q, cu_k, case.d_qk ** -0.5, case.causal, rows=poisoned)
    assert rows == poisoned
    idx = torch.tensor(rows, device=DEVICE)
    for name, a, r in (("out", out[idx].float(), r_out.to(DEVICE)), ("lse", lse[idx].float(), r_lse.to(DEVICE))):
        for what, f in (("NaN", torch.isnan), ("+inf", torch.isposinf), ("-inf", torch.isneginf)):
            assert torch.equal(f(a), f(r)), f"{name}: {what} positions differ from the reference's [{case}]"


@gpu
def test_fp8_default_outputs_and_out_dtype(mha):
    torch = _torch()
    case = Case((100, 200), (150, 200), h_q=8, h_kv=2, causal=False, pad=0)
    q, k, v, ds, _, _, _, cu_q, cu_k = make_inputs(case)
    kw = dict(q_descale=ds[0], k_descale=ds[1], v_descale=ds[2])
    out, lse = mha.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 200, 200, **kw)
    assert out.shape == (300, 8, 128) and out.dtype == torch.bfloat16
    assert lse.shape == (300, 8) and lse.dtype == torch.float32 and lse.stride() == (1, 300)
    out16, lse16 = mha.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 200, 200, out_dtype=torch.float16, **kw)
    assert out16.dtype == torch.float16
    assert torch.equal(lse16, lse)  # the output type changes only the final rounding
    assert float((out16.float() - out.float()).abs().max()) <= 2.0 ** -8 * float(out.float().abs().max()) + 1e-6


@gpu
def test_fp8_packed_variants(mha):
    """qkv (total, h, 192 + 192 + 128) and kv (total, h_kv, 192 + 128) float8 tensors: the same bits as separate views
    (row strides of 512 / 320 elements: multiples of 16)."""
    torch = _torch()
    f8 = torch.float8_e4m3fn
    g = torch.Generator(device=DEVICE).manual_seed(5)
    cu = torch.tensor([0, 300, 301, 1300], dtype=torch.int32, device=DEVICE)
    qkv = (torch.randn((1300, 4, 512), generator=g, device=DEVICE) * QUANT).clamp(-448, 448).to(f8)
    ds = torch.full((3, 4), 1.0 / QUANT, device=DEVICE)
    kw = dict(causal=True, q_descale=ds, k_descale=ds, v_descale=ds)
    a = mha.flash_attn_varlen_qkvpacked_func(qkv, cu, 1000, 192, **kw)
    b = mha.flash_attn_varlen_func(qkv[..., :192], qkv[..., 192:384], qkv[..., 384:], cu, cu, 1000, 1000, **kw)
    assert torch.equal(a[0].view(torch.int16), b[0].view(torch.int16)) and torch.equal(a[1], b[1])
    q = qkv[..., :192]
    kv = (torch.randn((1300, 2, 320), generator=g, device=DEVICE) * QUANT).clamp(-448, 448).to(f8)
    ds2 = torch.full((3, 2), 1.0 / QUANT, device=DEVICE)
    kw2 = dict(causal=False, q_descale=ds2, k_descale=ds2, v_descale=ds2)
    c = mha.flash_attn_varlen_kvpacked_func(q, kv, cu, cu, 1000, 1000, 192, **kw2)
    d = mha.flash_attn_varlen_func(q, kv[..., :192], kv[..., 192:], cu, cu, 1000, 1000, **kw2)
    assert torch.equal(c[0].view(torch.int16), d[0].view(torch.int16)) and torch.equal(c[1], d[1])


@gpu
def test_fp8_argument_errors(mha):
    torch = _torch()
    case = Case((100, 200), (150, 200), h_q=8, h_kv=2, causal=False, pad=0)
    q, k, v, ds, _, _, _, cu_q, cu_k = make_inputs(case)
    kw = dict(q_descale=ds[0], k_descale=ds[1], v_descale=ds[2])
    with pytest.raises(ValueError, match="'k' has dtype bfloat16"):
        mha.flash_attn_varlen_func(q, k.float().bfloat16(), v, cu_q, cu_k, 200, 200, **kw)
    with pytest.raises(ValueError, match="'q_descale' has shape"):
        mha.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 200, 200, q_descale=ds[0][:, :1].contiguous())
    with pytest.raises(ValueError, match="'v_descale' has dtype float16, expected float32"):
        mha.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 200, 200, v_descale=ds[2].half())
    with pytest.raises(ValueError, match="only float8_e4m3fn q, k, v take descales"):
        mha.flash_attn_varlen_func(q.float().bfloat16(), k.float().bfloat16(), v.float().bfloat16(), cu_q, cu_k, 200,
                                   200, **kw)
    with pytest.raises(ValueError, match="'out_dtype'"):
        mha.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 200, 200, out_dtype=torch.float32, **kw)
    with pytest.raises(ValueError, match="multiple of 16 elements"):
        buf = torch.zeros((300, 8, 200), device=DEVICE).to(torch.float8_e4m3fn)
        mha.flash_attn_varlen_func(buf[..., :192], k, v, cu_q, cu_k, 200, 200, **kw)
    try:
        qg = q.detach().clone().requires_grad_(True)
    except RuntimeError:  # a torch that refuses requires_grad on float8 tensors: nothing to refuse then
        qg = None
    if qg is not None:
        with pytest.raises(NotImplementedError, match="forward-only"):
            mha.flash_attn_varlen_func(qg, k, v, cu_q, cu_k, 200, 200, **kw)


@gpu
@pytest.mark.parametrize("d_qk,causal", [(192, True), (128, False)])
def test_fp8_error_against_the_bf16_kernel(mha, d_qk, causal):
    """The FP8 kernel and the bf16 kernel on the same values (descales powers of two, so the dequantised values are
    exact in bf16), both against the fp32 reference: prints both kernels' errors (the design note's table) and checks
    that the FP8 error stays within the FP8 bound while the bf16 one stays within flash_mla's tolerance."""
    torch = _torch()
    case = Case((4096, 1000, 129), (4096, 1000, 129), h_q=8, h_kv=2, causal=causal, d_qk=d_qk, descale="single",
                pad=0)
    q, k, v, ds, deq, cu_q, cu_k, cu_q_t, cu_k_t = make_inputs(case)
    ds = tuple(torch.full((1,), 2.0 ** -6, device=DEVICE) for _ in range(3))  # 1 / 64: exact in bf16
    f8out, f8lse = mha.flash_attn_varlen_func(q, k, v, cu_q_t, cu_k_t, 4096, 4096, causal=causal, q_descale=ds[0],
                                              k_descale=ds[1], v_descale=ds[2])
    qb, kb, vb = (t.float() * 2.0 ** -6 for t in (q, k, v))
    assert all(torch.equal(t.bfloat16().float(), t) for t in (qb, kb, vb))
    bout, blse = mha.flash_attn_varlen_func(qb.bfloat16(), kb.bfloat16(), vb.bfloat16(), cu_q_t, cu_k_t, 4096, 4096,
                                            causal=causal)
    torch.cuda.synchronize()
    rows = sorted(random.Random(1).sample(range(cu_q[-1]), 1500))
    R = _ref()
    ref = R.fp8_ref(qb, kb, vb, cu_q, cu_k, d_qk ** -0.5, causal, rows=rows)
    f8 = R.check_fp8(f" fp8 [{case}]", f8out, f8lse, ref)
    idx = torch.tensor(ref[0], device=DEVICE)
    berr = (bout[idx].float() - ref[1]).abs()
    bl = (blse[idx] - ref[2]).abs()
    bl = torch.where(torch.isfinite(bl), bl, 0.0)
    import dense_decode_ref

    bstats = dict(out_max_abs_err=float(berr.max()), out_mean_abs_err=float(berr.mean()),
                  out_cos_diff=float(dense_decode_ref.cos_diff(bout[idx].float(), ref[1])),
                  lse_max_abs_err=float(bl.max()))
    _report(f"FP8 vs bf16 kernel, d{d_qk} {'causal' if causal else 'full'} (s 4096/1000/129, h 8/2): fp8 {_fmt(f8)}; "
            f"bf16 {_fmt(bstats)}")


_ENV_CODE = r"""
import torch, openmla
from openmla import _openmla as C
print("block_n", C._mha_prefill_fp8_block_n())
q = (torch.randn((300, 2, 128), device="cuda") * 48).to(torch.float8_e4m3fn)
cu = torch.tensor([0, 300], dtype=torch.int32, device="cuda")
try:
    out, lse = openmla.flash_attn_varlen_func(q, q, q, cu, cu, 300, 300, causal=True, q_descale=1 / 48,
                                              k_descale=1 / 48, v_descale=1 / 48)
    torch.cuda.synchronize()
    print("call ok", bool(torch.isfinite(out).all()))
except ValueError as err:
    print("ValueError", err)
"""


@gpu
@pytest.mark.parametrize("value", ("128", "192", "", "256"))
def test_fp8_block_n_from_the_environment(smoke, value):
    """OPENMLA_FP8_BLOCK_N (read once per process) picks the kernel; unset or empty: the default; another value: every
    FP8 call raises ValueError naming the variable."""
    import subprocess
    import sys

    from test_mha_prefill import SMOKE_TIMEOUT_S, _child_env

    ok, report = smoke
    if not ok:
        pytest.fail(f"dense MHA prefill smoke test failed: {report}")
    env = dict(_child_env(), OPENMLA_FP8_BLOCK_N=value)
    proc = subprocess.run([sys.executable, "-c", _ENV_CODE], env=env, capture_output=True, text=True,
                          timeout=SMOKE_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    if value == "256":
        assert "block_n 0" in proc.stdout and "ValueError" in proc.stdout and "OPENMLA_FP8_BLOCK_N" in proc.stdout, \
            proc.stdout
        return
    want = (f"block_n {value}",) if value else ("block_n 128", "block_n 192")  # empty: the default
    assert proc.stdout.split("\n")[0] in want, proc.stdout
    assert "call ok True" in proc.stdout, proc.stdout
