"""Dense and sparse decode at every head count an engine hands over unpadded.

Tensor parallelism and decode context parallelism leave a rank with few heads (Kimi-K3's 96 heads: 12 per GPU at
TP8, 6 at TP16, 96 or 99 after an all-gather; DeepSeek's 128: 16 at TP8, 8 at TP16). Every h_q of HEAD_COUNTS is run
here with h_kv = 1, the caller passing exactly its heads (no padding):

- dense decode, bf16, page 64, s_q 1 and 2 (the second causal), against the torch fp32 reference of
  test_dense_decode.py: unused pages and the tails of last pages NaN-poisoned, block-table entries past a request's
  pages garbage, out / lse NaN-filled before the call;
- sparse decode, both FP8 layouts (V3.2 656 B/token, MODEL1 584 B/token), against the torch reference of
  test_sparse_decode.py (every token no used slot selects NaN-poisoned, -1 and out-of-range slots, out / lse
  NaN-filled before the call), in two shapes per head count: a small uniform batch (no topk_length: the host
  computes the schedule's records) and a larger batch with per-request lengths, an extra cache and a sink (device
  schedule; at 65..128 heads the two 64-head tiles form crossover pairs).

The inputs and checks are those of the two decode test files (imported, not copied); only the head counts and the
shapes are chosen here. Without torch or a Hopper GPU every test is collected and skipped with its reason.
"""
from __future__ import annotations

import pytest

import test_dense_decode as dense
import test_sparse_decode as sparse

gpu = pytest.mark.gpu

HEAD_COUNTS = (1, 6, 8, 12, 16, 32, 64, 96, 99, 128)


def _dense_cases():
    cases = []
    for h_q in HEAD_COUNTS:
        # s_q = 1: several requests, one partition each or a few; s_q = 2 causal: two long requests split over
        # every partition, so the combine writes the result.
        cases.append(dense.Case(6, 1, h_q, 1, 4096, varlen=True, causal=False, provided_out=True))
        cases.append(dense.Case(2, 2, h_q, 1, 20000, varlen=True, causal=True, provided_out=True))
    return cases


def _sparse_cases():
    Case, Sel = sparse.Case, sparse.Sel
    cases = []
    for h_q in HEAD_COUNTS:
        for layout in sparse.LAYOUTS:
            # Small uniform batch: topk 2048 from 4K-token requests, no per-request lengths (host records).
            cases.append(Case(layout, 3, 2, h_q, Sel(4096, 2048, 64), sink="random", varlen=False))
            # Device schedule: per-request lengths, an extra cache with its own, odd page sizes, a sink.
            cases.append(Case(layout, 40, 1 if h_q % 2 else 2, h_q, Sel(2046, 576, 61, lens=True),
                              Sel(512, 100, 53, lens=True), sink="random", lse_contiguous=h_q % 3 == 0))
    return cases


DENSE = _dense_cases()
SPARSE = _sparse_cases()


def test_every_head_count_is_covered():
    assert {c.h_q for c in DENSE} == set(HEAD_COUNTS) and {c.h_q for c in SPARSE} == set(HEAD_COUNTS)
    assert {(c.h_q, c.s_q) for c in DENSE} == {(h, s) for h in HEAD_COUNTS for s in (1, 2)}
    assert {(c.h_q, c.layout) for c in SPARSE} == {(h, l) for h in HEAD_COUNTS for l in sparse.LAYOUTS}
    assert all(c.h_kv == 1 and c.dtype == "bf16" and c.provided_out for c in DENSE)
    assert all(c.provided_out for c in SPARSE)


@gpu
@pytest.mark.parametrize("case", DENSE, ids=str)
def test_dense_decode_head_count(case):
    dense.run_case(case, seed=40)


@gpu
@pytest.mark.parametrize("case", SPARSE, ids=str)
def test_sparse_decode_head_count(case):
    sparse.run_case(case, seed=41)


@gpu
@pytest.mark.parametrize("h_q", [h for h in HEAD_COUNTS if h % 64])
def test_sparse_decode_head_count_matches_the_padded_call(h_q):
    """What engines do today, padding the heads to 64 with zero queries, against the unpadded call: the live heads'
    outputs must agree within the kernels' tolerances (bitwise is not promised: the two calls may take different
    tile shapes)."""
    torch = sparse._torch()
    case = sparse.Case("v32", 4, 2, h_q, sparse.Sel(4096, 2048, 64), sink="random", varlen=False)
    inp = sparse.make_inputs(case, seed=42)
    out, lse = sparse.decode(inp)
    pad = -(-h_q // 64) * 64
    q_pad = torch.zeros((case.b, case.s_q, pad, inp.q.shape[-1]), dtype=inp.q.dtype, device=inp.q.device)
    q_pad[:, :, :h_q] = inp.q
    sink_pad = torch.zeros((pad,), dtype=torch.float32, device=inp.q.device)
    sink_pad[:h_q] = inp.sink
    out_p, lse_p = sparse.decode(inp, q=q_pad, sink=sink_pad)
    torch.cuda.synchronize()
    sparse._ref().check_sparse_decode(out, lse, out_p[:, :, :h_q], lse_p[:, :h_q], what=f" [padded h_q={h_q}]")


@gpu
@pytest.mark.parametrize("case", [
    sparse.Case("v32", 3, 2, 16, sparse.Sel(4096, 2048, 64), sink="random", varlen=False),
    sparse.Case("model1", 3, 2, 12, sparse.Sel(4096, 2048, 64), sink="random", varlen=False),
    sparse.Case("v32", 40, 1, 32, sparse.Sel(2046, 576, 61, lens=True), sparse.Sel(512, 100, 53, lens=True),
                sink="random"),
    sparse.Case("model1", 40, 3, 1, sparse.Sel(2046, 576, 61, lens=True), sparse.Sel(512, 100, 53, lens=True),
                sink="random", zero_len=True),
    sparse.Case("v32", 2, 1, 8, sparse.Sel(20000, 16384, 64), varlen=False),  # one request over every partition
], ids=str)
def test_sparse_decode_few_heads_shapes(case):
    """Further few-heads shapes (partial 64-head tiles: a request of no length, one request split over every
    partition) against the reference, with NaN-filled provided outputs. Until the few-heads kernel was removed these
    were its A/B against the plain kernel (docs/sparse-decode.md, "Few heads")."""
    inp = sparse.make_inputs(case, seed=43)
    out, lse = sparse.nan_outputs(case)
    out, lse = sparse.decode(inp, out=out, lse=lse)
    sparse.check_against_reference(inp, out, lse, f"{case}")


@gpu
@pytest.mark.parametrize("case", [
    sparse.Case("v32", 8, 2, 16, sparse.Sel(1024, 576, 61, lens=True), sink="random", varlen=False),
    sparse.Case("model1", 8, 1, 32, sparse.Sel(1024, 576, 53, lens=True), sparse.Sel(512, 100, 64, lens=True),
                sink="random", varlen=False),
], ids=str)
def test_sparse_few_heads_cuda_graph_capture_and_replay(case):
    """The sparse decode suite's graph test (one step captured whole: planning and two layers; replayed after new
    inputs were written in place) at few heads."""
    sparse.test_cuda_graph_capture_and_replay(case)
