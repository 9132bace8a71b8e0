"""CPU-only test of benchmarks/run.py's records written as the run goes: after every case the JSON holds the records
so far and `"partial": true`, so a run cut short by a time limit keeps what it measured; the finished run's JSON has
no `partial`. A fake suite and a fake harness stand in for the GPU (no torch, no GPU)."""
import argparse
import json
import os
import sys
import types

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import run  # noqa: E402


def test_json_is_written_after_every_case(tmp_path, monkeypatch, capsys):
    out = tmp_path / "bench.json"
    seen = []

    def fake_run(case, h):
        if os.path.exists(out):  # what a run killed now would leave
            d = json.load(open(out))
            seen.append((d.get("partial"), [r["name"] for r in d["records"]]))
        return {"time_us": 10.0 * case["x"], "flops": 1e9}

    mod = types.ModuleType("bench_fake")
    mod.SUITE = "fake"
    mod.cases = lambda: [{"name": "a", "x": 1}, {"name": "b", "x": 2}, {"name": "c", "x": 3}]
    mod.run = fake_run
    monkeypatch.setattr(run, "discover", lambda: ({"fake": mod}, []))
    monkeypatch.setattr(run, "gpu_unavailable_reason", lambda: None)
    monkeypatch.setattr(run.harness_mod, "measure_ceilings", lambda: {"copy_gbps": 3000.0, "matmul_tflops": 800.0})
    monkeypatch.setattr(run.harness_mod, "device_name", lambda: "FakeGPU")
    monkeypatch.setattr(run.harness_mod, "Harness", lambda *a, **k: object())
    monkeypatch.setattr(run.peer_mod, "describe_peer", lambda: {"available": False, "why": "test"})
    args = argparse.Namespace(list=False, suite=["fake"], filter=None, json=str(out), history_dir=None, quick=False,
                              warmup=None, reps=None)
    assert run.run_benchmarks(args) == 0
    assert seen == [(True, ["a"]), (True, ["a", "b"])]
    final = json.load(open(out))
    assert "partial" not in final and [r["name"] for r in final["records"]] == ["a", "b", "c"]
    # each case's result is in the log as soon as it is measured
    assert "  time_us 20.00" in capsys.readouterr().out
