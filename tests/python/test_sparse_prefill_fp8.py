"""Tests of sparse prefill straight from the paged FP8 cache (openmla.flash_mla_sparse_fwd_fp8, bf16 compute).

The contract (include/openmla/prefill.h, sparse_prefill_fp8): the result of the bf16 sparse prefill on the
dequantised cache, with cache slots as indices. So every GPU case here

- builds the bf16 inputs of test_sparse_prefill.make_inputs (kv ~ N(0, 1) / 10 + offset; the last quarter of the
  rows NaN; invalid indices of every kind; topk_length with clamped values; attn_sink with +-inf), with
  s_kv = num_blocks * page_size;
- scatters kv's rows into the pages of a paged cache in a random page order (a block table), quantises it
  (openmla.quantize_kv_cache; NaN rows become poisoned tiles) and overwrites every page that holds no selectable row,
  and the padding between pages, with 0xFF bytes (NaN e4m3, NaN scales, NaN RoPE);
- maps the valid indices to cache slots (page * page_size + row) and keeps the invalid ones (they stay invalid:
  s_kv is the slot count);
- runs the FP8 entry on NaN-filled outputs, then the bf16 kernel (flash_mla_sparse_fwd) on
  dequantize_kv_cache(cache) viewed as rows, and compares under FlashMLA's sparse prefill tolerances (out abs 1e-3 /
  rel 2.01/128 / cos 5e-6; max_logits and lse abs 1e-6 / rel 8.01/65536; identical inf/NaN positions). The kernel
  dequantises exactly and runs the bf16 kernel's consumers, so the results are also expected to be bitwise those of
  the bf16 kernel (checked separately, so that a failure says which property broke).

Without torch or a Hopper GPU every GPU test is collected and skipped with its reason (conftest.py); the argument
checks of the binding run on the CPU.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

gpu = pytest.mark.gpu
DEVICE = "cuda"
D_V = 512
FORMAT_OF = {576: "v32", 512: "model1"}
BYTES_PER_TOKEN = {"v32": 656, "model1": 584}


def _torch():
    import torch

    return torch


def _openmla():
    import openmla

    return openmla


def _tsp():
    import test_sparse_prefill

    return test_sparse_prefill


def _ref():
    import sparse_prefill_ref

    return sparse_prefill_ref


@dataclass(frozen=True)
class Case:
    s_q: int
    num_blocks: int
    page_size: int
    topk: int
    h_q: int = 128
    d_qk: int = 576
    sink: bool = False
    lengths: bool = False
    pad: int = 0            # extra bytes between pages (a multiple of 16)
    q_scale: float = 1.0

    @property
    def s_kv(self):
        return self.num_blocks * self.page_size

    def __str__(self):
        s = (f"{FORMAT_OF[self.d_qk]}-hq{self.h_q}-sq{self.s_q}-pages{self.num_blocks}x{self.page_size}"
             f"-topk{self.topk}")
        if self.pad:
            s += f"-pad{self.pad}"
        if self.sink:
            s += "-sink"
        if self.lengths:
            s += "-len"
        if self.q_scale != 1.0:
            s += f"-qx{self.q_scale:g}"
        return s


def make_fp8_inputs(case: Case, seed=0):
    """(q, cache, slot_indices, topk_length, attn_sink) as the module docstring describes."""
    torch = _torch()
    tsp = _tsp()
    base = tsp.Case(case.s_q, case.s_kv, case.topk, h_q=case.h_q, d_qk=case.d_qk, sink=case.sink,
                    lengths=case.lengths, q_scale=case.q_scale)
    q, kv, indices, lengths, sink = tsp.make_inputs(base, seed)
    fmt = FORMAT_OF[case.d_qk]
    nb, ps, d = case.num_blocks, case.page_size, case.d_qk
    g = torch.Generator(device="cpu")
    g.manual_seed(seed * 131 + nb * 7 + ps)
    perm = torch.randperm(nb, generator=g).to(DEVICE)  # logical page i lives in physical page perm[i]
    pages = torch.empty((nb, ps, 1, d), dtype=torch.bfloat16, device=DEVICE)
    pages[perm] = kv.reshape(nb, ps, 1, d)
    bpt = BYTES_PER_TOKEN[fmt]
    stride = ps * bpt + case.pad
    stride = (stride + 15) // 16 * 16
    cache = _openmla().quantize_kv_cache(pages, fmt, page_stride_bytes=stride)
    # Pages without a selectable row (all their logical rows in the NaN quarter) and the bytes between pages: 0xFF.
    pool = max(1, (case.s_kv * 3) // 4)
    first_dead = (pool + ps - 1) // ps
    for logical in range(first_dead, nb):
        cache[int(perm[logical])].fill_(0xFF)
    if nb > 1 and stride > ps * bpt:
        raw = torch.as_strided(cache, (nb - 1, stride), (stride, 1))
        raw[:, ps * bpt:].fill_(0xFF)
    # Valid indices -> cache slots; invalid ones stay (s_kv is the slot count, so they remain out of range).
    idx = indices[:, 0, :].long()
    valid = (idx >= 0) & (idx < case.s_kv)
    safe = idx.clamp(0, case.s_kv - 1)
    slots = perm[safe // ps] * ps + safe % ps
    slot_idx = torch.where(valid, slots, idx).to(torch.int32)
    buf = torch.full((case.s_q + 1, 2, case.topk + 32), -3, dtype=torch.int32, device=DEVICE)
    slot_indices = buf[:case.s_q, :1, :case.topk]
    slot_indices.copy_(slot_idx[:, None, :])
    return q, cache, slot_indices, lengths, sink


def nan_outputs(s_q, h_q):
    torch = _torch()
    out = torch.full((s_q, h_q, D_V), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    mx = torch.full((s_q, h_q), float("nan"), dtype=torch.float32, device=DEVICE)
    lse = torch.full((s_q, h_q), float("nan"), dtype=torch.float32, device=DEVICE)
    return out, mx, lse


def _first_bad(a, b):
    torch = _torch()
    a32, b32 = a.float(), b.float()
    bad = ~((a32 == b32) | (a32.isnan() & b32.isnan()))
    if not bool(bad.any()):
        return "none"
    i = tuple(int(x) for x in bad.nonzero()[0])
    return f"{int(bad.sum())} differ, first at {i}: {float(a32[i])} vs {float(b32[i])}"


def run_and_compare(case: Case, seed=0, bitwise=True):
    """FP8 entry vs the bf16 kernel on the dequantised cache. Returns both results."""
    torch = _torch()
    om = _openmla()
    q, cache, slot_indices, lengths, sink = make_fp8_inputs(case, seed)
    out, mx, lse = nan_outputs(case.s_q, case.h_q)
    fmt = FORMAT_OF[case.d_qk]
    res = om.flash_mla_sparse_fwd_fp8(q, cache, slot_indices, 0.5, attn_sink=sink, topk_length=lengths, out=out,
                                      max_logits=mx, lse=lse)
    assert res[0] is out and res[1] is mx and res[2] is lse
    torch.cuda.synchronize()
    deq = om.dequantize_kv_cache(cache, fmt).reshape(case.s_kv, 1, case.d_qk)
    ref = om.flash_mla_sparse_fwd(q, deq, slot_indices, 0.5, attn_sink=sink, topk_length=lengths)
    torch.cuda.synchronize()
    assert not bool(ref[0].isnan().any()), "the inputs select poisoned rows"
    assert not bool(out.isnan().any()), f"unwritten or NaN outputs [{case}]: {int(out.isnan().sum())}"
    r = _ref()
    what = f" [{case}]"
    r.check_is_allclose(f"out{what}", out.float(), ref[0].float(), **r.OUT_TOL)
    stat = dict(r.STAT_TOL, abs_tol=1e-6 * case.q_scale)
    r.check_is_allclose(f"max_logits{what}", mx, ref[1], **stat)
    r.check_is_allclose(f"lse{what}", lse, ref[2], **stat)
    if bitwise:
        for name, a, b in (("out", out, ref[0]), ("max_logits", mx, ref[1]), ("lse", lse, ref[2])):
            assert torch.equal(a.view(torch.int16) if a.dtype == torch.bfloat16 else a.view(torch.int32),
                               b.view(torch.int16) if b.dtype == torch.bfloat16 else b.view(torch.int32)), \
                f"{name}{what} not bitwise the bf16 kernel's on the dequantised cache: {_first_bad(a, b)}"
    return (q, cache, slot_indices, lengths, sink), (out, mx, lse), ref


# ---------------------------------------------------------------------------------------------------
# Cases
# ---------------------------------------------------------------------------------------------------
# Both layouts x page sizes (64: the engines'; 1, 2, 53 odd, 256) x topk (whole blocks, odd, more than the pool).
MATRIX = [Case(62, nb, ps, k, d_qk=d, sink=(i % 2 == 0), lengths=(i % 3 == 0))
          for d in (576, 512)
          for i, (nb, ps, k) in enumerate([(64, 64, 2048), (19, 64, 576), (1200, 1, 512), (300, 2, 100), (23, 53, 333),
                                           (5, 256, 1024), (2, 64, 128), (7, 16, 65)])]
HEADS = [Case(40, 24, 64, 512, h_q=h, d_qk=d, sink=True, lengths=True) for d in (576, 512) for h in (8, 16, 64, 100)]
EXTRAS = [Case(62, 20, 64, 512, d_qk=d, pad=pad, sink=True, lengths=True, q_scale=qs)
          for d in (576, 512) for pad, qs in ((48, 1.0), (0, 30.0))]


def test_matrix_covers_both_layouts_and_page_sizes():
    assert {c.d_qk for c in MATRIX} == {576, 512}
    assert {1, 2, 53, 64, 256} <= {c.page_size for c in MATRIX}
    assert any(c.topk > c.s_kv * 3 // 4 for c in MATRIX)  # whole blocks of invalid slots


@gpu
@pytest.mark.parametrize("case", MATRIX, ids=str)
def test_fp8_matrix(case):
    run_and_compare(case)


@gpu
@pytest.mark.parametrize("case", HEADS, ids=str)
def test_fp8_head_counts(case):
    run_and_compare(case)


@gpu
@pytest.mark.parametrize("case", EXTRAS, ids=str)
def test_fp8_page_stride_and_large_logits(case):
    run_and_compare(case)


@gpu
@pytest.mark.parametrize("d_qk", (576, 512))
def test_fp8_long_prompt(d_qk):
    """s_q 1024 (many tiles per CTA: the producer runs ahead across tiles), topk 2048, 8K slots."""
    run_and_compare(Case(1024, 128, 64, 2048, d_qk=d_qk, sink=True, lengths=True))


@gpu
@pytest.mark.parametrize("d_qk", (576, 512))
def test_fp8_against_the_fp32_reference(d_qk):
    """The contract's tolerances against the torch fp32 reference on the dequantised cache."""
    torch = _torch()
    case = Case(62, 19, 64, 576, d_qk=d_qk, sink=True, lengths=True)
    (q, cache, idx, lengths, sink), (out, mx, lse), _ = run_and_compare(case, bitwise=False)
    deq = _openmla().dequantize_kv_cache(cache, FORMAT_OF[d_qk]).reshape(case.s_kv, 1, d_qk)
    ref = _ref().sparse_prefill_ref(q, deq, idx, 0.5, attn_sink=sink, topk_length=lengths)
    torch.cuda.synchronize()
    _ref().check_sparse_prefill(out, mx, lse, ref, what=f" [{case} vs fp32]")


