"""FLOP and byte counts of every OpenMLA benchmark, in ONE place.

These are FlashMLA's own benchmark formulas (docs/perf-method.md lists them, docs/targets.md says why they
matter), so our figures compare with the peer's. Benchmarks never count FLOPs or bytes themselves: they call
these functions. Every function takes plain numbers (or, where noted, a torch/numpy integer array) and returns
a float.

Conventions:
  - A FLOP is a multiply or an add (an FMA counts 2). No discount for masking unless stated.
  - Bytes are the minimum DRAM traffic of the call: every input read once, every output written once.
    Copy-like kernels (the KV-cache codec) count bytes read + bytes written, like the copy ceiling.
"""
from __future__ import annotations

# Head geometry of DeepSeek MLA.
D_QK_V32 = 576  # 512 NoPE + 64 RoPE (V3, V3.2)
D_QK_MODEL1 = 512  # 448 NoPE + 64 RoPE (MODEL1)
D_V = 512

# Bytes per token of the FP8 KV-cache layouts (docs/kv-cache-formats.md).
V32_TOKEN_BYTES = 656  # 512 e4m3 + 4 fp32 scales + 64 bf16 RoPE
MODEL1_TOKEN_BYTES = 584  # 576 data + 8 scale bytes (block-structured page)
# The peer counts MODEL1 sparse-decode reads at 576 B/token (scales ignored; docs/targets.md).
MODEL1_DECODE_TOKEN_BYTES = 576

BF16_BYTES = 2


# ------------------------------------------------------------------------------------------------
# Decode (dense and sparse)
# ------------------------------------------------------------------------------------------------
def decode_flops(b: int, s_q: int, h_q: int, mean_sk: float, d_qk: int = D_QK_V32, d_v: int = D_V) -> float:
    """2 * b * s_q * h_q * mean_sk * (d_qk + d_v).

    mean_sk: mean attended tokens per request (dense: mean cache_seqlens; sparse: topk, or the mean of
    topk_length, plus the extra cache's topk). No causal discount.
    """
    return 2.0 * b * s_q * h_q * mean_sk * (d_qk + d_v)


def dense_decode_bytes(b: int, s_q: int, h_q: int, h_kv: int, mean_sk: float, d_qk: int = D_QK_V32,
                       d_v: int = D_V, elem_bytes: int = BF16_BYTES) -> float:
    """b * (s_q*h_q*d_qk*2 [Q] + mean_sk*h_kv*d_qk*2 [KV, read once: K and V share the latent] + s_q*h_q*d_v*2 [O])."""
    return float(b) * (s_q * h_q * d_qk * elem_bytes + mean_sk * h_kv * d_qk * elem_bytes + s_q * h_q * d_v * elem_bytes)


def sparse_decode_flops(b: int, s_q: int, h_q: int, mean_topk: float, d_qk: int = D_QK_V32, d_v: int = D_V) -> float:
    """decode_flops with the attended tokens = topk (or mean topk_length; extra cache added). Invalid (-1)
    slots are counted, as FlashMLA does."""
    return decode_flops(b, s_q, h_q, mean_topk, d_qk, d_v)


def sparse_decode_bytes(b: int, s_q: int, h_q: int, unique_tokens: int, d_qk: int = D_QK_V32, d_v: int = D_V,
                        token_bytes: int | None = None) -> float:
    """2*b*s_q*h_q*d_qk [Q] + unique_tokens*token_bytes [cache] + 2*b*s_q*h_q*d_v [O].

    unique_tokens: distinct index values referenced (see count_unique_tokens). token_bytes defaults to
    656 for d_qk = 576 (V3.2) and 576 for d_qk = 512 (MODEL1).
    """
    if token_bytes is None:
        token_bytes = V32_TOKEN_BYTES if d_qk == D_QK_V32 else MODEL1_DECODE_TOKEN_BYTES
    return 2.0 * b * s_q * h_q * d_qk + float(unique_tokens) * token_bytes + 2.0 * b * s_q * h_q * d_v


def sparse_decode_mean_attended(topk: int, topk_length=None, extra_topk: int = 0, extra_topk_length=None) -> float:
    """The mean_topk of sparse_decode_flops: attended slots per query, averaged over requests (FlashMLA's N_att /
    (b * s_q)): topk, or the mean of topk_length (b,) clamped to [0, topk]; plus the same for the extra cache
    (extra_topk, extra_topk_length). topk_length arrays may be torch or numpy; invalid (-1) slots are counted."""

    def mean_len(k, lengths):
        if lengths is None:
            return float(k)
        if hasattr(lengths, "clamp"):  # torch
            return float(lengths.clamp(0, k).double().mean())
        import numpy as np

        return float(np.clip(np.asarray(lengths, dtype=np.float64), 0, k).mean())

    return mean_len(topk, topk_length) + (mean_len(extra_topk, extra_topk_length) if extra_topk else 0.0)


