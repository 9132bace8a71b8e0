"""GPU tests of dense MLA decode through the flash_mla-compatible API (openmla.flash_mla_with_kvcache).

Inputs follow flash_mla's own test (docs/contracts.md section 10): q and KV ~ N(0,1)/10
clamped to [-1, 1]; a random permutation of all pages as the block table; block-table entries past each
request's pages hold 2147480000; every unused page and the tail of each last page hold NaN. Results are
compared with the torch fp32 reference (dense_decode_ref.py) under flash_mla's tolerances (docs/contracts.md
section 8). The kernel always runs before the reference is allocated, so a stale correct answer left in
reused memory cannot produce a false pass.

Torch is imported inside the tests and helpers only: without torch or a Hopper GPU every test here is
collected and skipped with its reason (conftest.py), except the CPU cross-check of the two references.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass

import pytest

gpu = pytest.mark.gpu

D_QK, D_V, PAGE = 576, 512, 64
INVALID_PAGE = 2147480000
DEVICE = "cuda"  # every tensor of these tests lives there
HEAD_PAIRS = [(h_q, h_kv) for h_q in (1, 3, 9, 16, 63, 64, 126, 128) for h_kv in (1, 2, 3, 8) if h_q % h_kv == 0]


def _torch():
    import torch

    return torch


def _ref():
    import dense_decode_ref

    return dense_decode_ref


def _openmla():
    import openmla

    return openmla


# ---------------------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------------------
@dataclass
class Case:
    b: int
    s_q: int
    h_q: int
    h_kv: int
    s_k: int
    varlen: bool = False
    causal: bool = False
    dtype: str = "bf16"
    zero_len: bool = False
    provided_out: bool = False  # pass NaN-filled out / lse buffers

    def __str__(self):
        return (f"b{self.b}-sq{self.s_q}-hq{self.h_q}-hkv{self.h_kv}-sk{self.s_k}"
                f"{'-varlen' if self.varlen else ''}{'-causal' if self.causal else ''}-{self.dtype}"
                f"{'-zero' if self.zero_len else ''}{'-outbuf' if self.provided_out else ''}")


@dataclass
class Inputs:
    q: object
    k_cache: object
    block_table: object
    cache_seqlens: object


def torch_dtype(name):
    torch = _torch()
    return {"bf16": torch.bfloat16, "fp16": torch.float16}[name]


def draw_seqlens(b, s_q, s_k, *, varlen, zero_len, seed):
    """flash_mla's lengths: s_k, or max(N(s_k, s_k/2), s_q) when varlen; with zero_len each is 0 w.p. 1/2."""
    rng = random.Random(seed)
    lens = [max(int(rng.gauss(s_k, s_k / 2)), s_q) if varlen else s_k for _ in range(b)]
    if zero_len:
        lens = [0 if rng.random() < 0.5 else n for n in lens]
    return lens


def make_inputs(b, s_q, h_q, h_kv, *, seqlens, dtype="bf16", seed=0, clean_lens=None):
    """Paged inputs for `seqlens` (a list). Tokens [0, clean_lens[i]) of request i hold data (default:
    seqlens); every other cache row is NaN and every block-table entry past a request's pages is garbage."""
    torch = _torch()
    dev = DEVICE
    gen = torch.Generator().manual_seed(seed)
    clean = list(seqlens if clean_lens is None else clean_lens)
    assert all(c >= s for c, s in zip(clean, seqlens))
    max_len = max(max(clean), 1)
    max_blocks = (max_len + 255) // 256 * 256 // PAGE  # padded to 256 tokens, as flash_mla's test does
    num_blocks = b * max_blocks

    perm = torch.randperm(num_blocks, generator=gen).to(torch.int32).view(b, max_blocks)
    clean_t = torch.tensor(clean, dtype=torch.int64)
    cols = torch.arange(max_blocks, dtype=torch.int64)
    used = cols[None, :] * PAGE < clean_t[:, None]  # (b, max_blocks): page holds at least one clean token
    block_table = torch.where(used, perm, torch.full_like(perm, INVALID_PAGE))
    valid_rows = torch.zeros(num_blocks, dtype=torch.int64)  # clean rows per physical page
    valid_rows[perm[used].long()] = (clean_t[:, None] - cols[None, :] * PAGE).clamp(0, PAGE)[used]
    poison = torch.arange(PAGE)[None, :] >= valid_rows[:, None]  # (num_blocks, PAGE)

    dt = torch_dtype(dtype)
    g = torch.Generator(device=dev).manual_seed(seed)
    q = (torch.randn((b, s_q, h_q, D_QK), generator=g, device=dev) / 10).clamp_(-1, 1).to(dt)
    k_cache = (torch.randn((num_blocks, PAGE, h_kv, D_QK), generator=g, device=dev, dtype=dt) / 10).clamp_(-1, 1)
    k_cache[poison.to(dev)] = float("nan")
    return Inputs(q=q, k_cache=k_cache, block_table=block_table.to(dev),
                  cache_seqlens=torch.tensor(seqlens, dtype=torch.int32, device=dev))


