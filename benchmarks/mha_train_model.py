"""A small MLA-shaped transformer and its training loop, for the training check (tests/python/test_mha_train.py) and
the training-step benchmark (benchmarks/bench_mha_train.py, suite mha_train_step).

The model: token embedding, n_layers blocks of (RMSNorm, MLA-shaped attention, residual, RMSNorm, SwiGLU MLP,
residual), a final RMSNorm and an untied output projection. The attention has DeepSeek-V3's head layout at a small
width: a query head is d_qk = 192 = 128 NoPE + 64 RoPE, a key head the same (its 64 RoPE dims shared by every head, as
MLA's decoupled key), a value head d_v = 128; keys and values come from a compressed latent (kv_rank), expanded per kv
head. `h_kv` < `h_q` makes it GQA (each kv head serves h_q / h_kv query heads). Sequences are packed along the token
dimension and described by cumulative lengths, as flash_attn_varlen_func takes them.

Two attention backends, everything else shared: "openmla" (openmla.flash_attn_varlen_func, causal) and "sdpa"
(torch.nn.functional.scaled_dot_product_attention per sequence, is_causal, the kv heads repeated for GQA; torch picks
its kernel). Both use the default softmax scale d_qk ** -0.5.

Precision (the choice the training check documents): fp32 parameters and AdamW state; every matmul in bf16 (weights
cast per use), so the activations and q, k, v reach attention in bf16 and its gradients come back in bf16; RMSNorm,
RoPE and the loss in fp32. This is the usual mixed-precision recipe without autocast, and the two backends then differ
only in the attention kernels.

The task: next-token prediction on a fixed batch of synthetic sequences (seeded): each sequence repeats a random
segment of 8-32 tokens until its length, so after the first repetition every token is predictable by copying (what
attention must learn), and the same batch every step lets the loss fall fast enough for a 50-step check.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class TrainConfig:
    vocab: int = 512
    d_model: int = 256
    n_layers: int = 2
    h_q: int = 4
    h_kv: int = 4           # < h_q: GQA
    d_nope: int = 128
    d_rope: int = 64
    d_v: int = 128
    kv_rank: int = 128      # the compressed latent keys and values are expanded from
    mlp_hidden: int = 512
    lengths: tuple = (37, 256, 1, 130, 64, 511, 200, 97)  # tokens per packed sequence
    steps: int = 50
    lr: float = 3e-4
    weight_decay: float = 0.01
    seed: int = 0

    @property
    def d_qk(self) -> int:
        return self.d_nope + self.d_rope


def cumulative(lengths):
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    return cu


@dataclass
class Batch:
    tokens: torch.Tensor     # (total,) int64
    targets: torch.Tensor    # (total,) int64, -100 at each sequence's last token (nothing to predict)
    positions: torch.Tensor  # (total,) int64, the position inside its sequence
    cu_seqlens: torch.Tensor  # (b + 1,) int32
    cu_list: list = field(default_factory=list)
    max_len: int = 0


def make_batch(cfg: TrainConfig, device) -> Batch:
    rng = random.Random(cfg.seed + 1)
    tokens, targets, positions = [], [], []
    for n in cfg.lengths:
        segment = [rng.randrange(cfg.vocab) for _ in range(rng.randint(8, 32))]
        seq = [segment[i % len(segment)] for i in range(n)]
        tokens += seq
        targets += seq[1:] + [-100]
        positions += list(range(n))
    cu = cumulative(cfg.lengths)
    as_long = dict(dtype=torch.long, device=device)
    return Batch(torch.tensor(tokens, **as_long), torch.tensor(targets, **as_long), torch.tensor(positions, **as_long),
                 torch.tensor(cu, dtype=torch.int32, device=device), cu, max(cfg.lengths))


# ---------------------------------------------------------------------------------------------------------------
# Attention backends: q (total, h_q, d_qk), k (total, h_kv, d_qk), v (total, h_kv, d_v) bf16 -> (total, h_q, d_v)
# ---------------------------------------------------------------------------------------------------------------
def attention_openmla(q, k, v, batch: Batch):
    import openmla

    out, _ = openmla.flash_attn_varlen_func(q, k, v, batch.cu_seqlens, batch.cu_seqlens, batch.max_len, batch.max_len,
                                            causal=True)
    return out


def attention_sdpa(q, k, v, batch: Batch):
    group = q.shape[1] // k.shape[1]
    outs = []
    for i in range(len(batch.cu_list) - 1):
        a, b = batch.cu_list[i], batch.cu_list[i + 1]
        if a == b:
            continue
        qi = q[a:b].transpose(0, 1)[None]                                   # (1, h_q, s, d_qk)
        ki = k[a:b].repeat_interleave(group, dim=1).transpose(0, 1)[None]  # (1, h_q, s, d_qk)
        vi = v[a:b].repeat_interleave(group, dim=1).transpose(0, 1)[None]  # (1, h_q, s, d_v)
        outs.append(F.scaled_dot_product_attention(qi, ki, vi, is_causal=True)[0].transpose(0, 1))
    return torch.cat(outs, dim=0)


BACKENDS = {"openmla": attention_openmla, "sdpa": attention_sdpa}


# ---------------------------------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------------------------------
def _linear(x, weight):
    """x @ weight^T in bf16 (fp32 master weight cast per use)."""
    return F.linear(x.to(torch.bfloat16), weight.to(torch.bfloat16))


class RMSNorm(torch.nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        x = x.float()
        return (x * torch.rsqrt(x.square().mean(-1, keepdim=True) + self.eps) * self.weight).to(torch.bfloat16)


def rope(x, positions, base=10000.0):
    """Rotary embedding of the last dimension of x (..., n, d_rope) at `positions` (n,), in fp32 (rotate-half form)."""
    d = x.shape[-1]
    inv = base ** (-torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d)
    angle = positions.float()[:, None] * inv[None]           # (n, d / 2)
    shape = (angle.shape[0],) + (1,) * (x.dim() - 2) + (d // 2,)
    cos, sin = angle.cos().view(shape), angle.sin().view(shape)
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class MlaAttention(torch.nn.Module):
    def __init__(self, cfg: TrainConfig):
        super().__init__()
        self.cfg = cfg
        lin = lambda o, i: torch.nn.Parameter(torch.randn(o, i) / math.sqrt(i))  # noqa: E731
        self.w_q = lin(cfg.h_q * cfg.d_qk, cfg.d_model)
        self.w_kv_down = lin(cfg.kv_rank, cfg.d_model)
        self.kv_norm = RMSNorm(cfg.kv_rank)
        self.w_k_up = lin(cfg.h_kv * cfg.d_nope, cfg.kv_rank)
        self.w_v_up = lin(cfg.h_kv * cfg.d_v, cfg.kv_rank)
        self.w_k_rope = lin(cfg.d_rope, cfg.d_model)
        self.w_o = lin(cfg.d_model, cfg.h_q * cfg.d_v)

    def forward(self, x, batch: Batch, attention):
        cfg, n = self.cfg, x.shape[0]
        q = _linear(x, self.w_q).view(n, cfg.h_q, cfg.d_qk)
        q = torch.cat([q[..., :cfg.d_nope], rope(q[..., cfg.d_nope:], batch.positions).to(torch.bfloat16)], dim=-1)
        latent = self.kv_norm(_linear(x, self.w_kv_down))
        k_nope = _linear(latent, self.w_k_up).view(n, cfg.h_kv, cfg.d_nope)
        k_rope = rope(_linear(x, self.w_k_rope).view(n, 1, cfg.d_rope), batch.positions).to(torch.bfloat16)
        k = torch.cat([k_nope, k_rope.expand(n, cfg.h_kv, cfg.d_rope)], dim=-1)
        v = _linear(latent, self.w_v_up).view(n, cfg.h_kv, cfg.d_v)
        out = attention(q, k, v, batch)
        return _linear(out.reshape(n, cfg.h_q * cfg.d_v), self.w_o)


class Block(torch.nn.Module):
    def __init__(self, cfg: TrainConfig):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model)
        self.attn = MlaAttention(cfg)
        self.mlp_norm = RMSNorm(cfg.d_model)
        lin = lambda o, i: torch.nn.Parameter(torch.randn(o, i) / math.sqrt(i))  # noqa: E731
        self.w_gate = lin(cfg.mlp_hidden, cfg.d_model)
        self.w_up = lin(cfg.mlp_hidden, cfg.d_model)
        self.w_down = lin(cfg.d_model, cfg.mlp_hidden)

    def forward(self, x, batch, attention):
        x = x + self.attn(self.attn_norm(x), batch, attention).float()
        h = self.mlp_norm(x)
        h = F.silu(_linear(h, self.w_gate)) * _linear(h, self.w_up)
        return x + _linear(h, self.w_down).float()


class TinyMla(torch.nn.Module):
    """The residual stream is fp32; blocks compute in bf16 (module docstring, "Precision")."""

    def __init__(self, cfg: TrainConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = torch.nn.Parameter(torch.randn(cfg.vocab, cfg.d_model) * 0.5)
        self.blocks = torch.nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model)
        self.w_out = torch.nn.Parameter(torch.randn(cfg.vocab, cfg.d_model) / math.sqrt(cfg.d_model))

    def forward(self, batch: Batch, attention):
        x = self.embed[batch.tokens]
        for block in self.blocks:
            x = block(x, batch, attention)
        logits = _linear(self.norm(x), self.w_out).float()
        return F.cross_entropy(logits, batch.targets, ignore_index=-100)


def make_model(cfg: TrainConfig, device) -> TinyMla:
    """The model with parameters drawn on the CPU from cfg.seed, so every backend starts from the same values."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        model = TinyMla(cfg)
    return model.to(device)


def train(cfg: TrainConfig, backend: str, device, steps: int | None = None, keep_first_grads=False):
    """Trains a fresh model on the fixed batch with AdamW; returns the loss of every step (before its update) and,
    with keep_first_grads, {parameter name: gradient} of the first step."""
    attention = BACKENDS[backend]
    model = make_model(cfg, device)
    batch = make_batch(cfg, device)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    losses, first = [], None
    for step in range(cfg.steps if steps is None else steps):
        opt.zero_grad(set_to_none=True)
        loss = model(batch, attention)
        loss.backward()
        if keep_first_grads and step == 0:
            first = {name: p.grad.detach().clone() for name, p in model.named_parameters()}
        losses.append(float(loss.detach()))
        opt.step()
    return (losses, first) if keep_first_grads else losses


def step_callable(cfg: TrainConfig, backend: str, device):
    """A callable running one forward + backward of a fresh model on the fixed batch (no optimizer step), for timing;
    the model and batch are built once."""
    attention = BACKENDS[backend]
    model = make_model(cfg, device)
    batch = make_batch(cfg, device)

    def step():
        for p in model.parameters():
            p.grad = None
        model(batch, attention).backward()

    return step, model, batch
