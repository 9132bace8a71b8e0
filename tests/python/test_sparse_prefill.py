"""Tests of sparse top-k MLA prefill through the flash_mla-compatible API (openmla.flash_mla_sparse_fwd).

Inputs follow flash_mla's sparse prefill test (docs/sparse-prefill.md, "Tests"), with OpenMLA's contract
(include/openmla/prefill.h) on top:

- q, kv ~ N(0, 1) / 10 plus a random per-tensor offset in [-0.05, 0.05] (q scaled up in some cases so the
  online softmax rescales), sm_scale 0.5 unless stated; q, kv and indices are views into padded buffers
  (non-contiguous, padding NaN).
- Each token selects `topk` distinct random rows among the first 3/4 of kv, in random slot order; when topk
  exceeds them the remaining slots hold invalid values (INT_MIN, -123456, -1, s_kv, s_kv + 114514, 2147480000,
  INT_MAX); about 5% more slots are invalid, and some tokens have no valid slot at all.
- The last quarter of kv is NaN: no valid slot selects it, and half of the slots at or beyond a token's
  topk_length point into it (the other half hold garbage): reading one shows up as NaN.
- topk_length ~ randint(0, topk) per token, with values above topk and negative ones (they clamp).
- attn_sink ~ N(0, 1) per head, about 31% +inf and 31% -inf.
- out / max_logits / lse are NaN-filled before the call (every element must be written); results are compared
  with the torch fp32 reference (sparse_prefill_ref.py) under out abs 1e-3 / rel 2.01/128 / cos 5e-6, max_logits
  and lse abs 1e-6 / rel 8.01/65536, with identical inf/NaN positions.

Without torch or a Hopper GPU every GPU test here is collected and skipped with its reason (conftest.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import pytest

gpu = pytest.mark.gpu
DEVICE = "cuda"
D_V = 512
INVALID = (-2 ** 31, -123456, -1, None, None, 2147480000, 2 ** 31 - 1)  # None: s_kv and s_kv + 114514


def _torch():
    import torch

    return torch


def _ref():
    import sparse_prefill_ref

    return sparse_prefill_ref


def _openmla():
    import openmla

    return openmla


@dataclass(frozen=True)
class Case:
    s_q: int
    s_kv: int
    topk: int
    h_q: int = 128
    d_qk: int = 576
    sink: bool = False
    lengths: bool = False
    empty_tokens: bool = True  # ~3% of tokens have no valid slot
    q_scale: float = 1.0       # q multiplied by this (large logits exercise the online-softmax rescaling)
    sm_scale: float = 0.5

    def __str__(self):
        s = f"d{self.d_qk}-hq{self.h_q}-sq{self.s_q}-skv{self.s_kv}-topk{self.topk}"
        if self.sink:
            s += "-sink"
        if self.lengths:
            s += "-len"
        if self.q_scale != 1.0:
            s += f"-qx{self.q_scale:g}"
        return s


def make_inputs(case: Case, seed=0):
    """(q, kv, indices, topk_length, attn_sink) on the GPU, as described in the module docstring."""
    torch = _torch()
    g = torch.Generator(device=DEVICE)
    g.manual_seed(seed * 7919 + case.s_q * 31 + case.topk * 7 + case.h_q + case.d_qk + case.s_kv)
    s_q, s_kv, topk, h_q, d_qk = case.s_q, case.s_kv, case.topk, case.h_q, case.d_qk

    def randn(*shape):
        return torch.randn(*shape, generator=g, device=DEVICE)

    def offset():
        return float(torch.rand((), generator=g, device=DEVICE)) * 0.1 - 0.05

    q_buf = torch.full((s_q + 1, h_q + 1, d_qk + 128), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    q = q_buf[:s_q, :h_q, :d_qk]
    q.copy_(((randn(s_q, h_q, d_qk) / 10 + offset()) * case.q_scale).clamp(-10, 10))
    kv_buf = torch.full((s_kv + 1, 2, d_qk + 64), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    kv = kv_buf[:s_kv, :1, :d_qk]
    kv.copy_((randn(s_kv, 1, d_qk) / 10 + offset()).clamp(-10, 10))
    pool = max(1, (s_kv * 3) // 4)
    kv[pool:] = float("nan")  # never selected by a valid slot

    # Distinct random rows below `pool` per token, in random slot order; the rest invalid values.
    n_real = min(topk, pool)
    perm = torch.rand(s_q, pool, generator=g, device=DEVICE).argsort(dim=1)[:, :n_real].to(torch.int32)
    candidates = torch.tensor([v if v is not None else s_kv + (0 if i == 3 else 114514) for i, v in enumerate(INVALID)],
                              dtype=torch.int64, device=DEVICE).clamp(-2 ** 31, 2 ** 31 - 1).to(torch.int32)
    idx = candidates[torch.randint(0, len(INVALID), (s_q, topk), generator=g, device=DEVICE)]
    idx[:, :n_real] = perm
    idx = idx.gather(1, torch.rand(s_q, topk, generator=g, device=DEVICE).argsort(dim=1))  # shuffle slots
    sprinkle = torch.rand(s_q, topk, generator=g, device=DEVICE) < 0.05
    idx = torch.where(sprinkle, candidates[torch.randint(0, len(INVALID), (s_q, topk), generator=g, device=DEVICE)], idx)
    if case.empty_tokens:
        empty = torch.randn(s_q, generator=g, device=DEVICE) < -1.9  # ~3%
        fill = candidates[torch.randint(0, len(INVALID), (s_q,), generator=g, device=DEVICE)]
        idx = torch.where(empty[:, None], fill[:, None], idx)

    topk_length = None
    if case.lengths:
        topk_length = torch.randint(0, topk + 1, (s_q,), generator=g, device=DEVICE, dtype=torch.int32)
        odd = torch.rand(s_q, generator=g, device=DEVICE)
        topk_length = torch.where(odd < 0.05, torch.full_like(topk_length, topk + 17), topk_length)
        topk_length = torch.where(odd > 0.97, torch.full_like(topk_length, -5), topk_length)
        # Slots at or beyond the length: half point at poisoned rows, half are garbage.
        beyond = torch.arange(topk, device=DEVICE)[None, :] >= topk_length.clamp(0, topk)[:, None]
        if pool < s_kv:
            poisoned = torch.randint(pool, s_kv, (s_q, topk), generator=g, device=DEVICE, dtype=torch.int32)
            half = torch.rand(s_q, topk, generator=g, device=DEVICE) < 0.5
            idx = torch.where(beyond & half, poisoned, idx)

    idx_buf = torch.full((s_q + 1, 2, topk + 64), -7, dtype=torch.int32, device=DEVICE)
    indices = idx_buf[:s_q, :1, :topk]
    indices.copy_(idx[:, None, :])

    attn_sink = None
    if case.sink:
        attn_sink = randn(h_q).float()
        draw = randn(h_q)
        attn_sink = torch.where(draw > 0.5, math.inf, torch.where(draw < -0.5, -math.inf, attn_sink))
    return q, kv, indices, topk_length, attn_sink


def nan_outputs(s_q, h_q):
    torch = _torch()
    out = torch.full((s_q, h_q, D_V), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    mx = torch.full((s_q, h_q), float("nan"), dtype=torch.float32, device=DEVICE)
    lse = torch.full((s_q, h_q), float("nan"), dtype=torch.float32, device=DEVICE)
    return out, mx, lse


def run_and_check(case: Case, seed=0, rows=None):
    """Runs the kernel (before the reference allocates anything), then compares with the fp32 reference."""
    torch = _torch()
    q, kv, indices, lengths, sink = make_inputs(case, seed)
    out, mx, lse = nan_outputs(case.s_q, case.h_q)
    res = _openmla().flash_mla_sparse_fwd(q, kv, indices, case.sm_scale, attn_sink=sink, topk_length=lengths,
                                          out=out, max_logits=mx, lse=lse)
    assert res[0] is out and res[1] is mx and res[2] is lse
    torch.cuda.synchronize()
    ref = _ref().sparse_prefill_ref(q, kv, indices, case.sm_scale, attn_sink=sink, topk_length=lengths, rows=rows)
    assert not bool(ref[0].isnan().any()), "the inputs select poisoned rows"
    if rows is not None:
        out, mx, lse = out[rows], mx[rows], lse[rows]
    # Logits of q scaled up (q_scale > 1) are sums of larger, cancelling terms: their fp32 rounding (tensor-core
    # accumulation order against the reference's) grows with q, so the absolute tolerance of max_logits and lse
    # does too (observed: 1.7e-5 at q_scale 30 for logits near 0; a wrong max or sum is off by far more).
    _ref().check_sparse_prefill(out, mx, lse, ref, what=f" [{case}]", stat_abs_tol=1e-6 * case.q_scale)
    return q, kv, indices, lengths, sink


# ---------------------------------------------------------------------------------------------------
# Cases
# ---------------------------------------------------------------------------------------------------
# (s_kv, topk): flash_mla's grid plus the values (64, 576, 2048; topk above s_kv: whole blocks invalid).
SEL = [(64, 64), (592, 128), (1200, 512), (1200, 576), (8192, 2048), (95, 128), (153, 256)]
MATRIX = [Case(s_q, s_kv, topk, h_q=h, d_qk=d, sink=(i % 2 == 0), lengths=(i % 3 == 0))
          for d in (576, 512) for h in (128, 64) for i, (s_kv, topk) in enumerate(SEL) for s_q in (1, 62, 213)]
HEADS = [Case(62, 1200, 576, h_q=h, d_qk=d, sink=True, lengths=True) for d in (576, 512) for h in (8, 16, 32, 100)]
ODD_TOPK = [Case(62, 592, k, h_q=128, d_qk=d, lengths=(k % 2 == 1)) for d in (576, 512) for k in (1, 7, 63, 65, 100, 333,
                                                                                                  1000)]
FEATURES = [Case(213, 1200, 512, d_qk=d, sink=s, lengths=l, q_scale=q)
            for d in (576, 512) for s in (False, True) for l in (False, True) for q in (1.0, 30.0)]


def test_matrix_is_the_documented_one():
    """The grid covers every value the docs list (runs without a GPU)."""
    assert {c.s_q for c in MATRIX} == {1, 62, 213}
    assert {c.topk for c in MATRIX + ODD_TOPK} >= {64, 128, 512, 576, 2048, 1, 7, 63, 65, 100, 333, 1000}
    assert {c.h_q for c in MATRIX + HEADS} == {8, 16, 32, 64, 100, 128}
    assert {c.d_qk for c in MATRIX} == {576, 512}
    assert {(c.sink, c.lengths) for c in FEATURES} == {(a, b) for a in (False, True) for b in (False, True)}


@gpu
@pytest.mark.parametrize("case", MATRIX, ids=str)
def test_matrix(case):
    run_and_check(case)


@gpu
@pytest.mark.parametrize("case", HEADS, ids=str)
def test_head_counts(case):
    run_and_check(case)


@gpu
@pytest.mark.parametrize("d_qk", (576, 512))
@pytest.mark.parametrize("h_q", (8, 16, 32))
def test_small_head_counts_equal_padding_to_64(d_qk, h_q):
    """A shard of h_q heads gives, bit for bit, the first h_q heads of the same call padded to 64 heads (what
    engines do today), without the copy."""
    torch = _torch()
    case = Case(100, 1200, 512, h_q=h_q, d_qk=d_qk, sink=True, lengths=True)
    q, kv, indices, lengths, sink = make_inputs(case)
    om = _openmla()
    out, mx, lse = om.flash_mla_sparse_fwd(q, kv, indices, 0.5, attn_sink=sink, topk_length=lengths)
    q64 = torch.zeros((case.s_q, 64, d_qk), dtype=q.dtype, device=DEVICE)
    q64[:, :h_q] = q
    sink64 = torch.zeros(64, dtype=torch.float32, device=DEVICE)
    sink64[:h_q] = sink
    out64, mx64, lse64 = om.flash_mla_sparse_fwd(q64, kv, indices, 0.5, attn_sink=sink64, topk_length=lengths)
    assert torch.equal(out, out64[:, :h_q])
    assert torch.equal(mx, mx64[:, :h_q]) and torch.equal(lse, lse64[:, :h_q])


@gpu
@pytest.mark.parametrize("case", ODD_TOPK, ids=str)
def test_topk_any_value(case):
    run_and_check(case)


@gpu
@pytest.mark.parametrize("case", FEATURES, ids=str)
def test_sink_lengths_and_large_logits(case):
    run_and_check(case)


@gpu
@pytest.mark.parametrize("d_qk", (576, 512))
@pytest.mark.parametrize("s_q,s_kv,topk", [(1, 128, 128), (1, 256, 256), (1234, 4321, 4096), (300, 2048, 2048),
                                           (40, 32, 2048), (20, 64, 8192)])
def test_rows_without_valid_slots(d_qk, s_q, s_kv, topk):
    """All-invalid tokens (every slot one garbage value), topk far above s_kv (whole blocks invalid)."""
    torch = _torch()
    case = Case(s_q, s_kv, topk, h_q=64, d_qk=d_qk, sink=True)
    q, kv, indices, _, sink = run_and_check(case)
    # And a call where no token has a valid slot: out 0, lse +inf, max_logits -inf (whatever the sink).
    bad = torch.full_like(indices, -1)
    bad[::2] = 2 ** 31 - 1
    out, mx, lse = _openmla().flash_mla_sparse_fwd(q, kv, bad, 0.5, attn_sink=sink)
    assert bool((out == 0).all()) and bool(torch.isposinf(lse).all()) and bool(torch.isneginf(mx).all())


@gpu
@pytest.mark.parametrize("d_qk", (576, 512))
def test_sink_changes_out_only(d_qk):
    torch = _torch()
    case = Case(62, 1200, 576, d_qk=d_qk, sink=True, lengths=True)
    q, kv, indices, lengths, sink = make_inputs(case)
    om = _openmla()
    with_sink = om.flash_mla_sparse_fwd(q, kv, indices, 0.5, attn_sink=sink, topk_length=lengths)
    without = om.flash_mla_sparse_fwd(q, kv, indices, 0.5, topk_length=lengths)
    assert torch.equal(with_sink[1], without[1]) and torch.equal(with_sink[2], without[2])
    plus = torch.isposinf(sink)
    assert bool((with_sink[0][:, plus] == 0).all())
    minus = torch.isneginf(sink)
    assert torch.equal(with_sink[0][:, minus], without[0][:, minus])


@gpu
@pytest.mark.parametrize("d_qk", (576, 512))
def test_long_prompt_4096(d_qk):
    run_and_check(Case(4096, 8192, 2048, h_q=128, d_qk=d_qk, sink=True, lengths=True))


@gpu
def test_s_q_70000():
    """More query tokens than a grid dimension holds (checked on sampled rows)."""
    torch = _torch()
    rows = torch.cat([torch.arange(0, 300), torch.randint(300, 69700, (1500,)), torch.arange(69700, 70000)]).to(DEVICE)
    run_and_check(Case(70000, 256, 128, h_q=64, sink=True, lengths=True), rows=rows)


@gpu
@pytest.mark.parametrize("d_qk", (576, 512))
def test_bitwise_identical_on_repeat(d_qk):
    torch = _torch()
    case = Case(213, 8192, 2048, d_qk=d_qk, sink=True, lengths=True)
    q, kv, indices, lengths, sink = make_inputs(case)
    om = _openmla()
    first = om.flash_mla_sparse_fwd(q, kv, indices, 0.5, attn_sink=sink, topk_length=lengths)
    for _ in range(3):
        again = om.flash_mla_sparse_fwd(q, kv, indices, 0.5, attn_sink=sink, topk_length=lengths)
        for a, b in zip(first, again):
            assert torch.equal(a.view(torch.int16) if a.dtype == torch.bfloat16 else a.view(torch.int32),
                               b.view(torch.int16) if b.dtype == torch.bfloat16 else b.view(torch.int32))


@gpu
def test_outputs_with_strides_and_default_allocation():
    torch = _torch()
    case = Case(62, 1200, 512, sink=True, lengths=True)
    q, kv, indices, lengths, sink = make_inputs(case)
    om = _openmla()
    ref = om.flash_mla_sparse_fwd(q, kv, indices, 0.5, attn_sink=sink, topk_length=lengths)
    assert ref[0].shape == (62, 128, D_V) and ref[0].dtype == torch.bfloat16
    assert ref[1].shape == (62, 128) and ref[2].dtype == torch.float32
    out_pad = torch.full((62, 130, D_V + 64), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    out = out_pad[:, :128, :D_V]
    mx = torch.full((128, 62), float("nan"), dtype=torch.float32, device=DEVICE).t()
    lse = torch.full((63, 129), float("nan"), dtype=torch.float32, device=DEVICE)[:62, :128]
    res = om.flash_mla_sparse_fwd(q, kv, indices, 0.5, attn_sink=sink, topk_length=lengths, out=out, max_logits=mx,
                                  lse=lse)
    assert res[0] is out and res[1] is mx and res[2] is lse
    assert torch.equal(out, ref[0]) and torch.equal(mx, ref[1]) and torch.equal(lse, ref[2])
    assert bool(out_pad[:, 128:].isnan().all()) and bool(out_pad[..., D_V:].isnan().all())


@gpu
def test_against_the_cpu_reference():
    """The kernel, the torch reference and the C++ CPU reference agree on a small case."""
    torch = _torch()
    case = Case(20, 300, 130, h_q=64, d_qk=576, sink=True, lengths=True)
    q, kv, indices, lengths, sink = make_inputs(case)
    out, mx, lse = _openmla().flash_mla_sparse_fwd(q, kv, indices, 0.5, attn_sink=sink, topk_length=lengths)
    cpu = _openmla().reference.sparse_prefill(q.float().cpu().numpy(), kv.float().cpu().numpy(),
                                              indices.cpu().numpy(), 0.5, attn_sink=sink.cpu().numpy(),
                                              topk_length=lengths.cpu().numpy())
    ref = tuple(torch.from_numpy(x).to(DEVICE) for x in cpu)
    _ref().check_sparse_prefill(out, mx, lse, ref, what=" [cpu reference]")


@gpu
def test_argument_errors():
    torch = _torch()
    om = _openmla()
    q, kv, indices, lengths, sink = make_inputs(Case(4, 128, 64, h_q=64))
    with pytest.raises(ValueError, match="sm_scale"):
        om.flash_mla_sparse_fwd(q, kv, indices, 0.0)
    with pytest.raises(ValueError, match="'d_v'"):
        om.flash_mla_sparse_fwd(q, kv, indices, 0.5, d_v=256)
    with pytest.raises(ValueError, match="'indices'"):
        om.flash_mla_sparse_fwd(q, kv, indices.to(torch.int64), 0.5)
    with pytest.raises(ValueError, match="'kv'"):
        om.flash_mla_sparse_fwd(q, kv.float(), indices, 0.5)
    with pytest.raises(NotImplementedError, match="h_kv = 1"):
        om.flash_mla_sparse_fwd(q, kv.expand(128, 2, 576), indices, 0.5)
    with pytest.raises(ValueError, match="'topk_length'"):
        om.flash_mla_sparse_fwd(q, kv, indices, 0.5, topk_length=torch.zeros(5, dtype=torch.int32, device=DEVICE))
    with pytest.raises(ValueError, match="'attn_sink'"):
        om.flash_mla_sparse_fwd(q, kv, indices, 0.5, attn_sink=torch.zeros(3, device=DEVICE))
    with pytest.raises(ValueError, match="'out' overlaps"):
        om.flash_mla_sparse_fwd(q, kv, indices, 0.5, out=q.as_strided((4, 64, D_V), q.stride()))
    with pytest.raises(ValueError, match="'q'"):
        om.flash_mla_sparse_fwd(q.cpu(), kv, indices, 0.5)
