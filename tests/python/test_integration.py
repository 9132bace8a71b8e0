"""The recipes of docs/integration.md, run in each engine's own pattern on the GPU, against eager results bitwise.

- vLLM: one FlashMLASchedMeta per step, shared by every layer; the first layer's call plans; the whole step is
  captured in a CUDA graph; each step writes the new lengths (and queries) into the captured tensors in place and
  replays. Dense (the FLASHMLA backend: cache.unsqueeze(-2), causal) and sparse (FLASHMLA_SPARSE: the FP8 cache as
  uint8 (num_blocks, 64, 1, 656), a dummy (B, 1) block table, global slot indices), no head padding.
- SGLang: tensor metadata. get_mla_metadata(cache_seqlens, s_q * h_q // h_kv, h_kv) once at start-up for the
  largest batch gives the static buffers; at capture and before every replay the metadata is recomputed OUTSIDE
  the graph and copied into them (num_splits[:bs + 1]); the captured calls read the static buffers.
"""
import pytest

torch = pytest.importorskip("torch", reason="the integration tests need PyTorch, which is not installed here")

import openmla  # noqa: E402
from dense_decode_ref import check_dense_decode, dense_decode_ref  # noqa: E402

gpu = pytest.mark.gpu
D_QK, D_V, PAGE = 576, 512, 64
NUM_LAYERS = 3


