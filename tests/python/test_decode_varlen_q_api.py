"""Argument checking of decode with per-request query lengths (problem varlen_q, seqused_q), without a GPU.

The binding's C++ checks run before any CUDA call, so bad calls are exercised with the DLPack capsules of
test_decode_api.py that claim cuda:0 over host memory (never dereferenced: every call here is rejected, or only sizes
its workspace). Each test breaks one thing and expects the error to name it.
"""
import pytest

from openmla import _openmla as C

import test_decode_api as api
from test_decode_api import fake_cuda

pytestmark = api.pytestmark

NUM_SMS = 132


def dense_problem(**overrides):
    p = dict(batch=4, s_q=3, h_q=16, h_kv=1, d_qk=576, d_v=512, page_block_size=64, cache_format="bf16", causal=True,
             num_sms=NUM_SMS, varlen_q=True)
    p.update(overrides)
    return p


def sparse_problem(**overrides):
    p = dict(sparse=True, batch=4, s_q=3, h_q=64, d_qk=576, d_v=512, page_block_size=64, cache_format="fp8_v32",
             topk=128, num_sms=NUM_SMS, varlen_q=True)
    p.update(overrides)
    return p


def test_workspace_sizes():
    d = C.get_decode_workspace_sizes(**dense_problem())
    u = C.get_decode_workspace_sizes(**dense_problem(varlen_q=False))
    assert d["varlen_ints"] == 4 and u["varlen_ints"] == 0
    assert {k: v for k, v in d.items() if k != "varlen_ints"} == {k: v for k, v in u.items() if k != "varlen_ints"}
    # Dense: the partitions of a one-position problem (h_q 128, s_q 3: 6 m-blocks, 22 partitions; varlen 66).
    d = C.get_decode_workspace_sizes(**dense_problem(h_q=128))
    u = C.get_decode_workspace_sizes(**dense_problem(h_q=128, varlen_q=False))
    assert (u["num_sm_parts"], d["num_sm_parts"]) == (22, 66)
    assert d["partial_rows"] == (4 + 66) * 3 * 128 and d["metadata_ints"] == 66 * 8
    # Sparse: the sizes of b * s_q one-token requests, and one length per token (two with an extra cache).
    s = C.get_decode_workspace_sizes(**sparse_problem())
    flat = C.get_decode_workspace_sizes(**sparse_problem(varlen_q=False, batch=12, s_q=1))
    assert s["varlen_ints"] == 12
    assert {k: v for k, v in s.items() if k != "varlen_ints"} == {k: v for k, v in flat.items() if k != "varlen_ints"}
    e = C.get_decode_workspace_sizes(**sparse_problem(extra_topk=64, extra_page_block_size=64))
    assert e["varlen_ints"] == 24 and e["num_splits_ints"] == 13


def test_not_with_batch_invariant():
    for p in (dense_problem(batch_invariant=True, max_blocks_per_seq=8), sparse_problem(batch_invariant=True)):
        with pytest.raises(NotImplementedError, match="varlen_q.*batch_invariant"):
            C.get_decode_workspace_sizes(**p)


def test_dense_not_with_pages_below_16():
    with pytest.raises(NotImplementedError, match="'problem.page_block_size'.*16"):
        C.get_decode_workspace_sizes(**dense_problem(page_block_size=8))
    assert C.get_decode_workspace_sizes(**dense_problem(page_block_size=16))["varlen_ints"] == 4


def _plan_args(p, sizes, **overrides):
    b = p["batch"]
    make = dict(
        cache_seqlens=lambda: None if p.get("sparse") else fake_cuda((b,), "int32"),
        tile_scheduler_metadata=lambda: fake_cuda((sizes["num_sm_parts"], 8), "int32"),
        num_splits=lambda: fake_cuda((sizes["num_splits_ints"],), "int32"),
        seqused_q=lambda: fake_cuda((b,), "int32"),
        varlen_lengths=lambda: fake_cuda((sizes["varlen_ints"],), "int32"),
    )
    return {k: overrides[k] if k in overrides else f() for k, f in make.items()}


@pytest.mark.parametrize("family", ["dense", "sparse"])
@pytest.mark.parametrize("name,bad,match", [
    ("seqused_q", None, r"'seqused_q' is required"),
    ("seqused_q", "int64", r"'seqused_q'"),
    ("seqused_q", "short", r"'seqused_q'"),
    ("seqused_q", "host", r"'seqused_q'"),
    ("varlen_lengths", None, r"'schedule.varlen_lengths' is required"),
    ("varlen_lengths", "short", r"'schedule.varlen_lengths' has"),
    ("varlen_lengths", "int64", r"'schedule.varlen_lengths'"),
])
def test_plan_names_the_bad_argument(family, name, bad, match):
    import numpy as np

    p = dense_problem() if family == "dense" else sparse_problem()
    sizes = C.get_decode_workspace_sizes(**p)
    n = p["batch"] if name == "seqused_q" else sizes["varlen_ints"]
    value = {None: None, "int64": lambda: fake_cuda((n,), "int64"), "short": lambda: fake_cuda((n - 1,), "int32"),
             "host": lambda: np.zeros(n, dtype=np.int32)}[bad]
    args = _plan_args(p, sizes, **{name: value() if callable(value) else value})
    with pytest.raises(ValueError, match=match):
        C.plan_decode(args["cache_seqlens"], args["tile_scheduler_metadata"], args["num_splits"],
                      seqused_q=args["seqused_q"], varlen_lengths=args["varlen_lengths"], **p)


