"""Tests of sparse top-k MLA decode over an FP8 cache through the flash_mla-compatible API
(openmla.flash_mla_with_kvcache with indices and is_fp8_kvcache=True).

Inputs follow flash_mla's sparse decode test (docs/contracts.md section 10), with the OpenMLA contract of
include/openmla/decode.h on top (docs/contracts.md section 3):

- q ~ N(0, 1) clamped to [-1, 1]; KV ~ N(0, 1) / 10 clamped, quantised on the GPU into the FP8 layout
  (V3.2: 656 B/token, MODEL1: 584 B/token, block-structured pages) with padded page strides (V3.2: one
  spare token per page; MODEL1: pages rounded up to a multiple of 576 bytes, as flash_mla's allocator does);
  softmax_scale = d_qk ** -0.55 (deliberately not the default).
- Each request owns a random list of pages holding its L tokens (L ~ N(s_k, s_k / 2) when varlen); each
  query row selects `topk` distinct random tokens below L, in random slot order, padded with -1 when
  L < topk; about 5% more slots are -1 and 3% hold out-of-range garbage (skipped too: OpenMLA extension).
- topk_length ~ randint(0, topk) per request; half of the slots at or beyond it hold garbage (2^31 - 1,
  random huge or negative values: never to be dereferenced), the other half keep a valid-looking index.
- Every token no used slot selects is NaN-poisoned AFTER quantisation (all its bytes 0xFF: e4m3 NaN, NaN
  scales, NaN bf16 RoPE), and so is the page padding: reading one shows up as NaN in the output.
- out and lse are NaN-filled before the call (every element must be written), the kernel runs before the
  reference allocates anything, and results are compared with the torch fp32 reference on the DEQUANTISED
  cache (sparse_decode_ref.py) under flash_mla's sparse tolerances, with identical inf/NaN positions.

Torch is imported inside the tests and helpers only: without torch or a Hopper GPU every GPU test here is
collected and skipped with its reason (conftest.py). The argument checks of the Python layer and the matrix
coverage run everywhere; the CPU cross-check of the two references runs wherever torch imports.
"""
from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass, replace
from typing import Optional

import pytest

gpu = pytest.mark.gpu

D_V = 512
DEVICE = "cuda"
LAYOUTS = ("v32", "model1")
D_QK = {"v32": 576, "model1": 512}
BYTES_PER_TOKEN = {"v32": 656, "model1": 584}
MODEL1_PAGE_ALIGN = 576  # flash_mla's MODEL1 allocator rounds every page up to a multiple of 576 bytes
PAGE_SIZES = {2, 53, 61, 64, 69, 256, 576}
SPARE_PAGES = 3  # pages no request owns (poisoned)
INT32_MAX = 2 ** 31 - 1
SAME = object()  # "the inputs' own attn_sink" (None is a sink value: no sink)


def _torch():
    import torch

    return torch


def _ref():
    import sparse_decode_ref

    return sparse_decode_ref


def _openmla():
    import openmla

    return openmla


# ---------------------------------------------------------------------------------------------------
# Cases
# ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Sel:
    """One cache and its selection: tokens per request (mean), slots per query row, page size, and whether
    per-request lengths (topk_length / extra_topk_length) are given."""

    s_k: int
    topk: int
    page: int
    lens: bool = False

    def __str__(self):
        return f"sk{self.s_k}-topk{self.topk}-page{self.page}{'-len' if self.lens else ''}"


@dataclass(frozen=True)
class Case:
    layout: str
    b: int
    s_q: int
    h_q: int
    main: Sel
    extra: Optional[Sel] = None
    sink: str = "none"         # "none", "random" (N(0,1), ~31% +inf, ~31% -inf), "+inf", "-inf"
    varlen: bool = True
    all_invalid: bool = False  # every slot of both caches is -1 or out of range
    zero_len: bool = False     # about half of the requests get topk_length 0 (and extra_topk_length 0)
    provided_out: bool = True  # NaN-filled out / lse passed in (else the API allocates them)
    lse_contiguous: bool = False
    cache_dtype: str = "uint8"  # how the byte cache is typed: uint8, int8 or float8_e4m3fn
    big_values: bool = False   # every third token x 2^20 (quantisation scales above 2^7), q x 2^-20

    def __str__(self):
        s = f"{self.layout}-b{self.b}-sq{self.s_q}-hq{self.h_q}-{self.main}"
        if self.extra is not None:
            s += f"-extra[{self.extra}]"
        if self.sink != "none":
            s += f"-sink{self.sink}"
        for flag in ("all_invalid", "zero_len"):
            if getattr(self, flag):
                s += "-" + flag
        if not self.varlen:
            s += "-fixedlen"
        if not self.provided_out:
            s += "-alloc"
        if self.cache_dtype != "uint8":
            s += "-" + self.cache_dtype
        if self.big_values:
            s += "-big"
        return s


# flash_mla's (s_k, topk, page size) triples for the main cache (docs/contracts.md section 10).
MAIN_SELS = [(512, 64, 2), (512, 64, 64), (512, 64, 69), (1024, 576, 61), (2046, 2048, 64), (2046, 2048, 576)]
# Extra caches: every page size of that test grid, topk multiples of 64 and not.
EXTRA_SELS = [(512, 64, 2), (1024, 128, 256), (300, 100, 53), (2046, 512, 64), (512, 37, 69), (1024, 576, 61),
              (700, 64, 576)]
CACHE_DTYPES = ("uint8", "int8", "float8_e4m3fn")


def _matrix_cases():
    """h_q = 128: both layouts x the six (s_k, topk, page) triples x s_q in {1, 3}; b in {4, 74, 321} and
    the features (sink, topk_length, extra cache with or without its own length) drawn with a fixed seed so
    that every combination of the three features appears for each layout (test_matrix_covers_every_value)."""
    rng = random.Random(20261123)
    cases = []
    for layout in LAYOUTS:
        features = [(s, l, e) for s in (False, True) for l in (False, True) for e in (False, True)]
        features += rng.sample(features, 4)
        rng.shuffle(features)
        bs = [4, 74, 321] * 4
        rng.shuffle(bs)
        slot = 0
        for s_k, topk, page in MAIN_SELS:
            for s_q in (1, 3):
                sink, lens, extra = features[slot]
                extra_sel = None
                if extra:
                    e = EXTRA_SELS[rng.randrange(len(EXTRA_SELS))]
                    extra_sel = Sel(*e, lens=rng.random() < 0.5)
                cases.append(Case(layout, bs[slot], s_q, 128, Sel(s_k, topk, page, lens), extra_sel,
                                  sink="random" if sink else "none", provided_out=slot % 4 != 3,
                                  lse_contiguous=slot % 4 == 1, cache_dtype=CACHE_DTYPES[slot % 3]))
                slot += 1
    return cases