def inputs_for(case: Case, seed=0):
    lens = draw_seqlens(case.b, case.s_q, case.s_k, varlen=case.varlen, zero_len=case.zero_len, seed=seed)
    return make_inputs(case.b, case.s_q, case.h_q, case.h_kv, seqlens=lens, dtype=case.dtype, seed=seed)


def nan_out_buffers(b, s_q, h_q, dtype, lse_contiguous=False):
    torch = _torch()
    out = torch.full((b, s_q, h_q, D_V), float("nan"), dtype=dtype, device=DEVICE)
    if lse_contiguous:
        lse = torch.full((b, h_q, s_q), float("nan"), dtype=torch.float32, device=DEVICE)
    else:
        lse = torch.full((b, s_q, h_q), float("nan"), dtype=torch.float32, device=DEVICE).transpose(1, 2)
    return out, lse


def decode(inp: Inputs, causal, meta=None, **kwargs):
    om = _openmla()
    if meta is None:
        meta, _ = om.get_mla_metadata()
    return om.flash_mla_with_kvcache(inp.q, inp.k_cache, inp.block_table, inp.cache_seqlens, D_V, meta,
                                     causal=causal, **kwargs)


def reference(inp: Inputs, causal, softmax_scale=None):
    return _ref().dense_decode_ref(inp.q, inp.k_cache, inp.block_table, inp.cache_seqlens, D_V,
                                   softmax_scale=softmax_scale, causal=causal)


def check_against_reference(inp: Inputs, out, lse, causal, what="", softmax_scale=None):
    torch = _torch()
    torch.cuda.synchronize()  # the kernel has finished before the reference allocates anything
    ref_out, ref_lse = reference(inp, causal, softmax_scale)
    _ref().check_dense_decode(out, lse, ref_out, ref_lse, what=f" [{what}]" if what else "")
    # Rows that see no key: exactly 0 and +inf (the tolerance check alone would accept a tiny value).
    empty = torch.isposinf(ref_lse)  # (b, h_q, s_q)
    if bool(empty.any()):
        assert bool(torch.isposinf(lse[empty]).all()), f"lse of empty rows is not +inf [{what}]"
        out_rows = out.transpose(1, 2)[empty]  # (n, d_v)
        assert bool((out_rows == 0).all()), f"out of empty rows is not exactly 0 [{what}]"


def run_case(case: Case, seed=0):
    torch = _torch()
    inp = inputs_for(case, seed)
    kwargs = {}
    if case.provided_out:
        out_buf, lse_buf = nan_out_buffers(case.b, case.s_q, case.h_q, inp.q.dtype)
        kwargs = dict(out=out_buf, lse=lse_buf)
    out, lse = decode(inp, case.causal, **kwargs)
    assert out.shape == (case.b, case.s_q, case.h_q, D_V) and out.dtype == inp.q.dtype
    assert lse.shape == (case.b, case.h_q, case.s_q) and lse.dtype == torch.float32
    if case.provided_out:
        assert out is kwargs["out"] and lse is kwargs["lse"]
    check_against_reference(inp, out, lse, case.causal, str(case))
    return inp, out, lse


# ---------------------------------------------------------------------------------------------------
# The correctness matrix
# ---------------------------------------------------------------------------------------------------
def _full_row_cases():
    """h_q = 128, h_kv = 1 (DeepSeek's geometry): every b x s_q x s_k x varlen x causal."""
    cases = []
    for i, (b, s_q, s_k, varlen, causal) in enumerate(
            (b, s_q, s_k, v, c) for b in (1, 2, 6, 64) for s_q in (1, 2, 4) for s_k in (20, 140, 4096)
            for v in (False, True) for c in (False, True)):
        cases.append(Case(b, s_q, 128, 1, s_k, varlen, causal, provided_out=i % 2 == 1))
    return cases


