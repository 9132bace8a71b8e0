"""OpenMLA: Multi-head Latent Attention kernels for NVIDIA Hopper (sm_90a).

The Python API mirrors DeepSeek's ``flash_mla`` package (same names, arguments, returns), so an engine
can switch by changing one import:

    import openmla as flash_mla
    sched_meta, _ = flash_mla.get_mla_metadata()
    out, lse = flash_mla.flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, 512,
                                                sched_meta, causal=True)

Besides the decode functions, the package exports sparse prefill (``flash_mla_sparse_fwd``), dense MHA
prefill (``flash_attn_varlen_func`` and its packed variants, forward), the FP8 KV-cache codec (``quantize_kv_cache``,
``dequantize_kv_cache``, ``append_kv_cache``), the merge of partial attention states for decode context parallelism
(``merge_attn_states``; helpers for the ranks' slices in ``openmla.dcp``), ``query_capability``, ``version`` and ``build_commit``,
checked mode (``set_checked_mode``, ``checked_mode``, ``check_status``; the environment variable
``OPENMLA_CHECK=1`` turns it on), and the CPU reference implementations as ``openmla.reference``. Where torch is
importable, importing the package also registers the torch custom ops ``torch.ops.openmla.*``
(python/openmla/_torch_ops.py).

Importing the package needs neither torch nor a GPU. Torch is used at run time, where present, to
allocate outputs and find the current stream.
"""
from __future__ import annotations

import importlib
import importlib.util

try:
    from . import _openmla
except ModuleNotFoundError as _err:  # only "not built"; a broken extension (undefined symbol...) raises as is
    if _err.name != f"{__name__}._openmla":
        raise
    raise ImportError(
        "openmla: the compiled extension openmla._openmla is not built. Run tools/test.sh (or "
        "`cmake -S . -B build -G Ninja && cmake --build build`), which places it in python/openmla/, "
        "or install the package with `pip install .`"
    ) from _err

#: Feature names understood by query_capability().
# The page sizes dense decode takes (k_cache.shape[1]); docs/dense-decode.md, "Page sizes". query_capability
# ("dense_decode_any_page_size") answers for the device and build; a call with another page size raises ValueError
# naming problem.page_block_size.
DENSE_PAGE_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)

FEATURES = ("kv_cache_quantize", "dense_decode", "sparse_decode", "sparse_prefill", "dense_prefill",
            "merge_attn_states", "decode_batch_invariant", "dense_decode_fp8", "dense_prefill_fp8",
            "dense_decode_any_page_size", "decode_varlen_q", "sparse_prefill_fp8")

__version__ = _openmla.version()


def version() -> str:
    """The library version, "major.minor.patch"."""
    return _openmla.version()


def build_commit() -> str:
    """The git commit the compiled library was built from ("unknown" when built outside git)."""
    return _openmla.build_commit()


def query_capability(feature: str, device=0) -> tuple[bool, str]:
    """Whether ``feature`` runs on CUDA device ``device`` with this build: ``(True, "")`` or ``(False, reason)``.

    ``feature`` is one of :data:`FEATURES`. ``device`` is a device index, a ``torch.device`` or a string
    such as ``"cuda:1"``. The reason names what is missing: no CUDA device, a GPU that is not Hopper
    (compute capability 9.0), a kernel family compiled out, or a kernel not implemented yet. Never raises
    for a missing GPU; raises ValueError for an unknown feature name.
    """
    return tuple(_openmla.query_capability(feature, _device_index(device)))


def set_checked_mode(enabled: bool) -> None:
    """Turns checked mode on or off for the whole process (overrides the ``OPENMLA_CHECK`` environment variable).

    In checked mode every call also checks, on the GPU, the inputs it cannot see from the host (block-table entries,
    cache_seqlens, sparse indices and top-k lengths, append slots, the attention sink, whether the schedule matches
    the call's lengths) and records the first violation; :func:`check_status` reports it. No host synchronisation
    and no allocation, so checked calls can be captured in CUDA graphs. Off by default; free when off.
    """
    _openmla.set_checked_mode(bool(enabled))


def checked_mode() -> bool:
    """Whether checked mode is on (``OPENMLA_CHECK`` set to anything but "" or "0", or :func:`set_checked_mode`)."""
    return bool(_openmla.checked_mode())


