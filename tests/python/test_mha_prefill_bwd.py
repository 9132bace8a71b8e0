"""Tests of the dense MHA prefill backward through the flash_mla-compatible API: autograd of
openmla.flash_attn_varlen_func and its packed variants, the binding openmla._openmla.mha_prefill_bwd, and the torch
custom ops torch.ops.openmla.flash_attn_varlen_fwd / _bwd (torch.compile, opcheck).

Criterion (FlashAttention's backward tests; mha_prefill_ref.grad_within_tolerance): for each of dq, dk, dv, the max
abs error of ours against torch fp32 autograd of plain attention on the same inputs (mha_prefill_ref.mha_grad_ref:
varlen by looping over the sequences, GQA by repeat_interleave, causal bottom-right) is at most 2 x the max abs error
of the same torch computation in the inputs' dtype (bf16 / fp16) against that fp32 reference, plus a small epsilon.
Inputs: test_mha_prefill.make_inputs (views into buffers with NaN in the padded heads, columns and the rows past the
last sequence; NaN-poisoned sequences between the compared ones where a case says so), dout likewise a view of a
NaN-padded buffer. Only the rows inside the compared sequences are compared (rows past the last sequence are neither
read nor written: include/openmla/prefill.h).

Without torch or a Hopper GPU every GPU test here is collected and skipped with its reason (conftest.py). Without a
GPU but with torch, the Python layer (autograd, the packed variants' gradients, the ops, torch.compile, opcheck) runs
against an emulated binding whose MHA entries are the torch reference on CPU tensors (_EmulatedBinding), and the ops'
fake implementations run on meta tensors.
"""
from __future__ import annotations

import os
import random
import subprocess
import sys

import pytest

import openmla
from conftest import ROOT
from test_mha_prefill import LENGTHS, Case, _cu, compared_rows, make_inputs

gpu = pytest.mark.gpu
DEVICE = "cuda"
SMOKE_TIMEOUT_S = 180


def _torch():
    import torch

    return torch


def _ref():
    import mha_prefill_ref

    return mha_prefill_ref


def _has_torch():
    try:
        import torch  # noqa: F401
    except Exception:
        return False
    return True


needs_torch = pytest.mark.skipif(not _has_torch(), reason="needs PyTorch (CPU is enough), which is not installed here")


# ---------------------------------------------------------------------------------------------------------------
# Cases
# ---------------------------------------------------------------------------------------------------------------
def _random_lengths(rng, n, choices=LENGTHS):
    return tuple(rng.choice(choices) for _ in range(n))


def _matrix():
    """(d_qk, dtype, causal) x two GQA ratios each, so that every ratio (1, 2, 8, 16) meets every (d_qk, dtype) pair
    and, over the pairs, both masks: 16 cases, not the full product. Five random lengths of the issue's list per
    case."""
    rng = random.Random(23)
    ratios = ((16, 16), (16, 8), (16, 2), (16, 1))
    cases = []
    for i, (d_qk, fp16, causal) in enumerate((d, f, c) for d in (192, 128) for f in (False, True)
                                             for c in (False, True)):
        j, c = i // 2, i % 2  # (d_qk, dtype) pair, mask: the two masks of a pair take the four ratios between them
        for h_q, h_kv in (ratios[(2 * c + j) % 4], ratios[(2 * c + 1 + j) % 4]):
            lens = _random_lengths(rng, 5)
            cases.append(Case(lens, lens, h_q=h_q, h_kv=h_kv, d_qk=d_qk, fp16=fp16, causal=causal))
    return cases


MATRIX = _matrix()
# Every length of the issue as one sequence (GQA 2, causal; the matrix has the non-causal ones in batches).
EACH_LENGTH = [Case((n,), (n,), h_q=4, h_kv=2, causal=True) for n in LENGTHS]
# Chunked prefill (s_q < s_k), more queries than keys (rows without keys under causal, a sequence without keys), and a
# sequence without queries (keys nobody sees: dk = dv = 0).
S_Q_DIFFERS = ([Case((1, 63, 129, 1000), (700, 64, 4097, 1000 + 129), h_q=8, h_kv=2, causal=c, d_qk=d)
                for c in (False, True) for d in (192, 128)]
               + [Case((129, 300, 65), (64, 0, 1), h_q=4, h_kv=4, causal=c) for c in (False, True)]
               + [Case((65, 0, 200), (65, 300, 129), h_q=4, h_kv=1, causal=c, fp16=True) for c in (False, True)])
POISONED = [Case((65, 200, 1, 130, 64), (65, 200, 1, 130, 64), h_q=8, h_kv=2, causal=c, poison=(1, 3), pad=131)
            for c in (False, True)]
LARGE_LOGITS = [Case((1000, 129), (1000, 129), h_q=8, h_kv=4, q_scale=4.0, causal=True, fp16=f) for f in (False, True)]


