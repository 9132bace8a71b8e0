"""The package itself: import without torch or a GPU, version, capability query, error mapping."""
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from conftest import GPU_SKIP_REASON, ROOT

import openmla

PYTHONPATH = os.pathsep.join([os.path.join(ROOT, "python"), os.path.join(ROOT, ".deps", "py")])


def run_isolated(code: str, hide_gpu: bool = False) -> str:
    """Runs `code` in a fresh interpreter in which `import torch` fails (and, optionally, no GPU is visible)."""
    prelude = "import sys; sys.modules['torch'] = None\n"  # makes `import torch` raise ImportError
    env = dict(os.environ, PYTHONPATH=PYTHONPATH)
    if hide_gpu:
        env["CUDA_VISIBLE_DEVICES"] = ""
    proc = subprocess.run([sys.executable, "-c", prelude + code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"isolated interpreter failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def cmake_project_version() -> str:
    with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
        m = re.search(r"project\(openmla VERSION (\d+\.\d+\.\d+)", f.read())
    assert m, "project(openmla VERSION x.y.z) not found in CMakeLists.txt"
    return m.group(1)


def test_import_without_torch_and_without_gpu():
    out = run_isolated(
        "import openmla\n"
        "assert 'torch' not in sys.modules or sys.modules['torch'] is None\n"
        "print(openmla.version())\n"
        "print(openmla.query_capability('kv_cache_quantize'))\n",
        hide_gpu=True,
    )
    lines = out.strip().splitlines()
    assert lines[0] == cmake_project_version()
    assert lines[1].startswith("(False, ")


def test_version_matches_the_build():
    assert re.fullmatch(r"\d+\.\d+\.\d+", openmla.version())
    assert openmla.version() == openmla.__version__ == cmake_project_version()


def test_build_commit_is_a_string():
    commit = openmla.build_commit()
    assert isinstance(commit, str) and commit
    assert commit == "unknown" or re.fullmatch(r"[0-9a-f]{7,40}(-dirty)?", commit), commit


@pytest.mark.parametrize("feature", openmla.FEATURES)
def test_query_capability_returns_flag_and_reason(feature):
    supported, reason = openmla.query_capability(feature)
    assert isinstance(supported, bool) and isinstance(reason, str)
    if supported:
        assert reason == ""
    else:
        assert reason.startswith(feature + ": "), reason


@pytest.mark.parametrize("feature", ["kv_cache_quantize", "dense_decode"])
def test_query_capability_without_gpu_names_the_reason(feature):
    # CUDA_VISIBLE_DEVICES="" hides any GPU, so this runs the same on every machine.
    out = run_isolated(f"import openmla; print(openmla.query_capability({feature!r}))", hide_gpu=True)
    supported, reason = eval(out)
    assert supported is False
    # Compiled in: no CUDA device. Compiled out by a CMake option: says so.
    assert "no CUDA device" in reason or "compiled out" in reason, reason


@pytest.mark.skipif(GPU_SKIP_REASON is None, reason="this machine has a Hopper GPU")
def test_query_capability_on_this_machine_explains_why_not():
    supported, reason = openmla.query_capability("kv_cache_quantize")
    assert supported is False
    assert re.search(r"no CUDA device|Hopper|compute capability|compiled out", reason), reason


def test_query_capability_not_implemented_features_say_so():
    for feature in ("sparse_prefill", "dense_prefill"):
        supported, reason = openmla.query_capability(feature)
        if not supported:
            assert reason.startswith(feature + ": ")


@pytest.mark.gpu
def test_query_capability_on_hopper_kv_cache_supported():
    assert openmla.query_capability("kv_cache_quantize") == (True, "")
    assert openmla.query_capability("kv_cache_quantize", device="cuda:0") == (True, "")


def test_query_capability_unknown_feature_is_value_error():
    with pytest.raises(ValueError, match=r"argument 'feature'"):
        openmla.query_capability("flash_attention_9000")


def test_query_capability_bad_device_argument():
    with pytest.raises(ValueError, match=r"argument 'device'"):
        openmla.query_capability("dense_decode", device="cpu")
    supported, reason = openmla.query_capability("kv_cache_quantize", device=1000)
    assert supported is False and reason


def test_cpp_invalid_argument_becomes_value_error_with_the_same_message():
    # A float16 host (numpy) array where the C++ API wants a bfloat16 CUDA tensor: the C++ validation
    # (src/api/validate.cpp, check_dtype) rejects it before any CUDA call, so this runs without a GPU. The
    # Python exception must be ValueError and carry the C++ Status message unchanged.
    quantize = getattr(openmla._openmla, "kv_cache_quantize", None)
    if quantize is None:
        pytest.skip("the binding has no kv_cache_quantize yet")
    src = np.zeros((2, 64, 1, 576), dtype=np.float16)
    dst = np.zeros((2, 64, 1, 656), dtype=np.uint8)
    with pytest.raises(ValueError) as err:
        quantize(src, dst, "v32", 0)
    assert str(err.value) == "argument 'src' has dtype float16, expected bfloat16"


def test_missing_submodule_names_the_file(monkeypatch):
    monkeypatch.setitem(openmla._MISSING, "not_a_function", "openmla.not_a_function is not available: x.py is missing")
    with pytest.raises(ImportError, match="x.py is missing"):
        openmla.not_a_function  # noqa: B018
    with pytest.raises(AttributeError):
        openmla.no_such_name  # noqa: B018


def test_public_names_exported():
    for name in ("version", "build_commit", "query_capability"):
        assert callable(getattr(openmla, name))
    for name in ("quantize_kv_cache", "dequantize_kv_cache", "append_kv_cache", "get_mla_metadata",
                 "flash_mla_with_kvcache", "FlashMLASchedMeta", "reference"):
        if name in openmla._MISSING:
            continue  # its submodule is not in this tree yet; using it raises a clear ImportError
        assert hasattr(openmla, name), name
