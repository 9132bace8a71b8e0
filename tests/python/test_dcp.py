"""Decode context parallelism (DCP) over two GPUs: each rank decodes its slice of every request's KV with
openmla.flash_mla_with_kvcache, the ranks all-gather (out, lse) through NCCL, openmla.merge_attn_states combines them,
and the result must match one decode of the whole cache on one GPU within the decode tolerances (docs/contracts.md
section 8). docs/integration.md, "Decode context parallelism", is the recipe this follows.

Run as plain `pytest tests/python/test_dcp.py`: the module spawns two worker processes once (torch.multiprocessing,
NCCL over 127.0.0.1), runs every case in them and the tests read the results. It skips with its reason where fewer than
two Hopper GPUs (or no NCCL) are visible. The helpers of openmla.dcp are also tested on the CPU against brute force
(torch, no GPU).

Cases: dense decode (bf16 cache, page 64, d_qk 576, d_v 512) at h_q 16 and 128, s_q 1 and 2 non-causal in both
layouts (contiguous and interleaved), causal s_q = 2 in the contiguous layout (the last rank runs causal, the other one
not: openmla.dcp.local_causal); sparse decode over the FP8 V3.2 cache (each rank's indices filtered to its tokens and
translated to its local slots, the others -1: openmla.dcp.split_indices) at h_q 128 and 64, s_q 1 and 2, both layouts.
Request lengths include 0 and 1, so a rank's slice is often empty (out 0, lse +inf), which the merge must skip.
"""
from __future__ import annotations

import json
import math
import os
import socket
import tempfile
import time
import traceback

import pytest

torch = pytest.importorskip("torch", reason="DCP tests need PyTorch, which is not installed here")

import openmla  # noqa: E402
from openmla import dcp  # noqa: E402

gpu = pytest.mark.gpu
WORLD = 2
D_QK, D_V, PAGE = 576, 512, 64
LENGTHS = [1, 0, 200, 4097, 1000, 63]  # tokens per request: empty slices, one page, several, a tail
SPARSE_TOPK = 256
WORKER_TIMEOUT_S = 540


# ---------------------------------------------------------------------------------------------------------------
# The cases
# ---------------------------------------------------------------------------------------------------------------
def _dense_cases():
    cases = []
    for h_q in (16, 128):
        for s_q, causal, layouts in ((1, False, dcp.LAYOUTS), (2, False, dcp.LAYOUTS), (2, True, ("contiguous",))):
            for layout in layouts:
                cases.append(dict(kind="dense", h_q=h_q, s_q=s_q, causal=causal, layout=layout))
    return cases


def _sparse_cases():
    return [dict(kind="sparse", h_q=h_q, s_q=s_q, causal=False, layout=layout)
            for h_q in (128, 64) for s_q in (1, 2) for layout in dcp.LAYOUTS]


CASES = _dense_cases() + _sparse_cases()


def case_id(c):
    return f"{c['kind']}-h{c['h_q']}-sq{c['s_q']}{'-causal' if c['causal'] else ''}-{c['layout']}"


# ---------------------------------------------------------------------------------------------------------------
# Inputs (every rank builds the same full inputs from the case's seed on the CPU)
# ---------------------------------------------------------------------------------------------------------------
def full_inputs(case, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)
    b, s_q, h_q = len(LENGTHS), case["s_q"], case["h_q"]
    lengths = torch.tensor(LENGTHS, dtype=torch.int32)
    q = (torch.randn((b, s_q, h_q, D_QK), generator=g) / 10).clamp(-1, 1).to(torch.bfloat16)
    kv = [(torch.randn((L, D_QK), generator=g) / 10).clamp(-1, 1).to(torch.bfloat16) for L in LENGTHS]
    positions = None
    if case["kind"] == "sparse":
        q = torch.randn((b, s_q, h_q, D_QK), generator=g).clamp(-1, 1).to(torch.bfloat16)
        positions = torch.full((b, s_q, SPARSE_TOPK), -1, dtype=torch.int32)
        for i, L in enumerate(LENGTHS):
            for s in range(s_q):
                n = min(L, SPARSE_TOPK)
                positions[i, s, :n] = torch.randperm(L, generator=g)[:n].to(torch.int32)
                positions[i, s] = positions[i, s, torch.randperm(SPARSE_TOPK, generator=g)]  # -1 slots anywhere
    return q, kv, lengths, positions