def test_matrix_covers_the_issue():
    """The cases cover every value the issue lists (runs without a GPU)."""
    cases = MATRIX + EACH_LENGTH + S_Q_DIFFERS
    assert set(LENGTHS) <= {n for c in cases for n in c.s_q + c.s_k}
    assert {c.h_q // c.h_kv for c in MATRIX} == {1, 2, 8, 16}
    assert {(c.d_qk, c.fp16, c.causal) for c in MATRIX} == {(d, f, c) for d in (192, 128) for f in (0, 1)
                                                            for c in (0, 1)}
    for d_qk in (192, 128):
        for fp16 in (False, True):
            assert {c.h_q // c.h_kv for c in MATRIX if (c.d_qk, c.fp16) == (d_qk, fp16)} == {1, 2, 8, 16}
    assert any(q < k for c in S_Q_DIFFERS for q, k in zip(c.s_q, c.s_k))
    assert any(q > k for c in S_Q_DIFFERS for q, k in zip(c.s_q, c.s_k))
    assert any(q == 0 < k for c in S_Q_DIFFERS for q, k in zip(c.s_q, c.s_k))


# ---------------------------------------------------------------------------------------------------------------
# Running a case
# ---------------------------------------------------------------------------------------------------------------
def make_dout(total_q, h_q, d_v, dtype, device, seed, rows_in_sequences):
    """dout as a view into a NaN buffer (an extra head, 64 extra columns) whose rows inside sequences are N(0, 1) and
    whose rows past the last sequence stay NaN (never read into a result)."""
    torch = _torch()
    g = torch.Generator(device=device).manual_seed(seed)
    buf = torch.full((total_q, h_q + 1, d_v + 64), float("nan"), dtype=dtype, device=device)
    view = buf[:, :h_q, :d_v]
    view[:rows_in_sequences] = torch.randn((rows_in_sequences, h_q, d_v), generator=g, device=device).to(dtype)
    return view


def grad_inputs(case: Case, seed=0, device=DEVICE):
    """make_inputs' q, k, v as leaves requiring grad (the same NaN-padded views), dout, cu lists and tensors."""
    q, k, v, cu_q, cu_k, cu_q_t, cu_k_t = make_inputs(case, seed)
    q, k, v = (t.detach().requires_grad_(True) for t in (q, k, v))
    dout = make_dout(q.shape[0], case.h_q, 128, q.dtype, device, seed + 101, cu_q[-1])
    return q, k, v, dout, cu_q, cu_k, cu_q_t, cu_k_t


def key_rows(case: Case, cu_k):
    return [t for i in range(len(case.s_k)) if i not in case.poison for t in range(cu_k[i], cu_k[i + 1])]


def check_grads(case: Case, q, k, v, dout, cu_q, cu_k, grads, what=""):
    """grads = (dq, dk, dv) against the fp32 reference with FlashAttention's criterion, plus the exact zeros of the
    contract: dq of a row that sees no key, dk and dv of a key that no row sees. Returns {name: (error, allowed)}."""
    torch = _torch()
    ref = _ref()
    scale = case.softmax_scale if case.softmax_scale is not None else case.d_qk ** -0.5
    exact = ref.mha_grad_ref(q, k, v, cu_q, cu_k, dout, scale, case.causal, skip=case.poison)
    lowp = ref.mha_grad_ref(q, k, v, cu_q, cu_k, dout, scale, case.causal, compute_dtype=q.dtype, skip=case.poison)
    rows_q, rows_k = compared_rows(case, cu_q), key_rows(case, cu_k)
    margins = {}
    for i, (name, rows) in enumerate((("dq", rows_q), ("dk", rows_k), ("dv", rows_k))):
        margins[name] = ref.grad_within_tolerance(f"{name}{what} [{case}]", grads[i], exact[i + 1], lowp[i + 1],
                                                  rows=rows)
    dq, dk, dv = grads
    for i in range(len(case.s_q)):
        if i in case.poison:
            continue
        s_q, s_k = case.s_q[i], case.s_k[i]
        no_key = [cu_q[i] + t for t in range(s_q) if s_k == 0 or (case.causal and t + s_k - s_q < 0)]
        if no_key:
            assert bool((dq[torch.tensor(no_key, device=dq.device)] == 0).all()), f"dq of rows without keys [{case}]"
        if s_q == 0 and s_k > 0:  # keys that no row sees
            assert bool((dk[cu_k[i]:cu_k[i + 1]] == 0).all()) and bool((dv[cu_k[i]:cu_k[i + 1]] == 0).all()), \
                f"dk / dv of keys no row sees [{case}]"
    print(f"[{case}]{what} " + " ".join(f"{n} {e:.3g}/{a:.3g}" for n, (e, a) in margins.items()))
    return margins


def run_and_check(mha, case: Case, seed=0, deterministic=False):
    """Forward and backward through flash_attn_varlen_func and autograd (the kernels run before the references
    allocate anything), then check_grads. Returns (q.grad, k.grad, v.grad)."""
    torch = _torch()
    q, k, v, dout, cu_q, cu_k, cu_q_t, cu_k_t = grad_inputs(case, seed)
    out, lse = mha.flash_attn_varlen_func(q, k, v, cu_q_t, cu_k_t, max(case.s_q), max(case.s_k), causal=case.causal,
                                          softmax_scale=case.softmax_scale, deterministic=deterministic)
    assert out.requires_grad and not lse.requires_grad
    out.backward(dout)
    torch.cuda.synchronize()
    grads = (q.grad, k.grad, v.grad)
    check_grads(case, q, k, v, dout, cu_q, cu_k, grads, what=" det" if deterministic else "")
    return grads


# ---------------------------------------------------------------------------------------------------------------
# GPU: the smoke call, then the cases
# ---------------------------------------------------------------------------------------------------------------
_SMOKE_CODE = r"""
import torch, openmla
g = torch.Generator(device="cuda").manual_seed(0)
cu = torch.tensor([0, 70, 200], dtype=torch.int32, device="cuda")
q = torch.randn((200, 4, 192), generator=g, device="cuda").bfloat16().requires_grad_()
k = torch.randn((200, 2, 192), generator=g, device="cuda").bfloat16().requires_grad_()
v = torch.randn((200, 2, 128), generator=g, device="cuda").bfloat16().requires_grad_()
out, lse = openmla.flash_attn_varlen_func(q, k, v, cu, cu, 130, 130, causal=True)
out.backward(torch.randn_like(out))
torch.cuda.synchronize()
for t in (q, k, v):
    assert bool(torch.isfinite(t.grad).all()), "non-finite gradient"
print("smoke ok")
"""


def _child_env():
    return dict(os.environ,
                PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "python"), os.path.join(ROOT, ".deps", "py"),
                                            os.environ.get("PYTHONPATH", "")]))


@pytest.fixture(scope="module")
def smoke():
    """One tiny forward + backward in a child process with a time limit: (ok, report). A hang or a fault there fails
    every GPU test of this module with the child's output instead of hanging the session."""
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
        pytest.fail(f"dense MHA prefill backward smoke test failed, not running the GPU case: {report}")
    return openmla


@gpu
@pytest.mark.parametrize("case", MATRIX, ids=str)
def test_matrix(mha, case):
    run_and_check(mha, case)


@gpu
@pytest.mark.parametrize("case", EACH_LENGTH, ids=str)
def test_each_length(mha, case):
    run_and_check(mha, case)


@gpu
@pytest.mark.parametrize("case", S_Q_DIFFERS, ids=str)
def test_s_q_differs_from_s_k(mha, case):
    run_and_check(mha, case)


@gpu
@pytest.mark.parametrize("case", POISONED, ids=str)
def test_nan_poisoned_neighbours_and_padding(mha, case):
    """NaN in the sequences between the compared ones, in the padded heads and columns of q, k, v and dout, and in the
    rows past the last sequence: a tile that straddles a sequence end (in q and in k / v) must not let a NaN reach a
    compared gradient."""
    run_and_check(mha, case)


