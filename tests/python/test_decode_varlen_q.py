"""GPU tests of decode with per-request query lengths (flash_mla_with_kvcache(..., seqused_q=...)), dense and sparse.

q stays (b, s_q, h_q, d_qk) with s_q the largest length; request i has seqused_q[i] rows. Inputs as the dense and
sparse decode tests make them (NaN-poisoned cache tails and unused pages, garbage block-table entries and index
slots), plus: every query row past its request's length is NaN, and (sparse) its index row is garbage. Outputs are
NaN-filled before the call. Checked:

- against the torch fp32 reference of each request decoded alone with s_q = its length (dense: causal
  bottom-right per request) under the decode tolerances; rows past the length exactly out 0, lse +inf;
- full lengths (every seqused_q = s_q): dense bitwise equal to the uniform call;
- mixed lengths against uniform calls of the same requests;
- lengths outside [0, s_q] are clamped (bitwise equal to the clamped call); checked mode reports them;
- a CUDA graph captured once at the largest shapes (plan and two layers), replayed with other lengths (0 and 1
  among them) and other cache lengths: bitwise equal to eager calls, and to the reference.

Torch is imported inside the tests only: without torch or a Hopper GPU every test here is skipped (conftest.py).
"""
from __future__ import annotations

import random

import pytest

gpu = pytest.mark.gpu

D_V = 512
DEVICE = "cuda"


def _torch():
    import torch

    return torch


def _openmla():
    import openmla

    return openmla


def _dense():
    import test_dense_decode

    return test_dense_decode


def _sparse():
    import test_sparse_decode

    return test_sparse_decode


# ---------------------------------------------------------------------------------------------------
# Dense
# ---------------------------------------------------------------------------------------------------
def dense_inputs(b, s_q, h_q, h_kv, seqlens, used, dtype="bf16", seed=0, page=64):
    """Dense inputs (test_dense_decode.make_inputs) with the query rows past each request's length set to NaN.
    `page` != 64: the same cache re-paged (test_dense_decode_page_sizes does the same)."""
    torch = _torch()
    td = _dense()
    inp = td.make_inputs(b, s_q, h_q, h_kv, seqlens=seqlens, dtype=dtype, seed=seed)
    rows = torch.arange(s_q, device=DEVICE)[None, :] >= torch.tensor(used, device=DEVICE)[:, None]
    inp.q[rows] = float("nan")
    if page != 64:
        inp = repage(inp, page)
    return inp, torch.tensor(used, dtype=torch.int32, device=DEVICE)


def repage(inp, page):
    """The same logical cache with pages of `page` tokens (each 64-token page cut or merged), unused entries garbage."""
    torch = _torch()
    td = _dense()
    nb, p64, h_kv, d = inp.k_cache.shape
    b, cols = inp.block_table.shape
    tokens = cols * 64
    # Gather each request's logical tokens (garbage pages read as NaN), then write them into fresh pages in order.
    bt = inp.block_table.long().clamp(0, nb - 1)
    logical = inp.k_cache[bt].reshape(b, tokens, h_kv, d).clone()
    valid = inp.block_table != td.INVALID_PAGE
    logical[~valid.repeat_interleave(64, dim=1)] = float("nan")
    new_cols = tokens // page
    k = logical.reshape(b * new_cols, page, h_kv, d)
    perm = torch.randperm(b * new_cols, generator=torch.Generator().manual_seed(7)).to(DEVICE)
    k_cache = torch.empty_like(k)
    k_cache[perm] = k
    table = perm.view(b, new_cols).to(torch.int32)
    lens = inp.cache_seqlens.long()
    unused = torch.arange(new_cols, device=DEVICE)[None, :] * page >= lens[:, None]
    table = torch.where(unused, torch.full_like(table, td.INVALID_PAGE), table)
    return td.Inputs(q=inp.q, k_cache=k_cache, block_table=table, cache_seqlens=inp.cache_seqlens)


def dense_call(inp, used, causal, meta=None, **kwargs):
    om = _openmla()
    if meta is None:
        meta, _ = om.get_mla_metadata()
    return om.flash_mla_with_kvcache(inp.q, inp.k_cache, inp.block_table, inp.cache_seqlens, D_V, meta,
                                     causal=causal, seqused_q=used, **kwargs)