@gpu
@pytest.mark.parametrize("d_qk", (576, 512))
def test_fp8_rows_without_valid_slots(d_qk):
    """Every slot invalid (-1, out of range): out 0, lse +inf, max_logits -inf, no byte of the cache read (the whole
    cache is 0xFF)."""
    torch = _torch()
    om = _openmla()
    fmt = FORMAT_OF[d_qk]
    cache = torch.full((4, 64, 1, BYTES_PER_TOKEN[fmt]), 0xFF, dtype=torch.uint8, device=DEVICE)
    q = torch.randn(9, 64, d_qk, device=DEVICE).to(torch.bfloat16)
    vals = torch.tensor([-1, 256, 2 ** 31 - 1, -2 ** 31, 1000], dtype=torch.int32, device=DEVICE)
    idx = vals[torch.randint(0, 5, (9, 1, 130), device=DEVICE)]
    out, mx, lse = nan_outputs(9, 64)
    om.flash_mla_sparse_fwd_fp8(q, cache, idx, 0.5, out=out, max_logits=mx, lse=lse)
    torch.cuda.synchronize()
    assert bool((out == 0).all())
    assert bool(torch.isposinf(lse).all()) and bool(torch.isneginf(mx).all())


@gpu
def test_fp8_dtype_views_and_default_allocation():
    """A float8_e4m3fn / int8 cache reads as its bytes; outputs allocated when not given; the format from the last
    dimension or named."""
    torch = _torch()
    om = _openmla()
    case = Case(20, 8, 64, 256, d_qk=576, sink=True, lengths=True)
    q, cache, idx, lengths, sink = make_fp8_inputs(case)
    a = om.flash_mla_sparse_fwd_fp8(q, cache, idx, 0.5, attn_sink=sink, topk_length=lengths)
    b = om.flash_mla_sparse_fwd_fp8(q, cache.view(torch.float8_e4m3fn), idx, 0.5, attn_sink=sink,
                                    topk_length=lengths, kv_cache_format="v32")
    c = om.flash_mla_sparse_fwd_fp8(q, cache.view(torch.int8), idx, 0.5, attn_sink=sink, topk_length=lengths)
    for x, y, z in zip(a, b, c):
        assert torch.equal(x, y) and torch.equal(x, z)
    assert a[0].shape == (20, 128, D_V) and a[1].shape == (20, 128) and a[2].dtype == torch.float32


