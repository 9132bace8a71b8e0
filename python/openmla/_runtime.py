"""Run-time helpers shared by the Python API: torch (optional) and CUDA stream handling.

Torch is never needed to build or import OpenMLA; it is used where present to allocate outputs and to
find the current CUDA stream. Functions that need it raise a clear error when it is missing.
"""
from __future__ import annotations

try:  # torch is optional
    import torch as _torch
except Exception:  # pragma: no cover - depends on the machine
    _torch = None


def has_torch() -> bool:
    return _torch is not None


def require_torch(what: str):
    """Returns the torch module or raises ImportError naming the function that needs it."""
    if _torch is None:
        raise ImportError(f"openmla.{what} needs PyTorch to allocate its outputs; install torch or use the C++ API")
    return _torch


def torch_tensors_read_in_place() -> bool:
    """Whether the binding reads torch tensors by itself: torch >= 2.10 publishes the DLPack C exchange API on
    torch.Tensor, through which the binding reads a tensor, torch's current stream and allocates outputs without a
    Python call into torch (python/csrc/object_tensors.h). Looked up on a CPU tensor: no GPU is touched."""
    if _torch is None:
        return False
    try:
        from . import _openmla

        return bool(_openmla.read_tensor(_torch.empty(0, device="cpu"))[-1])
    except Exception:  # pragma: no cover - depends on the torch build
        return False


def is_torch_tensor(x) -> bool:
    return _torch is not None and isinstance(x, _torch.Tensor)


def stream_of(tensor) -> int:
    """The raw cudaStream_t (as int) of torch's current stream on `tensor`'s device; 0 otherwise."""
    if _torch is not None and isinstance(tensor, _torch.Tensor) and tensor.is_cuda:
        return _torch.cuda.current_stream(tensor.device).cuda_stream
    return 0


def as_byte_view(tensor):
    """Views an FP8 / int8 torch tensor as uint8 (the C++ API treats FP8 caches as bytes)."""
    if _torch is not None and isinstance(tensor, _torch.Tensor) and tensor.dtype != _torch.uint8:
        if tensor.element_size() == 1:
            return tensor.view(_torch.uint8)
    return tensor