def dense_reference(inp, used, causal):
    """Each request decoded alone with s_q = its length; rows past it 0 / +inf."""
    import dense_decode_ref

    torch = _torch()
    b, s_q, h_q, _ = inp.q.shape
    out = torch.zeros((b, s_q, h_q, D_V), dtype=inp.q.dtype, device=DEVICE)
    lse = torch.full((b, h_q, s_q), float("inf"), dtype=torch.float32, device=DEVICE)
    for i, n in enumerate(used.clamp(0, s_q).tolist()):
        if n == 0:
            continue
        o, l = dense_decode_ref.dense_decode_ref(inp.q[i:i + 1, :n], inp.k_cache, inp.block_table[i:i + 1],
                                                 inp.cache_seqlens[i:i + 1], D_V, causal=causal)
        out[i, :n] = o[0]
        lse[i, :, :n] = l[0]
    return out, lse


def check_dense(inp, used, causal, out, lse, what=""):
    import dense_decode_ref

    torch = _torch()
    torch.cuda.synchronize()
    ref_out, ref_lse = dense_reference(inp, used, causal)
    dense_decode_ref.check_dense_decode(out, lse, ref_out, ref_lse, what=f" [{what}]")
    empty = torch.isposinf(ref_lse)
    assert bool(torch.isposinf(lse[empty]).all()), f"lse of empty rows is not +inf [{what}]"
    assert bool((out.transpose(1, 2)[empty] == 0).all()), f"out of empty rows is not exactly 0 [{what}]"


def nan_outputs(b, s_q, h_q, dtype):
    torch = _torch()
    out = torch.full((b, s_q, h_q, D_V), float("nan"), dtype=dtype, device=DEVICE)
    lse = torch.full((b, s_q, h_q), float("nan"), dtype=torch.float32, device=DEVICE).transpose(1, 2)
    return out, lse


DENSE_CASES = [
    # (b, s_q, h_q, h_kv, s_k, causal, dtype, page)
    (8, 4, 128, 1, 600, True, "bf16", 64),
    (6, 3, 16, 1, 300, True, "bf16", 64),
    (5, 2, 64, 1, 200, False, "bf16", 64),
    (7, 4, 32, 2, 333, True, "fp16", 64),
    (6, 3, 16, 1, 300, True, "bf16", 32),
    (4, 5, 128, 1, 256, True, "fp16", 128),
    (3, 4, 128, 1, 9000, True, "bf16", 64),  # long requests (one with 1 row): split into chunks, merged
    (3, 1, 16, 1, 100, True, "bf16", 64),    # s_q = 1: lengths 0 and 1 only
]


def _lengths(b, s_q, s_k, seed):
    """Cache lengths (one request shorter than s_q) and query lengths with 0, 1 and s_q among them."""
    rng = random.Random(seed)
    seqlens = [max(1, int(rng.gauss(s_k, s_k / 3))) for _ in range(b)]
    seqlens[-1] = max(1, s_q - 1)  # fewer keys than query rows: early rows see nothing (causal)
    used = [rng.randint(0, s_q) for _ in range(b)]
    used[0] = 0
    used[min(1, b - 1)] = 1
    used[-1] = s_q
    return seqlens, used


@gpu
@pytest.mark.parametrize("case", DENSE_CASES, ids=lambda c: "b{}-sq{}-hq{}-hkv{}-sk{}{}-{}-page{}".format(
    c[0], c[1], c[2], c[3], c[4], "-causal" if c[5] else "", c[6], c[7]))
def test_dense_matches_reference(case):
    b, s_q, h_q, h_kv, s_k, causal, dtype, page = case
    seqlens, used = _lengths(b, s_q, s_k, seed=b * 7 + s_q)
    inp, used_t = dense_inputs(b, s_q, h_q, h_kv, seqlens, used, dtype=dtype, seed=3, page=page)
    out_buf, lse_buf = nan_outputs(b, s_q, h_q, inp.q.dtype)
    out, lse = dense_call(inp, used_t, causal, out=out_buf, lse=lse_buf)
    assert out is out_buf and lse is lse_buf
    check_dense(inp, used_t, causal, out, lse, what=f"lengths {used}")