@gpu
@pytest.mark.parametrize("case", LARGE_LOGITS, ids=str)
def test_large_logits(mha, case):
    run_and_check(mha, case)


@gpu
def test_softmax_scale(mha):
    run_and_check(mha, Case((129, 64), (200, 64), h_q=4, h_kv=1, causal=True, softmax_scale=0.3))


@gpu
@pytest.mark.parametrize("deterministic", (False, True))
def test_every_output_element_is_written(mha, deterministic):
    """Through the binding with caller-owned dq, dk, dv: views into buffers filled with NaN (an extra head, extra
    columns, rows past the last sequence). Every element of the rows inside sequences is written (and finite), the rows
    past the last sequence get 0 (they reach no output), nothing outside the views is written."""
    torch = _torch()
    case = Case((300, 0, 129, 1), (200, 65, 129, 1), h_q=8, h_kv=2, causal=True, pad=7)
    q, k, v, dout, cu_q, cu_k, cu_q_t, cu_k_t = grad_inputs(case)
    q, k, v = (t.detach() for t in (q, k, v))
    out, lse = mha.flash_attn_varlen_func(q, k, v, cu_q_t, cu_k_t, 300, 300, causal=True)

    def nan_view(rows, heads, cols):
        return torch.full((rows, heads + 1, cols + 32), float("nan"), dtype=q.dtype, device=DEVICE)[:, :heads, :cols]

    dq, dk, dv = nan_view(q.shape[0], 8, 192), nan_view(k.shape[0], 2, 192), nan_view(v.shape[0], 2, 128)
    problem = dict(batch=len(case.s_q), total_q=q.shape[0], h_q=8, h_kv=2, d_qk=192, d_v=128, dtype="bfloat16",
                   causal=True, deterministic=deterministic)
    C = mha._openmla
    workspace = torch.empty(C.get_mha_prefill_bwd_workspace_size(**problem), dtype=torch.uint8, device=DEVICE)
    C.mha_prefill_bwd(q, k, v, out, dout, lse, cu_q_t, cu_k_t, workspace, dq, dk, dv, softmax_scale=0.0,
                      stream=torch.cuda.current_stream().cuda_stream, **problem)
    torch.cuda.synchronize()
    for name, t, n in (("dq", dq, cu_q[-1]), ("dk", dk, cu_k[-1]), ("dv", dv, cu_k[-1])):
        assert bool(torch.isfinite(t[:n]).all()), f"{name}: an element inside the sequences was not written"
        assert bool((t[n:] == 0).all()), f"{name}: a row past the last sequence is not 0"
        base = t._base
        assert bool(base[:, -1].isnan().all()) and bool(base[..., t.shape[2]:].isnan().all()), \
            f"{name}: written outside its view"
    check_grads(case, q, k, v, dout, cu_q, cu_k, (dq, dk, dv), what=" binding")


@gpu
@pytest.mark.parametrize("causal", (False, True))
def test_deterministic_is_bitwise_repeatable(mha, causal):
    """deterministic=True: dq, dk and dv bitwise identical over three runs (many key blocks add into each query block:
    long sequences, GQA 8)."""
    torch = _torch()
    case = Case((4097, 1000, 129, 0, 65), (4097, 1300, 300, 5, 65), h_q=16, h_kv=2, causal=causal, pad=0)
    q, k, v, dout, _, _, cu_q, cu_k = grad_inputs(case)
    runs = []
    for _ in range(3):
        for t in (q, k, v):
            t.grad = None
        out, _ = mha.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 4097, 4097, causal=causal, deterministic=True)
        out.backward(dout)
        runs.append(tuple(t.grad.clone() for t in (q, k, v)))
    torch.cuda.synchronize()
    for again in runs[1:]:
        for name, a, b in zip(("dq", "dk", "dv"), runs[0], again):
            assert torch.equal(a.view(torch.int16), b.view(torch.int16)), f"{name} differs between runs [{case}]"


@gpu
def test_deterministic_agrees_with_the_default(mha):
    """Both orders of dq's additions meet the criterion, and they differ by no more than the reference tolerance."""
    case = Case((4097, 1000, 129), (4097, 1000, 129), h_q=16, h_kv=2, causal=True, pad=0)
    fast = run_and_check(mha, case, deterministic=False)
    fixed = run_and_check(mha, case, deterministic=True)
    for name, a, b in zip(("dq", "dk", "dv"), fast, fixed):
        diff = float((a.float() - b.float()).abs().max())
        scale = float(b.float().abs().max())
        assert diff <= 2.0 ** -6 * scale, f"{name}: deterministic and default differ by {diff:.3g} (max |grad| {scale:.3g})"
        print(f"{name}: deterministic vs default max diff {diff:.3g} (max |grad| {scale:.3g})")


@gpu
@pytest.mark.parametrize("d_qk", (192, 128))
def test_packed_variants(mha, d_qk):
    """qkvpacked and kvpacked: the gradient of the packed tensor holds, bit for bit, the unpacked call's gradients on
    the same views (deterministic=True, so the order of dq's additions is fixed)."""
    torch = _torch()
    lens = (65, 300, 1)
    cu = torch.tensor(_cu(lens), dtype=torch.int32, device=DEVICE)
    total, h = sum(lens), 4
    g = torch.Generator(device=DEVICE).manual_seed(77 + d_qk)
    base = torch.randn((total, h, 2 * d_qk + 128), generator=g, device=DEVICE).bfloat16()
    dout = torch.randn((total, h, 128), generator=g, device=DEVICE).bfloat16()

    qkv = base.clone().requires_grad_(True)
    out, _ = mha.flash_attn_varlen_qkvpacked_func(qkv, cu, 300, d_qk, causal=True, deterministic=True)
    out.backward(dout)
    q = base[..., :d_qk].clone().requires_grad_(True)
    kv = base[..., d_qk:].clone().requires_grad_(True)
    out2, _ = mha.flash_attn_varlen_kvpacked_func(q, kv, cu, cu, 300, 300, d_qk, causal=True, deterministic=True)
    out2.backward(dout)
    leaves = [base[..., :d_qk], base[..., d_qk:2 * d_qk], base[..., 2 * d_qk:]]
    leaves = [t.clone().requires_grad_(True) for t in leaves]
    out3, _ = mha.flash_attn_varlen_func(*leaves, cu, cu, 300, 300, causal=True, deterministic=True)
    out3.backward(dout)
    torch.cuda.synchronize()
    unpacked = torch.cat([t.grad for t in leaves], dim=-1)
    assert torch.equal(qkv.grad, unpacked)
    assert torch.equal(torch.cat([q.grad, kv.grad], dim=-1), unpacked)
    case = Case(lens, lens, h_q=h, h_kv=h, d_qk=d_qk, pad=0)
    check_grads(case, *leaves, dout, _cu(lens), _cu(lens), [t.grad for t in leaves], what=" packed")


