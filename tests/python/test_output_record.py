"""The refactor guard's comparison (output_record.py --check) on hand-made records: no GPU needed."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import output_record  # noqa: E402


def _write(path, lines):
    with open(path, "w") as f:
        for d in lines:
            f.write(json.dumps(d) + "\n")


def _call(test, n, inputs, outputs):
    return {"test": test, "call": n, "entry": "flash_mla_sparse_fwd", "inputs": inputs, "outputs": outputs}


def test_identical_records_pass(tmp_path, capsys):
    a = [_call("t::x", 0, ["i0"], ["o0", "o1"]), _call("t::x", 1, ["i1"], ["o2"])]
    _write(tmp_path / "a.jsonl", a)
    _write(tmp_path / "b.jsonl", list(reversed(a)))
    assert output_record.check(str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")) == 0
    assert "2 calls identical, 0 different" in capsys.readouterr().out


def test_differences_fail_and_are_named(tmp_path, capsys):
    _write(tmp_path / "a.jsonl", [_call("t::x", 0, ["i0"], ["o0", "o1"]), _call("t::y", 0, ["i"], ["o"]),
                                  _call("t::z", 0, ["i"], ["o"])])
    _write(tmp_path / "b.jsonl", [_call("t::x", 0, ["i0"], ["o0", "oX"]), _call("t::y", 0, ["j"], ["o"])])
    assert output_record.check(str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")) == 1
    out = capsys.readouterr().out
    assert "DIFFERENT      t::x #0 (flash_mla_sparse_fwd): outputs [1]" in out
    assert "INPUTS DIFFER  t::y #0" in out
    assert "ONLY IN A      t::z #0" in out
