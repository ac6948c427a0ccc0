"""The loss each task trains with (`loss_for`): cross-entropy per classification target
(with class weights), mean squared error for regression, Cox's negative partial
log-likelihood for survival (Breslow's handling of tied times).

A loss takes the model's logits (B, task.outputs) and the labels y (B, len(task.targets))
as `Cohort.labels` holds them: class indices, values, or (time, event). Logits of a
half-precision model (bf16, fp16) are taken in fp32: the loss is a sum over the batch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor

from tilestore.errors import OptionError

if TYPE_CHECKING:
    from tilestore.learn.task import Task

Loss = Callable[[Tensor, Tensor], Tensor]


def loss_for(task: Task, class_weights: Sequence[Sequence[float]] | None = None) -> Loss:
    """The loss of `task`; `class_weights`: one weight per class of each classification
    target (e.g. inverse frequencies), or None for equal weights."""
    if task.kind == "classification":
        loss = _classification(task, class_weights)
    elif class_weights is not None:
        raise OptionError(f"class weights for a {task.kind} task: only classes have weights")
    else:
        loss = LOSSES[task.kind]

    def wide(logits: Tensor, y: Tensor) -> Tensor:
        return loss(logits.to(torch.promote_types(logits.dtype, torch.float32)), y)

    return wide


def _classification(task: Task, class_weights: Sequence[Sequence[float]] | None) -> Loss:
    heads = task.heads()
    if class_weights is None:
        weights: list[Tensor | None] = [None] * len(heads)
    else:
        if len(class_weights) != len(heads) or any(
            len(w) != len(c) for w, c in zip(class_weights, task.classes, strict=False)
        ):
            raise OptionError(
                f"class weights {[len(w) for w in class_weights]} per target for classes "
                f"{[len(c) for c in task.classes]}: one weight per class of each target"
            )
        if any(not w >= 0 for ws in class_weights for w in ws):
            raise OptionError(f"class weights {class_weights}: each must be a number >= 0")
        weights = [torch.as_tensor(w, dtype=torch.float32).detach().cpu() for w in class_weights]

    def cross_entropy(logits: Tensor, y: Tensor) -> Tensor:
        """The mean over targets of each target's (weighted) cross-entropy."""
        terms = [
            F.cross_entropy(
                logits[:, head],
                y[:, t].long(),
                weight=None if w is None else w.to(logits.device, logits.dtype),
            )
            for t, (head, w) in enumerate(zip(heads, weights, strict=True))
        ]
        return torch.stack(terms).mean()

    return cross_entropy


def mse(logits: Tensor, y: Tensor) -> Tensor:
    """Mean squared error over patients and targets."""
    return F.mse_loss(logits, y.to(logits.dtype))


def cox(logits: Tensor, y: Tensor) -> Tensor:
    """Cox's negative partial log-likelihood (Breslow), averaged over events:

        -1/E sum_{i: event} [ r_i - log sum_{j: t_j >= t_i} exp(r_j) ]

    r = logits[:, 0], the risk (higher: earlier event); y = (time, event). A batch without
    an event carries no information: 0 (still tied to the graph, so backward works)."""
    risk = logits[:, 0]
    time, event = y[:, 0], y[:, 1].to(torch.bool)
    if not bool(event.any()):
        return risk.sum() * 0.0
    at_risk = time[None, :] >= time[:, None]  # [i, j]: j still at risk when i has its event
    low = torch.finfo(risk.dtype).min
    log_sums = torch.logsumexp(risk[None, :].masked_fill(~at_risk, low), dim=1)
    return -(risk - log_sums)[event].mean()


LOSSES: dict[str, Loss] = {"regression": mse, "survival": cox}