@gpu
def test_gradients_of_some_inputs_only(mha):
    """Only q requires grad: k and v get none, q.grad is the full call's; lse used in the loss changes nothing (it
    carries no gradient)."""
    torch = _torch()
    case = Case((100, 257), (150, 257), h_q=8, h_kv=2, causal=True, pad=0)
    q, k, v, dout, _, _, cu_q, cu_k = grad_inputs(case)
    out, lse = mha.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 257, 257, causal=True, deterministic=True)
    out.backward(dout)
    full = q.grad.clone()
    q2 = q.detach().requires_grad_(True)
    k2, v2 = k.detach(), v.detach()
    out2, lse2 = mha.flash_attn_varlen_func(q2, k2, v2, cu_q, cu_k, 257, 257, causal=True, deterministic=True)
    ((out2.float() * dout.float()).sum() + lse2.sum()).backward()
    torch.cuda.synchronize()
    assert k2.grad is None and v2.grad is None
    assert torch.equal(q2.grad, full)


@gpu
def test_expanded_and_strided_dout(mha):
    """out.sum() hands the backward an expanded dout (stride 0): the Python layer packs it before the call."""
    torch = _torch()
    case = Case((100, 129), (100, 129), h_q=4, h_kv=4, causal=False, pad=0)
    q, k, v, _, cu_q_l, cu_k_l, cu_q, cu_k = grad_inputs(case)
    out, _ = mha.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 129, 129)
    out.float().sum().backward()
    torch.cuda.synchronize()
    ones = torch.ones_like(out)
    check_grads(case, q, k, v, ones, cu_q_l, cu_k_l, (q.grad, k.grad, v.grad), what=" sum")


@gpu
def test_cuda_graph_capture_of_forward_and_backward(mha):
    """A forward + backward captured in a CUDA graph (the workspace and the gradients come from the graph's pool) and
    replayed gives the eager gradients bit for bit (deterministic=True), also after the inputs change in place."""
    torch = _torch()
    case = Case((300, 65, 1000), (300, 65, 1000), h_q=8, h_kv=2, causal=True, pad=0)
    q, k, v, dout, _, _, cu_q, cu_k = grad_inputs(case)

    def step():
        out, _ = mha.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 1000, 1000, causal=True, deterministic=True)
        out.backward(dout)

    def eager_grads():
        for t in (q, k, v):
            t.grad = None
        step()
        torch.cuda.synchronize()
        return [t.grad.clone() for t in (q, k, v)]

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture stream, as torch.cuda.graph wants
        for _ in range(2):
            for t in (q, k, v):
                t.grad = None
            step()
    torch.cuda.current_stream().wait_stream(side)
    for t in (q, k, v):
        t.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    captured = [t.grad for t in (q, k, v)]
    for _ in range(2):
        graph.replay()
        torch.cuda.synchronize()
        expected = eager_grads()
        for name, got, want in zip(("dq", "dk", "dv"), captured, expected):
            assert torch.equal(got, want), f"{name}: the replay differs from the eager call"
        with torch.no_grad():  # new values in place: the replay must follow them
            for t in (q, k, v):
                t.mul_(0.5)


@gpu
def test_refuses_caller_outputs_under_grad(mha):
    case = Case((10,), (10,), h_q=2, h_kv=2, pad=0)
    q, k, v, _, _, _, cu_q, cu_k = grad_inputs(case)
    with pytest.raises(ValueError, match="argument 'out'"):
        mha.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 10, 10, out=_torch().empty((10, 2, 128), dtype=q.dtype,
                                                                                    device=DEVICE))


# ---------------------------------------------------------------------------------------------------------------
# GPU: the torch custom ops
# ---------------------------------------------------------------------------------------------------------------
def _op_inputs(requires_grad, h_q=4, h_kv=2, lens=(65, 130), seed=5):
    torch = _torch()
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    total = sum(lens)
    q = torch.randn((total, h_q, 192), generator=g, device=DEVICE).bfloat16().requires_grad_(requires_grad)
    k = torch.randn((total, h_kv, 192), generator=g, device=DEVICE).bfloat16().requires_grad_(requires_grad)
    v = torch.randn((total, h_kv, 128), generator=g, device=DEVICE).bfloat16().requires_grad_(requires_grad)
    cu = torch.tensor(_cu(lens), dtype=torch.int32, device=DEVICE)
    return q, k, v, cu, max(lens)


@gpu
def test_opcheck_forward_op(mha):
    torch = _torch()
    q, k, v, cu, m = _op_inputs(True)
    torch.library.opcheck(torch.ops.openmla.flash_attn_varlen_fwd.default, (q, k, v, cu, cu, m, None, True, True))


@gpu
def test_opcheck_backward_op(mha):
    torch = _torch()
    q, k, v, cu, m = _op_inputs(False)
    out, lse = torch.ops.openmla.flash_attn_varlen_fwd(q, k, v, cu, cu, m, None, True)
    dout = torch.randn_like(out)
    torch.library.opcheck(torch.ops.openmla.flash_attn_varlen_bwd.default,
                          (dout, q, k, v, out, lse, cu, cu, None, True, True))


