"""Tests of dense MHA prefill through the flash_mla-compatible API (openmla.flash_attn_varlen_func and the packed
variants), against the torch fp32 reference (mha_prefill_ref.py) and the CPU reference.

A GPU test first runs one tiny call in a child process with a time limit (the `smoke` fixture), so that a kernel that
hangs or faults fails this module quickly instead of the session.

Inputs: q, k, v ~ N(0, 1) (bf16 or fp16; logits ~ N(0, 1) under the default scale, q x 8 in the large-logit cases so
the online softmax rescales), views into buffers with padded heads and columns (non-contiguous) unless stated;
outputs NaN-filled before the call (every row inside a sequence must be written, rows past the last sequence must
not); the kernel runs before the reference allocates anything. Tolerances: out abs 1e-3 / rel 2.01/128 / cos 5e-6, or
within the bound of P's rounding to bf16/fp16 (mha_prefill_ref.py, P_ROUNDING_U),
lse rel 8.01/65536 and abs 1e-5 x the q scale (mha_prefill_ref.py says why it is not 1e-6 here), with identical
inf/NaN positions (docs/contracts.md section 8).

Without torch or a Hopper GPU every GPU test here is collected and skipped with its reason (conftest.py).
"""
from __future__ import annotations

import inspect
import math
import os
import random
import subprocess
import sys
from dataclasses import dataclass, field

import pytest

import openmla
from conftest import GPU_SKIP_REASON, ROOT

gpu = pytest.mark.gpu
DEVICE = "cuda"
LENGTHS = (0, 1, 63, 64, 65, 127, 128, 129, 1000, 4097)  # the issue's lengths
SMOKE_TIMEOUT_S = 180


def _torch():
    import torch

    return torch


def _ref():
    import mha_prefill_ref

    return mha_prefill_ref


def _child_env():
    """The environment of a child process: this one's, with the package on the path."""
    return dict(os.environ,
                PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "python"), os.path.join(ROOT, ".deps", "py")]))


_SMOKE_CODE = r"""
import torch, openmla
torch.backends.cuda.matmul.allow_tf32 = False
g = torch.Generator(device="cuda").manual_seed(0)
cu = torch.tensor([0, 70, 200], dtype=torch.int32, device="cuda")
q = torch.randn((200, 4, 192), generator=g, device="cuda").bfloat16()
k = torch.randn((200, 2, 192), generator=g, device="cuda").bfloat16()
v = torch.randn((200, 2, 128), generator=g, device="cuda").bfloat16()
out, lse = openmla.flash_attn_varlen_func(q, k, v, cu, cu, 130, 130, causal=True)
torch.cuda.synchronize()
z = torch.einsum("thd,shd->hts", q[70:].float(), k[70:].float().repeat_interleave(2, dim=1)) * 192 ** -0.5
z = z.masked_fill(torch.ones(130, 130, device="cuda").triu(1).bool(), float("-inf"))
ref = torch.einsum("hts,shd->thd", z.softmax(-1), v[70:].float().repeat_interleave(2, dim=1))
err = (out[70:].float() - ref).abs().max().item()
assert err < 2e-2, f"max error {err}"
print("smoke ok", err)
"""


@pytest.fixture(scope="module")
def smoke():
    """One tiny call in a child process with a time limit: (ok, report). A hang or a fault there fails every GPU test
    of this module with the child's output instead of hanging the session."""
    try:
        proc = subprocess.run([sys.executable, "-c", _SMOKE_CODE], env=_child_env(), capture_output=True, text=True,
                              timeout=SMOKE_TIMEOUT_S)
    except subprocess.TimeoutExpired as err:
        return False, f"the smoke call did not finish within {SMOKE_TIMEOUT_S} s (a hang?): {err.stdout}{err.stderr}"
    if proc.returncode != 0:
        return False, f"the smoke call failed (rc {proc.returncode}):\n{proc.stdout}\n{proc.stderr[-3000:]}"
    return True, proc.stdout


@pytest.fixture
def mha(smoke):
    ok, report = smoke
    if not ok:
        pytest.fail(f"dense MHA prefill smoke test failed, not running the GPU case: {report}")
    return openmla


