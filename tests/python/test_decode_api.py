"""Argument checking of the decode binding, without a GPU and without torch.

Every check of the C++ API runs before its first CUDA call (src/api/decode.cpp), so bad calls can be
exercised here with "CUDA" arrays that are really host memory: `fake_cuda` builds a DLPack capsule that
claims device cuda:0 over a numpy buffer. Nothing ever dereferences it: each call below is rejected by
validation. Host arrays are plain numpy arrays. Every problem passes num_sms explicitly so that no call
has to ask a device for its SM count.
"""
import ctypes
import re

import numpy as np
import pytest

from openmla import _openmla as C
from openmla import decode as dec


def _real_cuda_device_present():
    try:
        import torch
    except Exception:
        return False
    return torch.cuda.is_available()


# These tests hand the binding DLPack capsules that claim cuda:0 but point at host memory: safe only where no
# real GPU could ever be reached (CI, developer machines). On a GPU machine the GPU tests cover the API.
pytestmark = pytest.mark.skipif(
    _real_cuda_device_present(),
    reason="validation-only tests with fake device pointers; they run on machines without a GPU")

# ---------------------------------------------------------------------------------------------------
# Fake CUDA arrays: DLPack capsules over host memory
# ---------------------------------------------------------------------------------------------------
_KDL_CPU, _KDL_CUDA = 1, 2
_DTYPES = {  # name -> (DLPack type code, bits)
    "bf16": (4, 16), "fp16": (2, 16), "fp32": (2, 32), "int32": (0, 32), "int64": (0, 64), "uint8": (1, 8),
}


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32), ("dtype", _DLDataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


_PyCapsule_New = ctypes.pythonapi.PyCapsule_New
_PyCapsule_New.restype = ctypes.py_object
_PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_CAPSULE_NAME = b"dltensor"
_keep_alive = []  # the structs and buffers behind every capsule live until the end of the session


def fake_cuda(shape, dtype="bf16", strides=None, device_type=_KDL_CUDA, device_id=0, align=16):
    """A DLPack capsule describing a `dtype` array of `shape` (element strides, default row-major) on cuda:0 (or
    cuda:`device_id`),
    backed by (never touched) host memory, `align`-byte aligned. A capsule can be consumed once: build one per call."""
    code, bits = _DTYPES[dtype]
    if strides is None:
        strides, acc = [], 1
        for n in reversed(shape):
            strides.insert(0, acc)
            acc *= n
    extent = 1 + sum((n - 1) * s for n, s in zip(shape, strides)) if all(shape) else 1
    buf = np.zeros(extent * bits // 8 + 48 + align, dtype=np.uint8)
    addr = (buf.ctypes.data + align - 1) // align * align  # the API checks 16-byte alignment of several arguments
    shape_arr = (ctypes.c_int64 * len(shape))(*shape)
    stride_arr = (ctypes.c_int64 * len(shape))(*strides)
    mt = _DLManagedTensor()
    mt.dl_tensor.data = addr
    mt.dl_tensor.device = _DLDevice(device_type, device_id)
    mt.dl_tensor.ndim = len(shape)
    mt.dl_tensor.dtype = _DLDataType(code, bits, 1)
    mt.dl_tensor.shape = ctypes.cast(shape_arr, ctypes.POINTER(ctypes.c_int64))
    mt.dl_tensor.strides = ctypes.cast(stride_arr, ctypes.POINTER(ctypes.c_int64))
    mt.dl_tensor.byte_offset = 0
    mt.manager_ctx = None
    mt.deleter = None
    _keep_alive.append((buf, shape_arr, stride_arr, mt))
    return _PyCapsule_New(ctypes.addressof(mt), _CAPSULE_NAME, None)


# ---------------------------------------------------------------------------------------------------
# A valid dense problem and its arguments; each test breaks exactly one thing
# ---------------------------------------------------------------------------------------------------
NUM_SMS = 132


def problem(**overrides):
    p = dict(batch=4, s_q=2, h_q=16, h_kv=1, d_qk=576, d_v=512, page_block_size=64, cache_format="bf16",
             causal=True, num_sms=NUM_SMS)
    p.update(overrides)
    return p


def dense_args(p, **overrides):
    """Positional arguments of C.dense_decode for problem p (fake CUDA arrays), with overrides by name."""
    sizes = C.get_decode_workspace_sizes(**p)
    b, s_q, h_q, h_kv = p["batch"], p["s_q"], p["h_q"], p["h_kv"]
    dt = p["cache_format"]
    make = {
        "q": lambda: fake_cuda((b, s_q, h_q, 576), dt),
        "k_cache": lambda: fake_cuda((10, 64, h_kv, 576), dt),
        "block_table": lambda: fake_cuda((b, 8), "int32"),
        "cache_seqlens": lambda: fake_cuda((b,), "int32"),
        "metadata": lambda: fake_cuda((sizes["num_sm_parts"], 8), "int32"),
        "num_splits": lambda: fake_cuda((b + 1,), "int32"),
        "partial_o": lambda: fake_cuda((sizes["partial_rows"], 512), "fp32"),
        "partial_lse": lambda: fake_cuda((sizes["partial_rows"],), "fp32"),
        "out": lambda: fake_cuda((b, s_q, h_q, 512), dt),
        "lse": lambda: fake_cuda((b, h_q, s_q), "fp32", strides=[s_q * h_q, 1, h_q]),
    }
    return [overrides[name] if name in overrides else make[name]() for name in make]


def expect_dense_error(p, match, **overrides):
    with pytest.raises(ValueError, match=match) as info:
        C.dense_decode(*dense_args(p, **overrides), softmax_scale=0.0, stream=0, **p)
    return str(info.value)


# ---------------------------------------------------------------------------------------------------
# dense_decode: every rejected argument is named
# ---------------------------------------------------------------------------------------------------
def test_host_q_is_rejected():
    p = problem()
    host_q = np.zeros((4, 2, 16, 576), dtype=np.float16)
    msg = expect_dense_error(dict(p, cache_format="fp16"), r"'q'", q=host_q)
    assert "cuda" in msg.lower() or "device" in msg.lower(), msg


def test_host_cache_seqlens_is_rejected():
    expect_dense_error(problem(), r"'cache_seqlens'", cache_seqlens=np.zeros(4, dtype=np.int32))


def test_wrong_q_dtype():
    expect_dense_error(problem(), r"'q'", q=fake_cuda((4, 2, 16, 576), "fp32"))


def test_q_dtype_must_match_cache_format():
    # dense_args builds every array in the problem's dtype; break only q.
    expect_dense_error(problem(cache_format="fp16"), r"'q'", q=fake_cuda((4, 2, 16, 576), "bf16"))


def test_wrong_k_cache_dtype():
    expect_dense_error(problem(), r"'k_cache'", k_cache=fake_cuda((10, 64, 1, 576), "fp16"))


def test_wrong_block_table_dtype():
    expect_dense_error(problem(), r"'block_table'", block_table=fake_cuda((4, 8), "int64"))


def test_wrong_last_dim_575():
    # The problem says 576 but q has 575 columns: q is named.
    expect_dense_error(problem(), r"'q'", q=fake_cuda((4, 2, 16, 575), "bf16"))
    # The Python layer derives d_qk from q.shape[-1]: then the problem's d_qk is named.
    p = problem(d_qk=575)
    with pytest.raises(ValueError, match=r"d_qk"):
        C.dense_decode(*dense_args(p, q=fake_cuda((4, 2, 16, 575), "bf16"), k_cache=fake_cuda((10, 64, 1, 575))),
                       **p)


def test_wrong_k_cache_last_dim():
    expect_dense_error(problem(), r"'k_cache'", k_cache=fake_cuda((10, 64, 1, 575), "bf16"))


def test_mismatched_batch():
    expect_dense_error(problem(), r"'block_table'", block_table=fake_cuda((5, 8), "int32"))
    expect_dense_error(problem(), r"'cache_seqlens'", cache_seqlens=fake_cuda((3,), "int32"))
    expect_dense_error(problem(), r"'q'", q=fake_cuda((5, 2, 16, 576), "bf16"))


def test_h_q_not_multiple_of_h_kv():
    p = problem(h_q=9, h_kv=2)
    with pytest.raises(ValueError, match=r"h_q.*h_kv|h_kv.*h_q"):
        C.get_decode_workspace_sizes(**p)


def test_k_cache_heads_must_match_h_kv():
    expect_dense_error(problem(h_kv=2), r"'k_cache'", k_cache=fake_cuda((10, 64, 1, 576), "bf16"))


def test_page_size_not_supported():
    # Dense decode takes the powers of two 1 to 256 (docs/dense-decode.md, "Page sizes").
    for page in (3, 12, 48, 512):
        expect_dense_error(problem(page_block_size=page), r"page_block_size",
                           k_cache=fake_cuda((10, page, 1, 576), "bf16"))
    # The problem says 64 but the cache pages hold 32 tokens: k_cache is named.
    expect_dense_error(problem(), r"'k_cache'", k_cache=fake_cuda((10, 32, 1, 576), "bf16"))


def test_d_v_not_512():
    with pytest.raises(ValueError, match=r"d_v"):
        C.get_decode_workspace_sizes(**problem(d_v=256))


def test_out_shape_and_lse_dtype():
    expect_dense_error(problem(), r"'out'", out=fake_cuda((4, 2, 16, 256), "bf16"))
    expect_dense_error(problem(), r"'lse'", lse=fake_cuda((4, 16, 2), "bf16"))
    expect_dense_error(problem(), r"'lse'", lse=fake_cuda((4, 2, 16), "fp32"))  # (b, s_q, h_q) is not (b, h_q, s_q)


def test_strides_must_allow_tma():
    # A row stride of 580 elements (1160 bytes) is not a multiple of 16 bytes.
    q = fake_cuda((4, 2, 16, 576), "bf16", strides=[2 * 16 * 580, 16 * 580, 580, 1])
    expect_dense_error(problem(), r"'q'", q=q)
    q = fake_cuda((4, 2, 16, 576), "bf16", strides=[2 * 16 * 576 * 2, 16 * 576 * 2, 576 * 2, 2])
    expect_dense_error(problem(), r"'q'", q=q)  # last dim not contiguous


def test_workspace_too_small_is_named():
    p = problem()
    sizes = C.get_decode_workspace_sizes(**p)
    expect_dense_error(p, r"partial_o", partial_o=fake_cuda((sizes["partial_rows"] - 1, 512), "fp32"))
    expect_dense_error(p, r"metadata", metadata=fake_cuda((sizes["num_sm_parts"] + 1, 8), "int32"))


def test_bad_problem_fields():
    with pytest.raises(ValueError, match=r"batch"):
        C.get_decode_workspace_sizes(**problem(batch=0))
    with pytest.raises(ValueError, match=r"cache_format"):
        C.get_decode_workspace_sizes(**problem(cache_format="int4"))
    with pytest.raises(TypeError, match=r"unknown keyword argument 'heads'"):
        C.get_decode_workspace_sizes(**problem(heads=3))
    with pytest.raises(TypeError, match=r"causal"):
        C.get_decode_workspace_sizes(**problem(causal=1))
    with pytest.raises(TypeError, match=r"h_q"):
        C.get_decode_workspace_sizes(**problem(h_q=16.0))


# ---------------------------------------------------------------------------------------------------
# plan_decode
# ---------------------------------------------------------------------------------------------------
def test_plan_rejects_host_and_mis_sized_arguments():
    p = problem()
    sizes = C.get_decode_workspace_sizes(**p)
    parts = sizes["num_sm_parts"]
    with pytest.raises(ValueError, match=r"'cache_seqlens'"):
        C.plan_decode(np.zeros(4, dtype=np.int32), fake_cuda((parts, 8), "int32"), fake_cuda((5,), "int32"), **p)
    with pytest.raises(ValueError, match=r"'cache_seqlens'"):
        C.plan_decode(fake_cuda((3,), "int32"), fake_cuda((parts, 8), "int32"), fake_cuda((5,), "int32"), **p)
    with pytest.raises(ValueError, match=r"num_splits"):
        C.plan_decode(fake_cuda((4,), "int32"), fake_cuda((parts, 8), "int32"), fake_cuda((4,), "int32"), **p)
    with pytest.raises(ValueError, match=r"metadata"):
        C.plan_decode(fake_cuda((4,), "int32"), fake_cuda((parts - 1, 8), "int32"), fake_cuda((5,), "int32"), **p)


def test_plan_takes_no_cache_seqlens_when_sparse():
    # Sparse planning ignores cache_seqlens (None is accepted); its lengths are topk_length / extra_topk_length.
    p = problem(cache_format="fp8_v32", causal=False, sparse=True, topk=128)
    parts = C.get_decode_workspace_sizes(**p)["num_sm_parts"]
    with pytest.raises(ValueError, match=r"'topk_length'"):
        C.plan_decode(None, fake_cuda((parts, 8), "int32"), fake_cuda((5,), "int32"),
                      topk_length=fake_cuda((3,), "int32"), **p)
    with pytest.raises(ValueError, match=r"'topk_length'"):
        C.plan_decode(None, fake_cuda((parts, 8), "int32"), fake_cuda((5,), "int32"),
                      topk_length=np.zeros(4, dtype=np.int32), **p)
    # Dense planning needs it: None is reported as a missing argument.
    dense = problem()
    parts = C.get_decode_workspace_sizes(**dense)["num_sm_parts"]
    with pytest.raises(ValueError, match=r"'cache_seqlens' is required"):
        C.plan_decode(None, fake_cuda((parts, 8), "int32"), fake_cuda((5,), "int32"), **dense)


def test_sparse_binding_signature():
    signature = C.sparse_decode.__doc__.splitlines()[0]  # nanobind's generated signature line
    assert re.findall(r"(\w+): ", signature) == [
        "q", "k_cache", "indices", "tile_scheduler_metadata", "num_splits", "partial_o", "partial_lse", "out", "lse",
        "topk_length", "attn_sink", "extra_k_cache", "extra_indices", "extra_topk_length", "softmax_scale", "stream",
        "seqused_q", "varlen_lengths"]
    for name in ("topk_length", "attn_sink", "extra_k_cache", "extra_indices", "extra_topk_length"):
        assert f"{name}: ndarray[] | None = None" in signature, signature
    assert ("softmax_scale: float = 0.0, stream: int = 0, seqused_q: ndarray[] | None = None, "
            "varlen_lengths: ndarray[] | None = None, **problem") in signature, signature


# ---------------------------------------------------------------------------------------------------
# get_decode_workspace_sizes
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("b,s_q,h_q,h_kv,parts", [
    (128, 1, 128, 1, 66),  # 2 m-blocks of 64 rows per KV head -> 132 / 2 partitions (flash_mla's count)
    (128, 2, 128, 1, 33),  # 4 m-blocks
    (128, 1, 16, 1, 132),  # one m-block: one partition per SM
    (7, 1, 128, 8, 16),    # 16 rows per KV head, 8 KV heads: 132 / 8
    (1, 4, 63, 3, 22),     # 84 rows per KV head -> 2 m-blocks, 3 KV heads: 132 / 3 / 2
])
def test_workspace_sizes(b, s_q, h_q, h_kv, parts):
    sizes = C.get_decode_workspace_sizes(**problem(batch=b, s_q=s_q, h_q=h_q, h_kv=h_kv))
    assert set(sizes) == {"num_sm_parts", "metadata_ints", "num_splits_ints", "partial_rows", "partial_o_bytes",
                          "partial_lse_bytes", "merge_counter_ints", "varlen_ints"}
    assert sizes["varlen_ints"] == 0  # per-request query lengths only (test_decode_varlen_q_api.py)
    assert sizes["num_sm_parts"] == parts
    assert 1 <= parts <= C.MAX_DECODE_SM_PARTS
    assert sizes["metadata_ints"] == parts * C.DECODE_SCHEDULE_RECORD_INTS == parts * 8
    assert sizes["num_splits_ints"] == b + 1
    assert sizes["partial_rows"] == (b + parts) * s_q * h_q
    assert sizes["partial_o_bytes"] == sizes["partial_rows"] * 512 * 4
    assert sizes["partial_lse_bytes"] == sizes["partial_rows"] * 4
    # One merge counter per (request, kv head, m-block of 64 packed rows).
    assert sizes["merge_counter_ints"] == b * h_kv * -(-(s_q * (h_q // h_kv)) // 64)


def test_workspace_sizes_do_not_depend_on_batch_or_causal():
    # An engine sizes the schedule once for its largest batch: num_sm_parts must not move with b.
    parts = {C.get_decode_workspace_sizes(**problem(batch=b, causal=c))["num_sm_parts"]
             for b in (1, 7, 128, 1000) for c in (False, True)}
    assert len(parts) == 1


def test_workspace_sizes_follow_num_sms():
    small = C.get_decode_workspace_sizes(**problem(h_q=128, s_q=1, num_sms=20))
    assert small["num_sm_parts"] == 10
    huge = C.get_decode_workspace_sizes(**problem(h_q=16, s_q=1, num_sms=1000))
    assert huge["num_sm_parts"] == C.MAX_DECODE_SM_PARTS  # the combine kernel handles at most 160 splits


# ---------------------------------------------------------------------------------------------------
# The flash_mla-compatible layer: what it decides before needing torch or a GPU
# ---------------------------------------------------------------------------------------------------
def test_get_mla_metadata_without_cache_seqlens_is_the_object_style():
    # flash_mla's current API: no cache_seqlens -> an empty schedule object; the other arguments are ignored.
    for args, kwargs in (((), {}), ((None, 128, 1, 128), {"is_fp8_kvcache": False}), ((), {"topk": 2048})):
        meta, splits = dec.get_mla_metadata(*args, **kwargs)
        assert isinstance(meta, dec.FlashMLASchedMeta)
        assert splits is None
        assert meta.have_initialized is False
        assert meta.config is None and meta.tile_scheduler_metadata is None and meta.num_splits is None
    a, _ = dec.get_mla_metadata()
    b, _ = dec.get_mla_metadata()
    assert a is not b


def test_get_mla_metadata_signature_is_flash_mlas_older_one():
    import inspect

    params = list(inspect.signature(dec.get_mla_metadata).parameters.values())
    # flash_mla's arguments, then OpenMLA's batch_invariant (docs/decode-schedule.md, "Batch invariance").
    assert [p.name for p in params] == ["cache_seqlens", "num_q_tokens_per_head_k", "num_heads_k", "num_heads_q",
                                        "is_fp8_kvcache", "topk", "batch_invariant"]
    assert {p.name: p.default for p in params} == {
        "cache_seqlens": None, "num_q_tokens_per_head_k": None, "num_heads_k": None, "num_heads_q": None,
        "is_fp8_kvcache": False, "topk": None, "batch_invariant": False}


def test_get_mla_metadata_batch_invariant_object():
    meta, splits = dec.get_mla_metadata(batch_invariant=True)
    assert isinstance(meta, dec.FlashMLASchedMeta) and splits is None
    assert meta.batch_invariant is True and meta.have_initialized is False
    assert "batch_invariant=True" in repr(meta)
    assert dec.get_mla_metadata()[0].batch_invariant is False


class _Lengths:
    """Stands for a (b,) lengths tensor: the tensor style checks its other arguments before touching it."""

    def __init__(self, b):
        self.shape = (b,)


@pytest.mark.parametrize("args,kwargs,exc,pattern", [
    ((1, 2, 3), {}, TypeError, r"argument 'cache_seqlens' must be a \(b,\) int32 CUDA tensor"),
    ((np.zeros((2, 2), dtype=np.int32), 128, 1), {}, TypeError, r"'cache_seqlens'.*of shape \(2, 2\)"),
    ((_Lengths(4), 0, 1), {}, ValueError, r"argument 'num_q_tokens_per_head_k' must be a positive int"),
    ((_Lengths(4), 128, None), {}, ValueError, r"argument 'num_heads_k' must be a positive int"),
    ((_Lengths(4), 128.0, 1), {}, ValueError, r"argument 'num_q_tokens_per_head_k'"),
    ((_Lengths(4), 128, 1, True), {}, ValueError, r"argument 'num_heads_q' must be None or a positive int"),
    ((_Lengths(4), 100, 1, 64), {}, ValueError, r"not a multiple of num_heads_q"),
    ((_Lengths(4), 128, 1, 64), {"topk": 2048}, ValueError, r"'is_fp8_kvcache' is False"),
    ((_Lengths(4), 128, 1), {"is_fp8_kvcache": True, "topk": 2048}, ValueError, r"'num_heads_q' is required"),
    ((_Lengths(4), 128, 2, 128), {"is_fp8_kvcache": True, "topk": 2048}, ValueError, r"'num_heads_k' is 2"),
    ((_Lengths(4), 128, 1, 64), {"is_fp8_kvcache": True, "topk": 0}, ValueError, r"'topk' must be a positive int"),
])
def test_tensor_style_metadata_argument_errors(args, kwargs, exc, pattern):
    with pytest.raises(exc, match=pattern):
        dec.get_mla_metadata(*args, **kwargs)


def test_tensor_style_problem():
    # (b, s_q, h_q, h_kv, sparse, topk) from flash_mla's older arguments.
    assert dec._metadata_problem(_Lengths(4), 128, 1, None, False, None) == (4, 1, 128, 1, False, None)
    assert dec._metadata_problem(_Lengths(4), 2 * 128, 1, 128, False, None) == (4, 2, 128, 1, False, None)
    assert dec._metadata_problem(_Lengths(3), 2 * 16, 8, 128, False, None) == (3, 2, 128, 8, False, None)
    assert dec._metadata_problem(_Lengths(1), 7 * 64, 1, 64, True, 2048) == (1, 7, 64, 1, True, 2048)
    # is_fp8_kvcache without topk: the FP8 dense cache, on the dense schedule.
    assert dec._metadata_problem(_Lengths(4), 2 * 128, 1, 128, True, None) == (4, 2, 128, 1, False, None)


def test_signature_matches_flash_mla():
    import inspect

    params = list(inspect.signature(dec.flash_mla_with_kvcache).parameters.values())
    names = [p.name for p in params]
    assert names == ["q", "k_cache", "block_table", "cache_seqlens", "head_dim_v", "tile_scheduler_metadata",
                     "num_splits", "softmax_scale", "causal", "is_fp8_kvcache", "indices", "attn_sink",
                     "extra_k_cache", "extra_indices_in_kvcache", "topk_length", "extra_topk_length",
                     "batch_invariant", "seqused_q", "out", "lse", "descale_q", "descale_k"]
    defaults = {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}
    assert defaults == {"num_splits": None, "softmax_scale": None, "causal": False, "is_fp8_kvcache": False,
                        "indices": None, "attn_sink": None, "extra_k_cache": None, "extra_indices_in_kvcache": None,
                        "topk_length": None, "extra_topk_length": None, "batch_invariant": False, "seqused_q": None,
                        "out": None, "lse": None, "descale_q": None, "descale_k": None}
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY
               for p in params if p.name in ("out", "lse", "batch_invariant", "seqused_q", "descale_q", "descale_k"))


def _call(**kwargs):
    meta, _ = dec.get_mla_metadata()
    args = dict(q=object(), k_cache=object(), block_table=object(), cache_seqlens=object(), head_dim_v=512,
                tile_scheduler_metadata=meta)
    args.update(kwargs)
    return dec.flash_mla_with_kvcache(**args)


@pytest.mark.parametrize("name", ["attn_sink", "extra_k_cache", "extra_indices_in_kvcache", "topk_length",
                                  "extra_topk_length"])
def test_sparse_only_arguments_need_indices(name):
    # Without indices the call is dense, which takes none of these: the argument is named.
    with pytest.raises(ValueError, match=re.escape(f"argument '{name}' is a sparse-decode argument")):
        _call(**{name: object()})


def test_fp8_flag_without_indices_takes_the_fp8_dense_path():
    # Dense decode over an FP8 e4m3 cache (openmla.decode_fp8): its checks name the argument (q is no tensor here;
    # without torch the path says it needs torch).
    with pytest.raises((TypeError, ImportError), match=r"argument 'q' must be a torch.Tensor|needs PyTorch"):
        _call(is_fp8_kvcache=True)
    with pytest.raises((TypeError, ImportError), match=r"argument 'q' must be a torch.Tensor|needs PyTorch"):
        _call(descale_k=0.5)


def test_indices_select_sparse_mode():
    # Sparse mode checks its flags first (the sparse tests cover the rest): no NotImplementedError any more.
    with pytest.raises(ValueError, match=r"argument 'is_fp8_kvcache' is False but 'indices' was given"):
        _call(indices=object())


def test_num_splits_must_be_none_with_a_schedule_object():
    with pytest.raises(ValueError, match=r"'num_splits' must be None with a FlashMLASchedMeta"):
        _call(num_splits=object())


def test_schedule_object_type_is_checked():
    with pytest.raises(TypeError, match=r"argument 'tile_scheduler_metadata' must be the FlashMLASchedMeta"):
        _call(tile_scheduler_metadata=object())
    # A tensor is the tensor style, which needs num_splits too.
    with pytest.raises(ValueError, match=r"argument 'num_splits' is None but 'tile_scheduler_metadata' is a tensor"):
        _call(tile_scheduler_metadata=np.zeros((66, 8), dtype=np.int32))


@pytest.mark.parametrize("name", ["block_table", "cache_seqlens"])
def test_dense_mode_needs_block_table_and_lengths(name):
    # Without indices the call is dense: None is named (nanobind would only say the call matched no overload).
    with pytest.raises(ValueError, match=rf"argument '{name}' is None, but dense decode \(indices=None\) needs it"):
        _call(**{name: None})


# ---------------------------------------------------------------------------------------------------
# The keyword problem: each entry builds its family's struct (bind_decode_problem.h)
# ---------------------------------------------------------------------------------------------------
def test_keyword_problem_fields_of_the_other_family():
    sparse = problem(cache_format="fp8_v32", causal=False, sparse=True, topk=128)
    assert C.get_decode_workspace_sizes(**sparse)["num_sm_parts"] == 66  # 132 / (s_q 2 * ceil(16 / 64))
    # A field the family's struct does not have: accepted at the value the family implies, named otherwise.
    for field, value, family in (("h_kv", 2, sparse), ("causal", True, sparse), ("max_blocks_per_seq", 8, sparse),
                                 ("topk", 64, problem()), ("extra_topk", 1, problem()),
                                 ("extra_page_block_size", 64, problem())):
        with pytest.raises(ValueError, match=rf"argument 'problem.{field}' is .*decode problem has no {field}"):
            C.get_decode_workspace_sizes(**dict(family, **{field: value}))
    # A sparse problem without cache_format is SparseDecodeProblem's default (the V3.2 layout).
    no_format = {k: v for k, v in sparse.items() if k != "cache_format"}
    assert C.get_decode_workspace_sizes(**no_format) == C.get_decode_workspace_sizes(**sparse)
    # dense_decode and sparse_decode take their own family: a contradicting `sparse` is named.
    with pytest.raises(ValueError, match=r"argument 'problem.sparse' is True; dense_decode takes a dense problem"):
        C.dense_decode(*dense_args(problem()), **problem(sparse=True))
    with pytest.raises(ValueError, match=r"argument 'problem.sparse' is False; sparse_decode takes a sparse problem"):
        C.sparse_decode(*[fake_cuda((1,), "int32") for _ in range(9)], **dict(sparse, sparse=False))


# ---------------------------------------------------------------------------------------------------
# The per-call entries (python/csrc/bind_decode_step.cpp): each serves a call or raises the error of the flash_mla
# layer's checks (decode._check_call); here, with fake CUDA arrays and a stand-in check function, which calls they
# hand to the checks. The GPU tests (test_host_path.py) compare the messages themselves.
# ---------------------------------------------------------------------------------------------------
class _Refused(Exception):
    """Raised by the stand-in check function: the entry turned the call down."""


def _refuse(*args):
    raise _Refused(args)


class _Device:
    """Stands for the torch.device of a config: the entry reads its index."""

    index = 0


def _outcome(call):
    """'refused' when the entry called its check function, else what the call raised past the entry: the C++ API's
    error (here, with fake pointers, a valid call stops at the launch or at the SM count query)."""
    try:
        call()
    except _Refused:
        return "refused"
    except Exception as err:  # noqa: BLE001 - the outcome is the exception
        return err
    return "served"  # pragma: no cover - nothing can launch on host memory


def _schedule(p):
    sizes = C.get_decode_workspace_sizes(**p)
    return (fake_cuda((sizes["num_sm_parts"], 8), "int32"), fake_cuda((p["batch"] + 1,), "int32"),
            fake_cuda((max(sizes["merge_counter_ints"], 1),), "int32"),
            fake_cuda((sizes["partial_rows"], 512), "fp32"), fake_cuda((sizes["partial_rows"],), "fp32"))


DENSE_CONFIG = dict(b=4, s_q=2, h_q=16, page_block_size=64, h_k=1, causal=True, is_fp8_kvcache=False, topk=None,
                    extra_page_block_size=None, extra_topk=None, d_qk=576, d_v=512, device=_Device())
SPARSE_CONFIG = dict(DENSE_CONFIG, h_q=64, causal=False, is_fp8_kvcache=True, topk=128, topk_length_given=True)
SPARSE_PROBLEM = dict(batch=4, s_q=2, h_q=64, cache_format="fp8_v32", sparse=True, topk=128, num_sms=NUM_SMS)


def _step_call(sparse=False, **overrides):
    """DecodeStep.decode's arguments for the planned call of DENSE_CONFIG / SPARSE_CONFIG (fake CUDA arrays, caller
    outputs, stream 0), with overrides by name (a callable is called, so each call gets fresh capsules)."""
    h_q = 64 if sparse else 16
    args = dict(q=lambda: fake_cuda((4, 2, h_q, 576)), k_cache=lambda: fake_cuda((10, 64, 1, 576)),
                block_table=lambda: fake_cuda((4, 8), "int32"), cache_seqlens=lambda: fake_cuda((4,), "int32"),
                head_dim_v=512, softmax_scale=None, causal=True, is_fp8_kvcache=False, indices=None, attn_sink=None,
                extra_k_cache=None, extra_indices=None, topk_length=None, extra_topk_length=None,
                out=lambda: fake_cuda((4, 2, h_q, 512)),
                lse=lambda: fake_cuda((4, h_q, 2), "fp32", strides=[2 * h_q, 1, h_q]), stream=0)
    if sparse:
        args.update(k_cache=lambda: fake_cuda((10, 64, 1, 656), "uint8"), block_table=None, cache_seqlens=None,
                    causal=False, is_fp8_kvcache=True, indices=lambda: fake_cuda((4, 2, 128), "int32"),
                    topk_length=lambda: fake_cuda((4,), "int32"))
    args.update(overrides)
    return {k: v() if callable(v) else v for k, v in args.items()}


def _dense_step(checks=_refuse):
    return C.DecodeStep(*_schedule(problem()), config=dec._Config(**DENSE_CONFIG), checks=checks, **problem())


def _sparse_step(checks=_refuse):
    return C.DecodeStep(*_schedule(SPARSE_PROBLEM), config=dec._Config(**SPARSE_CONFIG), checks=checks,
                        **SPARSE_PROBLEM)


def _reaches(outcome, entry):
    """The entry passed the call on: the C++ API stopped it at the launch (no GPU here), or named an argument."""
    return isinstance(outcome, (RuntimeError, NotImplementedError, ValueError)) and str(outcome).startswith(entry)


def test_decode_step_serves_the_planned_call():
    for overrides in ({}, dict(head_dim_v=512.0), dict(head_dim_v="512"), dict(causal=1), dict(is_fp8_kvcache=0),
                      dict(softmax_scale=0.5)):
        assert _reaches(_outcome(lambda: _dense_step().decode(**_step_call(**overrides))), "dense_decode"), overrides
    # What the C++ API checks on every call is its to name.
    err = _outcome(lambda: _dense_step().decode(**_step_call(block_table=lambda: fake_cuda((4, 8), "int64"))))
    assert isinstance(err, ValueError) and "'block_table'" in str(err)
    assert _reaches(_outcome(lambda: _sparse_step().decode(**_step_call(sparse=True))), "sparse_decode")


@pytest.mark.parametrize("overrides", [
    dict(attn_sink=lambda: fake_cuda((16,), "fp32")), dict(topk_length=lambda: fake_cuda((4,), "int32")),
    dict(extra_k_cache=lambda: fake_cuda((10, 64, 1, 656), "uint8")),
    dict(extra_indices=lambda: fake_cuda((4, 2, 8), "int32")),
    dict(extra_topk_length=lambda: fake_cuda((4,), "int32")),
    dict(is_fp8_kvcache=True), dict(block_table=None), dict(cache_seqlens=None),
    dict(q=lambda: fake_cuda((4, 2, 32, 576))), dict(q=lambda: fake_cuda((4, 1, 16, 576))),
    dict(q=lambda: fake_cuda((5, 2, 16, 576))), dict(q=lambda: fake_cuda((4, 2, 16, 512))),
    dict(q=lambda: fake_cuda((8, 16, 576))), dict(q=lambda: fake_cuda((4, 2, 16, 576), device_id=1)),
    dict(q=lambda: np.zeros((4, 2, 16, 576), dtype=np.float16)), dict(q=object()), dict(q=None),
    dict(k_cache=lambda: fake_cuda((10, 32, 1, 576))), dict(k_cache=lambda: fake_cuda((10, 64, 2, 576))),
    dict(k_cache=lambda: fake_cuda((10, 64, 1, 576), device_id=1)), dict(k_cache=lambda: fake_cuda((640, 1, 576))),
    dict(causal=False), dict(head_dim_v=256), dict(head_dim_v="x"), dict(head_dim_v=None),
    dict(indices=lambda: fake_cuda((4, 2, 128), "int32"), is_fp8_kvcache=True, causal=False),
], ids=lambda o: ",".join(o))
def test_decode_step_hands_a_dense_call_it_cannot_serve_to_the_checks(overrides):
    assert _outcome(lambda: _dense_step().decode(**_step_call(**overrides))) == "refused"


@pytest.mark.parametrize("overrides", [
    dict(is_fp8_kvcache=False), dict(causal=True),
    dict(extra_indices=lambda: fake_cuda((4, 2, 8), "int32")),
    dict(extra_topk_length=lambda: fake_cuda((4,), "int32")),
    dict(extra_k_cache=lambda: fake_cuda((10, 64, 1, 656), "uint8")),
    dict(extra_k_cache=lambda: fake_cuda((10, 64, 1, 656), "uint8"), extra_indices=lambda: fake_cuda((4, 2, 8),
                                                                                                        "int32")),
    dict(k_cache=lambda: fake_cuda((10, 64, 1, 584), "uint8")), dict(k_cache=lambda: fake_cuda((10, 64, 1, 576))),
    dict(k_cache=lambda: fake_cuda((10, 32, 1, 656), "uint8")), dict(k_cache=lambda: fake_cuda((10, 64, 2, 656),
                                                                                                "uint8")),
    dict(indices=lambda: fake_cuda((4, 2, 64), "int32")), dict(indices=lambda: fake_cuda((8, 128), "int32")),
    dict(indices=lambda: fake_cuda((4, 2, 128), "int32", device_id=1)), dict(topk_length=None),
    dict(q=lambda: fake_cuda((4, 2, 32, 576))), dict(q=lambda: fake_cuda((4, 2, 64, 512))), dict(head_dim_v=576),
    dict(indices=None, block_table=lambda: fake_cuda((4, 8), "int32"), cache_seqlens=lambda: fake_cuda((4,), "int32"),
         is_fp8_kvcache=False, topk_length=None, k_cache=lambda: fake_cuda((10, 64, 1, 576))),
], ids=lambda o: ",".join(o))
def test_decode_step_hands_a_sparse_call_it_cannot_serve_to_the_checks(overrides):
    assert _outcome(lambda: _sparse_step().decode(**_step_call(sparse=True, **overrides))) == "refused"


def test_decode_step_raises_when_the_checks_find_nothing():
    # The entry and the checks disagree (a bug): an internal error that says what the entry turned down.
    with pytest.raises(RuntimeError, match=r"internal error: DecodeStep.decode turned the call down \(causal or "
                                           r"head_dim_v is not the planned one\)"):
        _dense_step(checks=lambda *args: None).decode(**_step_call(head_dim_v=256))
    # A reading error stands when the checks find nothing else.
    with pytest.raises(ValueError, match=r"argument 'q' has a dtype OpenMLA does not handle"):
        _dense_step(checks=lambda *args: None).decode(**_step_call(q=lambda: np.zeros((4, 2, 16, 576), np.complex64)))


def test_decode_step_calls_the_checks_with_the_config_and_the_call():
    seen = []
    step = C.DecodeStep(*_schedule(problem()), config=dec._Config(**DENSE_CONFIG),
                        checks=lambda *args: seen.append(args) or _refuse(), **problem())
    call = _step_call(causal=False)
    assert _outcome(lambda: step.decode(**call)) == "refused"
    config, *args = seen[0]
    assert config == dec._Config(**DENSE_CONFIG)
    names = ["q", "k_cache", "block_table", "cache_seqlens", "head_dim_v", "causal", "is_fp8_kvcache", "indices",
             "attn_sink", "extra_k_cache", "extra_indices", "topk_length", "extra_topk_length"]
    assert all(a is call[n] for a, n in zip(args, names)) and len(args) == len(names)


def _tensor_style(check_call=_refuse, check_plan=_refuse):
    def allocate(device, rows, d_v, counters):
        return fake_cuda((rows, d_v), "fp32"), fake_cuda((rows,), "fp32"), fake_cuda((counters,), "int32")
    return C.TensorStyleDecode(allocate, check_call, check_plan)


class _Exporter:
    """A DLPack exporter (the layer takes a tensor-style schedule from anything with __dlpack__)."""

    def __init__(self, capsule):
        self.capsule = capsule

    def __dlpack__(self, *args, **kwargs):
        return self.capsule

    def __dlpack_device__(self):
        return (_KDL_CUDA, 0)


def _tensor_call(sparse=False, **overrides):
    """TensorStyleDecode.decode's arguments (the schedule after head_dim_v)."""
    args = _step_call(sparse=sparse)
    p = SPARSE_PROBLEM if sparse else problem()
    sizes = C.get_decode_workspace_sizes(**p)
    schedule = [("tile_scheduler_metadata", _Exporter(fake_cuda((sizes["num_sm_parts"], 8), "int32"))),
                ("num_splits", fake_cuda((5,), "int32"))]
    args = dict(list(args.items())[:5] + schedule + list(args.items())[5:])
    args.update({k: v() if callable(v) else v for k, v in overrides.items()})
    return args


def test_tensor_style_entry_serves_a_valid_call():
    # With fake pointers a valid call passes the entry's tests and stops at the SM count query (no GPU here).
    for sparse in (False, True):
        err = _outcome(lambda: _tensor_style().decode(**_tensor_call(sparse=sparse)))
        assert isinstance(err, RuntimeError) and "SM count" in str(err), err


@pytest.mark.parametrize("sparse,overrides", [
    (False, dict(tile_scheduler_metadata=dec.FlashMLASchedMeta())), (False, dict(tile_scheduler_metadata=None)),
    (False, dict(tile_scheduler_metadata=b"12345678")),
    (False, dict(tile_scheduler_metadata=lambda: fake_cuda((1, 8)))),
    (False, dict(num_splits=None)),
    (False, dict(attn_sink=lambda: fake_cuda((16,), "fp32"))), (False, dict(is_fp8_kvcache=True)),
    (False, dict(block_table=None)), (False, dict(head_dim_v="x")),
    (False, dict(q=lambda: np.zeros((4, 2, 16, 576), dtype=np.float16))), (False, dict(q=lambda: fake_cuda((8, 576)))),
    (False, dict(stream=None)), (False, dict(k_cache=lambda: np.zeros((10, 64, 1, 576), dtype=np.float16))),
    (True, dict(is_fp8_kvcache=False)), (True, dict(causal=True)),
    (True, dict(k_cache=lambda: fake_cuda((10, 64, 1, 584), "uint8"))),
    (True, dict(extra_k_cache=lambda: fake_cuda((10, 64, 1, 584), "uint8"),
                extra_indices=lambda: fake_cuda((4, 2, 8), "int32"))),
    (True, dict(extra_k_cache=lambda: fake_cuda((10, 64, 1, 656), "uint8"))),
    (True, dict(indices=lambda: fake_cuda((4, 2, 128, 1), "int32"))),
], ids=lambda o: ",".join(o) if isinstance(o, dict) else str(o))
def test_tensor_style_entry_hands_a_call_it_cannot_serve_to_the_checks(sparse, overrides):
    assert _outcome(lambda: _tensor_style().decode(**_tensor_call(sparse=sparse, **overrides))) == "refused"


def test_tensor_style_plan_hands_a_host_tensor_to_the_checks():
    plan_args = (4, 2, 16, 1, False, 0, 0)
    assert _outcome(lambda: _tensor_style().plan(np.zeros(4, np.int32), None, None, None, *plan_args)) == "refused"
    # Without a framework allocator the schedule tensors must be given (with the stream).
    assert _outcome(lambda: _tensor_style().plan(fake_cuda((4,), "int32"), None, None, None, *plan_args)) == "refused"
    err = _outcome(lambda: _tensor_style().plan(fake_cuda((4,), "int32"), fake_cuda((4,), "int32"), None, None,
                                                *plan_args, fake_cuda((132, 8), "int32"), fake_cuda((5,), "int32"), 0))
    assert isinstance(err, RuntimeError) and "SM count" in str(err), err
