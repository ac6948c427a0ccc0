"""A linear head on one vector per slide or patient: logistic (cross-entropy), linear (MSE)
or Cox (partial likelihood) regression, the loss saying which (`tilestore.learn.losses`).

The vectors are a slide encoder's output (TITAN, PRISM...) or the mean of the tile
features. Where the vector is the mean of tiles, the head applied to each tile alone is
that tile's share of the prediction: `tile_scores` of the bag (B, N, D) gives W x_i, whose
mean over the real tiles is the logits minus the bias (for a slide encoder's vector no such
relation holds, and the scores mean only "what the head says of this tile").
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


class Linear(nn.Module):
    """logits = W v + b for vectors v (B, D); given bags of vectors (B, N, D) (a patient's
    slides' vectors, padded), v is each bag's mean over its real rows: the patient vector."""

    @checked
    def __init__(self, in_dim: InDim, outputs: Outputs, *, dropout: Dropout = 0.0) -> None:
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(in_dim, outputs)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> BagOutput:
        if x.dim() == 3:
            mask = full_mask(x, mask)
            x = masked_mean(zero_padding(x, mask), mask)
        if x.dim() != 2:
            raise ValueError(f"a vector model takes (B, D) or (B, N, D), not {tuple(x.shape)}")
        return BagOutput(self.head(self.dropout(x)))

    def tile_scores(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """W x_i for the tiles of bags x (B, N, D) whose mean is the vector."""
        mask = full_mask(x, mask)
        return (zero_padding(x, mask) @ self.head.weight.T) * mask[..., None]