def _head_pair_cases():
    """Every (h_q, h_kv) pair with each s_q; the other dimensions drawn with a fixed seed so that every
    value appears, some in fp16. b = 64 with s_k = 4096 (large caches at h_kv = 8) is left to the full row."""
    rng = random.Random(20261122)
    cases = []
    for h_q, h_kv in HEAD_PAIRS:
        for s_q in (1, 2, 4):
            s_k = rng.choice((20, 140, 4096))
            b = rng.choice((1, 2, 6, 64) if s_k != 4096 else (1, 2, 6))
            cases.append(Case(b, s_q, h_q, h_kv, s_k, varlen=rng.random() < 0.5, causal=rng.random() < 0.6,
                              dtype="fp16" if rng.random() < 0.3 else "bf16", provided_out=rng.random() < 0.5))
    return cases


FULL_ROW = _full_row_cases()
HEAD_PAIR = _head_pair_cases()
FP16_ROW = [Case(64, s_q, 128, 1, 4096, varlen=True, causal=c, dtype="fp16") for s_q in (1, 2) for c in (False, True)]


@gpu
@pytest.mark.parametrize("case", FULL_ROW, ids=str)
def test_matrix_h128_hkv1(case):
    run_case(case)


@gpu
@pytest.mark.parametrize("case", HEAD_PAIR, ids=str)
def test_matrix_head_pairs(case):
    run_case(case, seed=1)


@gpu
@pytest.mark.parametrize("case", FP16_ROW, ids=str)
def test_fp16(case):
    run_case(case, seed=2)


def test_matrix_covers_every_value():
    """The chosen subset covers every value of every dimension of the test matrix (docs/contracts.md section 10)."""
    cases = FULL_ROW + HEAD_PAIR + FP16_ROW
    assert {(c.h_q, c.h_kv) for c in cases} == set(HEAD_PAIRS)
    for field, values in (("h_q", {1, 3, 9, 16, 63, 64, 126, 128}), ("h_kv", {1, 2, 3, 8}), ("s_q", {1, 2, 4}),
                          ("varlen", {False, True}), ("causal", {False, True}), ("s_k", {20, 140, 4096}),
                          ("b", {1, 2, 6, 64}), ("dtype", {"bf16", "fp16"}), ("provided_out", {False, True})):
        assert {getattr(c, field) for c in cases} >= values, field
    assert {(c.s_q, c.causal) for c in HEAD_PAIR if c.s_q > 1} >= {(2, True), (4, True), (2, False), (4, False)}


# ---------------------------------------------------------------------------------------------------
# Corner cases
# ---------------------------------------------------------------------------------------------------
@gpu
@pytest.mark.parametrize("case", [
    Case(128, 2, 128, 1, 4096, varlen=True, causal=False, zero_len=True),
    Case(128, 2, 128, 1, 4096, varlen=True, causal=True, zero_len=True),
    Case(64, 4, 16, 2, 140, varlen=True, causal=True, zero_len=True, provided_out=True),
    Case(6, 1, 63, 3, 20, varlen=False, causal=False, zero_len=True),
], ids=str)
def test_zero_length_requests(case):
    run_case(case, seed=3)


@gpu
@pytest.mark.parametrize("h_q,h_kv,s_q", [(128, 1, 2), (16, 2, 1)])
def test_all_requests_empty(h_q, h_kv, s_q):
    torch = _torch()
    inp = make_inputs(8, s_q, h_q, h_kv, seqlens=[0] * 8, seed=4)
    out, lse = decode(inp, causal=True, **dict(zip(("out", "lse"), nan_out_buffers(8, s_q, h_q, inp.q.dtype))))
    torch.cuda.synchronize()
    assert bool((out == 0).all())
    assert bool(torch.isposinf(lse).all())


@gpu
@pytest.mark.parametrize("s_q", [2, 4])
def test_causal_rows_without_visible_keys(s_q):
    """With L < s_q, causal query i sees keys j <= L - s_q + i: the first s_q - L rows see nothing."""
    lens = [1, 2, 3, 4, 5, 0, 64, 65, 1, 3]
    inp = make_inputs(len(lens), s_q, 64, 2, seqlens=lens, seed=5)
    out, lse = decode(inp, causal=True, **dict(zip(("out", "lse"), nan_out_buffers(len(lens), s_q, 64, inp.q.dtype))))
    check_against_reference(inp, out, lse, True, f"short causal s_q={s_q}")


@gpu
@pytest.mark.parametrize("case", [
    Case(140, 1, 64, 1, 140, varlen=True),
    Case(200, 2, 128, 1, 140, varlen=True, causal=True, provided_out=True),
    Case(264, 1, 16, 1, 20, varlen=True),
    Case(133, 4, 9, 3, 140, varlen=True, causal=True, zero_len=True),
], ids=str)
def test_more_requests_than_sms(case):
    run_case(case, seed=6)


