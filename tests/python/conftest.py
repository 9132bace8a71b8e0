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
    # The output guard of a refactor (output_record.py): every prefill call's outputs, hashed, into this file.
    if os.environ.get("OPENMLA_RECORD_OUTPUTS") and GPU_SKIP_REASON is None:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import output_record

        output_record.install(os.environ["OPENMLA_RECORD_OUTPUTS"])


# The kernel families (query_capability features) each GPU test file calls. In a build with a family switched off
# (CMake OPENMLA_ENABLE_<FAMILY>=OFF) a GPU test of that family skips with the capability's reason instead of
# failing on "not built"; a file missing here is not checked.
FAMILIES_BY_FILE = {
    "test_dense_decode.py": ("dense_decode",),
    "test_dense_decode_page_sizes.py": ("dense_decode",),
    "test_dense_decode_small_pages.py": ("dense_decode", "dense_decode_any_page_size"),
    "test_decode_api.py": ("dense_decode", "sparse_decode"),
    "test_sparse_decode.py": ("sparse_decode",),
    "test_decode_heads.py": ("dense_decode", "sparse_decode", "kv_cache_quantize"),
    "test_kv_cache.py": ("kv_cache_quantize",),
    "test_sparse_prefill.py": ("sparse_prefill",),
    "test_sparse_prefill_fp8.py": ("sparse_prefill_fp8", "kv_cache_quantize"),
    "test_mha_prefill.py": ("dense_prefill",),
    "test_mha_prefill_api.py": ("dense_prefill",),
    "test_mha_prefill_fp8.py": ("dense_prefill", "dense_prefill_fp8"),
    "test_mha_prefill_bwd.py": ("dense_prefill",),
    "test_mha_train.py": ("dense_prefill",),
    "test_faults.py": ("dense_decode", "sparse_decode", "kv_cache_quantize", "sparse_prefill"),
    "test_integration.py": ("dense_decode", "kv_cache_quantize"),
    "test_torch_ops.py": ("dense_decode", "sparse_decode", "kv_cache_quantize", "sparse_prefill"),
    "test_host_path.py": ("dense_decode", "kv_cache_quantize", "sparse_prefill"),
    "test_package.py": ("dense_decode", "kv_cache_quantize"),
    "test_merge_states.py": ("merge_attn_states",),
    "test_dcp.py": ("merge_attn_states", "dense_decode", "sparse_decode", "kv_cache_quantize"),
    "test_batch_invariant.py": ("dense_decode", "sparse_decode", "decode_batch_invariant", "kv_cache_quantize"),
    "test_dense_decode_fp8.py": ("dense_decode_fp8",),
    "test_decode_varlen_q.py": ("dense_decode", "sparse_decode", "decode_varlen_q", "kv_cache_quantize"),
}


def _missing_family_reasons():
    """{feature: reason} for the families this build compiled out (empty when openmla does not import)."""
    try:
        import openmla
    except Exception:
        return {}
    missing = {}
    for feature in openmla.FEATURES:
        ok, reason = openmla.query_capability(feature)
        if not ok and "compiled out" in reason:  # api/capability.cpp: "<feature>: compiled out (OPTION=OFF)"
            missing[feature] = reason
    return missing


def pytest_collection_modifyitems(config, items):
    if GPU_SKIP_REASON is not None:
        skip = pytest.mark.skip(reason=GPU_SKIP_REASON)
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)
        return
    missing = _missing_family_reasons()
    if not missing:
        return
    for item in items:
        if "gpu" not in item.keywords:
            continue
        for feature in FAMILIES_BY_FILE.get(os.path.basename(str(item.fspath)), ()):
            if feature in missing:
                item.add_marker(pytest.mark.skip(reason=f"GPU test of a compiled-out family: {missing[feature]}"))
                break
