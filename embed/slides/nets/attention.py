"""Attention over a whole slide's tiles without an (n x n) matrix in memory: queries in
chunks, each chunk's bias made when it is needed. Exact: the same sums as one big softmax."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

CHUNK_BYTES = 2**28  # scores (and bias) of one chunk of queries: 256 MB


def chunk_rows(keys: int, heads: int, budget: int = CHUNK_BYTES) -> int:
    """How many query rows fit `budget` bytes of float32 scores against `keys` keys."""
    return max(1, budget // max(1, heads * keys * 4))


def chunked_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: Callable[[int, int], torch.Tensor] | None = None,
    budget: int = CHUNK_BYTES,
) -> torch.Tensor:
    """softmax(q k^T / sqrt(d) + bias) v over (heads, n, d) tensors, a chunk of queries at a
    time; bias(start, stop) gives the (heads, stop - start, n) additive bias of those rows."""
    heads, n, _ = q.shape
    rows = chunk_rows(k.shape[1], heads, budget)
    if rows >= n and bias is None:
        return F.scaled_dot_product_attention(q, k, v)
    out = torch.empty_like(q)
    for start in range(0, n, rows):
        stop = min(n, start + rows)
        mask = bias(start, stop).to(q.dtype) if bias is not None else None
        out[:, start:stop] = F.scaled_dot_product_attention(q[:, start:stop], k, v, attn_mask=mask)
    return out


def attention_with_lse(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, budget: int = CHUNK_BYTES
) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(q k^T / sqrt(d)) v and the log-sum-exp of each row's scores (what flash
    attention returns, to merge attentions over different key sets), over (..., n, d)
    tensors, queries in chunks; the softmax in float32."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    lead = int(math.prod(q.shape[:-2]))
    rows = chunk_rows(k.shape[-2], lead, budget)
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
    for start in range(0, q.shape[-2], rows):
        stop = min(q.shape[-2], start + rows)
        scores = (q[..., start:stop, :] @ k.transpose(-1, -2)).float() * scale
        top = scores.logsumexp(dim=-1)
        lse[..., start:stop] = top
        weights = torch.exp(scores - top.unsqueeze(-1)).to(v.dtype)
        out[..., start:stop, :] = weights @ v
    return out, lse