# ---------------------------------------------------------------------------------------------------
# Cases and inputs
# ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    s_q: tuple            # per sequence
    s_k: tuple
    h_q: int = 16
    h_kv: int = 16
    d_qk: int = 192
    fp16: bool = False
    causal: bool = True
    q_scale: float = 1.0  # q multiplied by this (large logits exercise the online-softmax rescaling)
    poison: tuple = ()    # sequences whose q, k, v rows are NaN (their outputs are not compared)
    pad: int = 3          # rows past the last sequence in q / k / v (NaN) and out / lse (must stay unwritten)
    softmax_scale: float | None = None

    def __str__(self):
        s = f"d{self.d_qk}-{'fp16' if self.fp16 else 'bf16'}-hq{self.h_q}-hkv{self.h_kv}-{'causal' if self.causal else 'full'}"
        s += f"-b{len(self.s_q)}-q{sum(self.s_q)}-k{sum(self.s_k)}"
        if self.q_scale != 1.0:
            s += f"-qx{self.q_scale:g}"
        if self.poison:
            s += "-poison"
        return s


def _cu(lengths):
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    return cu


def make_inputs(case: Case, seed=0):
    """q, k, v (views into NaN-padded buffers: extra heads and columns, `pad` NaN rows at the end), cu_q, cu_k (host
    lists and int32 device tensors)."""
    torch = _torch()
    g = torch.Generator(device=DEVICE).manual_seed(seed * 7919 + sum(case.s_q) * 31 + sum(case.s_k) + case.h_q)
    dt = torch.float16 if case.fp16 else torch.bfloat16
    cu_q, cu_k = _cu(case.s_q), _cu(case.s_k)
    tq, tk = cu_q[-1] + case.pad, cu_k[-1] + case.pad

    def rows(total, heads, dim, scale=1.0):
        buf = torch.full((total, heads + 1, dim + 64), float("nan"), dtype=dt, device=DEVICE)
        view = buf[:, :heads, :dim]
        view[: total - case.pad] = (torch.randn((total - case.pad, heads, dim), generator=g, device=DEVICE) * scale).to(dt)
        return view

    q = rows(tq, case.h_q, case.d_qk, case.q_scale)
    k = rows(tk, case.h_kv, case.d_qk)
    v = rows(tk, case.h_kv, 128)
    for i in case.poison:
        q[cu_q[i]:cu_q[i + 1]] = float("nan")
        k[cu_k[i]:cu_k[i + 1]] = float("nan")
        v[cu_k[i]:cu_k[i + 1]] = float("nan")
    cu_q_t = torch.tensor(cu_q, dtype=torch.int32, device=DEVICE)
    cu_k_t = torch.tensor(cu_k, dtype=torch.int32, device=DEVICE)
    return q, k, v, cu_q, cu_k, cu_q_t, cu_k_t


def nan_outputs(total_q, h_q, dtype):
    torch = _torch()
    out = torch.full((total_q, h_q, 128), float("nan"), dtype=dtype, device=DEVICE)
    lse = torch.full((h_q, total_q), float("nan"), dtype=torch.float32, device=DEVICE).t()
    return out, lse


def compared_rows(case: Case, cu_q):
    return [t for i in range(len(case.s_q)) if i not in case.poison for t in range(cu_q[i], cu_q[i + 1])]


def call_with_epilogue(q, k, v, cu_q_t, cu_k_t, case: Case, out, lse, epilogue):
    """The C binding with problem.epilogue forced ('registers' or 'staged'), so that both kernels run every case (the
    flash_mla layer lets the launch plan choose by the mean sequence length)."""
    torch = _torch()
    problem = dict(batch=len(case.s_q), h_q=case.h_q, h_kv=case.h_kv, d_qk=case.d_qk, d_v=128,
                   dtype="float16" if case.fp16 else "bfloat16", causal=case.causal, max_seqlen_qo=max(case.s_q))
    workspace = torch.empty(openmla._openmla.get_mha_prefill_workspace_size(**problem), dtype=torch.uint8,
                            device=DEVICE)
    openmla._openmla.mha_prefill(q, k, v, cu_q_t, cu_k_t, workspace, out, lse,
                                 softmax_scale=0.0 if case.softmax_scale is None else case.softmax_scale,
                                 epilogue=epilogue, stream=torch.cuda.current_stream().cuda_stream, **problem)


