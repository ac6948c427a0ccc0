"""Pooling a slide's tile features without weights: their mean, or their maximum per feature."""

from __future__ import annotations

import torch
from torch import nn


class _Weightless(nn.Module):
    """A pooling without weights: it reads the tile features alone, never their grid."""

    grid = False

    def __init__(self, in_dim: int | None = None) -> None:
        super().__init__()
        self.in_dim = in_dim


class Mean(_Weightless):
    """The mean of the tile features (TRIDENT's ``mean-<model>`` encoders)."""

    def forward(self, features: torch.Tensor, cells: torch.Tensor | None = None) -> torch.Tensor:
        return features.float().mean(dim=0)


class Max(_Weightless):
    """Each feature's maximum over the tiles."""

    def forward(self, features: torch.Tensor, cells: torch.Tensor | None = None) -> torch.Tensor:
        return features.float().amax(dim=0)