@gpu
def test_fp8_argument_errors():
    torch = _torch()
    om = _openmla()
    q, cache, idx, lengths, sink = make_fp8_inputs(Case(4, 4, 64, 64, h_q=64))
    with pytest.raises(ValueError, match="sm_scale"):
        om.flash_mla_sparse_fwd_fp8(q, cache, idx, 0.0)
    with pytest.raises(ValueError, match="'kv_cache'"):
        om.flash_mla_sparse_fwd_fp8(q, cache[..., :600], idx, 0.5)
    with pytest.raises(ValueError, match="'kv_cache'"):
        om.flash_mla_sparse_fwd_fp8(q, cache.reshape(256, 656), idx, 0.5)
    with pytest.raises(ValueError, match="'q' has head dimension"):
        om.flash_mla_sparse_fwd_fp8(q, cache, idx, 0.5, kv_cache_format="model1")
    with pytest.raises(ValueError, match="kv_cache_format"):
        om.flash_mla_sparse_fwd_fp8(q, cache, idx, 0.5, kv_cache_format="fp16")
    with pytest.raises(ValueError, match="'indices'"):
        om.flash_mla_sparse_fwd_fp8(q, cache, idx.to(torch.int64), 0.5)
    with pytest.raises(ValueError, match="'topk_length'"):
        om.flash_mla_sparse_fwd_fp8(q, cache, idx, 0.5, topk_length=torch.zeros(5, dtype=torch.int32, device=DEVICE))
    with pytest.raises(ValueError, match="'d_v'"):
        om.flash_mla_sparse_fwd_fp8(q, cache, idx, 0.5, d_v=576)
    with pytest.raises(ValueError, match="'q'"):
        om.flash_mla_sparse_fwd_fp8(q.cpu(), cache, idx, 0.5)


