"""COBRA (KatherLab, Lenz, Neidlinger et al., CVPR 2025): a slide's tile features weighted
by attention that a small Mamba-2 encoder computes, then averaged. The slide embedding is
in the tile model's own feature space (its width): COBRA only decides how much each tile
counts.

Per tile: an embedding head for the tile model's width (LayerNorm, Linear, SiLU, Linear to
768; one head per width the authors trained: 512 CONCH, 1024 UNI, 1280 Virchow2's class
token, 1536 H-optimus-0); the encoder (Linear + GELU, pre-norm residual Mamba-2 layers, a
Linear) and a LayerNorm; the 768 features dealt round-robin to `heads` gated attention
scorers (feature e * heads + k to head k), their raw scores averaged, a softmax over the
tiles. The slide embedding is that softmax's weighted mean of the tile features themselves.

Parameter names follow the authors' ``cobra.model.cobra.Cobra`` (``embed.<width>.head``,
``mamba_enc``, ``norm``, ``attn``), so their checkpoint's momentum encoder loads as it is
(`tilestore.embed.slides.load`); the forward pass is ours.
"""

from __future__ import annotations

import torch
from torch import nn

from tilestore.embed.slides.nets.abmil import GatedAttention, attend
from tilestore.embed.slides.nets.mamba import Mamba2

WIDTHS = (512, 1024, 1280, 1536)  # COBRA II's heads: CONCH, UNI, Virchow2 (CLS), H-optimus-0


class _Embed(nn.Module):
    """One tile model's features onto the encoder's width."""

    def __init__(self, width: int, dim: int) -> None:
        super().__init__()
        # index 2 is the authors' dropout (a no-op at inference)
        self.head = nn.Sequential(
            nn.LayerNorm(width),
            nn.Linear(width, dim),
            nn.Identity(),
            nn.SiLU(),
            nn.Linear(dim, dim),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(x)


class _Encoder(nn.Module):
    """The authors' ``Mamba2Enc``: Linear + GELU, pre-norm residual Mamba-2 layers, Linear."""

    def __init__(self, dim: int, layers: int, d_state: int) -> None:
        super().__init__()
        self._fc1 = nn.Sequential(nn.Linear(dim, dim), nn.GELU())
        self.layers = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(dim), Mamba2(dim, d_state=d_state)) for _ in range(layers)
        )
        self.classifier = nn.Linear(dim, dim)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        h = self._fc1(h)
        for layer in self.layers:
            h = h + layer(h)
        return self.classifier(h)


class Cobra(nn.Module):
    """COBRA's slide embedding of one tile model's features: (n, in_dim) -> (width,).

    in_dim: the stored features' width; width: the leading columns COBRA reads (Virchow2's
    class token, the first 1280 of tilestore's 2560-d CLS + mean features), in_dim where
    None; widths: the tile-model heads the checkpoint holds."""

    grid = False

    def __init__(
        self,
        in_dim: int,
        width: int | None = None,
        dim: int = 768,
        heads: int = 4,
        layers: int = 1,
        att_dim: int = 256,
        d_state: int = 128,
        widths: tuple[int, ...] = WIDTHS,
    ) -> None:
        super().__init__()
        self.in_dim, self.width, self.heads = in_dim, width or in_dim, heads
        if self.width not in widths:
            raise ValueError(f"COBRA has no head for {self.width}-d features, only {widths}")
        self.embed = nn.ModuleDict({str(w): _Embed(w, dim) for w in widths})
        self.mamba_enc = _Encoder(dim, layers, d_state)
        self.norm = nn.LayerNorm(dim)
        self.attn = nn.ModuleList(GatedAttention(dim // heads, att_dim) for _ in range(heads))

    def forward(self, features: torch.Tensor, cells: torch.Tensor | None = None) -> torch.Tensor:
        tiles = features[:, : self.width]
        h = self.norm(self.mamba_enc(self.embed[str(self.width)](tiles)))
        scores = torch.stack(
            [scorer(h[:, k :: self.heads])[:, 0] for k, scorer in enumerate(self.attn)], 1
        )
        return attend(scores.mean(1), tiles)
