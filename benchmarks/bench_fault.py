"""Garbage inputs: the time of a step with each kind of garbage beside the same step with valid inputs.

A garbage value must cost no more than a valid one (the goal: within 1.2x of the valid step). Each row `fault_<kind>`
times the step with one kind of garbage; `valid_time_us` is the same step with valid inputs, timed in the same run
(once per family, shared by its rows), and the row's target is 1.2 x valid_time_us, so ratio >= 1 means "within
1.2x". `slowdown` = time_us / valid_time_us.

  dense decode (b = 128 x 8K tokens, h_q = 128, s_q = 1, 128 block-table columns: the issue's step, 872 us on an
  H100 before, 25,368 us with one length of 2^31 - 1): one length 2^31 - 1 (clamped to the block table by the
  scheduler and the kernel), one length -5, one request's block-table entries all out of range / negative (read as
  zeros through the TMA bounds), NaN in every unused page (the cache is built with NaN pages between the used ones);
  sparse decode (V3.2 FP8, b = 64 x 8K tokens, s_q = 2, h_q = 128, topk 2048, sink, topk_length = topk): 10% of the
  slots INT_MIN / INT_MAX / past the cache / -1, topk_length 2^31 - 1 (clamped to topk) and negative (rows empty);
  append (64K new tokens into a 1M-token V3.2 cache): half the slots past the cache.
  checked mode: `fault_checked_dense_on` is the valid dense step with checked mode ON (the check kernel included in
  the span) beside the same step with it off (valid_time_us); off, an entry reads one flag and launches exactly
  what it launches without checked mode (the dense_decode and host_overhead suites time that path).

Timing: CUPTI span of the eager call's kernels (the decode suites' method, harness.time_cupti), after one call that
plans and a rest; the append rows by CUDA events (as the kv_cache suite).
"""
from __future__ import annotations

SUITE = "fault"
DEFAULT = True

D_V = 512
SLOWDOWN_GOAL = 1.2
INT32_MAX = 2 ** 31 - 1
INT32_MIN = -2 ** 31

_DENSE_KINDS = ("valid", "length_int_max", "length_negative", "block_table_out_of_range", "block_table_negative",
                "nan_unused_pages")
_SPARSE_KINDS = ("valid", "indices_int_min", "indices_int_max", "indices_beyond_cache", "indices_minus_one",
                 "topk_length_int_max", "topk_length_negative")
_APPEND_KINDS = ("valid", "slots_beyond_cache")

# The valid step of each family, timed once per run: {family: us}.
_VALID_US: dict = {}


def cases(quick=False):
    """Every kind of garbage of each family, after the family's valid step; the checked-mode row last."""
    del quick  # each row is a few hundred calls of a step below a millisecond
    rows = [dict(name=f"fault_dense_{k}", family="dense", kind=k) for k in _DENSE_KINDS]
    rows += [dict(name=f"fault_sparse_{k}", family="sparse", kind=k) for k in _SPARSE_KINDS]
    rows += [dict(name=f"fault_append_{k}", family="append", kind=k) for k in _APPEND_KINDS]
    rows.append(dict(name="fault_checked_dense_on", family="dense", kind="checked"))
    return rows


# ---------------------------------------------------------------------------------------------------------------
# Steps
# ---------------------------------------------------------------------------------------------------------------
def _dense_step(kind):
    """A call() of the dense step with `kind` of garbage (plans on its first call)."""
    import torch

    import bench_dense_decode as bd
    import openmla

    b, s_k = 128, 8192
    q, k_cache, block_table, seqlens, _ = bd.make_inputs(b, 1, 128, 1, s_k, varlen=False)
    if kind == "nan_unused_pages":
        # Every used page followed by an unused NaN page: twice the pages, the block table on the even ones.
        big = torch.full((2 * k_cache.shape[0],) + tuple(k_cache.shape[1:]), float("nan"), dtype=k_cache.dtype,
                         device=k_cache.device)
        big[0::2] = k_cache
        k_cache, block_table = big, block_table * 2
    elif kind == "length_int_max":
        seqlens[37] = INT32_MAX
    elif kind == "length_negative":
        seqlens[37] = -5
    elif kind == "block_table_out_of_range":
        block_table[37] = 2147480000
    elif kind == "block_table_negative":
        block_table[37] = -1
    out = torch.empty((b, 1, 128, D_V), dtype=q.dtype, device=q.device)
    lse = torch.empty((b, 1, 128), dtype=torch.float32, device=q.device).transpose(1, 2)
    meta, _ = openmla.get_mla_metadata()

    def call():
        openmla.flash_mla_with_kvcache(q, k_cache, block_table, seqlens, D_V, meta, causal=False, out=out, lse=lse)

    return call