# ---------------------------------------------------------------------------------------------------
# CPU: the binding's checks (no GPU, no torch needed)
# ---------------------------------------------------------------------------------------------------
def _host_args(fmt="v32", d_qk=576):
    q = np.zeros((4, 64, d_qk), dtype=np.uint16)  # bf16 bit patterns; the dtype check names 'q'
    cache = np.zeros((2, 64, 1, BYTES_PER_TOKEN[fmt]), dtype=np.uint8)
    idx = np.zeros((4, 1, 64), dtype=np.int32)
    out = np.zeros((4, 64, D_V), dtype=np.uint16)
    mx = np.zeros((4, 64), dtype=np.float32)
    lse = np.zeros((4, 64), dtype=np.float32)
    return q, cache, idx, out, mx, lse


def test_cpu_unknown_format_is_named():
    from openmla import _openmla as C

    q, cache, idx, out, mx, lse = _host_args()
    with pytest.raises(ValueError, match="kv_cache_format"):
        C.sparse_prefill_fp8(q, cache, "fp16", idx, out, mx, lse)


def test_cpu_host_arrays_are_rejected_naming_the_argument():
    from openmla import _openmla as C

    q, cache, idx, out, mx, lse = _host_args()
    with pytest.raises((ValueError, TypeError), match="'q'"):
        C.sparse_prefill_fp8(q, cache, "v32", idx, out, mx, lse)


def test_cpu_feature_is_listed():
    om = _openmla()
    assert "sparse_prefill_fp8" in om.FEATURES
    assert hasattr(om, "flash_mla_sparse_fwd_fp8")
    ok, reason = om.query_capability("sparse_prefill_fp8")
    assert ok or reason
