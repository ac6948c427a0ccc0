"""A tile encoder as one module: its backbone, then the pooling its model card names.

Every backbone a family builds (`tilestore.embed.models.families`) gives its final,
normalised token sequence from ``forward_features`` (n, tokens, dim), or a grid (n, h, w, dim)
for a hierarchical model, and says how many of those tokens come before the patch tokens
(``num_prefix_tokens``: the class token and any registers). Pooling is then one small
function of those tokens, the same for every family, so "CLS + mean" means one thing
everywhere. ``tokens`` gives the patch-token grid itself, for ``--tokens``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def _cls(backbone, tokens):
    return tokens[:, 0]


def _mean(backbone, tokens):
    return tokens[:, getattr(backbone, "num_prefix_tokens", 0) :].mean(dim=1)


def _token_mean(backbone, tokens):
    return tokens.mean(dim=1)


def _cls_mean(backbone, tokens):
    return torch.cat([_cls(backbone, tokens), _mean(backbone, tokens)], dim=-1)


def _prefix(backbone, tokens):
    return tokens[:, : backbone.num_prefix_tokens].flatten(1)


def _attention(backbone, tokens):
    return backbone.pool(tokens)


# pooling name (`tilestore.embed.models.spec.POOLINGS`) -> features from the token sequence
POOL = {
    "cls": _cls,
    "mean": _mean,
    "token-mean": _token_mean,
    "cls+mean": _cls_mean,
    "attn-pool": _attention,
    "multiscale": _prefix,
}


class Encoder(nn.Module):
    """backbone + pooling (+ the backbone's ``project`` where the model card projects):
    ``forward`` gives (n, output_dim) features of a normalised batch."""

    def __init__(self, backbone: nn.Module, pooling: str, project: bool = False):
        super().__init__()
        self.backbone = backbone
        self.pooling = pooling
        self.project = project

    @classmethod
    def of(cls, backbone: nn.Module, spec) -> Encoder:
        """The encoder a spec (`tilestore.embed.models.spec.ModelSpec`) names: its pooling and
        projection."""
        return cls(backbone, spec.pooling, spec.projection is not None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.pooling == "model":
            return self.backbone(x)
        pooled = POOL[self.pooling](self.backbone, self.sequence(x))
        return self.backbone.project(pooled) if self.project else pooled

    def sequence(self, x: torch.Tensor) -> torch.Tensor:
        """The final token sequence (n, tokens, dim), prefix tokens first."""
        tokens = self.backbone.forward_features(x)
        return tokens.flatten(1, 2) if tokens.ndim == 4 else tokens

    def tokens(self, x: torch.Tensor) -> torch.Tensor:
        """The patch tokens as a grid (n, h, w, dim): what ``--tokens`` stores."""
        return self._grid(self.backbone.forward_features(x))

    def features_and_tokens(self, x: torch.Tensor, grid: int | None) -> torch.Tensor:
        """One pass: the features, then the patch-token grid average-pooled to grid x grid
        (None: as the model makes it) and flattened, as one row per tile."""
        out = self.backbone.forward_features(x)
        patches = self._grid(out)
        if self.pooling == "model":  # timm's own head (timm:<arch>)
            features = self.backbone.forward_head(out)
        else:
            sequence = out.flatten(1, 2) if out.ndim == 4 else out
            pooled = POOL[self.pooling](self.backbone, sequence)
            features = self.backbone.project(pooled) if self.project else pooled
        if grid is not None and patches.shape[1:3] != (grid, grid):
            patches = F.adaptive_avg_pool2d(patches.permute(0, 3, 1, 2), grid).permute(0, 2, 3, 1)
        return torch.cat([features, patches.flatten(1).to(features.dtype)], dim=1)

    def _grid(self, tokens: torch.Tensor) -> torch.Tensor:
        if tokens.ndim == 4:  # a hierarchical model's grid, channels last (timm's Swin)
            if getattr(self.backbone, "output_fmt", "NCHW") != "NHWC":
                raise ValueError("a convolutional network's feature maps are not patch tokens")
            return tokens
        patches = tokens[:, getattr(self.backbone, "num_prefix_tokens", 0) :]
        side = math.isqrt(patches.shape[1])
        if side * side != patches.shape[1]:
            raise ValueError(f"{patches.shape[1]} patch tokens do not form a square grid")
        return patches.unflatten(1, (side, side))

    @property
    def num_prefix_tokens(self) -> int:
        return getattr(self.backbone, "num_prefix_tokens", 0)
