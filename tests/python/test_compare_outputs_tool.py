"""tools/compare_outputs.py and tools/compare_builds.sh without a GPU: the case list, --help and --list
without torch, the --check logic on hand-made recordings (identical, differing, missing, failed, non-deterministic,
other inputs, saved tensors with their max abs diff), and the argument errors of both tools."""
from __future__ import annotations

import copy
import importlib.util
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(ROOT, "tools", "compare_outputs.py")
BUILDS = os.path.join(ROOT, "tools", "compare_builds.sh")


@pytest.fixture(scope="module")
def tool():
    spec = importlib.util.spec_from_file_location("compare_outputs_tool", TOOL)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def run_tool(*args, block_torch=True):
    """Runs the script in a fresh interpreter; with block_torch, `import torch` fails there (as without torch)."""
    prelude = "import runpy, sys; "
    if block_torch:
        prelude += "sys.modules['torch'] = None; "
    code = prelude + f"sys.argv = [{TOOL!r}] + {list(args)!r}; runpy.run_path({TOOL!r}, run_name='__main__')"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


# ---------------------------------------------------------------------------------------------------------------
# The case list
# ---------------------------------------------------------------------------------------------------------------
def test_help_and_list_need_no_torch():
    r = run_tool("--help")
    assert r.returncode == 0, r.stderr
    assert "--check" in r.stdout and "--save-tensors" in r.stdout
    r = run_tool("--list")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert lines[-1].startswith(f"{len(lines) - 1} cases (dense_decode ")


def test_case_matrix(tool):
    cases = tool.all_cases()
    assert 100 <= len(cases) <= 200
    names = [c.name for c in cases]
    assert len(set(names)) == len(names)
    families = {c.family for c in cases}
    assert families == {"dense_decode", "sparse_decode", "kv_cache"}
    dense = [c for c in cases if c.family == "dense_decode"]
    sparse = [c for c in cases if c.family == "sparse_decode"]
    codec = [c for c in cases if c.family == "kv_cache"]
    # What the matrix promises to cover (the GPU tests' dimensions).
    assert {c.dtype for c in dense} == {"bf16", "fp16"} and {c.causal for c in dense} == {False, True}
    assert {1, 2} <= {c.s_q for c in dense} and {16, 64, 128} <= {c.h_q for c in dense}
    assert any(c.h_kv > 1 for c in dense) and any(c.zero_len or c.lens for c in dense)
    assert any(c.s_k >= 16384 for c in dense), "split-KV cases"
    assert {c.layout for c in sparse} == {"v32", "model1"}
    for layout in ("v32", "model1"):
        rows = [c for c in sparse if c.layout == layout]
        assert any(c.extra is not None for c in rows) and any(c.main.lens for c in rows)
        assert any(c.sink != "none" for c in rows) and any(c.extra is None for c in rows)
    assert {c.cache_dtype for c in sparse} == {"uint8", "int8", "float8_e4m3fn"}
    assert {c.op for c in codec} == {"quantize", "quantize_alloc", "append"}
    assert {c.fmt for c in codec} == {"v32", "model1"}


def test_seeds_depend_on_the_name_only(tool):
    a, b = tool.all_cases()[:2]
    assert tool.case_seed(a.name) == tool.case_seed(a.name) != tool.case_seed(b.name)
    assert tool.cases_digest(tool.all_cases()) == tool.cases_digest(tool.all_cases())
    assert tool.cases_digest(tool.all_cases()[1:]) != tool.cases_digest(tool.all_cases())