def test_plan_without_varlen_rejects_seqused_q():
    p = dense_problem(varlen_q=False)
    sizes = C.get_decode_workspace_sizes(**p)
    args = _plan_args(p, sizes)
    with pytest.raises(ValueError, match=r"'seqused_q' was given but problem.varlen_q is false"):
        C.plan_decode(args["cache_seqlens"], args["tile_scheduler_metadata"], args["num_splits"],
                      seqused_q=args["seqused_q"], **p)


def test_dense_call_needs_seqused_q():
    p = dense_problem()
    args = api.dense_args({k: v for k, v in p.items() if k != "varlen_q"})
    with pytest.raises(ValueError, match=r"'seqused_q' is required"):
        C.dense_decode(*args, **p)


@pytest.mark.parametrize("bad", ["int64", "short", "2d"])
def test_dense_call_names_a_bad_seqused_q(bad):
    p = dense_problem()
    b = p["batch"]
    used = {"int64": fake_cuda((b,), "int64"), "short": fake_cuda((b - 1,), "int32"),
            "2d": fake_cuda((b, 1), "int32")}[bad]
    args = api.dense_args({k: v for k, v in p.items() if k != "varlen_q"})
    with pytest.raises(ValueError, match=r"'seqused_q'"):
        C.dense_decode(*args, seqused_q=used, **p)


def test_dense_call_without_varlen_rejects_seqused_q():
    p = dense_problem(varlen_q=False)
    args = api.dense_args(p)
    with pytest.raises(ValueError, match=r"'seqused_q' was given but problem.varlen_q is false"):
        C.dense_decode(*args, seqused_q=fake_cuda((p["batch"],), "int32"), **p)


def _sparse_args(p, **overrides):
    b, s_q, h_q, topk = p["batch"], p["s_q"], p["h_q"], p["topk"]
    sizes = C.get_decode_workspace_sizes(**p)
    make = dict(
        q=lambda: fake_cuda((b, s_q, h_q, 576), "bf16"),
        k_cache=lambda: fake_cuda((10, 64, 1, 656), "uint8"),
        indices=lambda: fake_cuda((b, s_q, topk), "int32"),
        metadata=lambda: fake_cuda((sizes["num_sm_parts"], 8), "int32"),
        num_splits=lambda: fake_cuda((sizes["num_splits_ints"],), "int32"),
        partial_o=lambda: fake_cuda((sizes["partial_rows"], 512), "fp32"),
        partial_lse=lambda: fake_cuda((sizes["partial_rows"],), "fp32"),
        out=lambda: fake_cuda((b, s_q, h_q, 512), "bf16"),
        lse=lambda: fake_cuda((b, h_q, s_q), "fp32", strides=[s_q * h_q, 1, h_q]),
    )
    pos = [overrides[k] if k in overrides else f() for k, f in make.items()]
    kw = dict(seqused_q=overrides.get("seqused_q", fake_cuda((b,), "int32")),
              varlen_lengths=overrides.get("varlen_lengths", fake_cuda((sizes["varlen_ints"],), "int32")))
    return pos, kw


@pytest.mark.parametrize("name,value,match", [
    ("q", lambda p: fake_cuda((4, 3, 64, 576), "bf16", strides=[4 * 64 * 576, 64 * 576, 576, 1]), r"'q' has strides"),
    ("indices", lambda p: fake_cuda((4, 3, 128), "int32", strides=[4 * 128, 128, 1]), r"'indices' has strides"),
    ("lse", lambda p: fake_cuda((4, 64, 3), "fp32"), r"'lse' has strides"),
    ("q", lambda p: fake_cuda((4, 2, 64, 576), "bf16"), r"'q'.*s_q"),
    ("indices", lambda p: fake_cuda((4, 2, 128), "int32"), r"'indices'"),
    ("seqused_q", lambda p: fake_cuda((5,), "int32"), r"'seqused_q'"),
    ("seqused_q", lambda p: None, r"'seqused_q' is required"),
    ("varlen_lengths", lambda p: fake_cuda((11,), "int32"), r"'schedule.varlen_lengths' has 11"),
])
def test_sparse_call_names_the_bad_argument(name, value, match):
    p = sparse_problem()
    pos, kw = _sparse_args(p, **{name: value(p)})
    with pytest.raises(ValueError, match=match):
        C.sparse_decode(*pos, **kw, **p)
