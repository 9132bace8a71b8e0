"""The per-call host path of flash_mla_with_kvcache (python/csrc/bind_decode_step.cpp): one entry per schedule style.

GPU tests (marker `gpu`): each entry against the same call prepared in Python first (checks, torch outputs and stream,
tensors read through __dlpack__: what torch without the DLPack exchange API gets, forced by switching the exchange-API
path off) bitwise, for dense and sparse, with and without caller outputs; the tensor style
(get_mla_metadata(cache_seqlens, ...)) against the object style bitwise; no allocation on a call whose outputs
and schedule are given; torch.set_default_device("cuda"); every check still raised, and an entry that cannot serve a
call raising the error of the layer's checks; cross-stream use of one schedule; threads on two streams. Without a
GPU: what the binding reads from a CPU tensor.
"""
import threading

import pytest

torch = pytest.importorskip("torch", reason="the host path tests need PyTorch, which is not installed here")

from dense_decode_ref import check_dense_decode, dense_decode_ref  # noqa: E402

import openmla  # noqa: E402
from openmla import _openmla as C  # noqa: E402
from openmla import decode as dec  # noqa: E402

gpu = pytest.mark.gpu
D_QK, D_V, PAGE = 576, 512, 64


# ---------------------------------------------------------------------------------------------------------------
# Without a GPU: the tensor reader
# ---------------------------------------------------------------------------------------------------------------
def test_reader_takes_torch_tensors_through_the_exchange_api():
    x = torch.zeros((4, 2, 16, 576), dtype=torch.bfloat16)
    assert dec._IN_PLACE == hasattr(torch.Tensor, "__dlpack_c_exchange_api__")
    ptr, shape, strides, dtype, device, index, in_place = C.read_tensor(x.transpose(1, 2)[1:])
    assert ptr == x.transpose(1, 2)[1:].data_ptr()
    assert shape == (3, 16, 2, 576) and strides == (18432, 576, 9216, 1)
    assert (dtype, device, in_place) == ("bfloat16", "cpu", dec._IN_PLACE)
    assert C.read_tensor(torch.zeros(3, dtype=torch.float8_e4m3fn))[3] == "float8_e4m3fn"


def test_reader_errors_name_the_argument():
    with pytest.raises(TypeError, match=r"argument 'tensor' must be a tensor"):
        C.read_tensor([1, 2, 3])
    with pytest.raises(ValueError, match=r"argument 'tensor' has a dtype OpenMLA does not handle"):
        C.read_tensor(torch.zeros(3, dtype=torch.complex64))
    with pytest.raises(ValueError, match=r"argument 'tensor' has 7 dimensions; at most 6"):
        C.read_tensor(torch.zeros((1,) * 7))


def test_fresh_outputs_share_one_allocation_and_outlive_each_other():
    """The (out, lse) the per-call entries allocate come from one framework allocation (one allocator call): each is
    its own tensor of flash_mla's layout at a 256-byte offset, not overlapping the other, and either may outlive
    the other. On the CPU here; test_fresh_outputs_are_released_with_the_last_of_them checks the GPU's memory."""
    like = torch.zeros(1, dtype=torch.float16)
    out, lse = C._new_decode_outputs(like, 3, 2, 16, D_V)
    assert out.shape == (3, 2, 16, D_V) and out.is_contiguous() and out.dtype == torch.float16
    assert lse.shape == (3, 16, 2) and lse.stride() == (32, 1, 16) and lse.dtype == torch.float32
    assert out.data_ptr() % 16 == 0 and (lse.data_ptr() - out.data_ptr()) % 256 == 0
    assert lse.data_ptr() >= out.data_ptr() + out.numel() * out.element_size()
    out.fill_(1.0)
    lse.fill_(2.0)
    assert bool((out == 1).all()) and bool((lse == 2).all())
    del out
    lse.add_(1.0)
    assert bool((lse == 3).all())
    out, lse = C._new_decode_outputs(like, 1, 1, 1, D_V)
    del lse
    out.fill_(4.0)
    assert bool((out == 4).all())