def run_and_check(mha, case: Case, seed=0, rows=None, epilogue=None):
    """Runs the kernel (before the reference allocates anything), then compares with the fp32 reference. `epilogue`:
    through the C binding with that kernel forced (call_with_epilogue)."""
    torch = _torch()
    q, k, v, cu_q, cu_k, cu_q_t, cu_k_t = make_inputs(case, seed)
    out, lse = nan_outputs(q.shape[0], case.h_q, q.dtype)
    if epilogue is None:
        res = mha.flash_attn_varlen_func(q, k, v, cu_q_t, cu_k_t, max(case.s_q), max(case.s_k), causal=case.causal,
                                         softmax_scale=case.softmax_scale, out=out, lse=lse)
        assert res[0] is out and res[1] is lse
    else:
        call_with_epilogue(q, k, v, cu_q_t, cu_k_t, case, out, lse, epilogue)
    torch.cuda.synchronize()
    scale = case.softmax_scale if case.softmax_scale is not None else case.d_qk ** -0.5
    wanted = compared_rows(case, cu_q) if rows is None else rows
    ref = _ref().mha_prefill_ref(q, k, v, cu_q, cu_k, scale, case.causal, rows=wanted)
    _ref().check_mha_prefill(out, lse, ref, what=f" [{case}]", logit_scale=case.q_scale)
    # Rows past the last sequence are never written.
    assert bool(out[cu_q[-1]:].isnan().all()) and bool(lse[cu_q[-1]:].isnan().all())
    # Rows without a visible key: exactly 0 and +inf (the metric alone would accept a tiny value).
    empty = [cu_q[i] + t for i in range(len(case.s_q)) if i not in case.poison for t in range(case.s_q[i])
             if case.s_k[i] == 0 or (case.causal and t + case.s_k[i] - case.s_q[i] < 0)]
    if empty:
        idx = torch.tensor(empty, device=DEVICE)
        assert bool((out[idx] == 0).all()) and bool(torch.isposinf(lse[idx]).all()), f"rows without keys [{case}]"
    return q, k, v, cu_q_t, cu_k_t, out, lse


def _random_lengths(rng, n, choices=LENGTHS):
    return tuple(rng.choice(choices) for _ in range(n))


def _matrix():
    rng = random.Random(19)
    cases = []
    for d_qk in (192, 128):
        for fp16 in (False, True):
            for causal in (False, True):
                for h_q, h_kv in ((16, 16), (16, 8), (16, 2), (16, 1)):  # GQA ratios 1, 2, 8, 16
                    lens = _random_lengths(rng, 5)
                    cases.append(Case(lens, lens, h_q=h_q, h_kv=h_kv, d_qk=d_qk, fp16=fp16, causal=causal))
    return cases


MATRIX = _matrix()
# Every length of the issue as one sequence, s_q = s_k.
EACH_LENGTH = [Case((n,), (n,), h_q=4, h_kv=2, causal=c) for n in LENGTHS for c in (False, True)]
# Chunked prefill (s_q < s_k: queries attend to a longer context) and s_q > s_k (rows without keys under causal).
CHUNKED = [Case((1, 63, 129, 1000), (700, 64, 4097, 1000 + 129), h_q=8, h_kv=2, causal=c, d_qk=d)
           for c in (False, True) for d in (192, 128)]
MORE_QUERIES = [Case((129, 300, 65), (64, 0, 1), h_q=4, h_kv=4, causal=c) for c in (False, True)]
LARGE_LOGITS = [Case((1000, 129, 4097), (1000, 129, 4097), h_q=8, h_kv=4, q_scale=8.0, causal=c, fp16=f)
                for c in (False, True) for f in (False, True)]