def test_filter(tool, capsys):
    assert tool.main(["--list", "--filter", "^kv_cache/append"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert all(line.startswith("kv_cache/append") for line in out[:-1]) and len(out) > 2


# ---------------------------------------------------------------------------------------------------------------
# --check on hand-made recordings
# ---------------------------------------------------------------------------------------------------------------
def _entry(family, digests, inputs="00ff", repeat=True, files=None):
    outputs = {}
    for key, sha in digests.items():
        outputs[key] = {"shape": [2, 2], "dtype": "bfloat16", "nbytes": 8, "sha256": sha, "nan": 0, "inf": 0}
        if files:
            outputs[key]["file"] = files[key]
    return {"family": family, "inputs": inputs, "repeat_identical": repeat, "outputs": outputs, "seconds": 0.1}


def _recording(cases, tensors_dir=None, digest="abc"):
    return {"tool": "compare_outputs", "format": 1, "cases_digest": digest, "torch": "2.11.0",
            "device": "NVIDIA H100 (132 SMs)", "repeat": True, "tensors_dir": tensors_dir,
            "openmla": {"version": "0.1.0", "build_commit": "20f0c84", "package": "/x/python/openmla"},
            "cases": cases}


def _write(tmp_path, name, data):
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return str(path)


BASE = {
    "dense/grid/a": _entry("dense_decode", {"out": "11", "lse": "12"}),
    "sparse/grid/b": _entry("sparse_decode", {"out": "21", "lse": "22"}),
    "kv_cache/quantize/c": _entry("kv_cache", {"cache_storage": "31"}, repeat=None),
}


def test_check_identical(tool, tmp_path, capsys):
    a = _write(tmp_path, "a.json", _recording(BASE))
    b = _write(tmp_path, "b.json", _recording(copy.deepcopy(BASE)))
    assert tool.main(["--check", a, b]) == 0
    out = capsys.readouterr().out
    assert "all outputs bit-identical" in out
    assert "dense_decode          1          1          0" in out
    assert "all                   3          3          0" in out


def test_check_reports_each_kind_of_difference(tool, tmp_path, capsys):
    other = copy.deepcopy(BASE)
    other["dense/grid/a"]["outputs"]["lse"]["sha256"] = "99"
    other["sparse/grid/b"]["inputs"] = "0bad"
    other["kv_cache/quantize/c"] = {"family": "kv_cache", "error": "ValueError: argument 'src' ...", "seconds": 0}
    other["dense/only_b"] = _entry("dense_decode", {"out": "41"})
    base = copy.deepcopy(BASE)
    base["dense/not_deterministic"] = _entry("dense_decode", {"out": "51"}, repeat=False)
    other["dense/not_deterministic"] = _entry("dense_decode", {"out": "51"})
    a = _write(tmp_path, "a.json", _recording(base))
    b = _write(tmp_path, "b.json", _recording(other, digest="def"))
    assert tool.main(["--check", a, b]) == 1
    out = capsys.readouterr().out
    assert "different case lists" in out
    assert "all                   5          0          5" in out
    assert "lse: bytes differ (no saved tensors" in out
    assert "inputs differ" in out
    assert "error in B: ValueError: argument 'src'" in out
    assert "only in B" in out
    assert "not deterministic in A" in out
    assert out.rstrip().endswith("compare_outputs --check: DIFFERENT")


def test_check_max_abs_diff_from_saved_tensors(tool, tmp_path, capsys):
    np = pytest.importorskip("numpy")

    def bf16_bytes(values):  # float32 -> bf16 by truncation (exact for these values)
        return (np.asarray(values, np.float32).view(np.uint32) >> 16).astype(np.uint16).tobytes()

    for side, values in (("ta", [1.0, 2.0, float("nan"), 4.0]), ("tb", [1.0, 2.5, float("nan"), float("inf")])):
        (tmp_path / side).mkdir()
        (tmp_path / side / "a.out.bin").write_bytes(bf16_bytes(values))
        (tmp_path / side / "a.lse.bin").write_bytes(bf16_bytes([0.0, 0.0, 0.0, 0.0]))
    files = {"out": "a.out.bin", "lse": "a.lse.bin"}
    a_case = {"dense/a": _entry("dense_decode", {"out": "1", "lse": "2"}, files=files)}
    b_case = {"dense/a": _entry("dense_decode", {"out": "3", "lse": "2"}, files=files)}
    a = _write(tmp_path, "a.json", _recording(a_case, tensors_dir=str(tmp_path / "ta")))
    # B's folder is recorded at a path that no longer exists: found again next to the JSON.
    b = _write(tmp_path, "b.json", _recording(b_case, tensors_dir="/elsewhere/tb"))
    assert tool.main(["--check", a, b]) == 1
    out = capsys.readouterr().out
    assert "out: max |a-b| = 0.5 over 2 of 4 elements (1 with NaN/inf on one side only" in out
    assert "lse:" not in out


def test_check_rejects_a_file_it_did_not_write(tool, tmp_path):
    a = _write(tmp_path, "a.json", _recording(BASE))
    b = _write(tmp_path, "b.json", {"records": []})
    with pytest.raises(SystemExit, match=r"b\.json is not a file written by compare_outputs\.py --out"):
        tool.main(["--check", a, b])


# ---------------------------------------------------------------------------------------------------------------
# Argument errors
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("args,message", [
    ([], "one of --out, --check or --list is required"),
    (["--list", "--filter", "("], "argument --filter: not a regular expression"),
    (["--out", "x.json", "--filter", "no-such-case"], "argument --filter: no case matches 'no-such-case'"),
    (["--check", "a.json", "b.json", "--list"], "argument --check: not allowed with --out or --list"),
    (["--check", "a.json"], "argument --check: expected 2 arguments"),
])
def test_argument_errors(args, message):
    r = run_tool(*args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert message in r.stderr


def test_record_without_torch_names_what_is_missing(tmp_path):
    r = run_tool("--out", str(tmp_path / "x.json"), "--filter", "^kv_cache/append/v32-page1-")
    assert r.returncode == 2
    assert "compare_outputs: recording needs torch" in r.stderr
    assert not (tmp_path / "x.json").exists()


@pytest.mark.parametrize("args,message", [
    ([], "argument OLD_TREE is required"),
    (["/nonexistent/tree"], "argument OLD_TREE '/nonexistent/tree' is not an OpenMLA source tree"),
    (["."], "argument OLD_TREE is this tree itself"),
])
def test_compare_builds_argument_errors(args, message):
    r = subprocess.run(["bash", BUILDS, *args], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert message in r.stderr


def test_compare_builds_help():
    r = subprocess.run(["bash", BUILDS, "--help"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 0 and "git archive 20f0c84" in r.stdout
