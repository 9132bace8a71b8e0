"""The output guard of a refactor, on the GPU test matrix itself: with OPENMLA_RECORD_OUTPUTS=FILE set, the tests'
calls of the prefill entry points are recorded (conftest.py installs the wrappers), one JSON line per call: the test
that made it, the call's ordinal within the test, the sha256 of every input and output tensor. Run the same tests
under two builds (OPENMLA_PACKAGE_DIR points the tests at the other build's package) and compare:

    OPENMLA_RECORD_OUTPUTS=new.jsonl pytest tests/python/test_mha_prefill.py tests/python/test_sparse_prefill.py
    OPENMLA_PACKAGE_DIR=.ab/base/python OPENMLA_RECORD_OUTPUTS=base.jsonl pytest <the same files>
    python3 tests/python/output_record.py --check base.jsonl new.jsonl    # exit 1 on any difference

A call whose inputs differ between the two runs is reported as such (the test drew other inputs), not as an output
difference. Only calls that returned are recorded (argument-error tests record nothing). tools/compare_outputs.py is
the same guard for the decode families and the codec on a fixed matrix of its own.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import sys

# The recorded entry points: the flash_mla-compatible prefill functions, and the binding's MHA call with a forced
# epilogue (tests/python/test_mha_prefill.py, call_with_epilogue), whose outputs are its arguments out and lse.
PUBLIC = ("flash_attn_varlen_func", "flash_attn_varlen_qkvpacked_func", "flash_attn_varlen_kvpacked_func",
          "flash_mla_sparse_fwd")
BINDING_OUT_ARGS = {"mha_prefill": (6, 7)}


def _digest(t) -> str:
    import torch

    t = t.detach()
    if t.dtype in (torch.bfloat16, torch.float16, torch.float8_e4m3fn):
        t = t.view(torch.int16 if t.element_size() == 2 else torch.uint8)
    data = t.contiguous().cpu().numpy().tobytes()
    return f"{tuple(t.shape)}:{str(t.dtype)}:{hashlib.sha256(data).hexdigest()[:32]}"


def _tensors(values):
    import torch

    return [v for v in values if isinstance(v, torch.Tensor)]


class Recorder:
    def __init__(self, path: str):
        self.path = path
        self.counts: dict = {}
        open(path, "w").close()

    def record(self, what: str, inputs, outputs):
        import torch

        torch.cuda.synchronize()
        test = os.environ.get("PYTEST_CURRENT_TEST", "?").rsplit(" (", 1)[0]
        n = self.counts.get(test, 0)
        self.counts[test] = n + 1
        line = {"test": test, "call": n, "entry": what, "inputs": [_digest(t) for t in _tensors(inputs)],
                "outputs": [_digest(t) for t in _tensors(outputs)]}
        with open(self.path, "a") as f:
            f.write(json.dumps(line) + "\n")

    def wrap_public(self, module, name):
        fn = getattr(module, name)

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            res = fn(*args, **kwargs)
            outs = res if isinstance(res, (tuple, list)) else (res,)
            self.record(name, list(args) + list(kwargs.values()), outs)
            return res

        setattr(module, name, wrapper)

    def wrap_binding(self, ext, name, out_args):
        fn = getattr(ext, name)

        def wrapper(*args, **kwargs):
            res = fn(*args, **kwargs)
            self.record(name, [a for i, a in enumerate(args) if i not in out_args], [args[i] for i in out_args])
            return res

        setattr(ext, name, wrapper)


def install(path: str) -> None:
    """Wraps the prefill entry points of the openmla package first on sys.path (conftest.py, when
    OPENMLA_RECORD_OUTPUTS is set)."""
    import openmla

    rec = Recorder(path)
    for name in PUBLIC:
        if hasattr(openmla, name):
            rec.wrap_public(openmla, name)
    for name, out_args in BINDING_OUT_ARGS.items():
        if hasattr(openmla._openmla, name):
            rec.wrap_binding(openmla._openmla, name, out_args)


def _load(path):
    with open(path) as f:
        return {(d["test"], d["call"]): d for d in map(json.loads, f)}


def check(path_a: str, path_b: str) -> int:
    a, b = _load(path_a), _load(path_b)
    same = differ = inputs_differ = 0
    only = sorted(set(a) ^ set(b))
    for key in sorted(set(a) & set(b)):
        x, y = a[key], b[key]
        if x["inputs"] != y["inputs"]:
            inputs_differ += 1
            print(f"INPUTS DIFFER  {key[0]} #{key[1]} ({x['entry']})")
        elif x["outputs"] != y["outputs"]:
            differ += 1
            bad = [i for i, (p, q) in enumerate(zip(x["outputs"], y["outputs"])) if p != q]
            print(f"DIFFERENT      {key[0]} #{key[1]} ({x['entry']}): outputs {bad}")
        else:
            same += 1
    for key in only:
        print(f"ONLY IN {'A' if key in a else 'B'}      {key[0]} #{key[1]}")
    print(f"output_record: {same} calls identical, {differ} different, {inputs_differ} with other inputs, "
          f"{len(only)} in one run only ({path_a} vs {path_b})")
    return 0 if differ == 0 and inputs_differ == 0 and not only else 1


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] != "--check":
        print(__doc__)
        sys.exit(2)
    sys.exit(check(sys.argv[2], sys.argv[3]))