POISONED = [Case((65, 200, 1, 130, 64), (65, 200, 1, 130, 64), h_q=8, h_kv=2, causal=c, poison=(1, 3), pad=131)
            for c in (False, True)]


def test_matrix_covers_the_issue():
    """The grid covers every value the issue lists (runs without a GPU)."""
    lengths = {n for c in MATRIX + EACH_LENGTH + CHUNKED for n in c.s_q + c.s_k}
    assert set(LENGTHS) <= lengths
    assert {c.h_q // c.h_kv for c in MATRIX} == {1, 2, 8, 16}
    assert {(c.d_qk, c.fp16, c.causal) for c in MATRIX} == {(d, f, c) for d in (192, 128) for f in (0, 1) for c in (0, 1)}
    assert any(q < k for c in CHUNKED for q, k in zip(c.s_q, c.s_k))
    assert any(q > k for c in MORE_QUERIES for q, k in zip(c.s_q, c.s_k))


# ---------------------------------------------------------------------------------------------------
# Without a GPU: the Python layer's own checks and the signatures
# ---------------------------------------------------------------------------------------------------
def test_signatures_match_flash_mla():
    params = list(inspect.signature(openmla.flash_attn_varlen_func).parameters)
    assert params[:12] == ["q", "k", "v", "cu_seqlens_qo", "cu_seqlens_kv", "max_seqlen_qo", "max_seqlen_kv",
                           "dropout_p", "softmax_scale", "causal", "deterministic", "is_varlen"]
    params = list(inspect.signature(openmla.flash_attn_varlen_qkvpacked_func).parameters)
    assert params[:9] == ["qkv", "cu_seqlens", "max_seqlen", "head_dim_qk", "dropout_p", "softmax_scale", "causal",
                          "deterministic", "is_varlen"]
    params = list(inspect.signature(openmla.flash_attn_varlen_kvpacked_func).parameters)
    assert params[:12] == ["q", "kv", "cu_seqlens_qo", "cu_seqlens_kv", "max_seqlen_qo", "max_seqlen_kv",
                           "head_dim_qk", "dropout_p", "softmax_scale", "causal", "deterministic", "is_varlen"]


@pytest.mark.parametrize("kwargs,pattern", [
    (dict(dropout_p=0.1), "'dropout_p' is 0.1; dropout is not supported"),
    (dict(softmax_scale=0.0), "'softmax_scale' is 0.0"),
    (dict(softmax_scale=-1.0), "'softmax_scale' is -1.0"),
    (dict(softmax_scale=float("nan")), "'softmax_scale' is nan"),
])
def test_python_argument_errors(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        openmla.flash_attn_varlen_func(None, None, None, None, None, 16, 16, **kwargs)


def test_python_argument_errors_of_the_packed_variants():
    with pytest.raises(ValueError, match="'max_seqlen_qo' is -1"):
        openmla.flash_attn_varlen_func(None, None, None, None, None, -1, 16)
    with pytest.raises(ValueError, match="'max_seqlen' is 2.5"):
        openmla.flash_attn_varlen_qkvpacked_func(None, None, 2.5, 192)
    with pytest.raises(ValueError, match="'head_dim_qk' is 0"):
        openmla.flash_attn_varlen_qkvpacked_func(None, None, 16, 0)
    with pytest.raises(ValueError, match="'head_dim_qk' is None"):
        openmla.flash_attn_varlen_kvpacked_func(None, None, None, None, 16, 16, None)
    with pytest.raises(ValueError, match="'dropout_p'"):
        openmla.flash_attn_varlen_kvpacked_func(None, None, None, None, 16, 16, 192, dropout_p=0.5)


def test_exported_and_in_features():
    assert "dense_prefill" in openmla.FEATURES
    for name in ("flash_attn_varlen_func", "flash_attn_varlen_qkvpacked_func", "flash_attn_varlen_kvpacked_func"):
        assert name in openmla.__all__ and callable(getattr(openmla, name))


# ---------------------------------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------------------------------
@gpu
@pytest.mark.parametrize("case", MATRIX, ids=str)
def test_matrix(mha, case):
    run_and_check(mha, case)


@gpu
@pytest.mark.parametrize("epilogue", ("registers", "staged"))
@pytest.mark.parametrize("case", MATRIX[::2] + EACH_LENGTH[-2:], ids=str)
def test_both_epilogues(mha, case, epilogue):
    """Each kernel (O from the registers, O staged through shared memory) on the same cases, whichever the launch plan
    would pick."""
    run_and_check(mha, case, epilogue=epilogue)


@gpu
@pytest.mark.parametrize("case", [MATRIX[1], MATRIX[6], EACH_LENGTH[-1]], ids=str)
def test_epilogues_give_the_same_bits(mha, case):
    torch = _torch()
    q, k, v, cu_q, cu_k, cu_q_t, cu_k_t = make_inputs(case)
    res = {}
    for epilogue in ("registers", "staged"):
        out, lse = nan_outputs(q.shape[0], case.h_q, q.dtype)
        call_with_epilogue(q, k, v, cu_q_t, cu_k_t, case, out, lse, epilogue)
        torch.cuda.synchronize()
        res[epilogue] = (out, lse)
    (o1, l1), (o2, l2) = res["registers"], res["staged"]
    assert torch.equal(o1.view(torch.int16), o2.view(torch.int16)), f"out differs [{case}]"
    assert torch.equal(l1.contiguous().view(torch.int32), l2.contiguous().view(torch.int32)), f"lse differs [{case}]"


@gpu
@pytest.mark.parametrize("case", EACH_LENGTH, ids=str)
def test_each_length(mha, case):
    run_and_check(mha, case)


@gpu
@pytest.mark.parametrize("case", CHUNKED + MORE_QUERIES, ids=str)
def test_s_q_differs_from_s_k(mha, case):
    run_and_check(mha, case)


@gpu
@pytest.mark.parametrize("case", LARGE_LOGITS, ids=str)
def test_large_logits(mha, case):
    run_and_check(mha, case)


@gpu
@pytest.mark.parametrize("case", POISONED, ids=str)
def test_nan_poisoned_neighbours_and_padding(mha, case):
    """NaN in the sequences between the compared ones and in the rows past the last sequence: tiles that straddle a
    sequence end (in q and in k/v) must not let a NaN reach a result."""
    run_and_check(mha, case)


@gpu
def test_thousands_of_short_sequences(mha):
    """A mixed chunked-prefill step: 3000 sequences of 0-40 new tokens over 0-300 cached ones (GQA 8)."""
    rng = random.Random(7)
    s_q = tuple(rng.randint(0, 40) for _ in range(3000))
    s_k = tuple(q + rng.randint(0, 300) for q in s_q)
    case = Case(s_q, s_k, h_q=16, h_kv=2, causal=True)
    rows = sorted(random.Random(8).sample(range(sum(s_q)), 4000))
    run_and_check(mha, case, rows=rows)


@gpu
def test_long_context_sampled_rows(mha):
    """1 x 65536 causal, checked on sampled rows (first and last blocks, and random ones)."""
    n = 65536
    rows = sorted(set(list(range(0, 200)) + random.Random(3).sample(range(200, n - 200), 400) + list(range(n - 200, n))))
    run_and_check(mha, Case((n,), (n,), h_q=8, h_kv=8, causal=True, pad=0), rows=rows)


@gpu
@pytest.mark.parametrize("causal", (False, True))
def test_bitwise_identical_on_repeat(mha, causal):
    torch = _torch()
    case = Case((1000, 4097, 129, 0, 65), (1000, 4097, 300, 5, 65), h_q=16, h_kv=2, causal=causal)
    q, k, v, _, _, cu_q, cu_k = make_inputs(case)
    n = sum(case.s_q)  # rows past the last sequence (the `pad` rows of q) are never written: not compared
    first = mha.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 4097, 4097, causal=causal)
    for _ in range(3):
        again = mha.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 4097, 4097, causal=causal)
        assert torch.equal(first[0][:n].view(torch.int16), again[0][:n].view(torch.int16))
        assert torch.equal(first[1][:n].view(torch.int32), again[1][:n].view(torch.int32))


