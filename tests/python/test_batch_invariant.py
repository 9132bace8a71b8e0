"""GPU tests of batch-invariant decode (get_mla_metadata(batch_invariant=True); docs/decode-schedule.md, "Batch
invariance"): each request is decoded alone and inside several random batches (other sizes, other lengths, other
positions), and its out and lse must be bitwise equal every time; decoded alone it must match the torch fp32
reference under the usual tolerances. Dense (bf16, h_q 16 / 64 / 128, s_q 1 and s_q 2 causal, lengths from 1 token
to several chunks) and sparse (V3.2 FP8 cache, topk 2048 and a long topk whose requests split into several chunks,
h_q 64 / 128). Also: the tensor style equals the object style bit for bit, and a captured CUDA graph replays the same
bits.

Without torch or a Hopper GPU every test here is collected and skipped with its reason (conftest.py).
"""
from __future__ import annotations

import random

import pytest

gpu = pytest.mark.gpu

D_QK, D_V, PAGE = 576, 512, 64
CHUNK = 4096  # kDecodeInvariantChunkTokens (include/openmla/decode.h)
DEVICE = "cuda"


def _torch():
    import torch

    return torch


def _openmla():
    import openmla

    return openmla


# ---------------------------------------------------------------------------------------------------
# Dense: a pool of requests (own q rows, own pages in one shared cache, own length); a batch is a list of them
# ---------------------------------------------------------------------------------------------------
PROBE_LENGTHS = [1, 5, 63, 64, 65, 1000, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK + 7, 3 * CHUNK - 64, 5 * CHUNK + 100]


