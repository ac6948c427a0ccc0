"""Prov-GigaPath's slide encoder (prov-gigapath/prov-gigapath, ``gigapath_slide_enc12l768d``):
Prov-GigaPath tile features (1536-d) projected to 768, a fixed 2-D sin-cos position per
grid cell, and a 12-layer LongNet whose attention is dilated: five branches, each splitting
the sequence into segments (1,024 to 1,048,576 tokens) and, within a segment, letting head
group r attend only among every dr-th token from r (dr = 1, 2, 4, 8, 16); the branches are
merged by their softmax denominators (log-sum-exp), as flash attention returns them.

Exact to the authors' arithmetic, including its edges: a sequence is padded with zero
keys to whole segments (those keys take part in the softmax, as in the authors' code), and
a segment to a whole number of strides. Each branch's attention is computed a chunk of
queries at a time (`attention.attention_with_lse`), so 100,000 tiles fit. Parameter names
follow the authors' checkpoint (``encoder.layers.<i>.self_attn.q_proj`` ...).

Which output is the slide embedding differs between peers: TRIDENT takes the hidden states
after layer 11 of 12, mean-pooled over the tiles, then the final norm (``layer=11,
pool="mean"``); the authors' pipeline the states after layer 12, class token, final norm.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from tilestore.embed.slides.nets.attention import CHUNK_BYTES, attention_with_lse

MASKED_LSE = -1e8  # a position a branch does not attend from: its weight in the merge is 0


def segment_lengths(max_size: int = 262144, tile: int = 256) -> list[int]:
    """The authors' segment lengths: five powers of two from 2^10 to the longest sequence a
    slide of `max_size` px in `tile` px tiles can have, log-spaced and truncated."""
    longest = (max_size // tile) ** 2
    exponents = np.linspace(np.log2(1024), int(np.log2(longest)), 5)
    return [int(v) for v in np.power(2, exponents).astype(int)]


def sincos(positions: torch.Tensor, dim: int) -> torch.Tensor:
    """MAE's 1-D sin-cos embedding (float64) of positions: (n,) -> (n, dim)."""
    omega = 1.0 / 10000 ** (torch.arange(dim // 2, dtype=torch.float64) / (dim / 2.0))
    angles = positions.to(torch.float64)[:, None] * omega.to(positions.device)[None]
    return torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)


class _DilatedAttention(nn.Module):
    def __init__(self, dim: int, heads: int, segments: list[int], ratios: list[int]) -> None:
        super().__init__()
        self.heads, self.segments, self.ratios = heads, segments, ratios
        if any(heads % r for r in ratios):
            raise ValueError(f"{heads} heads do not split into groups of every ratio {ratios}")
        self.q_proj, self.k_proj = nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.v_proj, self.out_proj = nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.inner_attn_ln = nn.LayerNorm(dim)
        self.budget = CHUNK_BYTES

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, dim = x.shape
        shape = (n, self.heads, dim // self.heads)
        q, k, v = (p(x).view(shape) for p in (self.q_proj, self.k_proj, self.v_proj))
        outs, lses = zip(
            *(self._branch(q, k, v, s, r) for s, r in zip(self.segments, self.ratios, strict=True)),
            strict=True,
        )
        lse = torch.stack(lses)  # (branches, n, heads)
        weights = torch.softmax(lse, dim=0).unsqueeze(-1)
        out = (torch.stack(outs) * weights.to(outs[0].dtype)).sum(0)
        return self.out_proj(self.inner_attn_ln(out.reshape(n, dim)))

    def _branch(self, q, k, v, segment: int, ratio: int):
        """One branch: (n, heads, d) -> its output (n, heads, d) and log-sum-exp (n, heads)."""
        n, heads, d = q.shape
        size = min(segment, n)
        count = -(-n // size)
        padded = -(-size // ratio) * ratio  # a segment padded to whole strides
        group = heads // ratio

        def sparse(t: torch.Tensor) -> torch.Tensor:
            """(n, heads, d) -> (segments, heads, tokens, d): head group r takes positions
            r, r + ratio, ... of each segment."""
            t = F.pad(t, (0, 0, 0, 0, 0, count * size - n)).view(count, size, heads, d)
            t = F.pad(t, (0, 0, 0, 0, 0, padded - size)).view(count, -1, ratio, heads, d)
            picked = [t[:, :, r, r * group : (r + 1) * group] for r in range(ratio)]
            return torch.cat(picked, dim=2).transpose(1, 2)

        out, lse = attention_with_lse(sparse(q), sparse(k), sparse(v), self.budget)
        dense = out.new_zeros(count, padded, heads, d)
        dense_lse = lse.new_full((count, padded, heads), 0.0)
        for r in range(ratio):
            heads_r = slice(r * group, (r + 1) * group)
            dense[:, r::ratio, heads_r] = out[:, heads_r].transpose(1, 2)
            dense_lse[:, r::ratio, heads_r] = lse[:, heads_r].transpose(1, 2)
        dense_lse = dense_lse.masked_fill(dense_lse == 0, MASKED_LSE)
        # segments laid end to end at their padded length, cut to the sequence (as theirs)
        return dense.reshape(-1, heads, d)[:n], dense_lse.reshape(-1, heads)[:n]


class _FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(dim, hidden), nn.Linear(hidden, dim)
        self.ffn_layernorm = nn.LayerNorm(hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.ffn_layernorm(F.gelu(self.fc1(x).float()).to(x.dtype)))


class _Layer(nn.Module):
    def __init__(self, dim: int, heads: int, hidden: int, segments, ratios) -> None:
        super().__init__()
        self.self_attn = _DilatedAttention(dim, heads, segments, ratios)
        self.self_attn_layer_norm = nn.LayerNorm(dim)
        self.ffn = _FeedForward(dim, hidden)
        self.final_layer_norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.self_attn_layer_norm(x))
        return x + self.ffn(self.final_layer_norm(x))


class _Encoder(nn.Module):
    def __init__(self, depth: int, **layer) -> None:
        super().__init__()
        self.layers = nn.ModuleList(_Layer(**layer) for _ in range(depth))


class LongNetSlide(nn.Module):
    grid = True

    def __init__(
        self,
        in_dim: int = 1536,
        dim: int = 768,
        depth: int = 12,
        heads: int = 16,
        mlp_ratio: int = 4,
        grid_size: int = 1000,
        layer: int = 12,
        pool: str = "cls",
    ) -> None:
        super().__init__()
        if pool not in ("cls", "mean") or not 1 <= layer <= depth:
            raise ValueError(f"pool {pool!r} (cls, mean), layer {layer} (1-{depth})")
        self.in_dim, self.dim, self.grid_size = in_dim, dim, grid_size
        self.layer, self.pool = layer, pool
        self.patch_embed = nn.Module()
        self.patch_embed.proj = nn.Linear(in_dim, dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.encoder = _Encoder(
            depth,
            dim=dim,
            heads=heads,
            hidden=dim * mlp_ratio,
            segments=segment_lengths(),
            ratios=[1, 2, 4, 8, 16],
        )
        self.norm = nn.LayerNorm(dim, eps=1e-6)

    def positions(self, cells: torch.Tensor) -> torch.Tensor:
        """The fixed 2-D sin-cos embedding of each tile's cell (col, row): MAE's table over a
        grid_size^2 grid, indexed col * grid_size + row (the authors' x-major order), whose
        first half encodes the row and second the column."""
        if not cells.is_meta and (int(cells.max()) >= self.grid_size or int(cells.min()) < 0):
            raise ValueError(
                f"a tile lies outside the encoder's {self.grid_size} x {self.grid_size} grid"
            )
        half = self.dim // 2
        return torch.cat([sincos(cells[:, 1], half), sincos(cells[:, 0], half)], dim=1)

    def forward(self, features: torch.Tensor, cells: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed.proj(features)
        x = x + self.positions(cells).to(x.dtype)
        x = torch.cat([self.cls_token[0].to(x.dtype), x])  # the class token's position is 0
        for layer in self.encoder.layers[: self.layer]:
            x = layer(x)
        pooled = x[1:].mean(dim=0) if self.pool == "mean" else x[0]
        return self.norm(pooled)