@gpu
@pytest.mark.parametrize("h_q,page", [(128, 64), (16, 64), (64, 32)])
def test_dense_full_lengths_equal_uniform_call(h_q, page):
    """Every request at s_q rows: the uniform call's results. Bitwise where both calls have the same partitions (all
    positions in one m-block: h_q 16); otherwise the varlen schedule has more partitions (a one-position problem's), so
    its split points, and the fp32 summation order, differ: within the decode tolerances."""
    import dense_decode_ref

    torch = _torch()
    om = _openmla()
    b, s_q = 6, 3
    seqlens, _ = _lengths(b, s_q, 700, seed=11)
    inp, used = dense_inputs(b, s_q, h_q, 1, seqlens, [s_q] * b, page=page)
    out, lse = dense_call(inp, used, True)
    meta, _ = om.get_mla_metadata()
    ref = om.flash_mla_with_kvcache(inp.q, inp.k_cache, inp.block_table, inp.cache_seqlens, D_V, meta, causal=True)
    torch.cuda.synchronize()
    if h_q * s_q <= 64:
        assert torch.equal(out, ref[0]) and torch.equal(lse, ref[1])
    else:
        dense_decode_ref.check_dense_decode(out, lse, ref[0], ref[1], what=" [full lengths vs uniform]")


@gpu
@pytest.mark.parametrize("h_q", [128, 16])
def test_dense_mixed_lengths_against_uniform_calls(h_q):
    """A batch of mixed lengths against, for each length n, a uniform s_q = n call of the requests that have it."""
    torch = _torch()
    om = _openmla()
    b, s_q = 9, 4
    seqlens, _ = _lengths(b, s_q, 900, seed=5)
    used_list = [0, 1, 2, 3, 4, 1, 4, 2, 3]
    inp, used = dense_inputs(b, s_q, h_q, 1, seqlens, used_list)
    out, lse = dense_call(inp, used, True)
    import dense_decode_ref

    for n in range(1, s_q + 1):
        idx = [i for i, u in enumerate(used_list) if u == n]
        sel = torch.tensor(idx, device=DEVICE)
        meta, _ = om.get_mla_metadata()
        u_out, u_lse = om.flash_mla_with_kvcache(inp.q[sel, :n].contiguous(), inp.k_cache, inp.block_table[sel],
                                                 inp.cache_seqlens[sel], D_V, meta, causal=True)
        torch.cuda.synchronize()
        dense_decode_ref.check_dense_decode(out[sel, :n], lse[sel][:, :, :n], u_out, u_lse, what=f" [length {n}]")


@gpu
def test_dense_out_of_range_lengths_are_clamped():
    torch = _torch()
    b, s_q = 5, 3
    seqlens, _ = _lengths(b, s_q, 400, seed=9)
    inp, _ = dense_inputs(b, s_q, 64, 1, seqlens, [s_q] * b)
    raw = torch.tensor([-5, 7, 2, 2 ** 31 - 1, -(2 ** 31)], dtype=torch.int32, device=DEVICE)
    clamped = raw.clamp(0, s_q)
    a = dense_call(inp, raw, True)
    c = dense_call(inp, clamped, True)
    torch.cuda.synchronize()
    assert torch.equal(a[0], c[0]) and torch.equal(a[1], c[1])
    check_dense(inp, clamped, True, a[0], a[1], what="clamped")


@gpu
def test_checked_mode_reports_a_length_past_s_q():
    torch = _torch()
    om = _openmla()
    b, s_q = 3, 2
    seqlens, _ = _lengths(b, s_q, 200, seed=1)
    inp, _ = dense_inputs(b, s_q, 16, 1, seqlens, [s_q] * b)
    used = torch.tensor([1, 5, 0], dtype=torch.int32, device=DEVICE)
    om.set_checked_mode(True)
    try:
        om.check_status()
        dense_call(inp, used, True)
        with pytest.raises(ValueError, match=r"seqused_q'\[1\] is 5, past s_q = 2"):
            om.check_status()
    finally:
        om.set_checked_mode(False)


