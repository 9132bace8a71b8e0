"""Shared pytest fixtures. GPU tests carry the `gpu` marker and skip with a visible reason when there is
no torch, no CUDA device, or no Hopper GPU; everything else runs everywhere."""
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# OPENMLA_PACKAGE_DIR: the folder holding the openmla package under test (default: python/ of this tree); tools/test.sh
# points it at a copy beside a second build's extension (its family-off build).
sys.path.insert(0, os.environ.get("OPENMLA_PACKAGE_DIR") or os.path.join(ROOT, "python"))


def _gpu_skip_reason():
    try:
        import torch
    except Exception:
        return "GPU test: PyTorch is not installed on this machine"
    if not torch.cuda.is_available():
        return "GPU test: no CUDA device on this machine"
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) != (9, 0):
        return f"GPU test: needs a Hopper GPU (sm_90a), found compute capability {major}.{minor}"
    return None


GPU_SKIP_REASON = _gpu_skip_reason()


@pytest.fixture(autouse=True)
def _full_fp32_reference():
    """The torch references' fp32 matmuls must be real fp32 (TF32 off), as flash_mla's dense test keeps them."""
    try:
        import torch
    except Exception:
        yield
        return
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = old


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a Hopper GPU and torch")


def pytest_collection_modifyitems(config, items):
    if GPU_SKIP_REASON is None:
        return
    skip = pytest.mark.skip(reason=GPU_SKIP_REASON)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