@gpu
def test_compile_fullgraph_forward_and_backward(mha):
    """torch.compile(fullgraph=True) of a loss over flash_attn_varlen_func, then its backward: no graph break, and the
    same gradients as eager, bit for bit (deterministic=True; both run the same kernels on the same dout: the loss is
    linear in out, so dout is exactly w in both)."""
    torch = _torch()
    q, k, v, cu, m = _op_inputs(True)
    w = torch.randn((128,), device=DEVICE).bfloat16().float()

    def loss_fn(q, k, v):
        out, lse = openmla.flash_attn_varlen_func(q, k, v, cu, cu, m, m, causal=True, deterministic=True)
        return (out.float() * w).sum() + lse.sum()

    loss = loss_fn(q, k, v)
    loss.backward()
    eager = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    torch._dynamo.reset()
    compiled = torch.compile(loss_fn, fullgraph=True)
    loss_c = compiled(q, k, v)
    loss_c.backward()
    torch.cuda.synchronize()
    assert torch.allclose(loss_c, loss, rtol=1e-5)
    for name, a, t in zip(("dq", "dk", "dv"), eager, (q, k, v)):
        assert torch.equal(a, t.grad), f"{name}: compiled and eager gradients differ"


@gpu
def test_compile_fullgraph_packed_training_step(mha):
    """A qkv projection, the packed attention and an output projection under torch.compile(fullgraph=True): the
    parameters' gradients equal eager's within bf16 rounding (Inductor may fuse the projections differently)."""
    torch = _torch()
    g = torch.Generator(device=DEVICE).manual_seed(9)
    lens = (100, 157)
    cu = torch.tensor(_cu(lens), dtype=torch.int32, device=DEVICE)
    x = torch.randn((sum(lens), 256), generator=g, device=DEVICE).bfloat16()
    w_qkv = (torch.randn((256, 4 * 512), generator=g, device=DEVICE) * 0.05).bfloat16().requires_grad_(True)
    w_o = (torch.randn((4 * 128, 256), generator=g, device=DEVICE) * 0.05).bfloat16().requires_grad_(True)

    def step(x):
        qkv = (x @ w_qkv).view(-1, 4, 512)
        out, _ = openmla.flash_attn_varlen_qkvpacked_func(qkv, cu, 157, 192, causal=True, deterministic=True)
        return (out.reshape(-1, 512) @ w_o).float().square().mean()

    step(x).backward()
    eager = [w_qkv.grad.clone(), w_o.grad.clone()]
    w_qkv.grad = w_o.grad = None
    torch._dynamo.reset()
    torch.compile(step, fullgraph=True)(x).backward()
    torch.cuda.synchronize()
    for name, a, b in zip(("w_qkv", "w_o"), eager, (w_qkv.grad, w_o.grad)):
        err = float((a.float() - b.float()).abs().max())
        assert err <= 2.0 ** -7 * float(a.float().abs().max()), f"{name}: compiled vs eager differ by {err:.3g}"


# ---------------------------------------------------------------------------------------------------------------
# Without a GPU: the Python layer against an emulated binding (torch on the CPU), fake implementations on meta
# ---------------------------------------------------------------------------------------------------------------
class _EmulatedBinding:
    """openmla._openmla with its four MHA entries computed by the torch reference on the tensors' own device (CPU
    here), writing their outputs as the kernels do (rows inside sequences only); every other attribute is the real
    binding's. Each backward call is recorded (problem, scale, the dout it was handed)."""

    def __init__(self):
        self.bwd_calls = []

    def __getattr__(self, name):
        return getattr(openmla._openmla, name)

    def mha_prefill_call(self, *args, **kwargs):
        return None  # the general path takes every call

    def get_mha_prefill_workspace_size(self, **problem):
        return 16

    def get_mha_prefill_bwd_workspace_size(self, **problem):
        return 64

    def mha_prefill(self, q, k, v, cu_q, cu_k, workspace, out, lse, *, softmax_scale, stream, **problem):
        torch = _torch()
        scale = softmax_scale or problem["d_qk"] ** -0.5
        rows, o, l, _ = _ref().mha_prefill_ref(q, k, v, cu_q.tolist(), cu_k.tolist(), scale, problem["causal"])
        idx = torch.tensor(rows, dtype=torch.long)
        out[idx] = o.to(out.dtype)
        lse[idx] = l

    def mha_prefill_bwd(self, q, k, v, out, dout, lse, cu_q, cu_k, workspace, dq, dk, dv, *, softmax_scale, stream,
                        **problem):
        self.bwd_calls.append(dict(problem, softmax_scale=softmax_scale, dout_stride=tuple(dout.stride()),
                                   workspace_bytes=workspace.numel()))
        scale = softmax_scale or problem["d_qk"] ** -0.5
        cq, ck = cu_q.tolist(), cu_k.tolist()
        # The closed form, not autograd: an op's kernel runs below the autograd dispatch key (opcheck calls it so).
        gq, gk, gv = _grad_closed_form(q, k, v, cq, ck, dout, scale, problem["causal"])
        dq[:cq[-1]] = gq[:cq[-1]].to(dq.dtype)
        dk[:ck[-1]] = gk[:ck[-1]].to(dk.dtype)
        dv[:ck[-1]] = gv[:ck[-1]].to(dv.dtype)


def _grad_closed_form(q, k, v, cu_q, cu_k, dout, scale, causal):
    """The gradients of sum(out * dout) in fp32 by the textbook formulas (P = softmax(scale Q K^T), dV = P^T dO,
    dS = P o (dO V^T - rowsum(dO o O)), dQ = scale dS K, dK = scale dS^T Q), without autograd; GQA by summing the
    query heads of each kv head."""
    torch = _torch()
    h_q, h_kv = q.shape[1], k.shape[1]
    group = h_q // h_kv
    dq, dk, dv = (torch.zeros(t.shape, dtype=torch.float32) for t in (q, k, v))
    for i in range(len(cu_q) - 1):
        q0, q1, k0, k1 = cu_q[i], cu_q[i + 1], cu_k[i], cu_k[i + 1]
        s_q, s_k = q1 - q0, k1 - k0
        if s_q == 0 or s_k == 0:
            continue
        qi = q[q0:q1].detach().float()
        ki, vi = (t[k0:k1].detach().float().repeat_interleave(group, dim=1) for t in (k, v))
        z = torch.einsum("thd,shd->hts", qi, ki) * scale
        visible = torch.ones((s_q, s_k), dtype=torch.bool)
        if causal:
            visible = torch.arange(s_k)[None, :] <= torch.arange(s_q)[:, None] + (s_k - s_q)
        z = z.masked_fill(~visible, -float("inf")).masked_fill(~visible.any(-1, keepdim=True), 0.0)
        p = torch.softmax(z, dim=-1).masked_fill(~visible, 0.0)
        do = dout[q0:q1].detach().float()
        o = torch.einsum("hts,shd->thd", p, vi)
        ds = p * (torch.einsum("thd,shd->hts", do, vi) - (do * o).sum(-1).t()[..., None])
        dq[q0:q1] = torch.einsum("hts,shd->thd", ds, ki) * scale
        dk[k0:k1] = (torch.einsum("hts,thd->shd", ds, qi) * scale).view(s_k, h_kv, group, -1).sum(2)
        dv[k0:k1] = torch.einsum("hts,thd->shd", p, do).view(s_k, h_kv, group, -1).sum(2)
    return dq, dk, dv