def _head_cases():
    """h_q in {8, 16, 32, 64} with both layouts, various s_q, features drawn with a fixed seed."""
    rng = random.Random(7)
    cases = []
    for h_q in (8, 16, 32, 64):
        for layout in LAYOUTS:
            main = Sel(*rng.choice(MAIN_SELS[:4]), lens=rng.random() < 0.5)
            extra = Sel(*rng.choice(EXTRA_SELS), lens=rng.random() < 0.5) if rng.random() < 0.5 else None
            cases.append(Case(layout, rng.choice((4, 74)), rng.choice((1, 2, 3, 5)), h_q, main, extra,
                              sink=rng.choice(("none", "random")), lse_contiguous=rng.random() < 0.3))
    return cases


MATRIX = _matrix_cases()
HEADS = _head_cases()
ODD_TOPK = [
    Case("v32", 6, 2, 128, Sel(300, 37, 53, lens=True), Sel(200, 100, 256, lens=True), sink="random"),
    Case("model1", 6, 2, 128, Sel(300, 100, 256), Sel(200, 1, 53, lens=True), sink="random"),
    Case("v32", 74, 1, 64, Sel(512, 1, 61), Sel(100, 37, 2)),
    Case("model1", 74, 3, 64, Sel(512, 37, 2, lens=True), Sel(512, 100, 69), sink="random"),
    Case("v32", 9, 3, 16, Sel(1024, 100, 256, lens=True), sink="random"),
    Case("model1", 9, 1, 128, Sel(64, 1, 53, lens=True)),
]


def test_matrix_covers_every_value():
    """The chosen subsets cover every value of every dimension of the test matrix (docs/contracts.md section 10)."""
    for layout in LAYOUTS:
        rows = [c for c in MATRIX if c.layout == layout]
        assert {(c.main.s_k, c.main.topk, c.main.page) for c in rows} == set(MAIN_SELS)
        assert {c.b for c in rows} == {4, 74, 321} and {c.s_q for c in rows} == {1, 3}
        combos = {(c.sink != "none", c.main.lens, c.extra is not None) for c in rows}
        assert len(combos) == 8, combos
        assert any(c.extra is not None and c.extra.lens for c in rows)
        assert any(c.extra is not None and not c.extra.lens for c in rows)
        for s_q in (1, 3):  # each feature appears with a single and with several query tokens
            for feature in ("sink", "lens", "extra"):
                assert any(c.s_q == s_q and {"sink": c.sink != "none", "lens": c.main.lens,
                                             "extra": c.extra is not None}[feature] for c in rows), (s_q, feature)
    every = MATRIX + HEADS + ODD_TOPK + CORNER
    assert {c.h_q for c in every} >= {8, 16, 32, 64, 128}
    assert {c.main.page for c in every} >= PAGE_SIZES
    assert {c.extra.page for c in every if c.extra is not None} >= PAGE_SIZES
    assert {c.main.topk % 64 for c in every} - {0} and {c.extra.topk % 64 for c in every if c.extra} - {0}
    assert {1, 37, 100} <= {c.main.topk for c in every} and {1, 37, 100} <= {c.extra.topk for c in every if c.extra}
    assert {c.cache_dtype for c in every} == set(CACHE_DTYPES)
    for layout in LAYOUTS:  # sink, topk_length and the extra cache with BOTH layouts
        rows = [c for c in every if c.layout == layout]
        assert any(c.sink != "none" for c in rows) and any(c.main.lens for c in rows)
        assert any(c.extra is not None for c in rows)


# ---------------------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------------------
@dataclass
class Paged:
    """One FP8 cache and its selection."""

    storage: object            # flat uint8 bytes behind `cache` (page padding included)
    cache: object              # (num_blocks, page, 1, bytes_per_token) view handed to the kernel
    values: object             # (num_blocks, page, 1, d_qk) bf16, dequantised (NaN where poisoned): the reference's
    indices: object            # (b, s_q, topk) int32
    lengths: Optional[object]  # (b,) int32 or None
    page_stride: int           # bytes


@dataclass
class Inputs:
    case: Case
    q: object
    main: Paged
    extra: Optional[Paged]
    sink: Optional[object]
    scale: float