@gpu
@pytest.mark.parametrize("case", [
    Case(1, 1, 128, 1, 65536),
    Case(1, 2, 128, 1, 65536, causal=True),
    Case(1, 1, 16, 1, 32768 + 37),
    Case(1, 4, 64, 8, 16384 + 1, causal=True, provided_out=True),
    Case(2, 2, 128, 1, 40000, varlen=True, causal=True),
], ids=str)
def test_long_single_request_split_path(case):
    """One long request is split over every SM partition: the combine kernel produces the result."""
    run_case(case, seed=7)


@gpu
def test_one_long_request_among_short_ones():
    lens = [131072, 5, 0, 64, 1, 4096, 63, 65]
    inp = make_inputs(len(lens), 2, 128, 1, seqlens=lens, seed=8)
    out, lse = decode(inp, causal=True)
    check_against_reference(inp, out, lse, True, "one long among short")


# Requests split into exactly two chunks are merged inside the main kernel (the chunk that finishes last merges
# the other's partial; docs/dense-decode.md, "Split requests"); more chunks go through the combine kernel.
MERGE_CASES = [Case(64, 2, 128, 1, 2048, varlen=True, causal=True), Case(132, 1, 16, 2, 700, varlen=True),
               Case(40, 3, 9, 3, 1500, varlen=True, causal=True, zero_len=True, dtype="fp16")]


def _chunk_counts(meta):
    splits = meta.num_splits.cpu()
    return (splits[1:] - splits[:-1]).tolist()


@gpu
@pytest.mark.parametrize("publish_always", [False, True], ids=["merge-if-other-done", "always-publish"])
@pytest.mark.parametrize("case", MERGE_CASES, ids=str)
def test_two_chunk_requests_merged_in_kernel(case, publish_always):
    """Both ways a two-chunk request is merged: by the chunk that finds the other's partial already published
    (the usual one), and, with the test hook, by whichever of the two publishes last. The counters must be back
    at zero after every call, and repeated calls bitwise identical."""
    torch = _torch()
    om = _openmla()
    C = om._openmla
    inp = inputs_for(case, seed=21)
    meta, _ = om.get_mla_metadata()
    C._set_dense_merge_publish_always(publish_always)
    try:
        out, lse = decode(inp, case.causal, meta=meta)
        again = decode(inp, case.causal, meta=meta)
    finally:
        C._set_dense_merge_publish_always(False)
    torch.cuda.synchronize()
    assert 2 in _chunk_counts(meta), "the case must contain requests split into exactly two chunks"
    assert int(meta.merge_counters.abs().sum()) == 0, "a call left a merge counter non-zero"
    check_against_reference(inp, out, lse, case.causal, f"{case} publish_always={publish_always}")
    assert torch.equal(out, again[0]) and torch.equal(lse, again[1])


@gpu
@pytest.mark.parametrize("case", MERGE_CASES[:2], ids=str)
def test_without_merge_counters_the_combine_kernel_merges(case):
    """A schedule without merge counters (C++ callers of the earlier API) still gives the right answer: the combine
    kernel then merges the two-chunk requests too."""
    torch = _torch()
    om = _openmla()
    C = om._openmla
    inp = inputs_for(case, seed=22)
    meta, _ = om.get_mla_metadata()
    with_counters = decode(inp, case.causal, meta=meta)  # plans the schedule
    out, lse = nan_out_buffers(case.b, case.s_q, case.h_q, inp.q.dtype)
    problem = dict(batch=case.b, s_q=case.s_q, h_q=case.h_q, h_kv=case.h_kv, d_qk=D_QK, d_v=D_V, page_block_size=PAGE,
                   cache_format=case.dtype, causal=case.causal,
                   num_sms=torch.cuda.get_device_properties(0).multi_processor_count)
    C.dense_decode(inp.q, inp.k_cache, inp.block_table, inp.cache_seqlens, meta.tile_scheduler_metadata,
                   meta.num_splits, meta.partial_o, meta.partial_lse, out, lse, merge_counters=None,
                   softmax_scale=D_QK ** -0.5, stream=torch.cuda.current_stream().cuda_stream, **problem)
    torch.cuda.synchronize()
    assert 2 in _chunk_counts(meta)
    check_against_reference(inp, out, lse, case.causal, f"{case} combine only")
    # Two merge orders of the same partials: equal up to rounding.
    assert torch.allclose(out.float(), with_counters[0].float(), atol=2e-3, rtol=1e-2)


