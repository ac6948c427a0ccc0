"""Mean-pool + linear: the baseline bag model.

A bag's features are averaged over its real tiles and one linear layer gives the logits.
Each tile's score is the same linear layer applied to the tile alone, without its bias, so
the mean of a bag's tile scores is exactly its logits minus the bias.
"""

from __future__ import annotations

from torch import Tensor, nn

from tilestore.learn.models.base import (
    BagOutput,
    Dropout,
    InDim,
    Outputs,
    full_mask,
    masked_mean,
    zero_padding,
)
from tilestore.options import checked


class MeanPool(nn.Module):
    """logits = W mean_i(x_i) + b over the bag's real tiles."""

    @checked
    def __init__(self, in_dim: InDim, outputs: Outputs, *, dropout: Dropout = 0.0) -> None:
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(in_dim, outputs)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> BagOutput:
        mask = full_mask(x, mask)
        pooled = masked_mean(zero_padding(x, mask), mask)
        return BagOutput(self.head(self.dropout(pooled)))

    def tile_scores(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """W x_i per tile (B, N, outputs): their mean over real tiles is logits - b."""
        mask = full_mask(x, mask)
        return (zero_padding(x, mask) @ self.head.weight.T) * mask[..., None]