def _pages_for(lens_max, b):
    return -(-lens_max // PAGE) * b


def _step_lengths(b, max_len, seed):
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(1, max_len + 1, (b,), generator=g, dtype=torch.int32)
    lens[seed % b] = max_len  # a long request in every step: it is split
    return lens


# ---------------------------------------------------------------------------------------------------------------
# vLLM
# ---------------------------------------------------------------------------------------------------------------
@gpu
@pytest.mark.parametrize("b,s_q,h_q", [(8, 1, 128), (5, 2, 16), (16, 1, 32)])
def test_vllm_dense_step_in_a_cuda_graph(b, s_q, h_q):
    max_len = 4096
    pages = _pages_for(max_len, b)
    g = torch.Generator(device="cuda").manual_seed(b)
    # Per-layer cache as vLLM keeps it (num_blocks, block_size, 576), passed with unsqueeze(-2).
    caches = [(torch.randn((pages, PAGE, D_QK), generator=g, device="cuda") / 10).to(torch.bfloat16)
              for _ in range(NUM_LAYERS)]
    queries = [torch.empty((b, s_q, h_q, D_QK), dtype=torch.bfloat16, device="cuda") for _ in range(NUM_LAYERS)]
    block_table = torch.randperm(pages, device="cuda").to(torch.int32).view(b, pages // b)
    seq_lens = torch.zeros((b,), dtype=torch.int32, device="cuda")
    scale = 0.1147  # the model's softmax scale (mscale folded in), as vLLM passes it

    def forward(sched):
        outs = []
        for layer in range(NUM_LAYERS):
            out, lse = openmla.flash_mla_with_kvcache(queries[layer], caches[layer].unsqueeze(-2), block_table,
                                                      seq_lens, D_V, sched, softmax_scale=scale, causal=True)
            outs.append((out, lse))
        return outs

    def new_step(step):
        seq_lens.copy_(_step_lengths(b, max_len, step))
        for layer, q in enumerate(queries):
            q.copy_((torch.randn(q.shape, generator=g, device="cuda") / 10).to(q.dtype))

    new_step(0)
    forward(openmla.get_mla_metadata()[0])  # warm-up, outside the capture
    torch.cuda.synchronize()
    sched, _ = openmla.get_mla_metadata()  # the metadata builder's object: created outside, planned inside
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = forward(sched)
    assert sched.have_initialized

    for step in range(1, 4):
        new_step(step)
        graph.replay()
        eager = forward(openmla.get_mla_metadata()[0])
        torch.cuda.synchronize()
        for (o_graph, l_graph), (o_eager, l_eager) in zip(captured, eager):
            assert torch.equal(o_graph, o_eager) and torch.equal(l_graph, l_eager)
    ref_out, ref_lse = dense_decode_ref(queries[0], caches[0].unsqueeze(-2), block_table, seq_lens,
                                        softmax_scale=scale, causal=True)
    check_dense_decode(captured[0][0], captured[0][1], ref_out, ref_lse, "vLLM pattern, layer 0")


@gpu
@pytest.mark.parametrize("b,h_q", [(4, 128), (6, 16)])
def test_vllm_sparse_step_in_a_cuda_graph(b, h_q):
    s_q, topk, blocks = 1, 512, 128
    g = torch.Generator(device="cuda").manual_seed(10 + b)
    caches = []
    for _ in range(NUM_LAYERS):
        kv = (torch.randn((blocks, PAGE, 1, D_QK), generator=g, device="cuda") / 10).to(torch.bfloat16)
        caches.append(openmla.quantize_kv_cache(kv, "v32").view(torch.uint8))  # fp8_ds_mla bytes
    queries = [torch.empty((b, s_q, h_q, D_QK), dtype=torch.bfloat16, device="cuda") for _ in range(NUM_LAYERS)]
    indices = torch.empty((b, s_q, topk), dtype=torch.int32, device="cuda")
    topk_lens = torch.empty((b,), dtype=torch.int32, device="cuda")
    sinks = [torch.randn((h_q,), generator=g, device="cuda") for _ in range(NUM_LAYERS)]
    dummy_block_table = torch.zeros((b, 1), dtype=torch.int32, device="cuda")
    seq_lens = torch.full((b,), blocks * PAGE, dtype=torch.int32, device="cuda")

    def forward(sched):
        return [openmla.flash_mla_with_kvcache(queries[i], caches[i], dummy_block_table, seq_lens, D_V, sched,
                                               is_fp8_kvcache=True, indices=indices, attn_sink=sinks[i],
                                               topk_length=topk_lens) for i in range(NUM_LAYERS)]

    def new_step(step):
        for q in queries:
            q.copy_(torch.randn(q.shape, generator=g, device="cuda").clamp_(-1, 1).to(q.dtype))
        indices.copy_(torch.randint(-1, blocks * PAGE, indices.shape, generator=g, device="cuda", dtype=torch.int32))
        topk_lens.copy_(torch.randint(0, topk + 1, (b,), generator=g, device="cuda", dtype=torch.int32))

    new_step(0)
    forward(openmla.get_mla_metadata()[0])
    torch.cuda.synchronize()
    sched, _ = openmla.get_mla_metadata()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = forward(sched)
    for step in range(1, 4):
        new_step(step)
        graph.replay()
        eager = forward(openmla.get_mla_metadata()[0])
        torch.cuda.synchronize()
        for (o_graph, l_graph), (o_eager, l_eager) in zip(captured, eager):
            assert torch.equal(o_graph, o_eager) and torch.equal(l_graph, l_eager)


# ---------------------------------------------------------------------------------------------------------------
# SGLang
# ---------------------------------------------------------------------------------------------------------------
@gpu
@pytest.mark.parametrize("q_len,h_q", [(1, 128), (2, 16), (1, 64)])
def test_sglang_tensor_metadata_with_cuda_graphs(q_len, h_q):
    max_bs, max_len = 12, 3000
    max_pages = -(-max_len // PAGE)
    g = torch.Generator(device="cuda").manual_seed(20 + h_q)
    num_pages = max_bs * max_pages
    kv_pool = [(torch.randn((num_pages * PAGE, D_QK), generator=g, device="cuda") / 10).to(torch.bfloat16)
               for _ in range(NUM_LAYERS)]
    # init_cuda_graph_state: static metadata buffers sized by a first call for the largest batch.
    cuda_graph_mla_metadata, cuda_graph_num_splits = openmla.get_mla_metadata(
        torch.ones((max_bs,), dtype=torch.int32, device="cuda"), q_len * h_q, 1)
    cuda_graph_kv_indices = torch.zeros((max_bs, max_pages), dtype=torch.int32, device="cuda")
    static_seq_lens = torch.ones((max_bs,), dtype=torch.int64, device="cuda")  # forward_batch.seq_lens (int64)
    static_q = [torch.zeros((max_bs * q_len, h_q, D_QK), dtype=torch.bfloat16, device="cuda")
                for _ in range(NUM_LAYERS)]
    scaling = D_QK ** -0.5

    def forward_decode(bs, metadata, num_splits, kv_indices, seq_lens, qs):
        outs = []
        for layer in range(NUM_LAYERS):
            reshape_q = qs[layer][: bs * q_len].view(bs, q_len, h_q, D_QK)
            o, _ = openmla.flash_mla_with_kvcache(
                q=reshape_q, k_cache=kv_pool[layer].view(-1, PAGE, 1, D_QK), block_table=kv_indices,
                cache_seqlens=seq_lens.to(torch.int32), head_dim_v=D_V, tile_scheduler_metadata=metadata,
                num_splits=num_splits, softmax_scale=scaling, causal=True)
            outs.append(o.view(-1, h_q * D_V))
        return outs

    def batch(bs, seed):
        gen = torch.Generator().manual_seed(seed)
        lens = torch.randint(1, max_len + 1 - q_len, (bs,), generator=gen)
        pages = torch.randperm(num_pages, generator=gen)[: bs * max_pages].view(bs, max_pages).to(torch.int32)
        qs = [(torch.randn((bs * q_len, h_q, D_QK), generator=gen) / 10).to(torch.bfloat16).cuda()
              for _ in range(NUM_LAYERS)]
        return lens.cuda(), pages.cuda(), qs

    for bs in (max_bs, 5):  # SGLang captures one graph per batch size
        lens, pages, qs = batch(bs, seed=bs)
        seq_lens = lens + q_len  # the lengths include the new tokens
        # init_forward_metadata_capture_cuda_graph: computed outside the graph, copied into the static buffers.
        static_seq_lens[:bs].copy_(seq_lens)
        cuda_graph_kv_indices[:bs].copy_(pages)
        mla_metadata, num_splits = openmla.get_mla_metadata(static_seq_lens[:bs].to(torch.int32), q_len * h_q, 1)
        cuda_graph_mla_metadata.copy_(mla_metadata)
        cuda_graph_num_splits[: bs + 1].copy_(num_splits)
        for layer in range(NUM_LAYERS):
            static_q[layer][: bs * q_len].copy_(qs[layer])
        forward_decode(bs, cuda_graph_mla_metadata, cuda_graph_num_splits[: bs + 1], cuda_graph_kv_indices[:bs],
                       static_seq_lens[:bs], static_q)  # warm-up run, as SGLang's capture does
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = forward_decode(bs, cuda_graph_mla_metadata, cuda_graph_num_splits[: bs + 1],
                                      cuda_graph_kv_indices[:bs], static_seq_lens[:bs], static_q)

        for step in range(3):
            lens, pages, qs = batch(bs, seed=100 * bs + step)
            seq_lens = lens + q_len
            # init_forward_metadata_replay_cuda_graph: outside the graph, then copy and replay.
            static_seq_lens[:bs].copy_(seq_lens)
            cuda_graph_kv_indices[:bs].copy_(pages)
            mla_metadata, num_splits = openmla.get_mla_metadata(seq_lens.to(torch.int32), q_len * h_q, 1)
            cuda_graph_mla_metadata.copy_(mla_metadata)
            cuda_graph_num_splits[: bs + 1].copy_(num_splits)
            for layer in range(NUM_LAYERS):
                static_q[layer][: bs * q_len].copy_(qs[layer])
            graph.replay()
            # Eager: the same batch through SGLang's non-graph path (fresh metadata, fresh tensors).
            eager = forward_decode(bs, mla_metadata, num_splits, pages, seq_lens, qs)
            # ... and through the object style: the same results.
            sched, _ = openmla.get_mla_metadata()
            obj = [openmla.flash_mla_with_kvcache(qs[i].view(bs, q_len, h_q, D_QK),
                                                  kv_pool[i].view(-1, PAGE, 1, D_QK), pages,
                                                  seq_lens.to(torch.int32), D_V, sched, softmax_scale=scaling,
                                                  causal=True)[0].view(-1, h_q * D_V) for i in range(NUM_LAYERS)]
            torch.cuda.synchronize()
            for o_graph, o_eager, o_obj in zip(captured, eager, obj):
                assert torch.equal(o_graph, o_eager) and torch.equal(o_eager, o_obj)
        ref_out, _ = dense_decode_ref(qs[0].view(bs, q_len, h_q, D_QK), kv_pool[0].view(-1, PAGE, 1, D_QK), pages,
                                      seq_lens.to(torch.int32), softmax_scale=scaling, causal=True)
        out0 = captured[0].view(bs, q_len, h_q, D_V)
        assert (out0.float() - ref_out.float()).abs().max().item() < 2e-2
        del graph


@gpu
def test_sglang_sparse_tensor_metadata_with_cuda_graphs():
    """DeepSeek-V3.2's SGLang backend: metadata from get_mla_metadata(..., num_heads_q, is_fp8_kvcache=True,
    topk), the FP8 cache, indices and an empty (B, 0) block table; graph pattern as above."""
    bs, q_len, h_q, topk, blocks = 6, 1, 64, 256, 64
    g = torch.Generator(device="cuda").manual_seed(30)
    kv = (torch.randn((blocks, PAGE, 1, D_QK), generator=g, device="cuda") / 10).to(torch.bfloat16)
    cache = openmla.quantize_kv_cache(kv, "v32")
    static_q = torch.zeros((bs, q_len, h_q, D_QK), dtype=torch.bfloat16, device="cuda")
    static_idx = torch.zeros((bs, q_len, topk), dtype=torch.int32, device="cuda")
    lens = torch.ones((bs,), dtype=torch.int32, device="cuda")
    md_static, ns_static = openmla.get_mla_metadata(lens, q_len * h_q, 1, h_q, True, topk)
    empty_bt = torch.empty((bs, 0), dtype=torch.int32, device="cuda")

    def forward(metadata, num_splits, q, idx):
        return openmla.flash_mla_with_kvcache(q, cache, empty_bt, lens, D_V, metadata, num_splits,
                                              is_fp8_kvcache=True, indices=idx)

    forward(md_static, ns_static, static_q, static_idx)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = forward(md_static, ns_static, static_q, static_idx)
    for step in range(3):
        q = torch.randn(static_q.shape, generator=g, device="cuda").clamp_(-1, 1).to(torch.bfloat16)
        idx = torch.randint(-1, blocks * PAGE, static_idx.shape, generator=g, device="cuda", dtype=torch.int32)
        md, ns = openmla.get_mla_metadata(lens, q_len * h_q, 1, h_q, True, topk)
        md_static.copy_(md)
        ns_static.copy_(ns)
        static_q.copy_(q)
        static_idx.copy_(idx)
        graph.replay()
        eager = forward(md, ns, q, idx)
        torch.cuda.synchronize()
        assert torch.equal(out, eager[0]) and torch.equal(lse, eager[1])
