"""CPU-only checks of the reference binding (openmla.reference) against small numpy float64 implementations.

No torch and no GPU needed."""
import numpy as np
import pytest

ml_dtypes = pytest.importorskip("ml_dtypes")
R = pytest.importorskip("openmla.reference")

BF16 = ml_dtypes.bfloat16


def bf16(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(BF16)


def np_attend(q, keys, values, scale, sink=None):
    """One query row: (out, lse, max) in float64; empty -> (0, +inf, -inf)."""
    if len(keys) == 0:
        return np.zeros(values.shape[-1]), np.inf, -np.inf
    z = scale * (keys @ q)
    m = z.max()
    lse = m + np.log(np.exp(z - m).sum())
    out = np.exp(z - lse) @ values
    if sink is not None:
        out = out / (1.0 + np.exp(sink - lse))
    return out, lse, m


def test_dense_decode_matches_numpy():
    rng = np.random.default_rng(0)
    b, s_q, h_q, h_kv, d_qk, d_v, page = 3, 2, 4, 2, 16, 8, 3
    lens = [7, 0, 4]
    pages = sum((L + page - 1) // page for L in lens)
    cache = bf16(rng, pages + 1, page, h_kv, d_qk, scale=0.5)
    cache[-1] = np.nan  # an unused page: must not leak
    perm = rng.permutation(pages)
    table = np.full((b, 4), 2147480000, dtype=np.int32)
    nxt = 0
    for i, L in enumerate(lens):
        for p in range((L + page - 1) // page):
            table[i, p] = perm[nxt]
            nxt += 1
    q_full = bf16(rng, b, s_q, h_q, d_qk + 5)
    q = q_full[..., 2:2 + d_qk]  # non-contiguous view
    scale = d_qk ** -0.5
    out, lse = R.dense_decode(q, cache, table, np.array(lens, dtype=np.int32), d_v, scale, causal=True,
                              dtype=np.float64)
    assert out.shape == (b, s_q, h_q, d_v) and lse.shape == (b, h_q, s_q)
    qf, cf = q.astype(np.float64), cache.astype(np.float64)
    for i, L in enumerate(lens):
        keys = np.stack([cf[table[i, j // page], j % page] for j in range(L)]) if L else np.zeros((0, h_kv, d_qk))
        for s in range(s_q):
            visible = max(0, min(L, L - s_q + s + 1))
            for h in range(h_q):
                g = h // (h_q // h_kv)
                k = keys[:visible, g]
                o, l, _ = np_attend(qf[i, s, h], k, k[:, :d_v], scale)
                np.testing.assert_allclose(out[i, s, h], o, rtol=1e-12, atol=1e-12)
                assert lse[i, h, s] == l or abs(lse[i, h, s] - l) < 1e-12
    assert np.all(out[1] == 0) and np.all(np.isinf(lse[1]) & (lse[1] > 0))


@pytest.mark.parametrize("layout_dim", [576, 512])
def test_sparse_decode_fp8_matches_numpy(layout_dim):
    rng = np.random.default_rng(1)
    b, s_q, h_q, page, blocks, topk = 2, 2, 2, 5, 3, 6
    bpt = {576: 656, 512: 584}[layout_dim]
    values = bf16(rng, blocks, page, 1, layout_dim, scale=0.1)
    cache = R.fp8_encode_pages(values, page_stride_bytes=page * bpt + 64)
    assert cache.shape == (blocks, page, 1, bpt) and cache.strides[0] == page * bpt + 64
    decoded = R.fp8_decode_pages(cache, as_float=True).astype(np.float64)
    # The codec is lossy but close: e4m3 keeps 3 mantissa bits, the scale is a power of two.
    np.testing.assert_allclose(decoded, values.astype(np.float64), rtol=0.07, atol=2e-3)
    n = blocks * page
    indices = np.stack([np.stack([rng.permutation(n)[:topk] for _ in range(s_q)]) for _ in range(b)]).astype(np.int32)
    indices[0, 1, 2] = -1
    topk_length = np.array([topk, 3], dtype=np.int32)
    sink = np.array([0.3, -np.inf], dtype=np.float32)
    q = bf16(rng, b, s_q, h_q, layout_dim)
    scale = layout_dim ** -0.55
    out, lse = R.sparse_decode(q, cache, indices, scale, 512, topk_length=topk_length, attn_sink=sink,
                               dtype=np.float64)
    flat = decoded.reshape(n, layout_dim)
    for i in range(b):
        for s in range(s_q):
            sel = [t for t in indices[i, s, :topk_length[i]] if t != -1]
            for h in range(h_q):
                o, l, _ = np_attend(q[i, s, h].astype(np.float64), flat[sel], flat[sel, :512], scale, sink[h])
                np.testing.assert_allclose(out[i, s, h], o, rtol=1e-10, atol=1e-12)
                np.testing.assert_allclose(lse[i, h, s], l, rtol=1e-12)
    # The dequantised-float variant gives the same answer.
    out_f, lse_f = R.sparse_decode(q, decoded.astype(np.float32), indices, scale, 512, topk_length=topk_length,
                                   attn_sink=sink, dtype=np.float64)
    np.testing.assert_array_equal(out, out_f)
    np.testing.assert_array_equal(lse, lse_f)


def test_sparse_prefill_invalid_indices_and_sink():
    rng = np.random.default_rng(2)
    s_q, s_kv, h_q, d_qk, d_v, topk = 4, 6, 2, 8, 4, 5
    q, kv = bf16(rng, s_q, h_q, d_qk), bf16(rng, s_kv, 1, d_qk)
    indices = rng.integers(0, s_kv, size=(s_q, 1, topk)).astype(np.int32)
    indices[0, 0, :2] = [-2**31, s_kv]
    indices[3, 0, :] = -1  # all invalid
    topk_length = np.array([5, 2, 0, 5], dtype=np.int32)
    sink = np.array([np.inf, 0.5], dtype=np.float32)
    out, mx, lse = R.sparse_prefill(q, kv, indices, 0.5, d_v, attn_sink=sink, topk_length=topk_length,
                                    dtype=np.float64)
    kvf = kv.astype(np.float64)[:, 0]
    for t in range(s_q):
        sel = [j for j in indices[t, 0, :topk_length[t]] if 0 <= j < s_kv]
        for h in range(h_q):
            o, l, m = np_attend(q[t, h].astype(np.float64), kvf[sel], kvf[sel, :d_v], 0.5, sink[h])
            np.testing.assert_allclose(out[t, h], o, rtol=1e-12, atol=1e-14)
            assert (lse[t, h] == l) or abs(lse[t, h] - l) < 1e-12
            assert (mx[t, h] == m) or abs(mx[t, h] - m) < 1e-12
    assert np.all(out[3] == 0) and np.all(lse[3] == np.inf) and np.all(mx[3] == -np.inf)
    assert np.all(out[:, 0] == 0)  # sink +inf


def test_mha_forward_and_backward():
    rng = np.random.default_rng(3)
    cu_q, cu_k = np.array([0, 2, 5], dtype=np.int32), np.array([0, 3, 4], dtype=np.int32)
    h_q, h_kv, d_qk, d_v = 2, 1, 4, 3
    q = rng.standard_normal((5, h_q, d_qk))
    k = rng.standard_normal((4, h_kv, d_qk))
    v = rng.standard_normal((4, h_kv, d_v))
    dout = rng.standard_normal((5, h_q, d_v))
    out, lse = R.mha_forward(q, k, v, cu_q, cu_k, causal=True, dtype=np.float64)
    scale = d_qk ** -0.5
    for bi in range(2):
        sq, sk = cu_q[bi + 1] - cu_q[bi], cu_k[bi + 1] - cu_k[bi]
        for i in range(sq):
            n = max(0, min(sk, i + sk - sq + 1))
            keys = k[cu_k[bi]:cu_k[bi] + n, 0]
            for h in range(h_q):
                o, l, _ = np_attend(q[cu_q[bi] + i, h], keys, v[cu_k[bi]:cu_k[bi] + n, 0], scale)
                np.testing.assert_allclose(out[cu_q[bi] + i, h], o, rtol=1e-12, atol=1e-14)
    assert np.all(lse[2] == np.inf)  # request 1 (s_q 3, s_k 1): its first query sees no key
    dq, dk, dv = R.mha_backward(q, k, v, cu_q, cu_k, dout, causal=True, dtype=np.float64)

    def loss(**tensors):
        args = {"q": q, "k": k, "v": v, **tensors}
        out = R.mha_forward(args["q"], args["k"], args["v"], cu_q, cu_k, causal=True, dtype=np.float64)[0]
        return float((out * dout).sum())

    eps = 1e-6
    for name, x, g in (("q", q, dq), ("k", k, dk), ("v", v, dv)):
        fd = np.zeros_like(x)
        for idx in np.ndindex(x.shape):
            plus, minus = x.copy(), x.copy()
            plus[idx] += eps
            minus[idx] -= eps
            fd[idx] = (loss(**{name: plus}) - loss(**{name: minus})) / (2 * eps)
        np.testing.assert_allclose(g, fd, rtol=1e-6, atol=1e-8, err_msg=name)


def test_merge_partials():
    o = np.array([[[1.0], [3.0]], [[np.nan], [5.0]], [[np.nan], [np.nan]]])
    lse2 = np.array([[0.0, np.log2(3.0)], [-np.inf, 1.0], [-np.inf, -np.inf]])
    out, lse = R.merge_partials(o, lse2, lse_base=2, attn_sink=[np.log(4.0), -np.inf, 0.0], dtype=np.float64)
    np.testing.assert_allclose(out[:, 0], [2.5 / 2, 5.0, 0.0], rtol=1e-6)
    np.testing.assert_allclose(lse[:2], [np.log(4.0), np.log(2.0)], rtol=1e-12)
    assert lse[2] == np.inf


def test_bad_arguments_name_the_argument():
    q = np.zeros((1, 1, 1, 4), dtype=np.float32)
    cache = np.zeros((2, 2, 1, 4), dtype=np.float32)
    with pytest.raises(ValueError, match="block_table"):
        R.dense_decode(q, cache, np.zeros((2, 2), dtype=np.int32), np.array([1], dtype=np.int32), 4, 1.0)
    with pytest.raises(ValueError, match="block_table"):
        R.dense_decode(q, cache, np.array([[7, 0]], dtype=np.int32), np.array([1], dtype=np.int32), 4, 1.0)
    with pytest.raises(ValueError, match="indices"):
        R.sparse_decode(q, cache[:, :, 0], np.array([[[5]]], dtype=np.int32), 1.0, 4)
    with pytest.raises(ValueError, match="k_cache"):
        R.sparse_decode(q, np.zeros((2, 2, 1, 100), dtype=np.uint8), np.array([[[0]]], dtype=np.int32), 1.0, 4)