# ---------------------------------------------------------------------------------------------------
# Invariances
# ---------------------------------------------------------------------------------------------------
@gpu
@pytest.mark.parametrize("case", [Case(6, 2, 128, 1, 4096, varlen=True, causal=True), Case(64, 1, 16, 2, 140, True)],
                         ids=str)
def test_permuted_block_table_gives_identical_results(case):
    torch = _torch()
    inp = inputs_for(case, seed=9)
    out1, lse1 = decode(inp, case.causal)
    num_blocks = inp.k_cache.shape[0]
    new_place = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(10)).to(DEVICE)
    k2 = torch.empty_like(inp.k_cache)
    k2[new_place] = inp.k_cache  # physical page p moves to new_place[p]
    bt = inp.block_table
    valid = bt != INVALID_PAGE
    bt2 = torch.where(valid, new_place.to(torch.int32)[bt.clamp(0, num_blocks - 1).long()], bt)
    inp2 = Inputs(inp.q, k2, bt2, inp.cache_seqlens)
    out2, lse2 = decode(inp2, case.causal)
    torch.cuda.synchronize()
    assert torch.equal(out1, out2)
    assert torch.equal(lse1, lse2)
    check_against_reference(inp2, out2, lse2, case.causal, "permuted")


@gpu
@pytest.mark.parametrize("case", [Case(6, 2, 128, 1, 4096, varlen=True, causal=True),
                                  Case(9, 4, 126, 3, 140, varlen=True, causal=True, dtype="fp16")], ids=str)
def test_non_contiguous_inputs(case):
    """q, k_cache and block_table as slices of padded tensors (NaN / garbage in the padding)."""
    torch = _torch()
    inp = inputs_for(case, seed=11)
    b, s_q, h_q, h_kv = case.b, case.s_q, case.h_q, case.h_kv
    q_pad = torch.full((b + 1, s_q + 1, h_q + 1, D_QK + 128), float("nan"), dtype=inp.q.dtype, device=DEVICE)
    q_nc = q_pad[:b, :s_q, :h_q, :D_QK]
    q_nc.copy_(inp.q)
    nb = inp.k_cache.shape[0]
    k_pad = torch.full((nb + 1, PAGE + 1, h_kv + 1, D_QK + 64), float("nan"), dtype=inp.q.dtype, device=DEVICE)
    k_nc = k_pad[:nb, :PAGE, :h_kv, :D_QK]
    k_nc.copy_(inp.k_cache)
    mb = inp.block_table.shape[1]
    bt_pad = torch.full((b + 1, mb + 3), INVALID_PAGE, dtype=torch.int32, device=DEVICE)
    bt_nc = bt_pad[1:, 2:mb + 2]  # also offset: the view does not start at the allocation
    bt_nc.copy_(inp.block_table)
    assert not (q_nc.is_contiguous() or k_nc.is_contiguous() or bt_nc.is_contiguous())

    out_c, lse_c = decode(inp, case.causal)
    inp_nc = Inputs(q_nc, k_nc, bt_nc, inp.cache_seqlens)
    out_nc, lse_nc = decode(inp_nc, case.causal)
    torch.cuda.synchronize()
    assert torch.equal(out_c, out_nc)
    assert torch.equal(lse_c, lse_nc)
    check_against_reference(inp, out_nc, lse_nc, case.causal, "non-contiguous")


@gpu
@pytest.mark.parametrize("case", [Case(64, 2, 128, 1, 4096, varlen=True, causal=True),
                                  Case(1, 1, 128, 1, 32768), Case(6, 4, 63, 3, 140, varlen=True, causal=True)],
                         ids=str)
def test_bitwise_identical_on_repeat(case):
    torch = _torch()
    inp = inputs_for(case, seed=12)
    meta, _ = _openmla().get_mla_metadata()
    first = decode(inp, case.causal, meta=meta)
    runs = [decode(inp, case.causal, meta=meta) for _ in range(3)] + [decode(inp, case.causal) for _ in range(2)]
    torch.cuda.synchronize()
    for out, lse in runs:
        assert torch.equal(first[0], out)
        assert torch.equal(first[1], lse)


@gpu
def test_softmax_scale():
    torch = _torch()
    inp = inputs_for(Case(6, 2, 64, 1, 140, varlen=True), seed=13)
    default = decode(inp, True)
    explicit = decode(inp, True, softmax_scale=D_QK ** -0.5)
    other = decode(inp, True, softmax_scale=0.2)
    torch.cuda.synchronize()
    assert torch.equal(default[0], explicit[0]) and torch.equal(default[1], explicit[1])
    check_against_reference(inp, *other, True, "scale 0.2", softmax_scale=0.2)