@gpu
def test_max_seqlen_only_sizes_the_grid(mha):
    """A too small max_seqlen_qo (one CTA) and an explicit deterministic=True / is_varlen=False give the same bits."""
    torch = _torch()
    case = Case((300, 129, 1000), (300, 500, 1000), h_q=8, h_kv=8, causal=True)
    q, k, v, _, _, cu_q, cu_k = make_inputs(case)
    n = sum(case.s_q)  # the `pad` rows past the last sequence are never written
    a = mha.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 1000, 1000, causal=True)
    b = mha.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 1, 1, causal=True, deterministic=True, is_varlen=False)
    assert torch.equal(a[0][:n].view(torch.int16), b[0][:n].view(torch.int16))
    assert torch.equal(a[1][:n].view(torch.int32), b[1][:n].view(torch.int32))


@gpu
def test_default_outputs_and_strided_outputs(mha):
    torch = _torch()
    case = Case((100, 200), (150, 200), h_q=8, h_kv=2, causal=False, pad=0)
    q, k, v, _, _, cu_q, cu_k = make_inputs(case)
    out, lse = mha.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 200, 200)
    assert out.shape == (300, 8, 128) and out.dtype == q.dtype and out.is_contiguous()
    assert lse.shape == (300, 8) and lse.dtype == torch.float32 and lse.stride() == (1, 300)  # flash_mla's layout
    out_pad = torch.full((300, 9, 128 + 64), float("nan"), dtype=q.dtype, device=DEVICE)
    out2 = out_pad[:, :8, :128]
    lse2 = torch.full((301, 9), float("nan"), dtype=torch.float32, device=DEVICE)[:300, :8]
    res = mha.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 200, 200, out=out2, lse=lse2)
    assert res[0] is out2 and res[1] is lse2
    assert torch.equal(out2, out) and torch.equal(lse2, lse)
    assert bool(out_pad[:, 8:].isnan().all()) and bool(out_pad[..., 128:].isnan().all())