@gpu
def test_checked_mode_accepts_a_valid_varlen_call():
    """Checked mode checks a per-request schedule against the lengths it was planned from (schedule.varlen_lengths):
    a valid call, lengths 0 and s_q among them, reports nothing, and the output is the unchecked call's."""
    torch = _torch()
    om = _openmla()
    b, s_q = 4, 3
    seqlens, _ = _lengths(b, s_q, 300, seed=4)
    inp, _ = dense_inputs(b, s_q, 64, 1, seqlens, [s_q] * b)
    used = torch.tensor([3, 0, 1, 2], dtype=torch.int32, device=DEVICE)
    plain = dense_call(inp, used, True)
    om.set_checked_mode(True)
    try:
        om.check_status()
        checked = dense_call(inp, used, True)
        torch.cuda.synchronize()
        om.check_status()
    finally:
        om.set_checked_mode(False)
    assert torch.equal(plain[0], checked[0]) and torch.equal(plain[1], checked[1])


@gpu
@pytest.mark.parametrize("h_q,s_q", [(128, 3), (16, 4)])
def test_dense_cuda_graph_replay_with_other_lengths(h_q, s_q):
    """One step (plan + two layers) captured at (b, s_q); replays with other query lengths (0 and 1 among them) and
    other cache lengths give the eager results bit for bit, and the reference's."""
    torch = _torch()
    om = _openmla()
    b = 6
    seqlens, used = _lengths(b, s_q, 500, seed=21)
    layers = [dense_inputs(b, s_q, h_q, 1, seqlens, [s_q] * b, seed=s)[0] for s in (1, 2)]
    for layer in layers[1:]:  # one step: the layers share the lengths tensors
        layer.cache_seqlens = layers[0].cache_seqlens
    used_t = torch.tensor(used, dtype=torch.int32, device=DEVICE)
    dense_call(layers[0], used_t, True)  # warm-up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        meta, _ = om.get_mla_metadata()
        outs = [dense_call(layer, used_t, True, meta=meta) for layer in layers]
    steps = [used, [0] * b, [1] * b, [s_q] * b, [(i * 5 + 1) % (s_q + 1) for i in range(b)]]
    for k, lens in enumerate(steps):
        used_t.copy_(torch.tensor(lens, dtype=torch.int32))
        if k == 4:  # other cache lengths too (within each request's clean tokens)
            new = [max(1, n - 37 * (i + 1)) for i, n in enumerate(seqlens)]
            layers[0].cache_seqlens.copy_(torch.tensor(new, dtype=torch.int32))
        for out, lse in outs:
            out.fill_(float("nan"))
            lse.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        for i, (out, lse) in enumerate(outs):
            check_dense(layers[i], used_t, True, out, lse, what=f"graph step {k} layer {i} lengths {lens}")
            eager = dense_call(layers[i], used_t, True)
            torch.cuda.synchronize()
            assert torch.equal(eager[0], out) and torch.equal(eager[1], lse), f"step {k} layer {i}"


@gpu
def test_dense_api_errors():
    torch = _torch()
    om = _openmla()
    b, s_q = 3, 2
    seqlens, _ = _lengths(b, s_q, 200, seed=1)
    inp, used = dense_inputs(b, s_q, 16, 1, seqlens, [s_q] * b)
    # Tensor-style metadata has no per-request query lengths.
    md, ns = om.get_mla_metadata(inp.cache_seqlens, s_q * 16, 1)
    with pytest.raises(ValueError, match="object style"):
        om.flash_mla_with_kvcache(inp.q, inp.k_cache, inp.block_table, inp.cache_seqlens, D_V, md, ns,
                                  causal=True, seqused_q=used)
    # One object serves calls of one kind.
    meta, _ = om.get_mla_metadata()
    dense_call(inp, used, True, meta=meta)
    with pytest.raises(ValueError, match="seqused_q"):
        om.flash_mla_with_kvcache(inp.q, inp.k_cache, inp.block_table, inp.cache_seqlens, D_V, meta, causal=True)
    meta, _ = om.get_mla_metadata()
    om.flash_mla_with_kvcache(inp.q, inp.k_cache, inp.block_table, inp.cache_seqlens, D_V, meta, causal=True)
    with pytest.raises(ValueError, match="seqused_q"):
        dense_call(inp, used, True, meta=meta)
    # Not with batch invariance.
    with pytest.raises(NotImplementedError, match="batch_invariant"):
        dense_call(inp, used, True, meta=om.get_mla_metadata(batch_invariant=True)[0])
    # The lengths tensor itself.
    for bad, match in ((used.to(torch.int64), "seqused_q"), (used[:2], "seqused_q"), (used.cpu(), "seqused_q")):
        with pytest.raises((ValueError, TypeError), match=match):
            dense_call(inp, bad, True)
    with pytest.raises(TypeError, match="seqused_q"):
        dense_call(inp, [1, 2, 0], True)


