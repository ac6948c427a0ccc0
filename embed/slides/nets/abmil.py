"""Attention-based multiple-instance pooling (Ilse et al. 2018, gated): a score per tile,
softmax over the slide's tiles, the weighted sum of the tiles. FEATHER, MADELEINE and CHIEF
are this, each with its own layers around it; EAGLE takes CHIEF's scores to choose tiles.

The modules' parameters are named as their authors' checkpoints name them (the layer
indices are those of the authors' `nn.Sequential`s), so the published weights load as
they are; the forward passes are ours.
"""

from __future__ import annotations

import torch
from torch import nn


class GatedAttention(nn.Module):
    """score = w . (tanh(A h) * sigmoid(B h)): one score per tile per head."""

    def __init__(self, dim: int, hidden: int, heads: int = 1) -> None:
        super().__init__()
        self.attention_a = nn.Sequential(nn.Linear(dim, hidden), nn.Tanh())
        self.attention_b = nn.Sequential(nn.Linear(dim, hidden), nn.Sigmoid())
        self.attention_c = nn.Linear(hidden, heads)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """(tiles, dim) -> (tiles, heads) scores, before the softmax."""
        return self.attention_c(self.attention_a(h) * self.attention_b(h))


def attend(scores: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """The softmax over tiles of (tiles,) scores, applied to (tiles, dim) values: (dim,)."""
    weights = torch.softmax(scores.float(), dim=0).to(values.dtype)
    return weights @ values


class Feather(nn.Module):
    """FEATHER (MahmoodLab's ABMIL, MIL-Lab): tile features through Linear + ReLU, gated
    attention pooling; the slide embedding is the pooled vector, before the classifier."""

    grid = False

    def __init__(self, in_dim: int, embed_dim: int = 512, attn_dim: int = 384) -> None:
        super().__init__()
        self.in_dim = in_dim
        self.patch_embed = nn.Sequential(nn.Linear(in_dim, embed_dim), nn.ReLU())
        self.global_attn = GatedAttention(embed_dim, attn_dim)

    def forward(self, features: torch.Tensor, cells: torch.Tensor | None = None) -> torch.Tensor:
        h = self.patch_embed(features)
        return attend(self.global_attn(h)[:, 0], h)


class Madeleine(nn.Module):
    """MADELEINE's H&E slide encoder (mahmoodlab/MADELEINE): a shared MLP widens each tile to
    `heads` interleaved embeddings, a gated attention pooler per head, and a projection of
    the heads' pooled vectors, concatenated feature-major."""

    grid = False

    def __init__(self, in_dim: int = 512, hidden: int = 512, heads: int = 4) -> None:
        super().__init__()
        self.in_dim, self.hidden, self.heads = in_dim, hidden, heads

        def block(i: int, o: int) -> list[nn.Module]:
            return [nn.Linear(i, o), nn.LayerNorm(o), nn.GELU(), nn.Dropout(0.1)]

        self.pre_attn = nn.Sequential(
            *block(in_dim, hidden), *block(hidden, hidden), *block(hidden, hidden * heads)
        )
        self.attn = nn.ModuleList(GatedAttention(hidden, hidden) for _ in range(heads))
        self.projector = nn.Linear(hidden * heads, hidden)

    def forward(self, features: torch.Tensor, cells: torch.Tensor | None = None) -> torch.Tensor:
        # (tiles, hidden * heads), feature-major: column e * heads + k is head k's feature e
        h = self.pre_attn(features).view(len(features), self.hidden, self.heads)
        pooled = torch.stack(
            [attend(pooler(h[:, :, k])[:, 0], h[:, :, k]) for k, pooler in enumerate(self.attn)],
            dim=1,
        )  # (hidden, heads)
        return self.projector(pooled.reshape(-1))


class Chief(nn.Module):
    """CHIEF's slide embedding (hms-dbmi/CHIEF, ``WSI_feature``): gated attention scores
    computed on a 512-d projection of each tile, applied to the tiles' own CTransPath
    features (768-d), without the anatomic-site text embedding its classifier adds."""

    grid = False

    def __init__(self, in_dim: int = 768, hidden: int = 512, attn_dim: int = 256) -> None:
        super().__init__()
        self.in_dim = in_dim
        self.attention_net = nn.Sequential(
            nn.Linear(in_dim, hidden), nn.ReLU(), nn.Dropout(0.25), GatedAttention(hidden, attn_dim)
        )

    def forward(self, features: torch.Tensor, cells: torch.Tensor | None = None) -> torch.Tensor:
        return attend(self.attention_net(features)[:, 0], features)


class Eagle(nn.Module):
    """EAGLE (KatherLab/EAGLE; STAMP's ``eagle``): CHIEF's attention scores over each tile's
    CTransPath features (the `guide`, 768-d, of the same tiles) choose the `top` tiles with
    the highest scores (all of a slide with fewer), and the slide embedding is the mean of
    those tiles' own features (Virchow2's class token, 1,280-d). CHIEF's attention layers
    are named as in its checkpoint, which EAGLE uses as published. A patient's vector is
    the same over the tiles of all its slides at once (`patients_from`)."""

    grid = False
    patients_from = "tiles"  # a patient: its slides' tiles together, not their vectors

    def __init__(
        self,
        in_dim: int = 1280,
        guide_dim: int = 768,
        hidden: int = 512,
        attn_dim: int = 256,
        top: int = 25,
    ) -> None:
        super().__init__()
        self.in_dim, self.top = in_dim, top
        self.attention_net = nn.Sequential(
            nn.Linear(guide_dim, hidden),
            nn.ReLU(),
            nn.Dropout(0.25),
            GatedAttention(hidden, attn_dim),
        )

    def chosen(self, guide: torch.Tensor) -> torch.Tensor:
        """The indices of the tiles CHIEF scores highest, highest first."""
        scores = self.attention_net(guide)[:, 0]
        return torch.topk(scores, min(self.top, len(scores))).indices

    def forward(
        self,
        features: torch.Tensor,
        cells: torch.Tensor | None = None,
        guide: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if guide is None or len(guide) != len(features):
            raise ValueError("EAGLE reads CTransPath features of the same tiles (guide)")
        return features[self.chosen(guide)].mean(dim=0)