class DensePool:
    def __init__(self, s_q, h_q, lengths, seed, page=PAGE):
        torch = _torch()
        self.s_q, self.h_q, self.lengths = s_q, h_q, lengths
        gen = torch.Generator(device=DEVICE).manual_seed(seed)
        pages = [max((L + page - 1) // page, 1) for L in lengths]
        self.width = max(pages)
        total = sum(pages)
        order = torch.randperm(total, generator=torch.Generator().manual_seed(seed)).tolist()
        self.rows, start = [], 0
        for n in pages:
            self.rows.append(order[start:start + n] + [0] * (self.width - n))
            start += n
        self.k_cache = (torch.randn((total, page, 1, D_QK), generator=gen, device=DEVICE, dtype=torch.bfloat16)
                        / 10).clamp_(-1, 1)
        self.q = (torch.randn((len(lengths), s_q, h_q, D_QK), generator=gen, device=DEVICE, dtype=torch.bfloat16)
                  / 10).clamp_(-1, 1)

    def batch(self, ids):
        torch = _torch()
        q = self.q[ids].contiguous()
        block_table = torch.tensor([self.rows[i] for i in ids], dtype=torch.int32, device=DEVICE)
        seqlens = torch.tensor([self.lengths[i] for i in ids], dtype=torch.int32, device=DEVICE)
        return q, block_table, seqlens

    def decode(self, ids, causal, style="object"):
        openmla = _openmla()
        q, bt, lens = self.batch(ids)
        if style == "object":
            meta, _ = openmla.get_mla_metadata(batch_invariant=True)
            return openmla.flash_mla_with_kvcache(q, self.k_cache, bt, lens, D_V, meta, causal=causal)
        md, ns = openmla.get_mla_metadata(lens, self.s_q * self.h_q, 1, batch_invariant=True)
        return openmla.flash_mla_with_kvcache(q, self.k_cache, bt, lens, D_V, md, ns, causal=causal,
                                              batch_invariant=True)


def random_batches(rng, num_probes, pool_size, count):
    """`count` batches of random sizes: every probe somewhere in at least one, among random other requests."""
    batches = []
    for k in range(count):
        size = rng.choice([2, 3, 8, 33, 70, 140])
        others = [rng.randrange(num_probes, pool_size) for _ in range(size)]
        probes = rng.sample(range(num_probes), k=min(num_probes, 1 + k % num_probes))
        ids = others + probes
        rng.shuffle(ids)
        batches.append(ids)
    return batches


def expect_bitwise(got, want, what):
    torch = _torch()
    assert torch.equal(got.view(torch.int16) if got.dtype == torch.bfloat16 else got.view(torch.int32),
                       want.view(torch.int16) if want.dtype == torch.bfloat16 else want.view(torch.int32)), what


# Page 64 (the page-64 invariant kernel), the other page sizes through the any-page and (1, 8) gather invariant kernels.
DENSE_CASES = ([(s_q, h_q, s_q == 2, PAGE) for h_q in (16, 64, 128) for s_q in (1, 2)] +
               [(2, 64, True, page) for page in (1, 8, 16, 32, 128, 256)])


@gpu
@pytest.mark.parametrize("s_q,h_q,causal,page", DENSE_CASES, ids=lambda v: str(v))
def test_dense_request_bits_do_not_depend_on_the_batch(s_q, h_q, causal, page):
    torch = _torch()
    import dense_decode_ref as ref

    rng = random.Random(1000 * s_q + h_q + page)
    others = [rng.choice([rng.randrange(1, 200), rng.randrange(1, 6 * CHUNK)]) for _ in range(40)]
    pool = DensePool(s_q, h_q, PROBE_LENGTHS + others, seed=h_q + s_q + page, page=page)
    n = len(PROBE_LENGTHS)
    alone = [pool.decode([i], causal) for i in range(n)]
    for i in range(n):
        q, bt, lens = pool.batch([i])
        ref_out, ref_lse = ref.dense_decode_ref(q, pool.k_cache, bt, lens, D_V, causal=causal)
        ref.check_dense_decode(alone[i][0], alone[i][1], ref_out, ref_lse, f" (request of {PROBE_LENGTHS[i]} tokens)")
    for ids in random_batches(rng, n, len(pool.lengths), 6):
        out, lse = pool.decode(ids, causal)
        for pos, i in enumerate(ids):
            if i < n:
                what = f"request of {PROBE_LENGTHS[i]} tokens at {pos} of a batch of {len(ids)}"
                expect_bitwise(out[pos], alone[i][0][0], "out, " + what)
                expect_bitwise(lse[pos], alone[i][1][0], "lse, " + what)
    torch.cuda.synchronize()


@gpu
def test_dense_tensor_style_equals_object_style():
    rng = random.Random(5)
    pool = DensePool(2, 128, PROBE_LENGTHS + [rng.randrange(1, 5 * CHUNK) for _ in range(20)], seed=5)
    ids = list(range(len(pool.lengths)))
    rng.shuffle(ids)
    a = pool.decode(ids, True, "object")
    b = pool.decode(ids, True, "tensor")
    expect_bitwise(a[0], b[0], "out")
    expect_bitwise(a[1], b[1], "lse")


@gpu
def test_dense_graph_replay_equals_eager():
    torch = _torch()
    openmla = _openmla()
    pool = DensePool(1, 128, PROBE_LENGTHS + [3 * CHUNK + 11, 17], seed=9)
    ids = list(range(len(pool.lengths)))
    q, bt, lens = pool.batch(ids)
    eager = pool.decode(ids, False)
    meta, _ = openmla.get_mla_metadata(batch_invariant=True)
    openmla.flash_mla_with_kvcache(q, pool.k_cache, bt, lens, D_V, meta)  # warm-up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        meta2, _ = openmla.get_mla_metadata(batch_invariant=True)
        out, lse = openmla.flash_mla_with_kvcache(q, pool.k_cache, bt, lens, D_V, meta2)
    graph.replay()
    torch.cuda.synchronize()
    expect_bitwise(out, eager[0], "out")
    expect_bitwise(lse, eager[1], "lse")


@gpu
def test_batch_invariant_flag_with_a_default_object_raises():
    torch = _torch()
    openmla = _openmla()
    pool = DensePool(1, 16, [100], seed=1)
    q, bt, lens = pool.batch([0])
    meta, _ = openmla.get_mla_metadata()
    with pytest.raises(ValueError, match="batch_invariant"):
        openmla.flash_mla_with_kvcache(q, pool.k_cache, bt, lens, D_V, meta, batch_invariant=True)
    torch.cuda.synchronize()


# ---------------------------------------------------------------------------------------------------
# Sparse: V3.2 FP8 cache, per-request index rows and top-k lengths
# ---------------------------------------------------------------------------------------------------
class SparsePool:
    def __init__(self, s_q, h_q, topk, lengths, num_tokens, seed):
        torch = _torch()
        openmla = _openmla()
        gen = torch.Generator(device=DEVICE).manual_seed(seed)
        self.topk, self.lengths = topk, lengths
        kv = (torch.randn((num_tokens // PAGE, PAGE, 1, D_QK), generator=gen, device=DEVICE, dtype=torch.bfloat16)
              / 10).clamp_(-1, 1)
        self.cache = openmla.quantize_kv_cache(kv, "v32")
        self.kv = openmla.dequantize_kv_cache(self.cache, "v32")
        b = len(lengths)
        self.q = (torch.randn((b, s_q, h_q, D_QK), generator=gen, device=DEVICE, dtype=torch.bfloat16)
                  / 10).clamp_(-1, 1)
        self.indices = torch.randint(0, num_tokens, (b, s_q, topk), generator=gen, device=DEVICE, dtype=torch.int32)
        self.indices[:, :, ::7] = -1  # skipped slots
        self.topk_length = torch.tensor(lengths, dtype=torch.int32, device=DEVICE)

    def decode(self, ids):
        openmla = _openmla()
        meta, _ = openmla.get_mla_metadata(batch_invariant=True)
        return openmla.flash_mla_with_kvcache(self.q[ids].contiguous(), self.cache, None, None, D_V, meta,
                                              is_fp8_kvcache=True, indices=self.indices[ids].contiguous(),
                                              topk_length=self.topk_length[ids].contiguous())


SPARSE_CASES = [(2, 64, 2048), (2, 128, 2048), (1, 128, 2048), (2, 128, 16384)]


@gpu
@pytest.mark.parametrize("s_q,h_q,topk", SPARSE_CASES, ids=lambda v: str(v))
def test_sparse_request_bits_do_not_depend_on_the_batch(s_q, h_q, topk):
    import sparse_decode_ref as ref

    rng = random.Random(topk + h_q + s_q)
    probes = [1, 63, 64, 65, 1000, topk] + ([CHUNK, CHUNK + 1, 3 * CHUNK - 5] if topk > CHUNK else [])
    others = [rng.choice([rng.randrange(0, 100), rng.randrange(0, topk + 1), topk]) for _ in range(40)]
    pool = SparsePool(s_q, h_q, topk, probes + others, num_tokens=64 * 1024, seed=topk + h_q)
    n = len(probes)
    alone = [pool.decode([i]) for i in range(n)]
    for i in range(n):
        ref_out, ref_lse = ref.sparse_decode_ref(pool.q[i:i + 1], pool.kv, pool.indices[i:i + 1],
                                                 topk_length=pool.topk_length[i:i + 1])
        ref.check_sparse_decode(alone[i][0], alone[i][1], ref_out, ref_lse, f" (request of {probes[i]} slots)")
    for ids in random_batches(rng, n, len(pool.lengths), 6):
        out, lse = pool.decode(ids)
        for pos, i in enumerate(ids):
            if i < n:
                what = f"request of {probes[i]} slots at {pos} of a batch of {len(ids)}"
                expect_bitwise(out[pos], alone[i][0][0], "out, " + what)
                expect_bitwise(lse[pos], alone[i][1][0], "lse, " + what)