# ---------------------------------------------------------------------------------------------------
# Sparse
# ---------------------------------------------------------------------------------------------------
def sparse_case(layout, b, s_q, h_q, topk=2048, page=64, extra=False, lens=True):
    ts = _sparse()
    main = ts.Sel(s_k=topk * 2 if topk >= 512 else 512, topk=topk, page=page, lens=lens)
    ex = ts.Sel(s_k=512, topk=128, page=61, lens=True) if extra else None
    return ts.Case(layout, b, s_q, h_q, main, ex, sink="random" if extra else "none")


def sparse_inputs(case, used, seed=0):
    """test_sparse_decode's inputs with the rows past each request's length poisoned: q NaN, indices garbage."""
    torch = _torch()
    ts = _sparse()
    inp = ts.make_inputs(case, seed=seed)
    rows = torch.arange(case.s_q, device=DEVICE)[None, :] >= torch.tensor(used, device=DEVICE)[:, None]
    inp.q[rows] = float("nan")
    gen = torch.Generator(device=DEVICE).manual_seed(seed + 99)
    for paged in (inp.main, inp.extra):
        if paged is None:
            continue
        num_tokens = paged.values.shape[0] * paged.values.shape[1]
        garbage = ts.garbage_indices(paged.indices.shape, num_tokens, gen).to(torch.int32)
        paged.indices[rows] = garbage[rows]
    return inp, torch.tensor(used, dtype=torch.int32, device=DEVICE)


def sparse_call(inp, used, meta=None, **kwargs):
    return _sparse().decode(inp, meta=meta, seqused_q=used, **kwargs)


def check_sparse(inp, used, out, lse, what=""):
    import sparse_decode_ref

    torch = _torch()
    torch.cuda.synchronize()
    ts = _sparse()
    ref_out, ref_lse = ts.reference(inp)
    rows = torch.arange(inp.case.s_q, device=DEVICE)[None, :] >= used.clamp(0, inp.case.s_q).long()[:, None]
    ref_out[rows] = 0
    ref_lse.transpose(1, 2)[rows] = float("inf")
    sparse_decode_ref.check_sparse_decode(out, lse, ref_out, ref_lse, what=f" [{what}]")
    empty = torch.isposinf(ref_lse)
    assert bool(torch.isposinf(lse[empty]).all()), f"lse of empty rows is not +inf [{what}]"
    assert bool((out.transpose(1, 2)[empty] == 0).all()), f"out of empty rows is not exactly 0 [{what}]"


SPARSE_CASES = [
    ("v32", 6, 3, 128, 2048, 64, False),   # crossover pairs
    ("v32", 5, 4, 64, 576, 61, False),
    ("model1", 4, 3, 128, 512, 64, True),  # extra cache, sink
    ("v32", 3, 2, 16, 2048, 64, False),
]


@gpu
@pytest.mark.parametrize("case", SPARSE_CASES, ids=lambda c: "{}-b{}-sq{}-hq{}-topk{}-page{}{}".format(
    c[0], c[1], c[2], c[3], c[4], c[5], "-extra" if c[6] else ""))
def test_sparse_matches_reference(case):
    layout, b, s_q, h_q, topk, page, extra = case
    c = sparse_case(layout, b, s_q, h_q, topk, page, extra)
    used = [random.Random(b + s_q).randint(0, s_q) for _ in range(b)]
    used[0], used[1], used[-1] = 0, 1, s_q
    inp, used_t = sparse_inputs(c, used, seed=4)
    out_buf, lse_buf = _sparse().nan_outputs(c)
    out, lse = sparse_call(inp, used_t, out=out_buf, lse=lse_buf)
    assert out is out_buf and lse is lse_buf
    check_sparse(inp, used_t, out, lse, what=f"lengths {used}")