@gpu
@pytest.mark.parametrize("default_device", [False, True])
def test_per_call_entry_equals_the_general_path(mha, monkeypatch, default_device):
    """flash_attn_varlen_func's per-call entry (python/csrc/bind_mha_call.cpp: outputs and workspace in one
    allocation) gives the general path's bits and layouts, with and without caller outputs and the default device."""
    torch = _torch()
    from openmla import mha as mha_module

    case = Case((100, 200), (150, 200), h_q=8, h_kv=2, causal=True, pad=0)
    q, k, v, _, _, cu_q, cu_k = make_inputs(case)
    if default_device:
        torch.set_default_device("cuda")
    try:
        fast = mha.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 200, 200, causal=True)
        given = (torch.empty_like(fast[0]), torch.empty((8, 300), device=DEVICE).t())
        fast_given = mha.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 200, 200, causal=True, out=given[0],
                                                lse=given[1])
        monkeypatch.setattr(mha_module, "_IN_PLACE", False)
        slow = mha.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 200, 200, causal=True)
    finally:
        if default_device:
            torch.set_default_device(None)
    assert fast_given[0] is given[0] and fast_given[1] is given[1]
    for got in (fast, fast_given):
        assert torch.equal(got[0], slow[0]) and torch.equal(got[1], slow[1])
        assert got[0].stride() == slow[0].stride() and got[1].stride() == slow[1].stride()


