"""PRISM's slide encoder (paige-ai/Prism, its image resampler): a Perceiver whose 513
latent queries read Virchow's tile features (CLS + mean, 2560-d) by cross-attention, then
attend to each other; the first latent, layer-normed, is the 1280-d slide embedding
(``slide_representations(...)["image_embedding"]``).

Of its 8 layers, the first two have their own cross-attention and the rest reuse the
second's; every layer reuses the first layer's 6 self-attention blocks (the authors' weight
sharing). Cross-attention reads the tiles in chunks of queries against all keys: 513 x n
scores, never more. Parameter names follow the authors' checkpoint.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class _GeGLU(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        value, gate = x.chunk(2, dim=-1)
        return value * F.gelu(gate)


class _FeedForward(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.net = nn.Sequential(nn.Linear(dim, dim * 2), _GeGLU(), nn.Linear(dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(self.norm(x))


class _CrossAttention(nn.Module):
    """One head of the latents (queries, layer-normed) over the tiles (keys, values: not
    normed, as the authors': norming a long context costs too much memory)."""

    def __init__(self, dim: int, context: int) -> None:
        super().__init__()
        self.x_norm = nn.LayerNorm(dim)
        self.to_q = nn.Linear(dim, dim, bias=False)
        self.to_kv = nn.Linear(context, dim * 2, bias=False)
        self.to_out = nn.Linear(dim, dim, bias=False)

    def keys(self, context: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        k, v = self.to_kv(context).chunk(2, dim=-1)
        return k.unsqueeze(0), v.unsqueeze(0)

    def forward(self, x: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        q = self.to_q(self.x_norm(x)).unsqueeze(0)
        return self.to_out(F.scaled_dot_product_attention(q, *kv)[0])


class _SelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.mha = nn.MultiheadAttention(dim, heads, bias=False, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm(x).unsqueeze(0)
        return self.mha(y, y, y, need_weights=False)[0][0]


class Prism(nn.Module):
    grid = False

    def __init__(
        self,
        in_dim: int = 2560,
        dim: int = 1280,
        latents: int = 512,
        depth: int = 8,
        blocks: int = 6,
        heads: int = 8,
        own_cross: int = 2,
    ) -> None:
        super().__init__()
        self.in_dim, self.depth = in_dim, depth
        self.latents = nn.Parameter(torch.zeros(latents + 1, dim))
        self.cross = nn.ModuleList(
            nn.ModuleDict({"xattn": _CrossAttention(dim, in_dim), "ff": _FeedForward(dim)})
            for _ in range(own_cross)
        )
        self.tf = nn.ModuleList(
            nn.ModuleDict({"mhsa": _SelfAttention(dim, heads), "ff": _FeedForward(dim)})
            for _ in range(blocks)
        )
        self.cls_norm = nn.LayerNorm(dim)

    def forward(self, features: torch.Tensor, cells: torch.Tensor | None = None) -> torch.Tensor:
        x = self.latents.to(features.dtype)
        kv = None
        for layer in range(self.depth):
            cross = self.cross[min(layer, len(self.cross) - 1)]
            if layer < len(self.cross):  # a layer with its own keys; the rest reuse the last
                kv = cross["xattn"].keys(features)
            x = x + cross["xattn"](x, kv)
            x = x + cross["ff"](x)
            for block in self.tf:
                x = x + block["mhsa"](x)
                x = x + block["ff"](x)
        return self.cls_norm(x[0])
