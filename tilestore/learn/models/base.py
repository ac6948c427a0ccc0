"""What every model gives back (`BagOutput`) and the few steps the models share: padding
made harmless, attention softmaxed over real tiles only, gradient x input attribution.

A batch of bags of different lengths is padded to its longest bag; `mask` (B, N) says which
tiles are real (True). A model zeroes the padding's features before anything else reads
them, so what padding holds (garbage, NaN) can never reach a real tile's result.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

import torch
from torch import Tensor, nn

from tilestore.options import Opt

# the hyper-parameters the models share, declared once (`tilestore.options`): a model's
# constructor is `checked`, so a value out of range is one OptionError line
InDim = Annotated[int, Opt("Width of the features the model reads.", low=1)]
Outputs = Annotated[int, Opt("The model's outputs (the task's).", low=1)]
Hidden = Annotated[int, Opt("Width of the tiles' encoding inside the model.", low=1)]
AttentionDim = Annotated[int, Opt("Width of the attention network's hidden layer.", low=1)]
Dropout = Annotated[float, Opt("Dropout probability while training.", low=0, high=0.95)]
Activation = Annotated[Literal["relu", "gelu"], Opt("The encoder's activation.")]
Gated = Annotated[bool, Opt("Gate the attention (sigmoid branch, Ilse 2018).")]


@dataclass(frozen=True)
class BagOutput:
    """A model's answer for a batch: logits (B, outputs) and, for attention models, each
    tile's attention (B, N), softmaxed over the bag's real tiles (0 on padding)."""

    logits: Tensor
    attention: Tensor | None = None


def full_mask(x: Tensor, mask: Tensor | None) -> Tensor:
    """The mask (B, N) as given, or every tile real."""
    if mask is None:
        return torch.ones(x.shape[:2], dtype=torch.bool, device=x.device)
    if mask.shape != x.shape[:2]:
        raise ValueError(f"mask of shape {tuple(mask.shape)} for bags of {tuple(x.shape[:2])}")
    return mask.to(torch.bool)


def zero_padding(x: Tensor, mask: Tensor) -> Tensor:
    """x with its padding tiles' features set to 0 (where, not a product: NaN stays out)."""
    return torch.where(mask[..., None], x, torch.zeros((), dtype=x.dtype, device=x.device))


def masked_softmax(scores: Tensor, mask: Tensor) -> Tensor:
    """Softmax over the tiles (last axis) of the real ones; padding gets exactly 0."""
    # the dtype's lowest value, not -inf: exp(lowest - max) is 0, and a row is never NaN
    low = torch.finfo(scores.dtype).min
    return torch.softmax(scores.masked_fill(~mask, low), dim=-1)


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """The mean (B, D) of each bag's real tiles (x (B, N, D) with padding already zeroed),
    summed and divided in fp32 at least: a count of 10,000 tiles is not exact in bf16."""
    wide = torch.promote_types(x.dtype, torch.float32)
    count = mask.sum(dim=1, keepdim=True).clamp(min=1).to(wide)
    return (x.sum(dim=1, dtype=wide) / count).to(x.dtype)


def gradient_x_input(model: nn.Module, x: Tensor, mask: Tensor | None) -> Tensor:
    """Each tile's contribution to each output (B, N, outputs): the gradient of the output
    with respect to the tile's features times the features, summed over the features
    (Simonyan 2014; Shrikumar 2016). Padding gets 0."""
    mask = full_mask(x, mask)
    with torch.enable_grad():
        x = zero_padding(x.detach(), mask).requires_grad_(True)
        logits = model(x, mask).logits
        scores = []
        for o in range(logits.shape[1]):
            # bags are independent, so the gradient of the batch's sum is each bag's own
            (grad,) = torch.autograd.grad(logits[:, o].sum(), x, retain_graph=True)
            scores.append((grad * x).sum(dim=-1))
    return torch.stack(scores, dim=-1).detach() * mask[..., None]