@pytest.fixture
def emulated(monkeypatch):
    """The package on the emulated binding, with CPU kernels for the two MHA ops (their CUDA implementations, which
    reach the binding through openmla.mha)."""
    torch = pytest.importorskip("torch", reason="the Python layer's autograd needs PyTorch (CPU is enough)")
    from openmla import _torch_ops
    from openmla import mha as mha_module

    binding = _EmulatedBinding()
    monkeypatch.setattr(mha_module, "_C", binding)
    monkeypatch.setattr(mha_module, "_IN_PLACE", False)
    lib = torch.library.Library("openmla", "IMPL")
    lib.impl("flash_attn_varlen_fwd", _torch_ops._mha_fwd, "CPU")
    lib.impl("flash_attn_varlen_bwd", _torch_ops._mha_bwd, "CPU")
    try:
        yield binding
    finally:
        lib._destroy()
        torch._dynamo.reset()


def _cpu_inputs(lens_q=(5, 0, 17, 9), lens_k=(7, 4, 17, 0), h_q=4, h_kv=2, d_qk=192, pad=2, seed=0):
    """q, k, v leaves (bf16, CPU; `pad` rows past the last sequence), dout, cu lists and int32 tensors."""
    torch = _torch()
    g = torch.Generator().manual_seed(seed)
    cu_q, cu_k = _cu(lens_q), _cu(lens_k)
    tq, tk = cu_q[-1] + pad, cu_k[-1] + pad
    q = torch.randn((tq, h_q, d_qk), generator=g).bfloat16().requires_grad_(True)
    k = torch.randn((tk, h_kv, d_qk), generator=g).bfloat16().requires_grad_(True)
    v = torch.randn((tk, h_kv, 128), generator=g).bfloat16().requires_grad_(True)
    dout = torch.randn((tq, h_q, 128), generator=g).bfloat16()
    return q, k, v, dout, cu_q, cu_k, torch.tensor(cu_q, dtype=torch.int32), torch.tensor(cu_k, dtype=torch.int32)


def _expected_grads(q, k, v, dout, cu_q, cu_k, causal, scale=None):
    """The emulated kernels' gradients: the fp32 reference rounded to the inputs' dtype (rows in sequences)."""
    scale = scale if scale is not None else q.shape[-1] ** -0.5
    gq, gk, gv = _grad_closed_form(q, k, v, cu_q, cu_k, dout, scale, causal)
    return [g[:n].to(t.dtype) for g, t, n in ((gq, q, cu_q[-1]), (gk, k, cu_k[-1]), (gv, v, cu_k[-1]))]


@needs_torch
@pytest.mark.parametrize("causal", (False, True))
def test_emulated_autograd_gives_the_kernels_gradients(emulated, causal):
    """flash_attn_varlen_func under autograd: out differentiable, lse not, q.grad / k.grad / v.grad the backward
    entry's dq / dk / dv (rows inside sequences), deterministic and softmax_scale passed through."""
    q, k, v, dout, cu_q, cu_k, cu_q_t, cu_k_t = _cpu_inputs()
    out, lse = openmla.flash_attn_varlen_func(q, k, v, cu_q_t, cu_k_t, 17, 17, softmax_scale=0.07, causal=causal,
                                              deterministic=True)
    assert out.requires_grad and not lse.requires_grad and lse.stride() == (1, q.shape[0])
    out.backward(dout)
    for name, got, want in zip(("dq", "dk", "dv"), (q.grad, k.grad, v.grad),
                               _expected_grads(q, k, v, dout, cu_q, cu_k, causal, 0.07)):
        assert got.shape == (q, k, v)[("dq", "dk", "dv").index(name)].shape
        assert _torch().equal(got[:want.shape[0]], want), name
    (call,) = emulated.bwd_calls
    assert call["deterministic"] is True and call["causal"] is causal and call["softmax_scale"] == pytest.approx(0.07)
    assert (call["batch"], call["total_q"], call["h_q"], call["h_kv"], call["d_qk"], call["d_v"], call["dtype"]) == \
        (4, q.shape[0], 4, 2, 192, 128, "bfloat16")
    assert call["workspace_bytes"] == 64  # the size query's answer


@needs_torch
def test_emulated_default_is_not_deterministic_and_scale_defaults(emulated):
    q, k, v, dout, _, _, cu_q, cu_k = _cpu_inputs()
    out, _ = openmla.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 17, 17)
    out.backward(dout)
    (call,) = emulated.bwd_calls
    assert call["deterministic"] is False and call["softmax_scale"] == 0.0  # 0: d_qk ** -0.5 in the C++ API


@needs_torch
@pytest.mark.parametrize("d_qk", (192, 128))
def test_emulated_packed_variants_write_one_gradient(emulated, d_qk):
    """qkvpacked / kvpacked: one gradient tensor for the packed input, equal to the unpacked call's gradients."""
    torch = _torch()
    lens = (5, 0, 17, 9)
    g = torch.Generator().manual_seed(3)
    base = torch.randn((sum(lens), 4, 2 * d_qk + 128), generator=g).bfloat16()
    dout = torch.randn((sum(lens), 4, 128), generator=g).bfloat16()
    cu = torch.tensor(_cu(lens), dtype=torch.int32)
    qkv = base.clone().requires_grad_(True)
    out, lse = openmla.flash_attn_varlen_qkvpacked_func(qkv, cu, 17, d_qk, causal=True)
    out.backward(dout)
    q = base[..., :d_qk].clone().requires_grad_(True)
    kv = base[..., d_qk:].clone().requires_grad_(True)
    out, _ = openmla.flash_attn_varlen_kvpacked_func(q, kv, cu, cu, 17, 17, d_qk, causal=True)
    out.backward(dout)
    want = torch.cat(_expected_grads(base[..., :d_qk], base[..., d_qk:2 * d_qk], base[..., 2 * d_qk:], dout,
                                     _cu(lens), _cu(lens), True), dim=-1)
    assert qkv.grad.shape == qkv.shape and torch.equal(qkv.grad, want)
    assert torch.equal(torch.cat([q.grad, kv.grad], dim=-1), want)
    # One backward call per packed call.
    assert len(emulated.bwd_calls) == 2