def check_status(device=None) -> None:
    """Raises ValueError naming the first input violation checked mode found since the last call (the call, the
    argument, the request / row / slot and the value), then clears it; returns None when there was none.

    ``device``: a CUDA device index, ``torch.device`` or ``"cuda[:N]"``; None: the current device. Synchronises that
    device (waits for every call already launched); not for use inside CUDA-graph capture.
    """
    _openmla.checked_mode_status(-1 if device is None else _device_index(device))


def _device_index(device) -> int:
    if isinstance(device, int):
        return device
    if isinstance(device, str):
        kind, _, idx = device.partition(":")
        if kind == "cuda" and (idx == "" or idx.isdigit()):
            return int(idx) if idx else 0
    elif getattr(device, "type", None) == "cuda":  # torch.device
        return device.index or 0
    raise ValueError(f"argument 'device': expected a CUDA device index, torch.device or 'cuda[:N]', got {device!r}")


# ---------------------------------------------------------------------------------------------------
# Public functions of the submodules, re-exported at the top level (flash_mla-compatible names).
# A submodule file that is absent (a kernel family not in this tree yet) turns its names into a clear
# ImportError at first use; an error raised while importing a submodule that exists is NOT hidden.
# ---------------------------------------------------------------------------------------------------
_EXPORTS = {
    "kv_cache": ("quantize_kv_cache", "dequantize_kv_cache", "append_kv_cache"),
    "decode": ("get_mla_metadata", "flash_mla_with_kvcache", "FlashMLASchedMeta"),
    "decode_fp8": ("flash_mla_with_kvcache_fp8",),
    "prefill": ("flash_mla_sparse_fwd", "flash_mla_sparse_fwd_fp8"),
    "mha": ("flash_attn_varlen_func", "flash_attn_varlen_qkvpacked_func", "flash_attn_varlen_kvpacked_func"),
    "merge": ("merge_attn_states",),
}
_MISSING: dict[str, str] = {}  # public name -> why it is unavailable

__all__ = ["FEATURES", "DENSE_PAGE_SIZES", "version", "build_commit", "query_capability", "set_checked_mode", "checked_mode",
           "check_status"]

for _module_name, _names in _EXPORTS.items():
    if importlib.util.find_spec(f"{__name__}.{_module_name}") is None:
        for _name in _names:
            _MISSING[_name] = (
                f"openmla.{_name} is not available: the submodule openmla.{_module_name} "
                f"(python/openmla/{_module_name}.py) is missing from this installation"
            )
        continue
    _module = importlib.import_module(f".{_module_name}", __name__)
    for _name in _names:
        if hasattr(_module, _name):
            globals()[_name] = getattr(_module, _name)
            __all__.append(_name)
        else:
            _MISSING[_name] = f"openmla.{_name} is not available: openmla.{_module_name} does not define it"

if importlib.util.find_spec(f"{__name__}.dcp") is not None:
    from . import dcp  # noqa: E402  (decode context parallelism: the ranks' slices of a request's tokens)

    __all__.append("dcp")

if importlib.util.find_spec(f"{__name__}.reference") is not None:
    from . import reference  # noqa: E402  (CPU reference implementations, over _openmla.ref)

    __all__.append("reference")
else:
    _MISSING["reference"] = (
        "openmla.reference is not available: python/openmla/reference.py is missing from this installation"
    )


# torch.ops.openmla.* (python/openmla/_torch_ops.py), where torch is importable. A failure to register them leaves
# the rest of the package usable and is reported once, as a warning.
from ._runtime import has_torch as _has_torch  # noqa: E402

if _has_torch():
    try:
        from . import _torch_ops  # noqa: F401
    except Exception as _err:  # pragma: no cover - depends on the torch build
        import warnings

        warnings.warn(f"openmla: the torch custom ops torch.ops.openmla.* could not be registered: "
                      f"{type(_err).__name__}: {_err}", RuntimeWarning, stacklevel=2)


def __getattr__(name: str):
    if name in _MISSING:
        raise ImportError(_MISSING[name])
    raise AttributeError(f"module 'openmla' has no attribute {name!r}")


del _module_name, _names
