"""FP8 KV-cache codec: quantise a paged bf16 MLA cache into DeepSeek's FP8 layouts, dequantise it back, and append
new tokens to an FP8 cache in place.

Formats (docs/kv-cache-formats.md):

* ``"v32"``    DeepSeek-V3.2, d_qk = 576, 656 bytes per token, token-interleaved records
  ``[512 x e4m3 NoPE | 4 x fp32 scale | 64 x bf16 RoPE]``.
* ``"model1"`` MODEL1, d_qk = 512, 584 bytes per token, block-structured pages: ``B x [448 x e4m3 | 64 x bf16]``
  followed by ``B x [7 x UE8M0 scale | 1 pad byte]`` for a page of B tokens.

Caches are ``(num_blocks, page_size, 1, bytes_per_token)`` byte tensors (uint8, int8 or float8_e4m3fn), tokens
``bytes_per_token`` apart inside a page and pages any multiple of 16 bytes apart (at least one page). Results are
bit-identical to the CPU codec (``openmla._openmla.kv_cache_cpu_encode`` / ``kv_cache_cpu_decode``).

Errors raise ``ValueError`` with the C++ API's message, which names the C++ argument: ``src``/``dst`` for
quantise (``kv_bf16``/``out`` here) and dequantise (``cache``/``out`` here), ``new_kv``/``slots``/``cache`` for
append. The kernels run on torch's current stream of the tensors' device. Numpy host arrays are accepted too
(bfloat16 from ml_dtypes) so argument errors can be exercised without torch; a GPU function given a host array
raises the "must be a CUDA tensor" error.
"""
from __future__ import annotations

import ctypes

from . import _openmla
from ._runtime import as_byte_view, is_torch_tensor, require_torch, stream_of, torch_tensors_read_in_place

__all__ = ["quantize_kv_cache", "dequantize_kv_cache", "append_kv_cache", "FORMATS", "bytes_per_token", "head_dim"]

#: FP8 cache formats accepted by the functions of this module.
FORMATS = ("v32", "model1")


def bytes_per_token(format: str) -> int:
    """Bytes one token occupies in a page: 656 (``"v32"``) or 584 (``"model1"``)."""
    return _openmla.kv_cache_bytes_per_token(format)


def head_dim(format: str) -> int:
    """d_qk the format stores: 576 (``"v32"``) or 512 (``"model1"``)."""
    return _openmla.kv_cache_head_dim(format)


def quantize_kv_cache(kv_bf16, format: str = "v32", out=None, page_stride_bytes: int | None = None):
    """Quantise a paged bf16 cache into an FP8 cache.

    Args:
        kv_bf16: ``(num_blocks, page_size, 1, d_qk)`` bfloat16 CUDA tensor (d_qk 576 for ``"v32"``, 512 for
            ``"model1"``); last dim contiguous, other strides multiples of 8 elements; any page size >= 1.
        format: ``"v32"`` or ``"model1"``.
        out: optional ``(num_blocks, page_size, 1, bytes_per_token)`` uint8 / int8 / float8_e4m3fn tensor to write.
        page_stride_bytes: when ``out`` is None, the page stride of the allocated cache (a multiple of 16,
            >= page_size * bytes_per_token; default: packed pages, each rounded up to 16 bytes).

    Returns:
        The FP8 cache (``out``, or a new uint8 tensor on kv_bf16's device).
    """
    # A malformed kv_bf16 gets a zero-page cache: the C++ API then reports kv_bf16's shape ('src' is checked first).
    shape = tuple(int(s) for s in kv_bf16.shape)
    num_blocks, page_size = shape[:2] if len(shape) == 4 else (0, 0)
    if out is None:
        out = _new_cache(kv_bf16, num_blocks, page_size, format, page_stride_bytes)
    elif page_stride_bytes is not None:
        raise ValueError("argument 'page_stride_bytes' only applies when 'out' is None (the stride of 'out' is used)")
    with _device_of(kv_bf16):
        _openmla.kv_cache_quantize(_dlpack_arg(kv_bf16), _dlpack_arg(out), format, stream_of(kv_bf16))
    return out


def dequantize_kv_cache(cache, format: str = "v32", out=None):
    """Dequantise an FP8 cache back into a paged bf16 cache.

    Args:
        cache: ``(num_blocks, page_size, 1, bytes_per_token)`` FP8 cache (uint8 / int8 / float8_e4m3fn CUDA tensor).
        format: ``"v32"`` or ``"model1"``.
        out: optional ``(num_blocks, page_size, 1, d_qk)`` bfloat16 tensor to write (strides as for
            :func:`quantize_kv_cache`).

    Returns:
        The bf16 cache (``out`` or a new contiguous tensor). Exact: every decoded value is a bf16 value; a tile
        poisoned by NaN/inf at quantisation decodes to NaN.
    """
    if out is None:
        shape = (int(cache.shape[0]), int(cache.shape[1]), 1, head_dim(format))
        if is_torch_tensor(cache):
            torch = require_torch("dequantize_kv_cache")
            out = torch.empty(shape, dtype=torch.bfloat16, device=cache.device)
        else:
            out = _host_bf16_empty(shape)
    with _device_of(cache):
        _openmla.kv_cache_dequantize(_dlpack_arg(cache), _dlpack_arg(out), format, stream_of(cache))
    return out