# ---------------------------------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------------------------------
def dense_inputs(b=6, s_q=2, h_q=128, h_kv=1, s_k=3000, seed=0, dtype=torch.bfloat16):
    g = torch.Generator(device="cuda").manual_seed(seed)
    pages = -(-s_k // PAGE)
    q = (torch.randn((b, s_q, h_q, D_QK), generator=g, device="cuda") / 10).clamp_(-1, 1).to(dtype)
    k = (torch.randn((b * pages, PAGE, h_kv, D_QK), generator=g, device="cuda") / 10).clamp_(-1, 1).to(dtype)
    bt = torch.randperm(b * pages, device="cuda").to(torch.int32).view(b, pages)
    lens = torch.randint(1, s_k + 1, (b,), generator=g, device="cuda", dtype=torch.int32)
    lens[0] = s_k  # one long request: it is split
    return q, k, bt, lens


def sparse_inputs(b=4, s_q=2, h_q=128, topk=512, blocks=64, seed=1, extra=False):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn((b, s_q, h_q, D_QK), generator=g, device="cuda").clamp_(-1, 1).to(torch.bfloat16)
    kv = (torch.randn((blocks, PAGE, 1, D_QK), generator=g, device="cuda") / 10).clamp_(-1, 1).to(torch.bfloat16)
    cache = openmla.quantize_kv_cache(kv, "v32")
    idx = torch.randint(-1, blocks * PAGE, (b, s_q, topk), generator=g, device="cuda", dtype=torch.int32)
    lengths = torch.randint(0, topk + 1, (b,), generator=g, device="cuda", dtype=torch.int32)
    sink = torch.randn((h_q,), generator=g, device="cuda")
    kwargs = dict(is_fp8_kvcache=True, indices=idx, attn_sink=sink, topk_length=lengths)
    if extra:
        kwargs.update(extra_k_cache=cache[: blocks // 2], extra_indices_in_kvcache=torch.randint(
            0, blocks // 2 * PAGE, (b, s_q, 100), generator=g, device="cuda", dtype=torch.int32))
    return q, cache, kwargs


def without_exchange_api(monkeypatch):
    """Switches the exchange-API path off: Python checks every call and gives the entry torch's outputs and stream
    first (the path of torch without the DLPack exchange API)."""
    monkeypatch.setattr(dec, "_IN_PLACE", False)


def layers(q, n=3):
    return [q] + [(q.float() * (0.5 + 0.25 * i)).to(q.dtype) for i in range(1, n)]


# ---------------------------------------------------------------------------------------------------------------
# An entry called at once == the same call prepared in Python first, bitwise
# ---------------------------------------------------------------------------------------------------------------
@gpu
@pytest.mark.parametrize("with_outputs", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_dense_entry_equals_the_call_prepared_in_python(monkeypatch, with_outputs, dtype):
    q, k, bt, lens = dense_inputs(dtype=dtype)

    def step():
        meta, _ = openmla.get_mla_metadata()
        results = []
        for ql in layers(q):
            out = lse = None
            if with_outputs:
                out = torch.full((*q.shape[:3], D_V), float("nan"), dtype=dtype, device="cuda")
                lse = torch.full((q.shape[0], q.shape[2], q.shape[1]), float("nan"), device="cuda")
            results.append(openmla.flash_mla_with_kvcache(ql, k, bt, lens, D_V, meta, causal=True, out=out, lse=lse))
            if with_outputs:
                assert results[-1][0] is out and results[-1][1] is lse
        return results, meta

    fast, meta = step()
    assert meta._step is not None
    with monkeypatch.context() as m:
        without_exchange_api(m)
        slow, _ = step()
    torch.cuda.synchronize()
    for (o1, l1), (o2, l2) in zip(fast, slow):
        assert torch.equal(o1, o2) and torch.equal(l1, l2)
        assert l1.stride() == l2.stride()
    ref_out, ref_lse = dense_decode_ref(q, k, bt, lens, causal=True)
    check_dense_decode(fast[0][0], fast[0][1], ref_out, ref_lse, "per-call path")


@gpu
@pytest.mark.parametrize("extra", [False, True])
def test_sparse_entry_equals_the_call_prepared_in_python(monkeypatch, extra):
    q, cache, kwargs = sparse_inputs(extra=extra)

    def step():
        meta, _ = openmla.get_mla_metadata()
        return [openmla.flash_mla_with_kvcache(ql, cache, None, None, D_V, meta, **kwargs) for ql in layers(q)]

    fast = step()
    with monkeypatch.context() as m:
        without_exchange_api(m)
        slow = step()
    torch.cuda.synchronize()
    for (o1, l1), (o2, l2) in zip(fast, slow):
        assert torch.equal(o1, o2) and torch.equal(l1, l2)


@gpu
def test_fresh_lse_has_flash_mlas_layout_on_the_per_call_path():
    q, k, bt, lens = dense_inputs(b=3, s_q=2, h_q=16, s_k=100)
    meta, _ = openmla.get_mla_metadata()
    openmla.flash_mla_with_kvcache(q, k, bt, lens, D_V, meta)
    out, lse = openmla.flash_mla_with_kvcache(q, k, bt, lens, D_V, meta)  # planned: the per-call path
    assert out.is_contiguous() and out.shape == (3, 2, 16, D_V) and out.dtype == q.dtype
    assert lse.shape == (3, 16, 2) and lse.stride() == (32, 1, 16) and lse.dtype == torch.float32
    assert out.device == q.device and lse.device == q.device


@gpu
def test_fresh_outputs_are_released_with_the_last_of_them():
    q, k, bt, lens = dense_inputs(b=4, s_q=1, h_q=128, s_k=500)
    meta, _ = openmla.get_mla_metadata()
    openmla.flash_mla_with_kvcache(q, k, bt, lens, D_V, meta)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    for _ in range(50):
        openmla.flash_mla_with_kvcache(q, k, bt, lens, D_V, meta)
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == base
    out, lse = openmla.flash_mla_with_kvcache(q, k, bt, lens, D_V, meta)
    expected = openmla.flash_mla_with_kvcache(q, k, bt, lens, D_V, meta, out=torch.empty_like(out),
                                              lse=torch.empty_like(lse))
    held = torch.cuda.memory_allocated()
    assert held > base
    del out
    assert torch.cuda.memory_allocated() == held  # one allocation: lse keeps out's memory
    assert torch.equal(lse, expected[1])  # and stays valid
    del lse
    assert torch.cuda.memory_allocated() < held
    del expected
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == base


# ---------------------------------------------------------------------------------------------------------------
# Tensor style == object style, bitwise
# ---------------------------------------------------------------------------------------------------------------
@gpu
@pytest.mark.parametrize("s_q,h_q,h_kv", [(1, 128, 1), (2, 64, 1), (4, 64, 8)])
def test_dense_tensor_style_equals_object_style(s_q, h_q, h_kv):
    q, k, bt, lens = dense_inputs(b=9, s_q=s_q, h_q=h_q, h_kv=h_kv, s_k=5000)
    meta, _ = openmla.get_mla_metadata()
    objects = [openmla.flash_mla_with_kvcache(ql, k, bt, lens, D_V, meta, causal=True) for ql in layers(q)]
    tile_md, num_splits = openmla.get_mla_metadata(lens, s_q * h_q // h_kv, h_kv)
    assert tile_md.dtype == torch.int32 and num_splits.dtype == torch.int32 and num_splits.shape == (10,)
    assert tile_md.shape == meta.tile_scheduler_metadata.shape
    tensors = [openmla.flash_mla_with_kvcache(ql, k, bt, lens, D_V, tile_md, num_splits, causal=True)
               for ql in layers(q)]
    # num_heads_q given: the same schedule.
    tile_md2, num_splits2 = openmla.get_mla_metadata(lens, s_q * h_q // h_kv, h_kv, h_q)
    torch.cuda.synchronize()
    assert torch.equal(tile_md, meta.tile_scheduler_metadata) and torch.equal(num_splits, meta.num_splits)
    assert torch.equal(tile_md2, tile_md) and torch.equal(num_splits2, num_splits)
    for (o1, l1), (o2, l2) in zip(objects, tensors):
        assert torch.equal(o1, o2) and torch.equal(l1, l2)


@gpu
def test_sparse_tensor_style_equals_object_style():
    q, cache, kwargs = sparse_inputs()
    kwargs.pop("topk_length")  # flash_mla's older metadata API has no per-request lengths
    b, s_q, h_q = q.shape[:3]
    topk = kwargs["indices"].shape[-1]
    meta, _ = openmla.get_mla_metadata()
    objects = [openmla.flash_mla_with_kvcache(ql, cache, None, None, D_V, meta, **kwargs) for ql in layers(q)]
    lens = torch.ones((b,), dtype=torch.int32, device="cuda")  # only its length counts in sparse mode
    tile_md, num_splits = openmla.get_mla_metadata(lens, s_q * h_q, 1, h_q, True, topk)
    tensors = [openmla.flash_mla_with_kvcache(ql, cache, None, None, D_V, tile_md, num_splits, **kwargs)
               for ql in layers(q)]
    torch.cuda.synchronize()
    assert torch.equal(tile_md, meta.tile_scheduler_metadata) and torch.equal(num_splits, meta.num_splits)
    for (o1, l1), (o2, l2) in zip(objects, tensors):
        assert torch.equal(o1, o2) and torch.equal(l1, l2)


@gpu
def test_tensor_style_entry_equals_the_call_prepared_in_python(monkeypatch):
    q, k, bt, lens = dense_inputs()
    tile_md, num_splits = openmla.get_mla_metadata(lens, q.shape[1] * q.shape[2], 1)
    fast = openmla.flash_mla_with_kvcache(q, k, bt, lens, D_V, tile_md, num_splits, causal=True)
    with monkeypatch.context() as m:
        without_exchange_api(m)
        tile_md2, num_splits2 = openmla.get_mla_metadata(lens, q.shape[1] * q.shape[2], 1)
        slow = openmla.flash_mla_with_kvcache(q, k, bt, lens, D_V, tile_md2, num_splits2, causal=True)
    torch.cuda.synchronize()
    assert torch.equal(tile_md, tile_md2) and torch.equal(num_splits, num_splits2)
    assert torch.equal(fast[0], slow[0]) and torch.equal(fast[1], slow[1])


@gpu
def test_tensor_style_errors_name_the_argument():
    q, k, bt, lens = dense_inputs(b=4, s_q=1, h_q=64)
    tile_md, num_splits = openmla.get_mla_metadata(lens, 64, 1)
    with pytest.raises(ValueError, match=r"num_splits"):
        openmla.flash_mla_with_kvcache(q, k, bt, lens, D_V, tile_md, num_splits[:-1], causal=True)
    # Planned for another head count whose partition count differs (h_q 64: 132 partitions on an H100; 128: 66).
    # (A head count with the same partition count, e.g. 16, gets the same schedule and is accepted: it is valid.)
    with pytest.raises(ValueError, match=r"metadata"):
        openmla.flash_mla_with_kvcache(q.repeat(1, 1, 2, 1), k, bt, lens, D_V, tile_md, num_splits)
    with pytest.raises(ValueError, match=r"argument 'num_splits' is None but 'tile_scheduler_metadata' is a tensor"):
        openmla.flash_mla_with_kvcache(q, k, bt, lens, D_V, tile_md)
    with pytest.raises(ValueError, match=r"'cache_seqlens'"):
        openmla.get_mla_metadata(lens.long(), 64, 1)
    with pytest.raises(ValueError, match=r"'cache_seqlens' must be a CUDA tensor"):
        openmla.get_mla_metadata(lens.cpu(), 64, 1)


# ---------------------------------------------------------------------------------------------------------------
# No allocation when outputs and schedule are given
# ---------------------------------------------------------------------------------------------------------------
def _allocations():
    return torch.cuda.memory_stats().get("allocation.all.allocated", 0)


@gpu
@pytest.mark.parametrize("style", ["object", "tensor", "sparse"])
def test_no_allocation_when_outputs_and_schedule_are_given(style):
    if style == "sparse":
        q, cache, kwargs = sparse_inputs()
        meta, _ = openmla.get_mla_metadata()
        call_args, call_kwargs = (q, cache, None, None, D_V, meta), kwargs
    else:
        q, k, bt, lens = dense_inputs()
        if style == "object":
            meta, splits = openmla.get_mla_metadata()
        else:
            meta, splits = openmla.get_mla_metadata(lens, q.shape[1] * q.shape[2], 1)
        call_args, call_kwargs = (q, k, bt, lens, D_V, meta, splits), dict(causal=True)
    out = torch.empty((*q.shape[:3], D_V), dtype=q.dtype, device="cuda")
    lse = torch.empty((q.shape[0], q.shape[2], q.shape[1]), device="cuda")
    openmla.flash_mla_with_kvcache(*call_args, **call_kwargs, out=out, lse=lse)  # plans / fills the scratch pool
    torch.cuda.synchronize()
    before = _allocations()
    for _ in range(20):
        got = openmla.flash_mla_with_kvcache(*call_args, **call_kwargs, out=out, lse=lse)
        assert got[0] is out and got[1] is lse
    torch.cuda.synchronize()
    assert _allocations() == before


# ---------------------------------------------------------------------------------------------------------------
# torch.set_default_device("cuda"), checks still made, other devices
# ---------------------------------------------------------------------------------------------------------------
@gpu
def test_default_device_gives_the_same_results():
    q, k, bt, lens = dense_inputs()
    meta, _ = openmla.get_mla_metadata()
    plain = [openmla.flash_mla_with_kvcache(ql, k, bt, lens, D_V, meta, causal=True) for ql in layers(q)]
    torch.set_default_device("cuda")
    try:
        meta2, _ = openmla.get_mla_metadata()
        under = [openmla.flash_mla_with_kvcache(ql, k, bt, lens, D_V, meta2, causal=True) for ql in layers(q)]
        tile_md, num_splits = openmla.get_mla_metadata(lens, q.shape[1] * q.shape[2], 1)
        tensor = openmla.flash_mla_with_kvcache(q, k, bt, lens, D_V, tile_md, num_splits, causal=True)
    finally:
        torch.set_default_device(None)
    torch.cuda.synchronize()
    for (o1, l1), (o2, l2) in zip(plain, under):
        assert torch.equal(o1, o2) and torch.equal(l1, l2)
    assert torch.equal(tensor[0], plain[0][0])


@gpu
def test_per_call_path_keeps_every_check():
    q, k, bt, lens = dense_inputs(b=4, s_q=1, h_q=64)
    meta, _ = openmla.get_mla_metadata()
    openmla.flash_mla_with_kvcache(q, k, bt, lens, D_V, meta)
    # Things that may change between the layers of a step are checked on every call, by the C++ API.
    with pytest.raises(ValueError, match=r"'block_table'"):
        openmla.flash_mla_with_kvcache(q, k, bt.long(), lens, D_V, meta)
    with pytest.raises(ValueError, match=r"'cache_seqlens'"):
        openmla.flash_mla_with_kvcache(q, k, bt, lens[:3], D_V, meta)
    with pytest.raises(ValueError, match=r"'k_cache'"):
        openmla.flash_mla_with_kvcache(q, k.float(), bt, lens, D_V, meta)
    with pytest.raises(ValueError, match=r"'out'"):
        openmla.flash_mla_with_kvcache(q, k, bt, lens, D_V, meta, out=torch.empty((4, 1, 64, 256), device="cuda",
                                                                                   dtype=q.dtype))
    with pytest.raises(ValueError, match=r"'lse'"):
        openmla.flash_mla_with_kvcache(q, k, bt, lens, D_V, meta, lse=torch.empty((4, 64, 1), device="cuda",
                                                                                   dtype=torch.bfloat16))
    with pytest.raises(ValueError, match=r"'q'"):
        openmla.flash_mla_with_kvcache(q.float(), k, bt, lens, D_V, meta)
    # Shapes the schedule was planned for: named by the layer's checks, which the entry hands the call to.
    with pytest.raises(ValueError, match=r"planned for h_q=64"):
        openmla.flash_mla_with_kvcache(q[:, :, :32], k, bt, lens, D_V, meta)
    with pytest.raises(ValueError, match=r"planned for d_v=512"):
        openmla.flash_mla_with_kvcache(q, k, bt, lens, 256, meta)
    with pytest.raises(ValueError, match=r"argument 'block_table' is None"):
        openmla.flash_mla_with_kvcache(q, k, None, lens, D_V, meta)
    with pytest.raises(ValueError, match=r"argument 'k_cache' must be a CUDA tensor"):
        openmla.flash_mla_with_kvcache(q, k.cpu(), bt, lens, D_V, meta)
    out, lse = openmla.flash_mla_with_kvcache(q, k, bt, lens, D_V, meta)  # still usable
    ref_out, ref_lse = dense_decode_ref(q, k, bt, lens)
    check_dense_decode(out, lse, ref_out, ref_lse, "after rejected calls")


# ---------------------------------------------------------------------------------------------------------------
# An entry that cannot serve a call raises the error of the layer's checks
# ---------------------------------------------------------------------------------------------------------------
def _error(call):
    """(type, message) of what call() raises."""
    with pytest.raises(Exception) as info:
        call()
    return type(info.value), str(info.value)


def _same_error_either_way(monkeypatch, call):
    """The error of call() through the entry at once, which must equal the error of the same call prepared in Python
    first (the checks run before the entry: torch without the DLPack exchange API)."""
    at_once = _error(call)
    with monkeypatch.context() as m:
        without_exchange_api(m)
        assert _error(call) == at_once
    return at_once


@gpu
def test_refusing_object_style_entry_raises_the_checks_error(monkeypatch):
    """A planned object's entry (DecodeStep.decode) turns each of these calls down and raises what the layer's
    checks raise for it: the error of the same call with the checks run first and, where the error is the call's own
    (not a difference from the plan), the error of a fresh object's first call, which runs the checks before
    planning."""
    q, k, bt, lens = dense_inputs(b=4, s_q=1, h_q=64)
    sq, cache, skw = sparse_inputs(b=4, s_q=1, h_q=64)
    dense_meta, _ = openmla.get_mla_metadata()
    openmla.flash_mla_with_kvcache(q, k, bt, lens, D_V, dense_meta)
    sparse_meta, _ = openmla.get_mla_metadata()
    openmla.flash_mla_with_kvcache(sq, cache, None, None, D_V, sparse_meta, **skw)
    dense = dict(q=q, k_cache=k, block_table=bt, cache_seqlens=lens, head_dim_v=D_V, tile_scheduler_metadata=dense_meta)
    sparse = dict(skw, q=sq, k_cache=cache, block_table=None, cache_seqlens=None, head_dim_v=D_V,
                  tile_scheduler_metadata=sparse_meta)
    own, planned = True, False  # the error is the call's own / a difference from the plan
    cases = [
        (dict(dense, attn_sink=skw["attn_sink"][:64]), own), (dict(dense, topk_length=lens), own),
        (dict(dense, is_fp8_kvcache=True), own), (dict(dense, block_table=None), own),
        (dict(dense, cache_seqlens=None), own), (dict(dense, q=q.cpu()), own), (dict(dense, q=q[0]), own),
        (dict(dense, q=object()), own), (dict(dense, k_cache=k.cpu()), own), (dict(dense, head_dim_v="x"), own),
        (dict(dense, q=q[:, :, :32]), planned), (dict(dense, q=q.repeat(2, 1, 1, 1)), planned),
        (dict(dense, k_cache=k[:, :32]), planned), (dict(dense, head_dim_v=256), planned),
        (dict(dense, causal=True), planned), (dict(sparse, tile_scheduler_metadata=dense_meta), planned),
        (dict(sparse, is_fp8_kvcache=False), own), (dict(sparse, causal=True), own),
        (dict(sparse, extra_topk_length=skw["topk_length"]), own),
        (dict(sparse, extra_k_cache=cache), own), (dict(sparse, k_cache=cache[..., :584]), own),
        (dict(sparse, k_cache=cache.cpu()), own), (dict(sparse, indices=skw["indices"][0]), own),
        (dict(sparse, indices=skw["indices"][..., :64]), planned), (dict(sparse, topk_length=None), planned),
        (dict(sparse, q=sq[:, :, :32]), planned), (dict(sparse, k_cache=cache[:, :32]), planned),
        (dict(dense, tile_scheduler_metadata=sparse_meta), planned),
    ]
    for args, is_own in cases:
        error = _same_error_either_way(monkeypatch, lambda: openmla.flash_mla_with_kvcache(**args))
        assert error[0] in (ValueError, TypeError, NotImplementedError), (args.keys(), error)
        assert "internal error" not in error[1], error
        if is_own:
            fresh = dict(args, tile_scheduler_metadata=openmla.get_mla_metadata()[0])
            assert _error(lambda: openmla.flash_mla_with_kvcache(**fresh)) == error
        else:
            assert "was planned for" in error[1], error
    # Nothing was planned again, and the objects still serve their calls.
    openmla.flash_mla_with_kvcache(**dense)
    openmla.flash_mla_with_kvcache(**sparse)


@gpu
def test_refusing_tensor_style_entry_raises_the_checks_error(monkeypatch):
    """The tensor style's entry (TensorStyleDecode.decode / .plan) raises, for a call it cannot serve, the error of
    the same call with the layer's checks run first."""
    q, k, bt, lens = dense_inputs(b=4, s_q=1, h_q=64)
    sq, cache, skw = sparse_inputs(b=4, s_q=1, h_q=64)
    md, ns = openmla.get_mla_metadata(lens, 64, 1)
    dense = dict(q=q, k_cache=k, block_table=bt, cache_seqlens=lens, head_dim_v=D_V, tile_scheduler_metadata=md,
                 num_splits=ns)
    cases = [dict(dense, tile_scheduler_metadata=openmla.get_mla_metadata()[0]),
             dict(dense, tile_scheduler_metadata=object()), dict(dense, tile_scheduler_metadata=None),
             dict(dense, attn_sink=skw["attn_sink"]), dict(dense, is_fp8_kvcache=True),
             dict(dense, cache_seqlens=None), dict(dense, q=q.cpu()), dict(dense, q=q[0]),
             dict(dense, k_cache=k.cpu()), dict(dense, head_dim_v="x"),
             dict(dense, indices=skw["indices"], is_fp8_kvcache=True),  # a bf16 cache is no FP8 layout
             dict(skw, q=sq, k_cache=cache[..., :584], block_table=None, cache_seqlens=None, head_dim_v=D_V,
                  tile_scheduler_metadata=md, num_splits=ns),
             dict(dense, num_splits=ns[:-1]), dict(dense, block_table=bt.long())]  # the C++ API's
    for args in cases:
        error = _same_error_either_way(monkeypatch, lambda: openmla.flash_mla_with_kvcache(**args))
        assert error[0] in (ValueError, TypeError, NotImplementedError) and "internal error" not in error[1], error
    error = _same_error_either_way(monkeypatch, lambda: openmla.get_mla_metadata(lens.cpu(), 64, 1))
    assert error == (ValueError, "argument 'cache_seqlens' must be a CUDA tensor, got Tensor on cpu")


@gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_call_on_the_second_device_while_the_first_is_current():
    with torch.cuda.device(1):
        q, k, bt, lens = dense_inputs(b=4, s_q=1, h_q=64)
    meta, _ = openmla.get_mla_metadata()
    assert torch.cuda.current_device() == 0
    first = openmla.flash_mla_with_kvcache(q, k, bt, lens, D_V, meta)
    second = openmla.flash_mla_with_kvcache(q, k, bt, lens, D_V, meta)
    assert torch.cuda.current_device() == 0 and second[0].device == q.device
    torch.cuda.synchronize(1)
    assert torch.equal(first[0], second[0])


# ---------------------------------------------------------------------------------------------------------------
# Streams and threads
# ---------------------------------------------------------------------------------------------------------------
@gpu
def test_schedule_planned_on_one_stream_used_on_another():
    q, k, bt, lens = dense_inputs(b=64, s_q=1, h_q=128, s_k=8000)
    expected = openmla.flash_mla_with_kvcache(q, k, bt, lens, D_V, openmla.get_mla_metadata()[0])
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    meta, _ = openmla.get_mla_metadata()
    torch.cuda._sleep(int(2e8))  # the plan runs late on the current stream ...
    openmla.flash_mla_with_kvcache(q, k, bt, lens, D_V, meta)
    with torch.cuda.stream(side):  # ... and the call on the side stream must wait for it
        out, lse = openmla.flash_mla_with_kvcache(q, k, bt, lens, D_V, meta)
    assert meta._step.last_stream == side.cuda_stream
    torch.cuda.synchronize()
    assert torch.equal(out, expected[0]) and torch.equal(lse, expected[1])


def _run_threads(workers):
    errors = []

    def wrap(fn):
        def run():
            try:
                fn()
            except BaseException as err:  # reported by the main thread
                errors.append(err)
        return run

    threads = [threading.Thread(target=wrap(fn)) for fn in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


@gpu
@pytest.mark.parametrize("style", ["object", "tensor"])
def test_two_threads_two_streams(style):
    inputs = [dense_inputs(b=32, s_q=1, h_q=128, s_k=6000, seed=s) for s in (3, 4)]
    expected = []
    for q, k, bt, lens in inputs:
        expected.append(openmla.flash_mla_with_kvcache(q, k, bt, lens, D_V, openmla.get_mla_metadata()[0]))
    torch.cuda.synchronize()
    results = [[], []]
    barrier = threading.Barrier(2)

    def worker(i):
        def run():
            q, k, bt, lens = inputs[i]
            stream = torch.cuda.Stream()
            with torch.cuda.stream(stream):
                barrier.wait()
                for _ in range(30):  # a new step each time: planning and the per-call path
                    if style == "object":
                        meta, splits = openmla.get_mla_metadata()
                    else:
                        meta, splits = openmla.get_mla_metadata(lens, q.shape[1] * q.shape[2], 1)
                    for _ in range(3):
                        results[i].append(openmla.flash_mla_with_kvcache(q, k, bt, lens, D_V, meta, splits))
            stream.synchronize()
        return run

    _run_threads([worker(0), worker(1)])
    torch.cuda.synchronize()
    for i in range(2):
        assert len(results[i]) == 90
        for out, lse in results[i]:
            assert torch.equal(out, expected[i][0]) and torch.equal(lse, expected[i][1])


@gpu
@pytest.mark.parametrize("same_stream", [True, False])
def test_two_threads_share_one_schedule(same_stream):
    """One FlashMLASchedMeta, two threads: planned once (a lock), and calls on two streams are ordered by the
    object, so every result is right (docs/python-api.md, "Threads")."""
    q, k, bt, lens = dense_inputs(b=32, s_q=1, h_q=128, s_k=6000, seed=5)
    expected = openmla.flash_mla_with_kvcache(q, k, bt, lens, D_V, openmla.get_mla_metadata()[0])
    torch.cuda.synchronize()
    meta, _ = openmla.get_mla_metadata()
    plans = []
    real_plan = dec._plan_step

    def counting_plan(*args, **kwargs):
        plans.append(1)
        return real_plan(*args, **kwargs)

    dec._plan_step = counting_plan
    results = [[], []]
    barrier = threading.Barrier(2)
    shared = torch.cuda.Stream()

    def worker(i):
        def run():
            stream = shared if same_stream else torch.cuda.Stream()
            with torch.cuda.stream(stream):
                barrier.wait()
                for _ in range(40):
                    results[i].append(openmla.flash_mla_with_kvcache(
                        (q.float() * (i + 1)).to(q.dtype), k, bt, lens, D_V, meta))
            stream.synchronize()
        return run

    try:
        _run_threads([worker(0), worker(1)])
    finally:
        dec._plan_step = real_plan
    torch.cuda.synchronize()
    assert len(plans) == 1
    second = openmla.flash_mla_with_kvcache((q.float() * 2).to(q.dtype), k, bt, lens, D_V,
                                            openmla.get_mla_metadata()[0])
    torch.cuda.synchronize()
    for out, lse in results[0]:
        assert torch.equal(out, expected[0]) and torch.equal(lse, expected[1])
    for out, lse in results[1]:
        assert torch.equal(out, second[0]) and torch.equal(lse, second[1])


# ---------------------------------------------------------------------------------------------------------------
# Sparse prefill's per-call entry (python/csrc/bind_prefill_call.cpp)
# ---------------------------------------------------------------------------------------------------------------
@gpu
@pytest.mark.parametrize("with_outputs", [False, True])
def test_sparse_prefill_call_entry_equals_flash_mla_sparse_fwd(with_outputs):
    s_q, h_q, topk, s_kv = 100, 64, 256, 2000
    g = torch.Generator(device="cuda").manual_seed(7)
    q = torch.randn((s_q, h_q, D_QK), generator=g, device="cuda").div_(10).to(torch.bfloat16)
    kv = torch.randn((s_kv, 1, D_QK), generator=g, device="cuda").div_(10).to(torch.bfloat16)
    idx = torch.randint(-1, s_kv, (s_q, 1, topk), generator=g, device="cuda", dtype=torch.int32)
    lengths = torch.randint(0, topk + 1, (s_q,), generator=g, device="cuda", dtype=torch.int32)
    sink = torch.randn((h_q,), generator=g, device="cuda")
    scale = D_QK ** -0.5
    expected = openmla.flash_mla_sparse_fwd(q, kv, idx, scale, attn_sink=sink, topk_length=lengths)
    outs = [None, None, None]
    if with_outputs:
        outs = [torch.empty_like(expected[0]), torch.empty_like(expected[1]), torch.empty_like(expected[2])]
    got = C.sparse_prefill_call(q, kv, idx, scale, D_V, sink, lengths, *outs)
    torch.cuda.synchronize()
    for e, o in zip(expected, got):
        assert torch.equal(e, o) and e.shape == o.shape and e.dtype == o.dtype
    if with_outputs:
        assert all(a is b for a, b in zip(got, outs))
    # The general path's cases: None, so that flash_mla_sparse_fwd names what is wrong.
    assert C.sparse_prefill_call(q, kv, idx, -1.0, D_V, None, None, None, None, None) is None
    assert C.sparse_prefill_call(q.cpu(), kv, idx, scale, D_V, None, None, None, None, None) is None
    with pytest.raises(ValueError, match="'indices'"):
        C.sparse_prefill_call(q, kv, idx.long(), scale, D_V, None, None, None, None, None)


# ---------------------------------------------------------------------------------------------------------------
# append_kv_cache's per-call entry (python/csrc/bind_kv_cache_call.cpp)
# ---------------------------------------------------------------------------------------------------------------
@gpu
@pytest.mark.parametrize("fmt,d", [("v32", 576), ("model1", 512)])
def test_append_per_call_path_equals_general_path(monkeypatch, fmt, d):
    from openmla import kv_cache

    g = torch.Generator(device="cuda").manual_seed(8)
    kv = (torch.randn((16, PAGE, 1, d), generator=g, device="cuda") / 10).to(torch.bfloat16)
    base = openmla.quantize_kv_cache(kv, fmt)
    new = (torch.randn((40, d), generator=g, device="cuda") / 10).to(torch.bfloat16)
    slots = torch.randperm(16 * PAGE, device="cuda")[:40].to(torch.int64)
    slots[3] = -1  # skipped
    fast = base.clone()
    openmla.append_kv_cache(new, slots, fast, fmt)
    with monkeypatch.context() as m:
        m.setattr(kv_cache, "_APPEND_IN_PLACE", False)
        slow = base.clone()
        openmla.append_kv_cache(new, slots, slow, fmt)
    torch.cuda.synchronize()
    assert kv_cache._APPEND_IN_PLACE == dec._IN_PLACE
    assert torch.equal(fast, slow) and not torch.equal(fast, base)
    with pytest.raises(ValueError, match="'slots'"):
        openmla.append_kv_cache(new, slots[:39], fast, fmt)
    with pytest.raises(ValueError, match="format"):
        openmla.append_kv_cache(new, slots, fast, "v31")
