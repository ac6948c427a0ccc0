"""TITAN's slide encoder (MahmoodLab/TITAN, its vision tower): CONCH v1.5 tile features on
their grid, a 6-block transformer whose attention is biased by the Euclidean distance
between tiles (2-D ALiBi, a slope per head), and the contrastive attentional pooler's one
query: the 768-d slide embedding TITAN's ``encode_slide_from_patch_features`` returns.

The authors' code builds the whole (heads x n x n) bias at once (12 x 30,000^2 floats:
43 GB); here each chunk of query rows makes its own (`attention.chunked_attention`), so a
slide of 100,000 tiles needs memory in n, not n^2. Parameter names follow the authors'
checkpoint (``blocks.modules_list.<i>`` read as ``blocks.<i>``).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from tilestore.embed.slides.nets.attention import CHUNK_BYTES, chunked_attention


def alibi_slopes(heads: int) -> list[float]:
    """ALiBi's geometric slopes (Press et al.): 2^(-8 i / n) for a power-of-two n heads;
    otherwise those of the power below, then every other one of the power above."""

    def power_of_two(n: int) -> list[float]:
        first = 2 ** (-8 / n)
        return [first ** (i + 1) for i in range(n)]

    below = 2 ** math.floor(math.log2(heads))
    if below == heads:
        return power_of_two(heads)
    return power_of_two(below) + power_of_two(2 * below)[0::2][: heads - below]


class _Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class _SelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, bias, budget: int) -> torch.Tensor:
        n, dim = x.shape
        q, k, v = self.qkv(x).view(n, 3, self.heads, dim // self.heads).permute(1, 2, 0, 3)
        out = chunked_attention(q, k, v, bias, budget)  # (heads, n, head_dim)
        return self.proj(out.transpose(0, 1).reshape(n, dim))


class _Block(nn.Module):
    def __init__(self, dim: int, heads: int, mlp_ratio: float) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = _SelfAttention(dim, heads)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = _Mlp(dim, int(dim * mlp_ratio))

    def forward(self, x: torch.Tensor, bias, budget: int) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), bias, budget)
        return x + self.mlp(self.norm2(x))


class _Pooler(nn.Module):
    """Learned queries attending to the layer-normed tokens (CoCa's attentional pooler)."""

    def __init__(self, dim: int, heads: int, queries: int = 1) -> None:
        super().__init__()
        self.query = nn.Parameter(torch.zeros(queries, dim))
        self.attn = nn.MultiheadAttention(dim, heads)
        self.ln_q = nn.LayerNorm(dim)
        self.ln_k = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(n, dim) tokens -> (queries, dim)."""
        keys = self.ln_k(x).unsqueeze(1)
        out, _ = self.attn(self.ln_q(self.query).unsqueeze(1), keys, keys, need_weights=False)
        return out[:, 0]


class Titan(nn.Module):
    grid = True

    def __init__(
        self,
        in_dim: int = 768,
        dim: int = 768,
        depth: int = 6,
        heads: int = 12,
        mlp_ratio: float = 4.0,
        pool_heads: int = 8,
        budget: int = CHUNK_BYTES,
    ) -> None:
        super().__init__()
        self.in_dim, self.budget = in_dim, budget
        self.patch_embed = nn.Sequential(nn.Linear(in_dim, dim), nn.GELU())
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.blocks = nn.ModuleList(_Block(dim, heads, mlp_ratio) for _ in range(depth))
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.attn_pool_contrastive = _Pooler(dim, pool_heads)
        self.register_buffer("slopes", torch.tensor(alibi_slopes(heads)), persistent=False)

    def forward(self, features: torch.Tensor, cells: torch.Tensor) -> torch.Tensor:
        """(n, in_dim) tile features and their (n, 2) grid cells -> (dim,)."""
        x = self.patch_embed(features)
        x = torch.cat([self.cls_token[0].to(x.dtype), x])
        where = cells.to(torch.float32)
        slopes = self.slopes.to(where.device).view(-1, 1, 1)

        n = len(x)
        wide = -(-n // 8) * 8  # rows 16-byte aligned, as fused attention kernels want them

        def bias(start: int, stop: int) -> torch.Tensor:
            """-slope * distance between tiles; nothing to or from the class token (row 0).
            Distances by differences (exact on whole cells, as the authors' cdist, whose
            kernel took 14x as long on an H100: bench/RESULTS.md, slide encoders)."""
            out = torch.zeros(len(slopes), stop - start, wide, device=x.device, dtype=x.dtype)
            out = out[..., :n]  # made in the attention's dtype: no copy that unaligns it
            rows = where[max(start, 1) - 1 : stop - 1]
            dx = rows[:, :1] - where[:, 0]
            dy = rows[:, 1:] - where[:, 1]
            distance = torch.sqrt(dx * dx + dy * dy)  # (rows, n - 1)
            out[:, max(start, 1) - start :, 1:] = -slopes * distance
            return out

        for block in self.blocks:
            x = block(x, bias, self.budget)
        return self.attn_pool_contrastive(self.norm(x))[0]
