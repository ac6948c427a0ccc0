"""Mean-pool + linear (placeholder of learn-models' module)."""

from __future__ import annotations

from torch import nn

from tilestore.learn.models.base import BagOutput


class MeanPool(nn.Module):
    def __init__(self, in_dim, outputs, **_):
        super().__init__()
        self.head = nn.Linear(in_dim, outputs)

    def forward(self, x, mask=None):
        if mask is None:
            pooled = x.mean(1)
        else:
            m = mask.unsqueeze(-1).to(x.dtype)
            pooled = (x * m).sum(1) / m.sum(1).clamp(min=1)
        return BagOutput(self.head(pooled), None)

    def tile_scores(self, x, mask=None):
        return self.head(x)