@gpu
@pytest.mark.parametrize("d_qk", (192, 128))
def test_packed_variants(mha, d_qk):
    """qkvpacked and kvpacked: views of one tensor, the same bits as the unpacked call on the same views."""
    torch = _torch()
    lens = (65, 300, 1)
    cu = torch.tensor(_cu(lens), dtype=torch.int32, device=DEVICE)
    total, h = sum(lens), 4
    g = torch.Generator(device=DEVICE).manual_seed(4421 + d_qk)  # seeded: the output record compares builds on it
    qkv = torch.randn((total, h, 2 * d_qk + 128), generator=g, device=DEVICE).bfloat16()
    q, k, v = qkv[..., :d_qk], qkv[..., d_qk:2 * d_qk], qkv[..., 2 * d_qk:]
    ref = mha.flash_attn_varlen_func(q, k, v, cu, cu, 300, 300, causal=True)
    packed = mha.flash_attn_varlen_qkvpacked_func(qkv, cu, 300, d_qk, causal=True)
    kvp = mha.flash_attn_varlen_kvpacked_func(q, qkv[..., d_qk:], cu, cu, 300, 300, d_qk, causal=True)
    for res in (packed, kvp):
        assert torch.equal(res[0], ref[0]) and torch.equal(res[1], ref[1])
    r = _ref().mha_prefill_ref(q, k, v, _cu(lens), _cu(lens), d_qk ** -0.5, True)
    _ref().check_mha_prefill(ref[0], ref[1], r, what=" [qkv packed]")


@gpu
def test_softmax_scale(mha):
    run_and_check(mha, Case((129, 64), (200, 64), h_q=4, h_kv=1, causal=True, softmax_scale=0.3))


@gpu
def test_against_the_cpu_reference(mha):
    """The kernel, the torch reference and the C++ CPU reference agree on a small case."""
    torch = _torch()
    case = Case((5, 130), (70, 130), h_q=4, h_kv=2, causal=True, pad=0)
    q, k, v, cu_q, cu_k, cu_q_t, cu_k_t = make_inputs(case)
    out, lse = mha.flash_attn_varlen_func(q, k, v, cu_q_t, cu_k_t, 130, 130, causal=True)
    cpu_out, cpu_lse = mha.reference.mha_forward(q.float().cpu().numpy(), k.float().cpu().numpy(),
                                                 v.float().cpu().numpy(), cu_q_t.cpu().numpy(), cu_k_t.cpu().numpy(),
                                                 causal=True)
    rows = list(range(sum(case.s_q)))
    p_abs_v = _ref().mha_prefill_ref(q, k, v, cu_q, cu_k, case.d_qk ** -0.5, True, rows=rows)[3]  # the error scale
    ref = (rows, torch.from_numpy(cpu_out).to(DEVICE).float(), torch.from_numpy(cpu_lse).to(DEVICE).float(), p_abs_v)
    _ref().check_mha_prefill(out, lse, ref, what=" [cpu reference]")


@gpu
def test_grad_mode_selects_autograd(mha):
    """q requiring grad makes out differentiable (lse never is), with the no-grad call's bits; under torch.no_grad()
    the call is the inference one. The backward itself: test_mha_prefill_bwd.py."""
    torch = _torch()
    case = Case((10,), (10,), h_q=2, h_kv=2, pad=0)
    q, k, v, _, _, cu_q, cu_k = make_inputs(case)
    q = q.detach().clone().requires_grad_(True)
    out, lse = mha.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 10, 10)
    assert out.requires_grad and not lse.requires_grad
    with torch.no_grad():
        out2, lse2 = mha.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 10, 10)
    assert not out2.requires_grad
    assert torch.equal(out.detach(), out2) and torch.equal(lse, lse2)