def _sparse_step(kind):
    import torch

    import bench_sparse_decode as bs
    import openmla

    b, s_q, h_q, topk = 64, 2, 128, 2048
    q, k_cache, indices, sink, _, _ = bs.make_inputs(b, s_q, h_q, topk, 8192)
    capacity = k_cache.shape[0] * k_cache.shape[1]
    garbage = {"indices_int_min": INT32_MIN, "indices_int_max": INT32_MAX, "indices_beyond_cache": capacity + 5,
               "indices_minus_one": -1}.get(kind)
    if garbage is not None:
        gen = torch.Generator(device=indices.device).manual_seed(1)
        hit = torch.rand(indices.shape, generator=gen, device=indices.device) < 0.1
        indices = torch.where(hit, torch.full_like(indices, garbage), indices)
    # Every row passes topk_length (topk: every slot used), so the rows differ in the garbage only.
    value = {"topk_length_int_max": INT32_MAX, "topk_length_negative": -5}.get(kind, topk)
    lengths = torch.full((b,), value, dtype=torch.int32, device=q.device)
    out = torch.empty((b, s_q, h_q, D_V), dtype=q.dtype, device=q.device)
    lse = torch.empty((b, s_q, h_q), dtype=torch.float32, device=q.device).transpose(1, 2)
    meta, _ = openmla.get_mla_metadata()

    def call():
        openmla.flash_mla_with_kvcache(q, k_cache, None, None, D_V, meta, is_fp8_kvcache=True, indices=indices,
                                       attn_sink=sink, topk_length=lengths, out=out, lse=lse)

    return call


def _append_step(kind):
    import torch

    import openmla

    pages, page, n = 16384, 64, 65536
    cache = torch.zeros((pages, page, 1, 656), dtype=torch.uint8, device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(2)
    new_kv = (torch.randn((n, 576), generator=gen, device="cuda") / 10).to(torch.bfloat16)
    slots = torch.randperm(pages * page, generator=gen, device="cuda")[:n]
    if kind == "slots_beyond_cache":
        slots[::2] += pages * page
    return lambda: openmla.append_kv_cache(new_kv, slots, cache, "v32")


def _time(harness, call, family):
    """Microseconds of one call: CUPTI span for the decode steps, CUDA events for append."""
    if family == "append":
        call()
        return harness.time_cuda(call).median_us, "events"
    harness.rest_before_timing(call)
    t = harness.time_cupti(call)
    return t.span_us, t.method


def _step(family, kind):
    return {"dense": _dense_step, "sparse": _sparse_step, "append": _append_step}[family](kind)


def _valid_us(harness, family):
    if family not in _VALID_US:
        _VALID_US[family] = _time(harness, _step(family, "valid"), family)[0]
    return _VALID_US[family]


def run(case, harness):
    import openmla

    family, kind = case["family"], case["kind"]
    if kind == "checked":
        valid = _valid_us(harness, family)
        before = openmla.checked_mode()
        openmla.set_checked_mode(True)
        try:
            us, method = _time(harness, _step(family, "valid"), family)
            openmla.check_status()  # a valid step: nothing recorded
        finally:
            openmla.set_checked_mode(before)
        return {"time_us": us, "valid_time_us": valid, "slowdown": us / valid, "timing_method": method,
                "note": "checked mode on; valid_time_us: the same step with it off"}
    us, method = _time(harness, _step(family, kind), family)
    if kind == "valid":
        _VALID_US[family] = us
    valid = _valid_us(harness, family)
    return {"time_us": us, "valid_time_us": valid, "slowdown": us / valid, "timing_method": method,
            "target": {"time_us": SLOWDOWN_GOAL * valid}}
