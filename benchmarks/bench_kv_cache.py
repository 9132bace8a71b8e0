"""FP8 KV-cache codec: quantise, dequantise and append at 1M tokens (page 64), both layouts, in GB/s against the
measured device-copy ceiling (the codec's goal, docs/targets.md: >= 80% of the copy ceiling).

Bytes are read + written (formulas.py: kv_quantize_bytes / kv_dequantize_bytes / kv_append_bytes), the same
counting as the copy ceiling. Inputs are N(0, 1) bf16 values with per-token magnitudes spread over 2^-20..2^20
(realistic scales; the kernels' cost does not depend on the values). Append writes every token to a slot of a
random permutation (scattered 656 / 584-byte records, int64 slots), i.e. the worst-case placement an engine
produces. The target of each row is 80% of this run's copy ceiling.

Timed with CUDA events (harness.time_cuda; records say timing_method "events"), not CUPTI as the decode suites:
the target comes from the copy ceiling, which is timed the same way, and a ~1 ms call hardly notices the few
microseconds of event overhead.
"""
from __future__ import annotations

SUITE = "kv_cache"
DEFAULT = True

PAGE = 64
TOKENS = 1 << 20  # 1M tokens = 16384 pages of 64
TARGET_FRACTION_OF_COPY = 0.8
_FORMATS = {"v32": 576, "model1": 512}


def _all_cases():
    cases = []
    for fmt in ("v32", "model1"):
        for op in ("quantize", "dequantize", "append"):
            cases.append(dict(name=f"{op}_{fmt}_1M_page{PAGE}", op=op, format=fmt, tokens=TOKENS, page_size=PAGE))
    return cases


def cases(quick=False):
    """Every row: each case takes about a millisecond of GPU time, so `quick` keeps them all."""
    return _all_cases()


def _inputs(fmt, tokens, page_size, device="cuda"):
    import torch

    d = _FORMATS[fmt]
    gen = torch.Generator(device=device).manual_seed(0)
    num_blocks = tokens // page_size
    kv = torch.randn((num_blocks, page_size, 1, d), generator=gen, device=device, dtype=torch.float32)
    kv *= torch.exp2(torch.randint(-20, 21, (num_blocks, page_size, 1, 1), generator=gen, device=device).float())
    return kv.to(torch.bfloat16)


def run(case, harness):
    import torch

    from openmla import kv_cache as kc

    fmt, tokens, page_size, op = case["format"], case["tokens"], case["page_size"], case["op"]
    d = _FORMATS[fmt]
    kv = _inputs(fmt, tokens, page_size)
    cache = kc.quantize_kv_cache(kv, fmt)
    f = harness.formulas

    if op == "quantize":
        def call():
            kc.quantize_kv_cache(kv, fmt, out=cache)

        nbytes = f.kv_quantize_bytes(tokens, fmt)
    elif op == "dequantize":
        out = torch.empty_like(kv)

        def call():
            kc.dequantize_kv_cache(cache, fmt, out=out)

        nbytes = f.kv_dequantize_bytes(tokens, fmt)
    else:
        gen = torch.Generator(device="cuda").manual_seed(1)
        slots = torch.randperm(tokens, generator=gen, device="cuda", dtype=torch.int64)
        new_kv = kv.view(tokens, d)

        def call():
            kc.append_kv_cache(new_kv, slots, cache, fmt)

        nbytes = f.kv_append_bytes(tokens, fmt, slot_bytes=8)

    call()
    torch.cuda.synchronize()
    timing = harness.time_cuda(call)
    time_us = float(getattr(timing, "median_us", timing))
    gbps = nbytes / (time_us * 1e-6) / 1e9
    copy_gbps = (getattr(harness, "ceilings", None) or {}).get("copy_gbps")
    record = {
        "params": {k: v for k, v in case.items() if k != "name"},
        "time_us": time_us,
        "bytes": nbytes,
        "gbps": gbps,
        "timing_method": "events",
    }
    if copy_gbps:
        record["target"] = {"gbps": TARGET_FRACTION_OF_COPY * copy_gbps}
    return record