@needs_torch
def test_emulated_expanded_dout_reaches_the_binding_packed(emulated):
    """out.sum() hands back an expanded gradient (strides 0): the binding gets a copy it can read."""
    q, k, v, _, cu_q, cu_k, cu_q_t, cu_k_t = _cpu_inputs()
    out, _ = openmla.flash_attn_varlen_func(q, k, v, cu_q_t, cu_k_t, 17, 17, causal=True)
    out.sum().backward()
    (call,) = emulated.bwd_calls
    assert call["dout_stride"] == (4 * 128, 128, 1)
    ones = _torch().ones((q.shape[0], 4, 128), dtype=q.dtype)
    assert _torch().equal(q.grad[:cu_q[-1]], _expected_grads(q, k, v, ones, cu_q, cu_k, True)[0])


@needs_torch
def test_emulated_some_inputs_only_and_lse_in_the_loss(emulated):
    torch = _torch()
    q, k, v, dout, cu_q, cu_k, cu_q_t, cu_k_t = _cpu_inputs()
    k2, v2 = k.detach(), v.detach()
    out, lse = openmla.flash_attn_varlen_func(q, k2, v2, cu_q_t, cu_k_t, 17, 17, causal=True)
    lse_finite = torch.where(torch.isinf(lse), 0.0, lse)
    ((out.float() * dout.float()).sum() + lse_finite.sum()).backward()
    assert k2.grad is None and v2.grad is None
    assert torch.equal(q.grad[:cu_q[-1]], _expected_grads(q, k, v, dout, cu_q, cu_k, True)[0])


@needs_torch
def test_emulated_no_grad_and_inference_mode_take_the_inference_path(emulated):
    torch = _torch()
    q, k, v, _, _, _, cu_q, cu_k = _cpu_inputs()
    for ctx in (torch.no_grad, torch.inference_mode):
        with ctx():
            out, lse = openmla.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 17, 17)
        assert not out.requires_grad
    out_buf = torch.empty((q.shape[0], 4, 128), dtype=q.dtype)
    with torch.no_grad():
        res = openmla.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 17, 17, out=out_buf)
    assert res[0] is out_buf
    assert emulated.bwd_calls == []


@needs_torch
@pytest.mark.parametrize("name", ("out", "lse"))
def test_caller_outputs_are_refused_under_grad(emulated, name):
    torch = _torch()
    q, k, v, _, _, _, cu_q, cu_k = _cpu_inputs()
    given = dict(out=torch.empty((q.shape[0], 4, 128), dtype=q.dtype), lse=torch.empty((q.shape[0], 4)))
    with pytest.raises(ValueError, match=f"argument '{name}': openmla.flash_attn_varlen_func allocates its outputs"):
        openmla.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 17, 17, **{name: given[name]})


@needs_torch
def test_emulated_compile_fullgraph_forward_and_backward(emulated):
    """torch.compile(fullgraph=True) routes the function to torch.ops.openmla.flash_attn_varlen_fwd, whose registered
    autograd formula is the backward op: one graph, the eager gradients (aot_eager: no code generation needed)."""
    torch = _torch()
    from torch._dynamo.testing import CompileCounterWithBackend

    q, k, v, dout, _, _, cu_q, cu_k = _cpu_inputs(pad=0)

    def loss_fn(q, k, v):
        out, lse = openmla.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 17, 17, causal=True, deterministic=True)
        return (out.float() * dout.float()).sum()

    loss_fn(q, k, v).backward()
    eager = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    counter = CompileCounterWithBackend("aot_eager")
    torch.compile(loss_fn, fullgraph=True, backend=counter)(q, k, v).backward()
    assert counter.frame_count == 1
    assert "flash_attn_varlen_fwd" in counter.graphs[0].code
    for name, a, t in zip(("dq", "dk", "dv"), eager, (q, k, v)):
        assert torch.equal(a, t.grad), name
    assert emulated.bwd_calls[-1]["deterministic"] is True


@needs_torch
def test_emulated_opcheck(emulated):
    """torch.library.opcheck of both ops against the emulated CPU kernels: schema, fake implementations (shapes,
    strides) against the real outputs, the registered autograd, AOT dispatch."""
    torch = _torch()
    q, k, v, dout, _, _, cu_q, cu_k = _cpu_inputs(pad=0)
    torch.library.opcheck(torch.ops.openmla.flash_attn_varlen_fwd.default, (q, k, v, cu_q, cu_k, 17, None, True, False))
    qd, kd, vd = (t.detach() for t in (q, k, v))
    out, lse = torch.ops.openmla.flash_attn_varlen_fwd(qd, kd, vd, cu_q, cu_k, 17, 0.1, False)
    torch.library.opcheck(torch.ops.openmla.flash_attn_varlen_bwd.default,
                          (dout, qd, kd, vd, out, lse, cu_q, cu_k, 0.1, False, True))


@needs_torch
def test_fake_implementations_on_meta_tensors():
    torch = _torch()
    q = torch.empty((300, 8, 192), dtype=torch.bfloat16, device="meta")
    k = torch.empty((500, 2, 192), dtype=torch.bfloat16, device="meta")
    v = torch.empty((500, 2, 128), dtype=torch.bfloat16, device="meta")
    cu = torch.empty((3,), dtype=torch.int32, device="meta")
    out, lse = torch.ops.openmla.flash_attn_varlen_fwd(q, k, v, cu, cu, 200, None, True)
    assert out.shape == (300, 8, 128) and out.dtype == torch.bfloat16 and out.is_contiguous()
    assert lse.shape == (300, 8) and lse.dtype == torch.float32 and lse.stride() == (1, 300)
    dq, dk, dv = torch.ops.openmla.flash_attn_varlen_bwd(out, q, k, v, out, lse, cu, cu, None, True, False)
    assert (dq.shape, dk.shape, dv.shape) == (q.shape, k.shape, v.shape)
    assert all(t.dtype == torch.bfloat16 and t.is_contiguous() for t in (dq, dk, dv))


