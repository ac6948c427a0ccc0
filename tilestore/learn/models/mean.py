"""Mean-pool + linear: the baseline bag model.

A bag's features are averaged over its real tiles and one linear layer gives the logits.
Each tile's score is the same linear layer applied to the tile alone, without its bias, so
the mean of a bag's tile scores is exactly its logits minus the bias (the linear vector
model's `tile_scores`, `tilestore.learn.models.linear`: mean-pooling is that model on the
bag's mean).
"""

from __future__ import annotations

from torch import Tensor

from tilestore.learn.models.base import BagOutput, full_mask, masked_mean, zero_padding
from tilestore.learn.models.linear import Linear


class MeanPool(Linear):
    """logits = W mean_i(x_i) + b over the bag's real tiles."""

    def forward(self, x: Tensor, mask: Tensor | None = None) -> BagOutput:
        mask = full_mask(x, mask)
        pooled = masked_mean(zero_padding(x, mask), mask)
        return BagOutput(self.head(self.dropout(pooled)))