# ---------------------------------------------------------------------------------------------------
# The schedule object
# ---------------------------------------------------------------------------------------------------
@gpu
def test_schedule_object_is_filled_on_first_use():
    torch = _torch()
    om = _openmla()
    inp = inputs_for(Case(5, 2, 128, 1, 140, varlen=True), seed=14)
    meta, none = om.get_mla_metadata()
    assert none is None and not meta.have_initialized
    decode(inp, True, meta=meta)
    assert meta.have_initialized
    assert meta.tile_scheduler_metadata.dtype == torch.int32
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    assert meta.tile_scheduler_metadata.shape == (sms // 4, 8)  # 4 m-blocks of 64 rows: 33 on an H100
    assert meta.num_splits.dtype == torch.int32 and meta.num_splits.shape == (6,)
    cfg = meta.config
    assert (cfg.b, cfg.s_q, cfg.h_q, cfg.page_block_size, cfg.h_k, cfg.causal, cfg.is_fp8_kvcache) == \
        (5, 2, 128, 64, 1, True, False)
    assert cfg.topk is None and cfg.extra_topk is None and cfg.extra_page_block_size is None
    splits = meta.num_splits.cpu()
    assert int(splits[0]) == 0 and bool((splits[1:] >= splits[:-1] + 1).all())  # >= 1 split per request


@gpu
def test_schedule_reuse_across_layers_equals_fresh_planning():
    torch = _torch()
    om = _openmla()
    base = inputs_for(Case(64, 2, 128, 1, 4096, varlen=True, causal=True), seed=15)
    layers = [base]
    for seed in (16, 17):  # other layers: new q and cache contents, same lengths, block table and NaN rows
        g = torch.Generator(device=DEVICE).manual_seed(seed)
        q = (torch.randn(base.q.shape, generator=g, device=DEVICE) / 10).clamp_(-1, 1).to(base.q.dtype)
        k = (torch.randn(base.k_cache.shape, generator=g, device=DEVICE) / 10).clamp_(-1, 1).to(base.q.dtype)
        k = torch.where(torch.isnan(base.k_cache), base.k_cache, k)
        layers.append(Inputs(q, k, base.block_table, base.cache_seqlens))
    meta, _ = om.get_mla_metadata()
    shared = [decode(inp, True, meta=meta) for inp in layers]
    fresh = [decode(inp, True) for inp in layers]
    torch.cuda.synchronize()
    for (o1, l1), (o2, l2) in zip(shared, fresh):
        assert torch.equal(o1, o2) and torch.equal(l1, l2)
    for i, inp in enumerate(layers):
        check_against_reference(inp, *shared[i], True, f"layer {i}")


@gpu
def test_schedule_reuse_with_inconsistent_shapes_raises():
    torch = _torch()
    om = _openmla()
    inp = inputs_for(Case(4, 2, 64, 1, 140, varlen=True, causal=True), seed=18)
    meta, _ = om.get_mla_metadata()
    decode(inp, True, meta=meta)

    def expect(field, **changes):
        with pytest.raises(ValueError, match=rf"planned for {field}="):
            om.flash_mla_with_kvcache(changes.get("q", inp.q), changes.get("k_cache", inp.k_cache),
                                      changes.get("block_table", inp.block_table),
                                      changes.get("cache_seqlens", inp.cache_seqlens), changes.get("head_dim_v", D_V),
                                      meta, causal=changes.get("causal", True))

    expect("causal", causal=False)
    expect("h_q", q=inp.q[:, :, :32])
    expect("s_q", q=inp.q[:, :1])
    other_b = inputs_for(Case(6, 2, 64, 1, 140, varlen=True, causal=True), seed=19)
    expect("b", q=other_b.q, block_table=other_b.block_table, cache_seqlens=other_b.cache_seqlens)
    expect("h_k", q=inp.q, k_cache=inp.k_cache.expand(-1, -1, 2, -1))
    expect("page_block_size", k_cache=inp.k_cache.view(-1, 32, 1, D_QK))
    expect("d_v", head_dim_v=256)
    # The rejected calls changed nothing: the schedule still serves the original shapes.
    out, lse = decode(inp, True, meta=meta)
    check_against_reference(inp, out, lse, True, "after rejected reuse")
    assert torch.isfinite(out).all()


@gpu
def test_rejected_first_call_leaves_schedule_unused():
    torch = _torch()
    om = _openmla()
    inp = inputs_for(Case(4, 1, 16, 1, 140), seed=20)
    meta, _ = om.get_mla_metadata()
    with pytest.raises(ValueError, match="block_table"):
        om.flash_mla_with_kvcache(inp.q, inp.k_cache, inp.block_table.to(torch.int64), inp.cache_seqlens, D_V, meta)
    assert not meta.have_initialized
    with pytest.raises(ValueError, match="page_block_size|k_cache"):
        om.flash_mla_with_kvcache(inp.q, inp.k_cache[:, :48], inp.block_table, inp.cache_seqlens, D_V,
                                  meta)
    assert not meta.have_initialized
    out, lse = decode(inp, False, meta=meta)
    check_against_reference(inp, out, lse, False, "after rejected first call")


@gpu
def test_errors_reach_the_caller_with_the_argument_named():
    torch = _torch()
    om = _openmla()
    inp = inputs_for(Case(4, 1, 16, 1, 140), seed=21)
    meta, _ = om.get_mla_metadata()
    with pytest.raises(ValueError, match="'q'"):
        om.flash_mla_with_kvcache(inp.q.float(), inp.k_cache, inp.block_table, inp.cache_seqlens, D_V, meta)
    with pytest.raises(ValueError, match="'q'"):
        om.flash_mla_with_kvcache(inp.q.cpu(), inp.k_cache, inp.block_table, inp.cache_seqlens, D_V, meta)
    with pytest.raises(ValueError, match="cache_seqlens"):
        om.flash_mla_with_kvcache(inp.q, inp.k_cache, inp.block_table, inp.cache_seqlens.cpu(), D_V, meta)
    with pytest.raises(ValueError, match="h_q"):
        om.flash_mla_with_kvcache(inp.q[:, :, :9], inp.k_cache.expand(-1, -1, 2, -1), inp.block_table,
                                  inp.cache_seqlens, D_V, meta)
    with pytest.raises(ValueError, match="d_v"):
        om.flash_mla_with_kvcache(inp.q, inp.k_cache, inp.block_table, inp.cache_seqlens, 256, meta)
    with pytest.raises(ValueError, match="'out'"):
        om.flash_mla_with_kvcache(inp.q, inp.k_cache, inp.block_table, inp.cache_seqlens, D_V, meta,
                                  out=torch.empty((4, 1, 16, D_V), dtype=torch.float16, device=DEVICE))
    with pytest.raises(ValueError, match="is_fp8_kvcache"):
        om.flash_mla_with_kvcache(inp.q, inp.k_cache, inp.block_table, inp.cache_seqlens, D_V, meta,
                                  indices=torch.zeros((4, 1, 64), dtype=torch.int32, device=DEVICE))


# ---------------------------------------------------------------------------------------------------
# Outputs
# ---------------------------------------------------------------------------------------------------
@gpu
@pytest.mark.parametrize("lse_contiguous", [False, True])
def test_caller_provided_out_and_lse(lse_contiguous):
    torch = _torch()
    case = Case(6, 4, 64, 2, 140, varlen=True, causal=True)
    inp = inputs_for(case, seed=22)
    out_buf, lse_buf = nan_out_buffers(case.b, case.s_q, case.h_q, inp.q.dtype, lse_contiguous=lse_contiguous)
    out, lse = decode(inp, True, out=out_buf, lse=lse_buf)
    assert out is out_buf and lse is lse_buf
    out_d, lse_d = decode(inp, True)
    torch.cuda.synchronize()
    assert torch.equal(out, out_d) and torch.equal(lse, lse_d)
    check_against_reference(inp, out, lse, True, "provided out/lse")


@gpu
def test_default_output_layout():
    case = Case(3, 2, 16, 1, 20)
    inp = inputs_for(case, seed=23)
    out, lse = decode(inp, False)
    assert out.is_contiguous() and out.shape == (3, 2, 16, D_V)
    # lse is flash_mla's transposed view of (b, s_q, h_q) storage.
    assert lse.shape == (3, 16, 2) and lse.stride() == (32, 1, 16)
    check_against_reference(inp, out, lse, False, "layout")


# ---------------------------------------------------------------------------------------------------
# CUDA graphs
# ---------------------------------------------------------------------------------------------------
@gpu
@pytest.mark.parametrize("s_q,h_q,h_kv,causal", [(2, 128, 1, True), (1, 16, 1, False), (4, 64, 8, True)])
def test_cuda_graph_capture_and_replay(s_q, h_q, h_kv, causal):
    """One decoding step captured whole: get_mla_metadata() and two "layers" sharing the schedule. Replay
    after changing cache_seqlens in place must give the results for the new lengths: the schedule is
    recomputed inside the graph."""
    torch = _torch()
    om = _openmla()
    lens1 = [300, 4096, 1, 0, 2000, 64, 65, 3000]
    lens2 = [4096, 0, 4096, 17, 1, 4000, 128, 5]
    clean = [4096] * len(lens1)  # every token either step may read holds data
    layer0 = make_inputs(len(lens1), s_q, h_q, h_kv, seqlens=lens1, clean_lens=clean, seed=24)
    g = torch.Generator(device=DEVICE).manual_seed(25)
    q1 = (torch.randn(layer0.q.shape, generator=g, device=DEVICE) / 10).clamp_(-1, 1).to(layer0.q.dtype)
    layer1 = Inputs(q1, layer0.k_cache, layer0.block_table, layer0.cache_seqlens)

    # Warm-up outside the capture (first-launch set-up of the kernels happens here, as in an engine).
    decode(layer0, causal)
    torch.cuda.synchronize()

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        meta, _ = om.get_mla_metadata()
        out0, lse0 = decode(layer0, causal, meta=meta)
        out1, lse1 = decode(layer1, causal, meta=meta)

    for step, lens in enumerate((lens1, lens2)):
        layer0.cache_seqlens.copy_(torch.tensor(lens, dtype=torch.int32))
        out0.fill_(float("nan"))
        out1.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        check_against_reference(layer0, out0, lse0, causal, f"graph layer 0 step {step}")
        check_against_reference(layer1, out1, lse1, causal, f"graph layer 1 step {step}")
        eager = decode(layer1, causal)
        torch.cuda.synchronize()
        assert torch.equal(eager[0], out1) and torch.equal(eager[1], lse1)


# ---------------------------------------------------------------------------------------------------
# The torch reference against the C++ CPU reference (no GPU needed)
# ---------------------------------------------------------------------------------------------------
def test_torch_reference_matches_cpu_reference():
    """dense_decode_ref.py (torch fp32) against openmla.reference (C++, double) on a tiny paged case with
    GQA, causal rows without keys, an empty request, NaN in unused rows and garbage block-table entries."""
    torch = pytest.importorskip("torch")
    np = pytest.importorskip("numpy")
    om = _openmla()
    reference = om.reference
    ref = _ref()
    gen = torch.Generator().manual_seed(26)
    b, s_q, h_q, h_kv, d_qk, d_v, page = 3, 3, 6, 2, 576, 512, 64
    lens = [130, 0, 2]
    num_blocks = 8
    q = (torch.randn((b, s_q, h_q, d_qk), generator=gen) / 10).to(torch.bfloat16)
    k = (torch.randn((num_blocks, page, h_kv, d_qk), generator=gen) / 10).to(torch.bfloat16)
    block_table = torch.tensor([[5, 1, 7, INVALID_PAGE], [INVALID_PAGE] * 4, [2, INVALID_PAGE, 0, 3]],
                               dtype=torch.int32)
    k[7, 2:] = float("nan")  # past token 130 of request 0
    k[2, 2:] = float("nan")  # past token 2 of request 2
    for p in (0, 3, 4, 6):
        k[p] = float("nan")  # pages no request uses
    seqlens = torch.tensor(lens, dtype=torch.int32)
    for causal in (False, True):
        t_out, t_lse = ref.dense_decode_ref(q, k, block_table, seqlens, d_v, causal=causal)
        # bf16 values handed over exactly as float32; the CPU reference accumulates in double.
        c_out, c_lse = reference.dense_decode(q.float().numpy(), k.float().numpy(), block_table.numpy(),
                                              seqlens.numpy(), head_dim_v=d_v, causal=causal)
        c_out = torch.from_numpy(np.asarray(c_out, dtype=np.float32))
        c_lse = torch.from_numpy(np.asarray(c_lse, dtype=np.float32))
        # The torch reference rounds out to bf16 once; compare in fp32 against the double reference.
        ref.check_is_allclose("out vs CPU reference", t_out.float(), c_out, abs_tol=1e-3, rel_tol=2.01 / 128,
                              cos_diff_tol=5e-6)
        ref.check_is_allclose("lse vs CPU reference", t_lse, c_lse, abs_tol=1e-5, rel_tol=1e-5)
        assert torch.isposinf(t_lse[1]).all()
        if causal:
            assert torch.isposinf(t_lse[2, :, 0]).all()  # L = 2 < s_q = 3: query 0 sees nothing