def page_stride_bytes(layout, page):
    bpt = BYTES_PER_TOKEN[layout]
    if layout == "v32":
        return (page + 1) * bpt  # one spare token per page: pages are not contiguous (656 = 16 * 41)
    return -(-page * bpt // MODEL1_PAGE_ALIGN) * MODEL1_PAGE_ALIGN


def token_byte_views(storage, layout, num_blocks, page, stride):
    """Views of the bytes of every token: (num_blocks, page, n) per contiguous run of one token's bytes."""
    torch = _torch()
    if layout == "v32":
        return [torch.as_strided(storage, (num_blocks, page, 656), (stride, 656, 1))]
    data = torch.as_strided(storage, (num_blocks, page, 576), (stride, 576, 1))  # 448 e4m3 + 64 bf16 RoPE
    scales = torch.as_strided(storage, (num_blocks, page, 8), (stride, 8, 1), page * 576)  # 7 UE8M0 + pad
    return [data, scales]


def garbage_indices(shape, num_tokens, gen):
    """Indices that are neither -1 nor a token: fixed candidates, random huge and random negative values."""
    torch = _torch()
    fixed = torch.tensor([-2, -123456, -2 ** 31, num_tokens, num_tokens + 1, 2147480000, INT32_MAX],
                         dtype=torch.int64, device=DEVICE)
    pick = torch.randint(0, len(fixed) + 2, shape, generator=gen, device=DEVICE)
    huge = torch.randint(num_tokens, INT32_MAX, shape, generator=gen, device=DEVICE)
    negative = torch.randint(-2 ** 31, -1, shape, generator=gen, device=DEVICE)
    out = torch.where(pick == len(fixed), huge, negative)
    return torch.where(pick < len(fixed), fixed[pick.clamp(max=len(fixed) - 1)], out)


def make_paged(layout, b, s_q, sel: Sel, *, varlen, all_invalid, zero_reqs, rng, gen, lengths=None,
               cache_dtype="uint8", big_values=False):
    """A paged FP8 cache and a selection into it (see the module docstring). `zero_reqs`: requests whose
    length is forced to 0 (when sel.lens). `lengths`: given per-request lengths instead of random ones."""
    torch = _torch()
    om = _openmla()
    d_qk, bpt, page, topk = D_QK[layout], BYTES_PER_TOKEN[layout], sel.page, sel.topk

    # Requests' token counts and their pages: a random placement of all pages.
    seq = [max(1, min(2 * sel.s_k, int(rng.gauss(sel.s_k, sel.s_k / 2)))) if varlen else sel.s_k for _ in range(b)]
    n_pages = [-(-n // page) for n in seq]
    num_blocks = sum(n_pages) + SPARE_PAGES
    num_tokens = num_blocks * page
    perm = torch.randperm(num_blocks, generator=gen, device=DEVICE)
    starts = torch.tensor([sum(n_pages[:i]) for i in range(b)], device=DEVICE)
    cols = torch.arange(max(n_pages), device=DEVICE)
    owned = cols[None, :] < torch.tensor(n_pages, device=DEVICE)[:, None]
    block_table = torch.where(owned, perm[(starts[:, None] + cols[None, :]).clamp(max=num_blocks - 1)], 0)

    # topk distinct positions below each request's length, in random slot order, -1 padded.
    seq_t = torch.tensor(seq, device=DEVICE)
    max_len = max(seq)
    key = torch.rand((b, s_q, max_len), generator=gen, device=DEVICE)
    key.masked_fill_(torch.arange(max_len, device=DEVICE)[None, None, :] >= seq_t[:, None, None], 2.0)
    pos = key.argsort(dim=-1)[..., :topk]
    pos = torch.where(pos < seq_t[:, None, None], pos, -1)
    if pos.shape[-1] < topk:
        pos = torch.cat([pos, torch.full((b, s_q, topk - pos.shape[-1]), -1, dtype=pos.dtype, device=DEVICE)], -1)
    pos = pos.gather(-1, torch.rand((b, s_q, topk), generator=gen, device=DEVICE).argsort(dim=-1))
    p = pos.clamp(min=0)
    pages = block_table.gather(1, (p // page).reshape(b, -1)).reshape(b, s_q, topk)
    idx = torch.where(pos >= 0, pages * page + p % page, -1)

    # Invalid slots: some more -1, some out-of-range garbage (or all of them).
    r = torch.rand(idx.shape, generator=gen, device=DEVICE)
    garbage = garbage_indices(idx.shape, num_tokens, gen)
    if all_invalid:
        idx = torch.where(r < 0.5, torch.full_like(idx, -1), garbage)
    else:
        idx = torch.where(r < 0.05, torch.full_like(idx, -1), torch.where(r < 0.08, garbage, idx))

    # Per-request lengths; half of the slots past them hold garbage, half a valid-looking index.
    lens_t = None
    used = (idx >= 0) & (idx < num_tokens)
    if sel.lens:
        if lengths is None:
            lengths = [0 if i in zero_reqs else rng.randint(0, topk) for i in range(b)]
        lens_t = torch.tensor(lengths, dtype=torch.int32, device=DEVICE)
        beyond = torch.arange(topk, device=DEVICE)[None, None, :] >= lens_t.long()[:, None, None]
        coin = torch.rand(idx.shape, generator=gen, device=DEVICE) < 0.5
        idx = torch.where(beyond & coin, garbage_indices(idx.shape, num_tokens, gen), idx)
        used &= ~beyond
    indices = idx.to(torch.int32)

    # The cache: quantise random values into padded pages, then poison every token no used slot selects.
    stride = page_stride_bytes(layout, page)
    storage = torch.full(((num_blocks - 1) * stride + page * bpt,), 255, dtype=torch.uint8, device=DEVICE)
    cache_u8 = torch.as_strided(storage, (num_blocks, page, 1, bpt), (stride, bpt, bpt, 1))
    kv = (torch.randn((num_blocks, page, 1, d_qk), generator=gen, device=DEVICE, dtype=torch.bfloat16) / 10)
    kv.clamp_(-1, 1)
    if big_values:  # scales above 2^7: the kernel's two-multiply dequantisation (kernel.cuh, store_tiles)
        kv.view(-1, d_qk)[::3] *= 2.0 ** 20
    om.quantize_kv_cache(kv, layout, out=cache_u8)
    selected = torch.zeros(num_tokens, dtype=torch.bool, device=DEVICE)
    selected[indices[used].long()] = True
    poison = ~selected.view(num_blocks, page)
    for view in token_byte_views(storage, layout, num_blocks, page, stride):
        view[poison] = 255
    values = om.dequantize_kv_cache(cache_u8, layout)
    cache = cache_u8 if cache_dtype == "uint8" else cache_u8.view(getattr(torch, cache_dtype))
    return Paged(storage, cache, values, indices, lens_t, stride)


def make_sink(kind, h_q, gen):
    torch = _torch()
    if kind == "none":
        return None
    if kind in ("+inf", "-inf"):
        return torch.full((h_q,), float(kind), dtype=torch.float32, device=DEVICE)
    sink = torch.randn((h_q,), generator=gen, device=DEVICE)
    u = torch.randn((h_q,), generator=gen, device=DEVICE)
    sink[u > 0.5] = math.inf
    sink[u < -0.5] = -math.inf
    return sink


def make_inputs(case: Case, seed=0, lengths=None, extra_lengths=None):
    torch = _torch()
    rng = random.Random(seed)
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    zero_reqs = {i for i in range(case.b) if rng.random() < 0.5} if case.zero_len else set()
    common = dict(varlen=case.varlen, all_invalid=case.all_invalid, zero_reqs=zero_reqs, rng=rng, gen=gen,
                  cache_dtype=case.cache_dtype, big_values=case.big_values)
    main = make_paged(case.layout, case.b, case.s_q, case.main, lengths=lengths, **common)
    extra = None
    if case.extra is not None:
        extra = make_paged(case.layout, case.b, case.s_q, case.extra, lengths=extra_lengths, **common)
    d_qk = D_QK[case.layout]
    q = torch.randn((case.b, case.s_q, case.h_q, d_qk), generator=gen, device=DEVICE).clamp_(-1, 1)
    if case.big_values:  # the big tokens' logits as usual (exact power-of-two scaling), the others' near 0
        q *= 2.0 ** -20
    return Inputs(case, q.to(torch.bfloat16), main, extra, make_sink(case.sink, case.h_q, gen), d_qk ** -0.55)


def nan_outputs(case: Case, lse_contiguous=None):
    torch = _torch()
    b, s_q, h_q = case.b, case.s_q, case.h_q
    out = torch.full((b, s_q, h_q, D_V), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    if case.lse_contiguous if lse_contiguous is None else lse_contiguous:
        lse = torch.full((b, h_q, s_q), float("nan"), dtype=torch.float32, device=DEVICE)
    else:
        lse = torch.full((b, s_q, h_q), float("nan"), dtype=torch.float32, device=DEVICE).transpose(1, 2)
    return out, lse


def decode(inp: Inputs, meta=None, q=None, sink=SAME, **kwargs):
    """One sparse flash_mla_with_kvcache call on `inp` (block_table and cache_seqlens are None)."""
    om = _openmla()
    if meta is None:
        meta, _ = om.get_mla_metadata()
    extra = inp.extra
    return om.flash_mla_with_kvcache(
        inp.q if q is None else q, inp.main.cache, kwargs.pop("block_table", None), kwargs.pop("cache_seqlens", None),
        kwargs.pop("head_dim_v", D_V), meta, softmax_scale=kwargs.pop("softmax_scale", inp.scale), is_fp8_kvcache=True,
        indices=kwargs.pop("indices", inp.main.indices), attn_sink=inp.sink if sink is SAME else sink,
        extra_k_cache=None if extra is None else extra.cache,
        extra_indices_in_kvcache=None if extra is None else extra.indices,
        topk_length=inp.main.lengths, extra_topk_length=None if extra is None else extra.lengths, **kwargs)


def reference(inp: Inputs, sink=SAME, softmax_scale=None):
    extra = inp.extra
    return _ref().sparse_decode_ref(
        inp.q, inp.main.values, inp.main.indices, inp.main.lengths, inp.sink if sink is SAME else sink,
        None if extra is None else extra.values, None if extra is None else extra.indices,
        None if extra is None else extra.lengths, softmax_scale=inp.scale if softmax_scale is None else softmax_scale)


def check_against_reference(inp: Inputs, out, lse, what="", sink=SAME, softmax_scale=None):
    torch = _torch()
    case = inp.case
    assert out.shape == (case.b, case.s_q, case.h_q, D_V) and out.dtype == torch.bfloat16, (out.shape, out.dtype)
    assert lse.shape == (case.b, case.h_q, case.s_q) and lse.dtype == torch.float32, (lse.shape, lse.dtype)
    torch.cuda.synchronize()  # the kernel has finished before the reference allocates anything
    ref_out, ref_lse = reference(inp, sink, softmax_scale)
    tag = f" [{what or case}]"
    # A used slot never points at a poisoned token (else both sides could agree on NaN).
    assert not bool(ref_out.isnan().any() or ref_lse.isnan().any()), f"the inputs select poisoned tokens{tag}"
    _ref().check_sparse_decode(out, lse, ref_out, ref_lse, what=tag)
    # Exact values where the contract gives them (the tolerance check alone would accept tiny values).
    empty = torch.isposinf(ref_lse)  # (b, h_q, s_q)
    if bool(empty.any()):
        assert bool(torch.isposinf(lse[empty]).all()), f"lse of rows without a valid token is not +inf{tag}"
        assert bool((out.transpose(1, 2)[empty] == 0).all()), f"out of rows without a valid token is not 0{tag}"
    s = inp.sink if sink is SAME else sink
    if s is not None and bool(torch.isposinf(s).any()):
        assert bool((out[:, :, torch.isposinf(s)] == 0).all()), f"out of heads with sink = +inf is not 0{tag}"
    return ref_out, ref_lse


def run_case(case: Case, seed=0):
    inp = make_inputs(case, seed)
    kwargs = {}
    if case.provided_out:
        out_buf, lse_buf = nan_outputs(case)
        kwargs = dict(out=out_buf, lse=lse_buf)
    out, lse = decode(inp, **kwargs)
    if case.provided_out:
        assert out is kwargs["out"] and lse is kwargs["lse"]
    check_against_reference(inp, out, lse)
    return inp, out, lse


# ---------------------------------------------------------------------------------------------------
# The correctness matrix
# ---------------------------------------------------------------------------------------------------
@gpu
@pytest.mark.parametrize("case", MATRIX, ids=str)
def test_matrix_h128(case):
    run_case(case, seed=1)


@gpu
@pytest.mark.parametrize("case", HEADS, ids=str)
def test_head_counts(case):
    run_case(case, seed=2)


@gpu
@pytest.mark.parametrize("case", [
    Case("v32", 5, 2, 1, Sel(512, 64, 61, lens=True), sink="random"),
    Case("model1", 5, 3, 100, Sel(300, 100, 53), Sel(512, 64, 64, lens=True), sink="random"),
], ids=str)
def test_head_counts_outside_the_tile_sizes(case):
    """The header promises any h_q >= 1: a lone head and a partial second 64-head tile."""
    run_case(case, seed=3)


@gpu
@pytest.mark.parametrize("case", ODD_TOPK, ids=str)
def test_topk_not_a_multiple_of_64(case):
    run_case(case, seed=4)


# ---------------------------------------------------------------------------------------------------
# Corner cases
# ---------------------------------------------------------------------------------------------------
CORNER = [
    Case("v32", 74, 2, 128, Sel(1024, 576, 61), sink="random", all_invalid=True),
    Case("model1", 74, 2, 128, Sel(1024, 576, 53, lens=True), Sel(512, 64, 61, lens=True), sink="random",
         all_invalid=True),
    Case("v32", 4, 1, 64, Sel(512, 64, 53), Sel(2046, 2048, 61), sink="+inf", all_invalid=True),
    Case("model1", 9, 3, 16, Sel(512, 128, 61), sink="-inf", all_invalid=True, provided_out=False),
    Case("v32", 74, 2, 128, Sel(1024, 576, 61, lens=True), sink="random", zero_len=True),
    Case("model1", 74, 2, 128, Sel(1024, 576, 53, lens=True), Sel(512, 100, 2, lens=True), sink="random",
         zero_len=True),
    Case("v32", 32, 3, 32, Sel(2046, 2048, 53, lens=True), Sel(256, 64, 256, lens=True), zero_len=True),
    Case("model1", 321, 1, 64, Sel(512, 64, 61, lens=True), sink="random", zero_len=True),
]


@gpu
@pytest.mark.parametrize("case", [
    Case("v32", 4, 2, 128, Sel(1024, 576, 61), big_values=True),  # plain kernel
    Case("model1", 4, 2, 128, Sel(1024, 576, 61, lens=True), big_values=True),
    Case("v32", 74, 1, 128, Sel(512, 64, 64), sink="random", big_values=True),  # crossover pairs
    Case("model1", 74, 3, 128, Sel(2046, 2048, 64), Sel(512, 100, 69), big_values=True),
    Case("v32", 9, 3, 64, Sel(2046, 2048, 576), big_values=True),
], ids=str)
def test_scales_above_2_pow_7(case):
    """Every third cache token has quantisation scales above 2^7, which the kernel dequantises with two multiplies
    per value (a single multiply by scale * 2^120 would overflow bf16); the other tokens take the single multiply,
    so both paths meet in one block. q is scaled by 2^-20, so the big tokens' logits are the usual ones; their V
    rows are 2^20 larger, so out is compared after the same exact scaling by 2^-20 (the tolerances are absolute
    below 1e-3)."""
    torch = _torch()
    inp = make_inputs(case)
    out, lse = decode(inp)
    torch.cuda.synchronize()
    ref_out, ref_lse = reference(inp)
    s = 2.0 ** -20
    _ref().check_sparse_decode(out * s, lse, ref_out * s, ref_lse, what=f" [{case}]")


@gpu
@pytest.mark.parametrize("case", CORNER, ids=str)
def test_rows_without_valid_tokens(case):
    """All indices invalid (-1 or out of range), or topk_length 0 (and extra_topk_length 0): out = 0 and
    lse = +inf whatever the sink (checked exactly in check_against_reference)."""
    inp, out, lse = run_case(case, seed=5)
    torch = _torch()
    if case.all_invalid:
        assert bool((out == 0).all()) and bool(torch.isposinf(lse).all())
    else:
        assert bool(torch.isposinf(lse).any()), "the case should contain rows without a valid token"


@gpu
@pytest.mark.parametrize("case", [
    Case("v32", 74, 2, 128, Sel(1024, 576, 61), Sel(512, 64, 53), varlen=True),
    Case("model1", 9, 3, 64, Sel(2046, 2048, 69, lens=True), Sel(700, 64, 576, lens=True)),
    Case("model1", 2, 1, 128, Sel(20000, 16384, 64), varlen=False),  # split over every SM partition: combine
], ids=str)
def test_sink_semantics(case):
    """sink = +inf gives out = 0; sink = -inf changes nothing (bitwise); no sink value changes lse (bitwise)."""
    torch = _torch()
    inp = make_inputs(case, seed=6)
    base = decode(inp, sink=None)
    results = {kind: decode(inp, sink=make_sink(kind, case.h_q, torch.Generator(device=DEVICE).manual_seed(9)),
                            out=nan_outputs(case)[0], lse=nan_outputs(case)[1])
               for kind in ("+inf", "-inf", "random")}
    torch.cuda.synchronize()
    check_against_reference(inp, *base, "no sink", sink=None)
    assert bool((results["+inf"][0] == 0).all()), "sink = +inf must give out = 0"
    assert torch.equal(results["-inf"][0], base[0]), "sink = -inf must not change out"
    for kind, (_, lse) in results.items():
        assert torch.equal(lse, base[1]), f"sink {kind} changed lse"
    sink = make_sink("random", case.h_q, torch.Generator(device=DEVICE).manual_seed(9))
    check_against_reference(inp, *results["random"], "random sink", sink=sink)


@gpu
@pytest.mark.parametrize("case", [
    Case("v32", 1, 1, 128, Sel(20000, 16384, 64), sink="random", varlen=False),
    Case("model1", 2, 2, 64, Sel(9000, 8192, 256, lens=True), Sel(2046, 1024, 61, lens=True), sink="random"),
    Case("v32", 1, 2, 128, Sel(9000, 8192, 61), Sel(2046, 1024, 69), sink="random", all_invalid=True),
    Case("model1", 3, 1, 16, Sel(5000, 4096, 53, lens=True), sink="random", zero_len=True),
], ids=str)
def test_long_selection_split_path(case):
    """Few requests with long selections are split over the SM partitions: the combine kernel writes the
    result, applies the sink and must keep empty rows at out = 0, lse = +inf."""
    run_case(case, seed=7)


# ---------------------------------------------------------------------------------------------------
# Invariances
# ---------------------------------------------------------------------------------------------------
@gpu
@pytest.mark.parametrize("case", [
    Case("v32", 74, 3, 128, Sel(2046, 2048, 64, lens=True), sink="random"),
    Case("model1", 9, 2, 64, Sel(9000, 8192, 61, lens=True), Sel(512, 100, 53, lens=True), sink="random"),
], ids=str)
def test_bitwise_identical_on_repeat(case):
    torch = _torch()
    inp = make_inputs(case, seed=8)
    meta, _ = _openmla().get_mla_metadata()
    first = decode(inp, meta=meta)
    runs = [decode(inp, meta=meta) for _ in range(3)] + [decode(inp) for _ in range(2)]
    torch.cuda.synchronize()
    for out, lse in runs:
        assert torch.equal(first[0], out) and torch.equal(first[1], lse)
    check_against_reference(inp, *first)


@gpu
@pytest.mark.parametrize("layout", LAYOUTS)
def test_cache_dtype_page_placement_and_ignored_arguments(layout):
    """The cache may be typed uint8, int8 or float8_e4m3fn; moving pages (indices remapped) changes nothing;
    block_table and cache_seqlens are ignored in sparse mode. All bitwise."""
    torch = _torch()
    case = Case(layout, 12, 2, 128, Sel(1024, 576, 61, lens=True), Sel(300, 100, 53), sink="random")
    inp = make_inputs(case, seed=9)
    base = decode(inp)
    for dtype in (torch.int8, torch.float8_e4m3fn):
        main = replace(inp.main, cache=inp.main.cache.view(dtype))
        extra = replace(inp.extra, cache=inp.extra.cache.view(dtype))
        assert torch.equal(decode(replace(inp, main=main, extra=extra))[0], base[0])
    garbage_bt = torch.full((case.b, 3), 2147480000, dtype=torch.int32, device=DEVICE)
    other = decode(inp, block_table=garbage_bt, cache_seqlens=torch.zeros(case.b, dtype=torch.int32, device=DEVICE))
    assert torch.equal(other[0], base[0]) and torch.equal(other[1], base[1])

    # Move every page of the main cache to a new place (same page stride) and remap the indices.
    m = inp.main
    num_blocks, page = m.cache.shape[0], m.cache.shape[1]
    new_place = torch.randperm(num_blocks, generator=torch.Generator(device=DEVICE).manual_seed(10), device=DEVICE)
    storage = torch.full_like(m.storage, 255)
    moved = torch.as_strided(storage, m.cache.shape, m.cache.stride())
    moved[new_place] = m.cache.view(torch.uint8)
    idx = m.indices.long()
    ok = (idx >= 0) & (idx < num_blocks * page)
    safe = idx.clamp(0, num_blocks * page - 1)
    remapped = torch.where(ok, new_place[safe // page] * page + safe % page, idx).to(torch.int32)
    main2 = replace(m, storage=storage, cache=moved, indices=remapped, values=None)
    out2, lse2 = decode(replace(inp, main=main2))
    torch.cuda.synchronize()
    assert torch.equal(out2, base[0]) and torch.equal(lse2, base[1])
    check_against_reference(inp, *base)


@gpu
@pytest.mark.parametrize("case", [
    Case("v32", 6, 2, 128, Sel(1024, 576, 61, lens=True), Sel(300, 100, 53, lens=True), sink="random"),
    Case("model1", 9, 3, 64, Sel(512, 37, 69), sink="random"),
], ids=str)
def test_non_contiguous_inputs_and_outputs(case):
    """q, indices and out as slices of padded tensors (NaN / garbage in the padding), lse with other strides."""
    torch = _torch()
    inp = make_inputs(case, seed=11)
    b, s_q, h_q, d_qk = inp.q.shape
    q_pad = torch.full((b + 1, s_q + 1, h_q + 1, d_qk + 128), float("nan"), dtype=inp.q.dtype, device=DEVICE)
    q_nc = q_pad[1:, :s_q, 1:, :d_qk]
    q_nc.copy_(inp.q)

    def padded_indices(t):
        topk = t.shape[-1]
        pad = torch.full((b + 2, s_q + 1, -(-(topk + 5) // 4) * 4), INT32_MAX, dtype=torch.int32, device=DEVICE)
        view = pad[2:, 1:, :topk]
        view.copy_(t)
        return view

    main = replace(inp.main, indices=padded_indices(inp.main.indices))
    extra = None if inp.extra is None else replace(inp.extra, indices=padded_indices(inp.extra.indices))
    out_pad = torch.full((b, s_q + 1, h_q + 2, D_V + 64), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    out_nc = out_pad[:, 1:, 2:, :D_V]
    lse_pad = torch.full((h_q + 3, s_q, b + 1), float("nan"), dtype=torch.float32, device=DEVICE)
    lse_nc = lse_pad[:h_q, :, 1:].permute(2, 0, 1)  # (b, h_q, s_q), batch innermost
    assert not any(t.is_contiguous() for t in (q_nc, main.indices, out_nc, lse_nc))

    base = decode(inp)
    out, lse = decode(replace(inp, main=main, extra=extra), q=q_nc, out=out_nc, lse=lse_nc)
    assert out is out_nc and lse is lse_nc
    torch.cuda.synchronize()
    assert torch.equal(out, base[0]) and torch.equal(lse, base[1])
    check_against_reference(inp, out, lse)


@gpu
def test_default_outputs_and_softmax_scale():
    torch = _torch()
    case = Case("model1", 3, 2, 16, Sel(512, 64, 64), provided_out=False)
    inp = make_inputs(case, seed=12)
    out, lse = decode(inp)
    assert out.is_contiguous() and out.shape == (3, 2, 16, D_V) and out.dtype == torch.bfloat16
    # lse is flash_mla's transposed view of (b, s_q, h_q) storage.
    assert lse.shape == (3, 16, 2) and lse.stride() == (32, 1, 16)
    check_against_reference(inp, out, lse)
    default = decode(inp, softmax_scale=None)
    explicit = decode(inp, softmax_scale=D_QK["model1"] ** -0.5)
    torch.cuda.synchronize()
    assert torch.equal(default[0], explicit[0]) and torch.equal(default[1], explicit[1])
    check_against_reference(inp, *default, "default scale", softmax_scale=D_QK["model1"] ** -0.5)


# ---------------------------------------------------------------------------------------------------
# The schedule object
# ---------------------------------------------------------------------------------------------------
@gpu
@pytest.mark.parametrize("layout", LAYOUTS)
def test_schedule_reuse_across_layers(layout):
    """One schedule, several layers (new q, cache contents and indices; same lengths): identical to planning
    afresh for every layer, and correct."""
    torch = _torch()
    om = _openmla()
    case = Case(layout, 74, 2, 128, Sel(1024, 576, 61, lens=True), Sel(512, 100, 53, lens=True), sink="random",
                varlen=False)
    layers = [make_inputs(case, seed=13)]
    lengths, extra_lengths = layers[0].main.lengths.tolist(), layers[0].extra.lengths.tolist()
    for seed in (14, 15):
        layer = make_inputs(case, seed=seed, lengths=lengths, extra_lengths=extra_lengths)
        # One lengths tensor per step, as in an engine.
        layers.append(replace(layer, main=replace(layer.main, lengths=layers[0].main.lengths),
                              extra=replace(layer.extra, lengths=layers[0].extra.lengths)))
    meta, none = om.get_mla_metadata()
    assert none is None
    shared = [decode(inp, meta=meta) for inp in layers]
    fresh = [decode(inp) for inp in layers]
    torch.cuda.synchronize()
    cfg = meta.config
    assert meta.have_initialized and cfg.is_fp8_kvcache and not cfg.causal
    assert (cfg.b, cfg.s_q, cfg.h_q, cfg.h_k, cfg.page_block_size, cfg.topk, cfg.extra_topk,
            cfg.extra_page_block_size, cfg.d_qk) == (74, 2, 128, 1, 61, 576, 100, 53, D_QK[layout])
    assert meta.tile_scheduler_metadata.dtype == torch.int32 and meta.tile_scheduler_metadata.shape[1] == 8
    assert meta.num_splits.dtype == torch.int32 and meta.num_splits.shape == (75,)
    for (o1, l1), (o2, l2) in zip(shared, fresh):
        assert torch.equal(o1, o2) and torch.equal(l1, l2)
    for i, inp in enumerate(layers):
        check_against_reference(inp, *shared[i], f"layer {i}")


@gpu
def test_schedule_reuse_with_other_shapes_raises():
    torch = _torch()
    om = _openmla()
    case = Case("model1", 4, 2, 64, Sel(512, 128, 64, lens=True), Sel(300, 64, 53), sink="random")
    inp = make_inputs(case, seed=16)
    meta, _ = om.get_mla_metadata()
    decode(inp, meta=meta)

    def expect(field, inputs=inp, **kwargs):
        with pytest.raises(ValueError, match=rf"planned for {field}="):
            decode(inputs, meta=meta, **kwargs)

    expect("topk", indices=inp.main.indices[..., :64])
    expect("extra_topk", inputs=replace(inp, extra=replace(inp.extra, indices=inp.extra.indices[..., :1])))
    expect("extra_page_block_size", inputs=replace(inp, extra=replace(inp.extra, cache=inp.extra.cache[:, :2])))
    expect("extra_page_block_size", inputs=replace(inp, extra=None))
    expect("page_block_size", inputs=replace(inp, main=replace(inp.main, cache=inp.main.cache[:, :32])))
    expect("topk_length_given", inputs=replace(inp, main=replace(inp.main, lengths=None)))
    expect("h_q", q=inp.q[:, :, :32])
    expect("s_q", q=inp.q[:, :1], indices=inp.main.indices[:, :1],
           inputs=replace(inp, extra=replace(inp.extra, indices=inp.extra.indices[:, :1])))
    other = make_inputs(replace(case, layout="v32"), seed=17)
    expect("d_qk", inputs=other)
    # A dense call with the sparse schedule, and a sparse call with a dense schedule.
    q_dense = torch.zeros((4, 2, 64, 576), dtype=torch.bfloat16, device=DEVICE)
    k_dense = torch.zeros((8, 64, 1, 576), dtype=torch.bfloat16, device=DEVICE)
    bt = torch.zeros((4, 2), dtype=torch.int32, device=DEVICE)
    lens = torch.full((4,), 100, dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match=r"planned for is_fp8_kvcache="):
        om.flash_mla_with_kvcache(q_dense, k_dense, bt, lens, D_V, meta)
    dense_meta, _ = om.get_mla_metadata()
    om.flash_mla_with_kvcache(q_dense, k_dense, bt, lens, D_V, dense_meta)
    with pytest.raises(ValueError, match=r"planned for .*="):
        decode(other, meta=dense_meta)
    # The rejected calls changed nothing: the schedule still serves the original shapes.
    out, lse = decode(inp, meta=meta)
    check_against_reference(inp, out, lse, "after rejected reuse")


@gpu
def test_rejected_first_call_leaves_schedule_unused():
    torch = _torch()
    om = _openmla()
    case = Case("v32", 4, 1, 64, Sel(512, 64, 64, lens=True), sink="random")
    inp = make_inputs(case, seed=18)
    meta, _ = om.get_mla_metadata()
    with pytest.raises(ValueError, match="indices"):
        decode(inp, meta=meta, indices=inp.main.indices.long())
    assert not meta.have_initialized
    with pytest.raises(ValueError, match="topk_length"):
        decode(replace(inp, main=replace(inp.main, lengths=inp.main.lengths[:3])), meta=meta)
    assert not meta.have_initialized
    out, lse = decode(inp, meta=meta)
    check_against_reference(inp, out, lse, "after rejected first call")
    assert torch.isfinite(out).all()


@gpu
def test_errors_reach_the_caller_with_the_argument_named():
    torch = _torch()
    om = _openmla()
    case = Case("v32", 4, 1, 64, Sel(512, 64, 64, lens=True), Sel(300, 64, 53), sink="random")
    inp = make_inputs(case, seed=19)

    def expect(exc, pattern, inputs=inp, **kwargs):
        meta, _ = om.get_mla_metadata()
        with pytest.raises(exc, match=pattern):
            decode(inputs, meta=meta, **kwargs)
        assert not meta.have_initialized

    expect(ValueError, r"'q'", q=inp.q.to(torch.float16))
    expect(ValueError, r"'q'", q=inp.q[..., :512])  # d_qk 512 against a V3.2 cache
    expect(ValueError, r"'indices'", indices=inp.main.indices.long())
    expect(ValueError, r"'attn_sink'", sink=inp.sink.to(torch.bfloat16))
    expect(ValueError, r"'attn_sink'", sink=inp.sink[:32])
    expect(ValueError, r"'topk_length'",
           inputs=replace(inp, main=replace(inp.main, lengths=inp.main.lengths.long())))
    expect(ValueError, r"'k_cache'", inputs=replace(inp, main=replace(inp.main, cache=inp.main.cache.cpu())))
    # Tokens must be bytes_per_token apart inside a page.
    num_blocks, page, _, bpt = inp.main.cache.shape
    bad_rows = torch.as_strided(inp.main.storage, (num_blocks // 2, page, 1, bpt), (inp.main.page_stride, 672, 672, 1))
    expect(ValueError, r"'k_cache'", inputs=replace(inp, main=replace(inp.main, cache=bad_rows)))
    expect(ValueError, r"extra_k_cache",
           inputs=replace(inp, extra=replace(inp.extra, cache=inp.extra.cache[..., :584])))
    expect(ValueError, r"'out'", out=torch.empty((4, 1, 64, D_V), dtype=torch.float16, device=DEVICE))
    expect(ValueError, r"'lse'", lse=torch.empty((4, 1, 64), dtype=torch.float32, device=DEVICE))
    expect(ValueError, r"d_v", head_dim_v=576)
    expect(ValueError, r"'causal'", causal=True)


# ---------------------------------------------------------------------------------------------------
# CUDA graphs
# ---------------------------------------------------------------------------------------------------
@gpu
@pytest.mark.parametrize("case", [
    Case("v32", 8, 2, 128, Sel(1024, 576, 61, lens=True), sink="random", varlen=False),
    Case("model1", 8, 1, 64, Sel(1024, 576, 53, lens=True), Sel(512, 100, 64, lens=True), sink="random",
         varlen=False),
], ids=str)
def test_cuda_graph_capture_and_replay(case):
    """One decoding step captured whole: get_mla_metadata() and two "layers" sharing the schedule. Replaying
    after writing new inputs (new topk_length values, indices, cache contents, q) in place gives the results
    for the new inputs: the schedule is recomputed inside the graph."""
    torch = _torch()
    om = _openmla()

    def step_inputs(seed, lens=None, extra_lens=None):
        layer0 = make_inputs(case, seed=seed, lengths=lens, extra_lengths=extra_lens)
        lens = layer0.main.lengths.tolist()
        extra_lens = None if layer0.extra is None else layer0.extra.lengths.tolist()
        layer1 = make_inputs(case, seed=seed + 1, lengths=lens, extra_lengths=extra_lens)
        # Both layers read the step's one lengths tensor (the schedule is planned from it).
        layer1 = replace(layer1, main=replace(layer1.main, lengths=layer0.main.lengths),
                         extra=None if layer1.extra is None else replace(layer1.extra, lengths=layer0.extra.lengths))
        return [layer0, layer1]

    static = step_inputs(20)
    decode(static[0])  # warm-up outside the capture (first-launch set-up), as an engine does
    torch.cuda.synchronize()

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        meta, _ = om.get_mla_metadata()
        outs = [decode(layer, meta=meta) for layer in static]

    first_lens = static[0].main.lengths.tolist()
    for step, seed in enumerate((None, 30)):
        current = static
        if seed is not None:
            current = step_inputs(seed, lens=[(n * 7 + 13) % (case.main.topk + 1) for n in first_lens])
            assert current[0].main.lengths.tolist() != first_lens
            for dst, src in zip(static, current):  # write the new step into the captured tensors, in place
                dst.q.copy_(src.q)
                dst.main.storage.copy_(src.main.storage)
                dst.main.indices.copy_(src.main.indices)
                dst.sink.copy_(src.sink)
                if dst.extra is not None:
                    dst.extra.storage.copy_(src.extra.storage)
                    dst.extra.indices.copy_(src.extra.indices)
            static[0].main.lengths.copy_(current[0].main.lengths)
            if static[0].extra is not None:
                static[0].extra.lengths.copy_(current[0].extra.lengths)
        for out, lse in outs:
            out.fill_(float("nan"))
            lse.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        for i, (out, lse) in enumerate(outs):
            check_against_reference(current[i], out, lse, f"graph layer {i} step {step}")
            eager = decode(static[i])
            torch.cuda.synchronize()
            assert torch.equal(eager[0], out) and torch.equal(eager[1], lse)


# ---------------------------------------------------------------------------------------------------
# The Python layer's own checks: they run before torch or CUDA is needed (no GPU)
# ---------------------------------------------------------------------------------------------------
class _Shaped:
    """Stands for a tensor where only the shape is looked at."""

    def __init__(self, *shape):
        self.shape = shape


def _sparse_call(**kwargs):
    om = _openmla()
    meta, _ = om.get_mla_metadata()
    args = dict(q=object(), k_cache=_Shaped(10, 64, 1, 656), block_table=None, cache_seqlens=None, head_dim_v=512,
                tile_scheduler_metadata=meta, is_fp8_kvcache=True, indices=object())
    args.update(kwargs)
    return om.flash_mla_with_kvcache(**args)


def test_sparse_mode_needs_fp8_and_no_causal():
    with pytest.raises(ValueError, match=r"argument 'is_fp8_kvcache' is False but 'indices' was given"):
        _sparse_call(is_fp8_kvcache=False)
    with pytest.raises(ValueError, match=r"argument 'causal' must be False"):
        _sparse_call(causal=True)


def test_extra_arguments_go_together():
    with pytest.raises(ValueError, match=r"'extra_indices_in_kvcache' was given without 'extra_k_cache'"):
        _sparse_call(extra_indices_in_kvcache=object())
    with pytest.raises(ValueError, match=r"'extra_topk_length' was given without 'extra_k_cache'"):
        _sparse_call(extra_topk_length=object())
    with pytest.raises(ValueError, match=r"'extra_indices_in_kvcache' is required when 'extra_k_cache' is given"):
        _sparse_call(extra_k_cache=_Shaped(10, 64, 1, 656))


def test_fp8_layout_follows_the_last_dimension():
    for bad in (576, 512, 600, 1312):
        with pytest.raises(ValueError, match=rf"argument 'k_cache' has last dimension {bad}; .*656.*584"):
            _sparse_call(k_cache=_Shaped(10, 64, 1, bad))
    with pytest.raises(ValueError, match=r"argument 'k_cache' must have 4 dimensions"):
        _sparse_call(k_cache=_Shaped(640, 1, 656))
    with pytest.raises(TypeError, match=r"argument 'k_cache' must be a torch.Tensor"):
        _sparse_call(k_cache=object())
    with pytest.raises(ValueError, match=r"argument 'extra_k_cache' has last dimension 576"):
        _sparse_call(extra_k_cache=_Shaped(10, 64, 1, 576), extra_indices_in_kvcache=object())
    with pytest.raises(ValueError, match=re.escape("'extra_k_cache' has 584 bytes per token but 'k_cache' has 656")):
        _sparse_call(extra_k_cache=_Shaped(10, 64, 1, 584), extra_indices_in_kvcache=object())


# ---------------------------------------------------------------------------------------------------
# The torch reference against the C++ CPU reference (torch on the CPU; no GPU needed)
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", LAYOUTS)
def test_torch_reference_matches_cpu_reference(layout):
    """sparse_decode_ref.py (torch fp32, on the dequantised cache) against openmla.reference.sparse_decode
    (C++, double, reading the FP8 bytes) on a small case: odd page sizes and page padding, -1 slots,
    garbage past topk_length, an extra cache with its own length, finite and infinite sinks, and a request
    without any valid token. Only -1 marks invalid slots here: the CPU reference rejects other values."""
    torch = pytest.importorskip("torch")
    np = pytest.importorskip("numpy")
    reference = _openmla().reference
    ref = _ref()
    d_qk, bpt = D_QK[layout], BYTES_PER_TOKEN[layout]
    gen = torch.Generator().manual_seed(21)
    b, s_q, h_q = 3, 2, 4

    def cache(num_blocks, page, topk, lengths):
        kv = (torch.randn((num_blocks, page, 1, d_qk), generator=gen) / 10).clamp(-1, 1).to(torch.bfloat16)
        stride = page_stride_bytes(layout, page)
        fp8 = reference.fp8_encode_pages(kv.view(torch.int16).numpy().view(np.uint16), page_stride_bytes=stride)
        num_tokens = num_blocks * page
        idx = torch.stack([torch.stack([torch.randperm(num_tokens, generator=gen)[:topk] for _ in range(s_q)])
                           for _ in range(b)]).to(torch.int32)
        idx[torch.rand(idx.shape, generator=gen) < 0.2] = -1
        used = idx >= 0
        lens = torch.tensor(lengths, dtype=torch.int32)
        beyond = (torch.arange(topk)[None, None, :] >= lens[:, None, None]).expand(idx.shape)
        idx[beyond] = INT32_MAX  # never read by either reference
        used &= ~beyond
        selected = torch.zeros(num_tokens, dtype=torch.bool)
        selected[idx[used].long()] = True
        # The bytes behind the strided cache, pages and padding, to poison tokens through token_byte_views().
        storage = torch.from_numpy(np.lib.stride_tricks.as_strided(fp8, ((num_blocks - 1) * stride + page * bpt,),
                                                                   (1,)))
        for view in token_byte_views(storage, layout, num_blocks, page, stride):
            view[~selected.view(num_blocks, page)] = 255
        values = torch.from_numpy(reference.fp8_decode_pages(fp8, as_float=True))
        return fp8, values, idx, lens

    fp8, values, idx, lens = cache(6, 5, 7, [7, 3, 0])
    xfp8, xvalues, xidx, xlens = cache(4, 3, 5, [5, 0, 0])
    q = torch.randn((b, s_q, h_q, d_qk), generator=gen).clamp(-1, 1).to(torch.bfloat16)
    sink = torch.tensor([0.3, math.inf, -math.inf, -1.0], dtype=torch.float32)
    scale = d_qk ** -0.55
    for extra in (False, True):
        t_out, t_lse = ref.sparse_decode_ref(q, values, idx, lens, sink, xvalues if extra else None,
                                             xidx if extra else None, xlens if extra else None, softmax_scale=scale)
        c_out, c_lse = reference.sparse_decode(q, fp8, idx.numpy(), softmax_scale=scale, topk_length=lens.numpy(),
                                               attn_sink=sink.numpy(), extra_k_cache=xfp8 if extra else None,
                                               extra_indices=xidx.numpy() if extra else None,
                                               extra_topk_length=xlens.numpy() if extra else None)
        c_out = torch.from_numpy(np.asarray(c_out, dtype=np.float32))
        c_lse = torch.from_numpy(np.asarray(c_lse, dtype=np.float32))
        ref.check_is_allclose("out vs CPU reference", t_out.float(), c_out, abs_tol=1e-3, rel_tol=2.01 / 128,
                              cos_diff_tol=5e-6)
        ref.check_is_allclose("lse vs CPU reference", t_lse, c_lse, abs_tol=1e-5, rel_tol=1e-5)
        assert torch.isposinf(t_lse[2]).all() and bool((t_out[2] == 0).all())  # request 2 selects nothing
        assert bool((t_out[:, :, 1] == 0).all())  # sink +inf on head 1
        assert torch.isfinite(t_lse[:2]).all()
