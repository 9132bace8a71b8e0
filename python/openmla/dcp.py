"""Decode context parallelism (DCP): which rank holds which token of a request, and each rank's decode inputs.

Under DCP every rank of a group of ``world`` ranks holds a slice of every request's KV tokens in its own paged cache,
at *local* positions 0, 1, ... of that slice. Each rank decodes its slice with :func:`openmla.flash_mla_with_kvcache`
(dense: its own block table and ``local_seqlens``; sparse: ``split_indices``), the ranks' (out, lse) are
all-gathered, and :func:`openmla.merge_attn_states` combines them (docs/integration.md, "Decode context
parallelism"). Two layouts of a request of length L:

* ``"interleaved"`` (vLLM's): token j lives on rank ``(j // interleave) % world`` at local position
  ``(j // (interleave * world)) * interleave + j % interleave`` (``interleave = 1``: token j on rank ``j % world``).
* ``"contiguous"``: rank r holds tokens ``[floor(r L / world), floor((r + 1) L / world))``, at local position
  ``j - floor(r L / world)``; the last rank always holds the last token (for L >= 1).

A rank whose slice of a request is empty returns out = 0, lse = +inf for its rows, which the merge treats as an empty
partial. Causal decode with s_q > 1 (bottom-right: query i sees keys j <= L - s_q + i) masks only the last s_q - 1
tokens of a request; a rank can apply that mask to its own slice only if those tokens are the last ones of its slice
and no other rank holds any of them. :func:`local_causal` says which rank runs causal, or raises where one call per
rank cannot express the mask (the interleaved layout, whose last tokens are spread over the ranks and whose owner of
the last token differs from request to request).

The functions take torch tensors and return new ones on the same device; none synchronises.
"""
from __future__ import annotations

from ._runtime import require_torch

__all__ = ["LAYOUTS", "local_seqlens", "token_placement", "split_indices", "local_causal"]

#: The token layouts the helpers understand.
LAYOUTS = ("interleaved", "contiguous")


def _check(rank, world, layout, interleave):
    if layout not in LAYOUTS:
        raise ValueError(f"argument 'layout' is {layout!r}; expected one of {LAYOUTS}")
    if not (isinstance(world, int) and world >= 1):
        raise ValueError(f"argument 'world' is {world!r}; expected an int >= 1")
    if rank is not None and not (isinstance(rank, int) and 0 <= rank < world):
        raise ValueError(f"argument 'rank' is {rank!r}; expected an int in [0, world = {world})")
    if not (isinstance(interleave, int) and interleave >= 1):
        raise ValueError(f"argument 'interleave' is {interleave!r}; expected an int >= 1")


def local_seqlens(cache_seqlens, rank: int, world: int, layout: str = "interleaved", interleave: int = 1):
    """The length of ``rank``'s slice of every request: (b,) int32 on cache_seqlens' device (negative lengths count
    as 0). The ``cache_seqlens`` a rank passes to its decode call."""
    _check(rank, world, layout, interleave)
    torch = require_torch("dcp.local_seqlens")
    lengths = cache_seqlens.to(torch.int64).clamp(min=0)
    if layout == "contiguous":
        local = (rank + 1) * lengths // world - rank * lengths // world
    else:
        cycle = interleave * world
        full = lengths // cycle
        rest = lengths - full * cycle
        local = full * interleave + (rest - rank * interleave).clamp(0, interleave)
    return local.to(torch.int32)


def token_placement(positions, cache_seqlens, world: int, layout: str = "interleaved", interleave: int = 1):
    """Where each token lives: ``(owner, local)``, the rank and the local position of token ``positions[i, ...]`` of
    request i (positions: (b, ...) integer tensor; cache_seqlens: (b,)). Positions outside ``[0, L_i)`` get owner and
    local -1."""
    _check(None, world, layout, interleave)
    torch = require_torch("dcp.token_placement")
    pos = positions.to(torch.int64)
    lengths = cache_seqlens.to(torch.int64).clamp(min=0).view((-1,) + (1,) * (pos.dim() - 1))
    valid = (pos >= 0) & (pos < lengths)
    p = pos.clamp(min=0)
    if layout == "contiguous":
        safe = lengths.clamp(min=1)
        owner = ((p + 1) * world + safe - 1) // safe - 1  # the largest r with floor(r L / world) <= p
        local = p - owner * lengths // world
    else:
        owner = (p // interleave) % world
        local = (p // (interleave * world)) * interleave + p % interleave
    none = torch.full_like(p, -1)
    return torch.where(valid, owner, none), torch.where(valid, local, none)


def split_indices(positions, cache_seqlens, local_block_table, page_size: int, rank: int, world: int,
                  layout: str = "interleaved", interleave: int = 1):
    """Sparse decode under DCP: ``rank``'s indices into its own cache.

    positions: (b, s_q, topk) integer token positions of the selected tokens within each request (-1 or any value
    outside ``[0, L_i)``: no token). local_block_table: (b, max_pages) int, the rank's pages of each request's slice.
    Returns (b, s_q, topk) int32: ``local_block_table[i, local // page_size] * page_size + local % page_size`` where
    this rank holds the token, -1 (skipped by the kernel) everywhere else. Slot order is kept, so the ranks' selections
    together are the request's selection.
    """
    _check(rank, world, layout, interleave)
    torch = require_torch("dcp.split_indices")
    owner, local = token_placement(positions, cache_seqlens, world, layout, interleave)
    mine = owner == rank
    local = torch.where(mine, local, torch.zeros_like(local))  # another rank's local position may pass our table
    b = positions.shape[0]
    page = torch.gather(local_block_table.to(torch.int64), 1, (local // page_size).view(b, -1)).view(local.shape)
    slots = page * page_size + local % page_size
    return torch.where(mine, slots, torch.full_like(slots, -1)).to(torch.int32)


def local_causal(causal: bool, s_q: int, rank: int, world: int, layout: str = "interleaved") -> bool:
    """The ``causal`` flag of ``rank``'s dense decode call.

    s_q == 1 or not causal: ``causal`` unchanged (nothing to mask). Causal with s_q > 1 in the contiguous layout: the
    last rank runs causal (the masked keys, the last s_q - 1 of the request, are the last of its slice) and the others
    run non-causal. Exact when the last rank's slice holds every masked key, floor((world - 1) L / world) <=
    max(L - s_q + 1, 0), which is every L for s_q = 2. The interleaved layout raises ValueError: decode query position i
    as its own s_q = 1 call over ``local_seqlens`` of the lengths L - s_q + 1 + i (a rank's tokens before a global
    position are a prefix of its slice), or use the contiguous layout.
    """
    _check(rank, world, layout, 1)
    if not causal or s_q <= 1:
        return bool(causal)
    if layout == "contiguous":
        return rank == world - 1
    raise ValueError("argument 'causal': causal decode with s_q > 1 cannot be split over ranks in the interleaved "
                     "layout (the last s_q - 1 tokens of a request lie on different ranks, and which rank holds the "
                     "last one differs from request to request); use s_q = 1 calls or the contiguous layout")
