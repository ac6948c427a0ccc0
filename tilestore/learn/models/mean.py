"""Mean-pool + linear: the baseline bag model.

A bag's features are averaged over its real tiles and one linear layer gives the logits.
Each tile's score is the same linear layer applied to the tile alone, without its bias, so
the mean of a bag's tile scores is exactly its logits minus the bias (the linear vector
model's `tile_scores`, `tilestore.learn.models.linear`: mean-pooling is that model on the
bag's mean).
"""

from __future__ import annotations

from tilestore.learn.models.linear import Linear


class MeanPool(Linear):
    """logits = W mean_i(x_i) + b over the bag's real tiles: the linear model's forward on a
    bag (B, N, D), registered apart because it reads tiles, not slide vectors."""