def count_unique_tokens(indices) -> int:
    """Distinct values in an index tensor (torch or numpy); -1 counts once, like FlashMLA's benchmark."""
    if hasattr(indices, "unique"):  # torch
        return int(indices.unique().numel())
    import numpy as np

    return int(np.unique(np.asarray(indices)).size)


# ------------------------------------------------------------------------------------------------
# Prefill
# ------------------------------------------------------------------------------------------------
def sparse_prefill_flops(s_q: int, topk: float, h_q: int, d_qk: int = D_QK_V32, d_v: int = D_V) -> float:
    """2 * s_q * topk * h_q * (d_qk + d_v); topk may be the mean per-token topk_length. Invalid slots counted."""
    return 2.0 * s_q * topk * h_q * (d_qk + d_v)


def sparse_prefill_bytes(s_q: int, h_q: int, valid_index_slots: int, d_qk: int = D_QK_V32, d_v: int = D_V) -> float:
    """2*d_qk*valid_index_slots [KV gathered] + 2*s_q*h_q*(d_qk + d_v) [Q and O] (FlashMLA's counting)."""
    return 2.0 * d_qk * valid_index_slots + 2.0 * s_q * h_q * (d_qk + d_v)


def dense_prefill_fwd_flops(seqlens_q, seqlens_k, h_q: int, d_qk: int, d_v: int, causal: bool) -> float:
    """2 * sum_i s_q,i * s_k,i * h_q * (d_qk + d_v), halved for causal (no finer causal accounting).

    seqlens_q / seqlens_k: per-sequence lengths (sequences of ints, or equal-length arrays).
    """
    total = sum(float(sq) * float(sk) for sq, sk in zip(seqlens_q, seqlens_k))
    flops = 2.0 * total * h_q * (d_qk + d_v)
    return flops / 2 if causal else flops


def dense_prefill_bwd_flops(seqlens_q, seqlens_k, h_q: int, d_qk: int, d_v: int, causal: bool) -> float:
    """2.5 x the forward FLOPs (the convention of FlashAttention's benchmarks)."""
    return 2.5 * dense_prefill_fwd_flops(seqlens_q, seqlens_k, h_q, d_qk, d_v, causal)


# ------------------------------------------------------------------------------------------------
# FP8 KV-cache codec (bytes read + written, comparable with the copy ceiling)
# ------------------------------------------------------------------------------------------------
def fp8_token_bytes(fmt: str) -> int:
    """Bytes one token occupies in the FP8 cache: 'v32' -> 656, 'model1' -> 584."""
    f = fmt.lower().replace(".", "").replace("_", "")
    if f in ("v32", "fp8v32"):
        return V32_TOKEN_BYTES
    if f in ("model1", "fp8model1"):
        return MODEL1_TOKEN_BYTES
    raise ValueError(f"unknown FP8 KV-cache format {fmt!r}; expected 'v32' or 'model1'")


def fp8_head_dim(fmt: str) -> int:
    """d_qk an FP8 format stores: 576 (V3.2) or 512 (MODEL1)."""
    return D_QK_V32 if fp8_token_bytes(fmt) == V32_TOKEN_BYTES else D_QK_MODEL1


def kv_quantize_bytes(num_tokens: int, fmt: str) -> float:
    """Quantise: read num_tokens bf16 rows of d_qk, write num_tokens FP8 records."""
    return float(num_tokens) * (fp8_head_dim(fmt) * BF16_BYTES + fp8_token_bytes(fmt))


def kv_dequantize_bytes(num_tokens: int, fmt: str) -> float:
    """Dequantise: read num_tokens FP8 records, write num_tokens bf16 rows (the same total as quantise)."""
    return kv_quantize_bytes(num_tokens, fmt)


def kv_append_bytes(num_tokens: int, fmt: str, slot_bytes: int = 8) -> float:
    """Append: read the new bf16 rows and their slot ids, write their FP8 records."""
    return kv_quantize_bytes(num_tokens, fmt) + float(num_tokens) * slot_bytes