def paged_cache(rows_per_request, device, poison=True):
    """Pages of 64 tokens holding each request's rows in order: (cache (blocks, 64, 1, 576) bf16, block_table (b, max)
    int32). Pages are handed out in reverse order (the table is not the identity); unused rows are NaN."""
    pages = [max(1, -(-r.shape[0] // PAGE)) for r in rows_per_request]
    total = sum(pages)
    cache = torch.full((total, PAGE, 1, D_QK), math.nan if poison else 0.0, dtype=torch.bfloat16)
    width = max(pages)
    table = torch.full((len(pages), width), 2147480000, dtype=torch.int32)
    order = list(reversed(range(total)))
    for i, rows in enumerate(rows_per_request):
        for p in range(pages[i]):
            page = order.pop(0)
            table[i, p] = page
            chunk = rows[p * PAGE:(p + 1) * PAGE]
            cache[page, :chunk.shape[0], 0] = chunk
    return cache.to(device), table.to(device)


def local_rows(kv, lengths, rank, layout):
    """The rank's rows of every request, in local order."""
    rows = []
    for i, k in enumerate(kv):
        pos = torch.arange(k.shape[0], dtype=torch.int32).view(1, -1)
        owner, local = dcp.token_placement(pos, lengths[i:i + 1], WORLD, layout)
        mine = (owner[0] == rank)
        order = torch.argsort(local[0][mine])
        rows.append(k[mine][order])
    return rows


def global_indices(positions, table):
    """Sparse indices into the whole cache: page * 64 + offset, -1 for no token."""
    pos = positions.to(torch.int64)
    page = torch.gather(table.to(torch.int64).cpu(), 1, (pos.clamp(min=0) // PAGE).view(pos.shape[0], -1))
    idx = page.view(pos.shape) * PAGE + pos.clamp(min=0) % PAGE
    return torch.where(pos >= 0, idx, torch.full_like(idx, -1)).to(torch.int32)


def decode(case, q, cache, table, lengths, causal, indices=None):
    sched, _ = openmla.get_mla_metadata()
    if case["kind"] == "dense":
        return openmla.flash_mla_with_kvcache(q, cache, table, lengths, D_V, sched, causal=causal)
    return openmla.flash_mla_with_kvcache(q, cache, None, None, D_V, sched, is_fp8_kvcache=True, indices=indices)


def run_case(case, seed, rank, device):
    """Both ranks: decode the slice, all-gather, merge. Rank 0 also decodes the whole cache. Returns (merged out,
    merged lse, one-GPU out, one-GPU lse) on rank 0, None elsewhere."""
    import torch.distributed as dist

    q, kv, lengths, positions = full_inputs(case, seed)
    q = q.to(device)
    b, s_q, h_q = q.shape[:3]
    fp8 = case["kind"] == "sparse"

    # ---- this rank's slice: its own paged cache, block table, lengths (dense) or indices (sparse)
    cache, table = paged_cache(local_rows(kv, lengths, rank, case["layout"]), device, poison=not fp8)
    local_lengths = dcp.local_seqlens(lengths, rank, WORLD, case["layout"]).to(device)
    indices = None
    if fp8:
        cache = openmla.quantize_kv_cache(cache, "v32")
        indices = dcp.split_indices(positions.to(device), lengths.to(device), table, PAGE, rank, WORLD,
                                    case["layout"])
    causal = dcp.local_causal(case["causal"], s_q, rank, WORLD, case["layout"])
    out, lse = decode(case, q, cache, table, local_lengths, causal, indices)

    # ---- all-gather the states as (tokens = b * s_q, heads) rows, then merge
    out_rows = out.reshape(b * s_q, h_q, D_V).contiguous()
    lse_rows = lse.transpose(1, 2).reshape(b * s_q, h_q).contiguous()  # (b, h, s_q) -> (b, s_q, h)
    outs = torch.empty((WORLD,) + out_rows.shape, dtype=out_rows.dtype, device=device)
    lses = torch.empty((WORLD,) + lse_rows.shape, dtype=torch.float32, device=device)
    dist.all_gather_into_tensor(outs, out_rows)
    dist.all_gather_into_tensor(lses, lse_rows)
    merged, merged_lse = openmla.merge_attn_states(outs, lses)
    merged = merged.view(b, s_q, h_q, D_V)
    merged_lse = merged_lse.view(b, s_q, h_q).transpose(1, 2)
    if rank != 0:
        return None

    # ---- one GPU, the whole cache
    full_cache, full_table = paged_cache(kv, device, poison=not fp8)
    full_indices = None
    if fp8:
        full_cache = openmla.quantize_kv_cache(full_cache, "v32")
        full_indices = global_indices(positions, full_table).to(device)
    ref_out, ref_lse = decode(case, q, full_cache, full_table, lengths.to(device), case["causal"], full_indices)
    return merged, merged_lse, ref_out, ref_lse


def check_case(case, merged, merged_lse, ref_out, ref_lse):
    import dense_decode_ref as D
    import sparse_decode_ref as S

    tol = S if case["kind"] == "sparse" else D
    D.check_is_allclose("out", merged, ref_out, **tol.OUT_TOL)
    D.check_is_allclose("lse", merged_lse, ref_lse, **tol.LSE_TOL)
    empty = torch.isinf(ref_lse)  # rows without keys: exactly 0 and +inf after the merge too
    assert (merged.transpose(1, 2)[empty] == 0).all()
    assert (merged_lse[empty] == math.inf).all()


def worker(rank, port, result_path):
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    from datetime import timedelta

    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD,
                            timeout=timedelta(seconds=300))
    results = {}
    try:
        for n, case in enumerate(CASES):
            # An error in a case's calls ends the worker (the ranks' collectives would fall out of step); a wrong
            # result is reported to that case's test.
            res = run_case(case, seed=1000 + n, rank=rank, device=device)
            if rank == 0:
                try:
                    check_case(case, *res)
                    results[case_id(case)] = None
                except AssertionError:
                    results[case_id(case)] = traceback.format_exc()
        if rank == 0:
            with open(result_path, "w") as f:
                json.dump(results, f)
    finally:
        dist.destroy_process_group()


def _two_gpu_skip_reason():
    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if visible < WORLD:
        return f"DCP test: needs {WORLD} CUDA GPUs, {visible} visible"
    if any(torch.cuda.get_device_capability(i) != (9, 0) for i in range(WORLD)):
        return "DCP test: needs two Hopper GPUs (sm_90a)"
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_nccl_available():
        return "DCP test: this torch build has no NCCL"
    return None


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def dcp_results():
    reason = _two_gpu_skip_reason()
    if reason:
        pytest.skip(reason)
    import torch.multiprocessing as mp

    path = os.path.join(tempfile.mkdtemp(prefix="openmla_dcp_"), "results.json")
    here = os.path.dirname(os.path.abspath(__file__))
    old = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = os.pathsep.join([here, os.path.dirname(openmla.__path__[0])] + ([old] if old else []))
    context = mp.spawn(worker, args=(_free_port(), path), nprocs=WORLD, join=False)
    deadline = time.monotonic() + WORKER_TIMEOUT_S
    try:
        while not context.join(timeout=max(1.0, deadline - time.monotonic())):  # True once both have exited
            if time.monotonic() > deadline:
                raise TimeoutError(f"DCP workers did not finish in {WORKER_TIMEOUT_S} s")
    except BaseException:  # a worker raised (its traceback is in the exception) or timed out: stop the other one
        for p in context.processes:
            if p.is_alive():
                p.kill()
        raise
    with open(path) as f:
        return json.load(f)


@gpu
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_dcp_matches_one_gpu(dcp_results, case):
    error = dcp_results[case_id(case)]
    assert error is None, error


# ---------------------------------------------------------------------------------------------------------------
# openmla.dcp helpers against brute force (CPU, no GPU needed)
# ---------------------------------------------------------------------------------------------------------------
def _brute_owner(L, world, layout, interleave):
    if layout == "contiguous":
        return [next(r for r in range(world) if r * L // world <= j < (r + 1) * L // world) for j in range(L)]
    return [(j // interleave) % world for j in range(L)]


@pytest.mark.parametrize("layout", dcp.LAYOUTS)
@pytest.mark.parametrize("world,interleave", [(1, 1), (2, 1), (3, 1), (4, 1), (2, 16), (3, 5)])
def test_placement_against_brute_force(layout, world, interleave):
    if layout == "contiguous" and interleave != 1:
        pytest.skip("interleave applies to the interleaved layout")
    lengths = torch.tensor([0, 1, 2, 3, 7, 64, 65, 100, 129], dtype=torch.int32)
    L_max = int(lengths.max())
    pos = torch.arange(-1, L_max + 2, dtype=torch.int32).expand(len(lengths), -1)
    owner, local = dcp.token_placement(pos, lengths, world, layout, interleave)
    for i, L in enumerate(lengths.tolist()):
        expect = _brute_owner(L, world, layout, interleave)
        counts = [0] * world
        for c, j in enumerate(pos[i].tolist()):
            if 0 <= j < L:
                assert owner[i, c] == expect[j]
                assert local[i, c] == counts[expect[j]]  # local positions count up in global order
                counts[expect[j]] += 1
            else:
                assert owner[i, c] == -1 and local[i, c] == -1
        for r in range(world):
            assert dcp.local_seqlens(lengths, r, world, layout, interleave)[i] == counts[r]


def test_split_indices_and_local_causal():
    lengths = torch.tensor([5, 0, 130], dtype=torch.int32)
    positions = torch.tensor([[[4, -1, 0, 2]], [[-1, -1, -1, -1]], [[129, 64, 63, 1]]], dtype=torch.int32)
    for layout in dcp.LAYOUTS:
        seen = torch.zeros_like(positions, dtype=torch.bool)
        for r in range(2):
            n = dcp.local_seqlens(lengths, r, 2, layout)
            table = torch.arange(3 * 3, dtype=torch.int32).view(3, 3) + 100 * r
            idx = dcp.split_indices(positions, lengths, table, 64, r, 2, layout)
            owner, local = dcp.token_placement(positions, lengths, 2, layout)
            mine = owner == r
            expect = table.to(torch.int64).gather(1, (local.clamp(min=0) // 64).view(3, -1)).view(local.shape) * 64 \
                + local.clamp(min=0) % 64
            assert torch.equal(idx[mine].to(torch.int64), expect[mine])
            assert (idx[~mine] == -1).all()
            assert (local[mine] < n.view(-1, 1, 1).expand_as(local)[mine]).all()
            seen |= mine
        assert torch.equal(seen, positions >= 0)
    assert dcp.local_causal(True, 1, 0, 2, "interleaved") is True
    assert dcp.local_causal(False, 2, 1, 2, "interleaved") is False
    assert [dcp.local_causal(True, 2, r, 2, "contiguous") for r in range(2)] == [False, True]
    with pytest.raises(ValueError, match=r"argument 'causal'"):
        dcp.local_causal(True, 2, 0, 2, "interleaved")
    with pytest.raises(ValueError, match=r"argument 'layout'"):
        dcp.local_seqlens(lengths, 0, 2, "striped")
    with pytest.raises(ValueError, match=r"argument 'rank'"):
        dcp.local_seqlens(lengths, 2, 2)