@needs_torch
def test_compile_fullgraph_on_meta_tensors():
    """The package function with inputs requiring grad traces into one graph on meta tensors (no GPU), and the
    backward's fake implementation gives the gradients' shapes."""
    torch = _torch()
    from torch._dynamo.testing import CompileCounterWithBackend

    cu = torch.empty((3,), dtype=torch.int32, device="meta")
    q = torch.empty((10, 4, 192), dtype=torch.bfloat16, device="meta", requires_grad=True)
    kv = torch.empty((10, 2, 320), dtype=torch.bfloat16, device="meta", requires_grad=True)

    def loss_fn(q, kv):
        out, lse = openmla.flash_attn_varlen_kvpacked_func(q, kv, cu, cu, 6, 6, 192, causal=True)
        return out.float().square().sum()

    counter = CompileCounterWithBackend("aot_eager")
    try:
        torch.compile(loss_fn, fullgraph=True, backend=counter)(q, kv).backward()
    finally:
        torch._dynamo.reset()
    assert counter.frame_count == 1
    assert q.grad.shape == q.shape and kv.grad.shape == kv.shape


@needs_torch
@pytest.mark.parametrize("requires_grad", (False, True))
def test_meta_and_cpu_tensors_are_named(requires_grad):
    """Outside torch.compile, tensors that are not on a CUDA device are refused with a message naming the argument,
    with or without autograd (no GPU needed: nothing is launched)."""
    torch = _torch()
    for device, pattern in (("cpu", "argument 'q' must be a CUDA tensor"), ("meta", "argument 'q' is a meta tensor")):
        q = torch.zeros((10, 2, 192), dtype=torch.bfloat16, device=device).requires_grad_(requires_grad)
        k = torch.zeros((10, 2, 192), dtype=torch.bfloat16, device=device)
        v = torch.zeros((10, 2, 128), dtype=torch.bfloat16, device=device)
        cu = torch.tensor([0, 10], dtype=torch.int32).to(device)
        with pytest.raises(ValueError, match=pattern):
            openmla.flash_attn_varlen_func(q, k, v, cu, cu, 10, 10)


@needs_torch
def test_backward_binding_names_host_tensors():
    """The binding's backward refuses host tensors with the C++ API's message naming the argument."""
    torch = _torch()
    q = torch.zeros((10, 2, 192), dtype=torch.bfloat16)
    k, v = torch.zeros((10, 2, 192), dtype=torch.bfloat16), torch.zeros((10, 2, 128), dtype=torch.bfloat16)
    out, dout = torch.zeros((10, 2, 128), dtype=torch.bfloat16), torch.zeros((10, 2, 128), dtype=torch.bfloat16)
    lse, cu = torch.zeros((10, 2)), torch.tensor([0, 10], dtype=torch.int32)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    problem = dict(batch=1, total_q=10, h_q=2, h_kv=2, d_qk=192, d_v=128, dtype="bfloat16", causal=True,
                   deterministic=False, num_sms=132)
    workspace = torch.empty(openmla._openmla.get_mha_prefill_bwd_workspace_size(**problem), dtype=torch.uint8)
    with pytest.raises(ValueError, match="argument 'q' must be a CUDA tensor"):
        openmla._openmla.mha_prefill_bwd(q, k, v, out, dout, lse, cu, cu, workspace, dq, dk, dv, softmax_scale=0.0,
                                         **problem)


@needs_torch
@pytest.mark.parametrize("causal", (False, True))
def test_torch_reference_matches_the_cpu_reference(causal):
    """mha_grad_ref (torch fp32 autograd) against openmla.reference.mha_backward (C++, double) on a small varlen GQA
    case with empty sequences and rows without keys."""
    import numpy as np

    torch = _torch()
    lens_q, lens_k = (5, 0, 17, 9, 3), (7, 4, 17, 0, 1)
    cu_q, cu_k = _cu(lens_q), _cu(lens_k)
    g = torch.Generator().manual_seed(1)
    q = torch.randn((cu_q[-1], 4, 192), generator=g).bfloat16()
    k = torch.randn((cu_k[-1], 2, 192), generator=g).bfloat16()
    v = torch.randn((cu_k[-1], 2, 128), generator=g).bfloat16()
    dout = torch.randn((cu_q[-1], 4, 128), generator=g).bfloat16()
    _, dq, dk, dv = _ref().mha_grad_ref(q, k, v, cu_q, cu_k, dout, 192 ** -0.5, causal)
    cpu = openmla.reference.mha_backward(q.float().numpy(), k.float().numpy(), v.float().numpy(),
                                         np.array(cu_q, dtype=np.int32), np.array(cu_k, dtype=np.int32),
                                         dout.float().numpy(), causal=causal)
    for name, a, b in zip(("dq", "dk", "dv"), (dq, dk, dv), cpu):
        assert float((a - torch.from_numpy(np.asarray(b))).abs().max()) < 1e-5, name
    # The emulated binding's closed form (the CPU tests' kernel stand-in) agrees too.
    for name, a, b in zip(("dq", "dk", "dv"), (dq, dk, dv), _grad_closed_form(q, k, v, cu_q, cu_k, dout, 192 ** -0.5,
                                                                                causal)):
        assert float((a - b).abs().max()) < 1e-5, name


def test_grad_criterion_helper():
    """grad_within_tolerance passes within 2 x the low-precision error, fails above it and on a NaN (no GPU)."""
    pytest.importorskip("torch", reason="the helper works on torch tensors")
    torch = _torch()
    ref = _ref()
    exact = torch.tensor([[1.0, -2.0], [0.5, 0.0]])
    lowp = exact + torch.tensor([[0.01, 0.0], [0.0, -0.01]])
    ref.grad_within_tolerance("ok", exact + 0.019, exact, lowp)
    with pytest.raises(AssertionError, match="exceeds 2 x"):
        ref.grad_within_tolerance("bad", exact + 0.03, exact, lowp)
    with pytest.raises(AssertionError, match="not finite"):
        ref.grad_within_tolerance("nan", torch.tensor([[float("nan"), 0.0], [0.0, 0.0]]), exact, lowp)
    ref.grad_within_tolerance("rows", torch.tensor([[9.0, 9.0], [0.5, 0.0]]), exact, lowp, rows=[1])
