"""Training step of a small MLA-shaped model (benchmarks/mha_train_model.py, the model of tests/python/test_mha_train.py
at a larger width): forward + backward of one step (no optimizer step), with openmla.flash_attn_varlen_func as the
attention and with torch SDPA per sequence (torch picks its kernel), in the same process.

Cases: d_model 1024, 4 blocks, 16 query heads of d_qk 192 (128 NoPE + 64 RoPE), d_v 128, kv latent 512, SwiGLU MLP
2816, 8 packed sequences of 512-4096 tokens (seeded); MHA (h_kv 16) and GQA (h_kv 4). Each step is timed with CUDA
events around it, an 8 GB flush before each (harness.time_cuda), median of the run's repetitions. `time_us` is
openmla's step; `sdpa_us` SDPA's; run.py's ratio (the target is SDPA's time) = sdpa_us / time_us (> 1: faster). The
whole step's time, so the ratio is diluted by the projections and MLPs both paths share.

Not in the default run (a model-level figure; `--suite mha_train_step`). Skips every case when the dense MHA
prefill family is compiled out or its backward answers NotImplementedError.
"""
from __future__ import annotations

import random

SUITE = "mha_train_step"
DEFAULT = False
SEED = 0


def _lengths(n=8, lo=512, hi=4096, seed=SEED):
    rng = random.Random(seed)
    return tuple(rng.randint(lo, hi) for _ in range(n))


def cases(quick=False):
    del quick
    import bench_mha_prefill_fwd as fwd

    why = fwd._build_gap()
    if why:
        print(f"[{SUITE}] skipped: {why}", flush=True)
        return []
    base = dict(d_model=1024, n_layers=4, h_q=16, kv_rank=512, mlp_hidden=2816, lengths=_lengths())
    return [dict(name="mla_d1024_l4_h16_mha", h_kv=16, **base), dict(name="mla_d1024_l4_h16_gqa4", h_kv=4, **base)]


def _config(case):
    import mha_train_model as m

    fields = ("d_model", "n_layers", "h_q", "h_kv", "kv_rank", "mlp_hidden", "lengths")
    return m.TrainConfig(**{k: case[k] for k in fields})


def run(case, harness):
    import torch

    import mha_train_model as m
    from harness import SkipCase

    cfg = _config(case)
    times = {}
    for backend in ("openmla", "sdpa"):
        step, model, batch = m.step_callable(cfg, backend, "cuda")
        try:
            harness.rest_before_timing(step)
        except NotImplementedError as err:
            raise SkipCase(f"{backend}: {err}") from err
        times[backend] = harness.time_cuda(step).median_us
        del step, model, batch
        torch.cuda.empty_cache()
    params = {k: v for k, v in case.items() if k not in ("name", "lengths")}
    params["tokens"] = sum(cfg.lengths)
    return {
        "params": dict(params, lengths=list(cfg.lengths)),
        "time_us": times["openmla"],
        "sdpa_us": times["sdpa"],
        "ratio_to_sdpa": times["sdpa"] / times["openmla"],
        "timing_method": "events",
        "target": {"time_us": times["sdpa"]},  # run.py: ratio = SDPA's step time / ours
    }