@gpu
@pytest.mark.parametrize("h_q", [128, 64])
def test_sparse_full_lengths_against_uniform_call(h_q):
    import sparse_decode_ref

    torch = _torch()
    c = sparse_case("v32", 4, 3, h_q)
    inp, used = sparse_inputs(c, [3] * 4)
    out, lse = sparse_call(inp, used)
    u_out, u_lse = _sparse().decode(inp)
    torch.cuda.synchronize()
    sparse_decode_ref.check_sparse_decode(out, lse, u_out, u_lse, what=" [full lengths vs uniform]")


@gpu
def test_sparse_cuda_graph_replay_with_other_lengths():
    torch = _torch()
    om = _openmla()
    c = sparse_case("v32", 5, 3, 128)
    inp, used_t = sparse_inputs(c, [3, 1, 0, 2, 3])
    sparse_call(inp, used_t)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        meta, _ = om.get_mla_metadata()
        out, lse = sparse_call(inp, used_t, meta=meta)
    for k, lens in enumerate(([3, 1, 0, 2, 3], [0] * 5, [1] * 5, [3] * 5, [2, 0, 3, 1, 1])):
        used_t.copy_(torch.tensor(lens, dtype=torch.int32))
        if k == 4:  # shorter top-k lengths too (longer ones would select poisoned tokens)
            inp.main.lengths.copy_(inp.main.lengths // 3)
        out.fill_(float("nan"))
        lse.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        check_sparse(inp, used_t, out, lse, what=f"graph step {k} lengths {lens}")
        eager = sparse_call(inp, used_t)
        torch.cuda.synchronize()
        assert torch.equal(eager[0], out) and torch.equal(eager[1], lse), f"step {k}"


@gpu
def test_sparse_view_rules():
    """q, indices, out and lse must allow the one-token-per-request view; the error names the argument."""
    torch = _torch()
    c = sparse_case("v32", 3, 2, 64, topk=576)
    inp, used = sparse_inputs(c, [2, 1, 0])
    wide = torch.empty((3, 4, 64, 576), dtype=torch.bfloat16, device=DEVICE)[:, :2]
    wide.copy_(inp.q)
    with pytest.raises(ValueError, match="'q'"):
        sparse_call(inp, used, q=wide)


@gpu
def test_dense_packed_layout_recipe_of_the_integration_guide():
    """docs/integration.md's packed -> padded gather and padded -> packed scatter, under a CUDA graph: the packed
    rows equal the padded call's rows of each request, bit for bit, and the reference."""
    torch = _torch()
    om = _openmla()
    b, s_max, H = 5, 4, 16
    seqlens, used = _lengths(b, s_max, 300, seed=31)
    inp, used_t = dense_inputs(b, s_max, H, 1, seqlens, used)
    total = sum(used)
    starts_list = [sum(used[:i]) for i in range(b + 1)]
    query_start_loc = torch.tensor(starts_list, dtype=torch.int32, device=DEVICE)
    q = torch.cat([inp.q[i, :n] for i, n in enumerate(used)] + [inp.q[:0, 0]], dim=0)  # (total, H, 576)

    def step():
        starts = query_start_loc[:-1]
        seqused_q = (query_start_loc[1:] - starts).to(torch.int32)
        rows = starts[:, None] + torch.arange(s_max, device=q.device)
        valid = torch.arange(s_max, device=q.device)[None, :] < seqused_q[:, None]
        q_pad = q[rows.clamp(max=q.shape[0] - 1)]
        meta, _ = om.get_mla_metadata()
        out, lse = om.flash_mla_with_kvcache(q_pad, inp.k_cache, inp.block_table, inp.cache_seqlens, D_V, meta,
                                             causal=True, seqused_q=seqused_q)
        dest = torch.where(valid, rows, q.shape[0]).reshape(-1)
        out_packed = q.new_empty((q.shape[0] + 1, H, D_V)).index_copy_(0, dest, out.reshape(-1, H, D_V))[:-1]
        return out, lse, out_packed

    step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        g_out, g_lse, g_packed = step()
    graph.replay()
    torch.cuda.synchronize()
    check_dense(inp, used_t, True, g_out, g_lse, what="packed recipe")
    expect = torch.cat([g_out[i, :n] for i, n in enumerate(used)], dim=0)
    assert g_packed.shape == (total, H, D_V) and torch.equal(g_packed, expect)