@gpu
def test_argument_errors(mha):
    torch = _torch()
    case = Case((10, 20), (10, 20), h_q=4, h_kv=2, pad=0)
    q, k, v, _, _, cu_q, cu_k = make_inputs(case)
    f = mha.flash_attn_varlen_func
    with pytest.raises(ValueError, match="'q' has dtype float32"):
        f(q.float(), k, v, cu_q, cu_k, 20, 20)
    with pytest.raises(ValueError, match="'k' has dtype float16"):
        f(q, k.half(), v, cu_q, cu_k, 20, 20)
    with pytest.raises(ValueError, match="'problem.h_q' is 4; must be a positive multiple of h_kv = 3"):
        f(q, torch.zeros((30, 3, 192), dtype=q.dtype, device=DEVICE), torch.zeros((30, 3, 128), dtype=q.dtype,
                                                                                     device=DEVICE), cu_q, cu_k, 20, 20)
    with pytest.raises(NotImplementedError, match=r"\(d_qk, d_v\) = \(192, 128\)"):
        f(q[..., :96], k[..., :96], v, cu_q, cu_k, 20, 20)
    with pytest.raises(ValueError, match="'cu_seqlens_qo' has dtype int64"):
        f(q, k, v, cu_q.long(), cu_k, 20, 20)
    with pytest.raises(ValueError, match="'cu_seqlens_kv' has size 2 in dimension 0"):
        f(q, k, v, cu_q, cu_k[:2], 20, 20)
    with pytest.raises(ValueError, match="'v' has size 29 in dimension 0"):
        f(q, k, v[:29], cu_q, cu_k, 20, 20)
    with pytest.raises(ValueError, match="'q' has stride 772 in dimension 0"):
        f(torch.zeros((30, 4, 193), dtype=q.dtype, device=DEVICE)[..., :192], k, v, cu_q, cu_k, 20, 20)
    with pytest.raises(ValueError, match="'out' overlaps argument 'q'"):
        f(q, k, v, cu_q, cu_k, 20, 20, out=q[..., :128])
    with pytest.raises(ValueError, match="'lse' has size 3 in dimension 1"):
        f(q, k, v, cu_q, cu_k, 20, 20, lse=torch.empty((30, 3), device=DEVICE))
    with pytest.raises(ValueError, match="'q' must be a CUDA tensor"):
        f(q.cpu(), k, v, cu_q, cu_k, 20, 20)
    with pytest.raises(ValueError, match="'qkv' has last dimension"):
        mha.flash_attn_varlen_qkvpacked_func(q, cu_q, 20, 192)


def test_capability_is_the_device_answer():
    """No run-time switch: dense prefill's capability is the device answer dense decode gets (no GPU needed), i.e.
    (True, "") on a Hopper GPU, else the same reason under its own name; or the build says it is compiled out."""
    dense_prefill = openmla.query_capability("dense_prefill")
    dense_decode = openmla.query_capability("dense_decode")
    if dense_prefill == (False, "dense_prefill: compiled out (OPENMLA_ENABLE_MHA_PREFILL=OFF)"):
        pytest.skip("dense MHA prefill is compiled out of this build")
    if dense_decode[1].endswith("compiled out (OPENMLA_ENABLE_DENSE_DECODE=OFF)"):
        pytest.skip("dense decode is compiled out: no built family to compare the device answer with")
    if dense_decode[0]:
        assert dense_prefill == (True, "")
    else:
        assert dense_decode[1].startswith("dense_decode: "), dense_decode
        assert dense_prefill == (False, "dense_prefill: " + dense_decode[1][len("dense_decode: "):])
    if GPU_SKIP_REASON is None:  # torch sees a Hopper GPU
        assert dense_prefill == (True, "")


@gpu
def test_valid_call_runs_in_a_fresh_process():
    """A fresh process that sets nothing (no environment variable, no mode) runs a valid call: equal logits, so out is v
    and lse is the logit + ln(s_k)."""
    code = r"""
import math, torch, openmla
assert openmla.query_capability('dense_prefill') == (True, ''), openmla.query_capability('dense_prefill')
q = torch.ones((10, 2, 192), dtype=torch.bfloat16, device='cuda')
k = torch.ones((10, 2, 192), dtype=torch.bfloat16, device='cuda')
v = torch.ones((10, 2, 128), dtype=torch.bfloat16, device='cuda')
cu = torch.tensor([0, 10], dtype=torch.int32, device='cuda')
out, lse = openmla.flash_attn_varlen_func(q, k, v, cu, cu, 10, 10)
torch.cuda.synchronize()
assert torch.allclose(out.float(), torch.ones_like(out, dtype=torch.float32), atol=1e-3), out
expect = 192 ** 0.5 + math.log(10)  # ten equal logits q.k * 192 ** -0.5 = 192 ** 0.5
assert torch.allclose(lse, torch.full_like(lse, expect), rtol=1e-5), (lse, expect)
print("call ok")
"""
    proc = subprocess.run([sys.executable, "-c", code], env=_child_env(), capture_output=True, text=True,
                          timeout=SMOKE_TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "call ok" in proc.stdout