def append_kv_cache(new_kv, slots, cache, format: str = "v32") -> None:
    """Quantise new tokens into their slots of an FP8 cache, in place.

    Args:
        new_kv: ``(n, d_qk)`` or ``(n, 1, d_qk)`` bfloat16 CUDA tensor; last dim contiguous, row stride a multiple
            of 8 elements.
        slots: ``(n,)`` int32 or int64 CUDA tensor, contiguous: ``slot = page * page_size + offset_in_page``.
            A negative slot skips its row (padding); slots >= num_blocks * page_size are skipped too. Slots must
            be distinct (two rows to one slot race).
        cache: the FP8 cache to update, as returned by :func:`quantize_kv_cache`.
        format: ``"v32"`` or ``"model1"``.

    Every written token is bit-identical to what :func:`quantize_kv_cache` would write for it.
    """
    # Engines call this for every layer of every step: torch tensors (torch >= 2.10) go straight to the binding,
    # which reads them and torch's current stream in place (docs/python-api.md, "Host cost").
    if _APPEND_IN_PLACE and _openmla.kv_cache_append_call(new_kv, slots, cache, format) is not None:
        return
    with _device_of(cache):
        _openmla.kv_cache_append(_dlpack_arg(new_kv), _dlpack_arg(slots), _dlpack_arg(cache), format,
                                 stream_of(cache))


# ---------------------------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------------------------
_APPEND_IN_PLACE = torch_tensors_read_in_place()
class _NoDevice:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _device_of(tensor):
    """Makes the tensor's GPU current while launching (torch's current stream is per device)."""
    if is_torch_tensor(tensor) and tensor.is_cuda:
        return require_torch("kv_cache").cuda.device(tensor.device)
    return _NoDevice()


def _new_cache(kv_bf16, num_blocks: int, page_size: int, format: str, page_stride_bytes: int | None):
    bpt = bytes_per_token(format)
    # Default: pages packed back to back, each rounded up to the 16-byte alignment the kernels need (MODEL1's
    # 584-byte tokens make page_size * 584 a non-multiple of 16 for odd page sizes).
    stride = -(-page_size * bpt // 16) * 16 if page_stride_bytes is None else int(page_stride_bytes)
    if stride < page_size * bpt or stride % 16 != 0:
        raise ValueError(f"argument 'page_stride_bytes' is {stride}; it must be a multiple of 16 and at least "
                         f"page_size * bytes_per_token = {page_size} * {bpt} = {page_size * bpt}")
    if is_torch_tensor(kv_bf16):
        torch = require_torch("quantize_kv_cache")
        # One extra page-stride worth of storage is never needed: the last page only needs page_size * bpt bytes.
        storage = torch.empty(max(num_blocks - 1, 0) * stride + page_size * bpt, dtype=torch.uint8,
                              device=kv_bf16.device)
        return torch.as_strided(storage, (num_blocks, page_size, 1, bpt), (stride, bpt, bpt, 1))
    import numpy as np

    storage = np.empty(max(num_blocks * stride, 16), dtype=np.uint8)
    return np.lib.stride_tricks.as_strided(storage, (num_blocks, page_size, 1, bpt), (stride, bpt, bpt, 1))


def _host_bf16_empty(shape):
    import numpy as np

    try:
        import ml_dtypes

        return np.empty(shape, dtype=ml_dtypes.bfloat16)
    except ImportError:  # bf16 bits in uint16; _dlpack_arg cannot tell them apart, so keep it bf16-typed below
        return _Bf16Bits(np.empty(shape, dtype=np.uint16))


class _Bf16Bits:
    """A uint16 numpy array standing for bf16 bit patterns (host fallback without ml_dtypes)."""

    def __init__(self, bits):
        self.bits = bits
        self.shape = bits.shape


_PyCapsule_GetPointer = ctypes.pythonapi.PyCapsule_GetPointer
_PyCapsule_GetPointer.restype = ctypes.c_void_p
_PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_DL_DTYPE_OFFSET = 20  # DLTensor: data (8) + device (8) + ndim (4), then dtype {code u8, bits u8, lanes u16}
_DL_BFLOAT = 4         # kDLBfloat


def _bf16_capsule(bits_u16):
    """DLPack capsule of a uint16 numpy array, re-typed as bfloat16 (numpy cannot export bf16 itself)."""
    capsule = bits_u16.__dlpack__()
    address = _PyCapsule_GetPointer(capsule, b"dltensor")
    if ctypes.c_uint8.from_address(address + _DL_DTYPE_OFFSET + 1).value != 16:
        raise RuntimeError("openmla: unexpected DLPack tensor layout while re-typing a numpy array as bfloat16")
    ctypes.c_uint8.from_address(address + _DL_DTYPE_OFFSET).value = _DL_BFLOAT
    return capsule


def _dlpack_arg(x):
    """What the binding receives: torch tensors with 1-byte dtypes as uint8 views; numpy bfloat16 / float8 arrays
    (ml_dtypes) as DLPack capsules / uint8 views, since numpy exports neither type through DLPack."""
    if is_torch_tensor(x):
        return as_byte_view(x)
    if isinstance(x, _Bf16Bits):
        return _bf16_capsule(x.bits)
    dtype = getattr(x, "dtype", None)
    if type(x).__module__ == "numpy" and dtype is not None:
        if dtype.name == "bfloat16":
            return _bf16_capsule(x.view("uint16"))
        if dtype.itemsize == 1 and dtype.name.startswith("float8"):
            return x.view("uint8")
    return x
