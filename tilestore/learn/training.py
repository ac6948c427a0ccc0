"""Training one model on bags (`fit`): AdamW under a one-cycle (or constant) learning rate,
validation-based early stopping, a seed that makes the weights bitwise repeatable on one
machine, a progress line per epoch. A model with a `training_loss(x, mask, y, loss)` of its
own (CLAM-SB: the bag's and the instances' losses) is trained on that, else on the task's
loss of its logits.

Repeatable: the weights drawn from a generator of the seed, the order and the tile sampling
from numpy generators of the seed, torch's deterministic algorithms on while it runs (set
back as they were after), so two fits with the same inputs give the same bytes.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tilestore.learn.bags import Bags
from tilestore.learn.options import LearnOptions


@dataclass(frozen=True)
class Fitted:
    """A model fitted: the model (its best validation epoch's weights, in eval mode), that
    epoch, the epochs run, the best validation loss, and each epoch's (train, valid) loss."""

    model: Any
    best_epoch: int
    epochs: int
    valid_loss: float
    history: tuple[tuple[float, float], ...]


@contextlib.contextmanager
def deterministic(threads: int | None = None) -> Iterator[None]:
    """torch's deterministic algorithms on (and its CPU threads `threads`, None: as they
    are) for the block, set back as they were after."""
    import torch

    was, warn = (
        torch.are_deterministic_algorithms_enabled(),
        (torch.is_deterministic_algorithms_warn_only_enabled()),
    )
    had = torch.get_num_threads()
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS's repeatable mode
    torch.use_deterministic_algorithms(True, warn_only=True)
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(was, warn_only=warn)
        torch.set_num_threads(had)


def class_weights(task: Any, labels: np.ndarray) -> list[Any] | None:
    """Inverse-frequency weights of each classification head's classes (of these labels)."""
    import torch

    if task.kind != "classification":
        return None
    found = []
    for j, classes in enumerate(task.classes):
        counts = np.bincount(labels[:, j].astype(int), minlength=len(classes)).astype(np.float64)
        weights = np.where(counts > 0, counts.sum() / np.maximum(counts, 1) / len(classes), 0.0)
        found.append(torch.tensor(weights, dtype=torch.float32))
    return found


def predict_bags(model: Any, bags: Bags, patients: Sequence[int], batch: int = 1) -> np.ndarray:
    """The model's outputs (patients, outputs) float64, in eval mode, no gradients."""
    import torch

    model.eval()
    out = []
    with torch.no_grad():
        for start in range(0, len(patients), batch):
            x, mask = bags.batch(patients[start : start + batch])
            out.append(model(x, mask).logits.float().cpu().numpy())
    return np.concatenate(out).astype(np.float64) if out else np.zeros((0, 0))


def fit(
    task: Any,
    bags: Bags,
    labels: np.ndarray,
    train: Sequence[int],
    valid: Sequence[int],
    options: LearnOptions,
    *,
    progress: Callable[[str], None] | None = None,
    label: str = "fit",
) -> Fitted:
    """Fit `options.model` on the bags of patients `train` (indices into `bags` and the rows
    of `labels`, as `tilestore.learn.cohort.Cohort.labels`), keeping the weights of the
    epoch of least loss on `valid` (the last epoch's where `valid` is empty) and stopping
    after `options.patience` epochs without a better one."""
    import torch

    from tilestore.learn.losses import loss_for
    from tilestore.learn.models import make_model

    device, dtype = bags.device, getattr(torch, bags.dtype)
    train, valid = list(train), list(valid)
    with deterministic(options.threads):
        torch.manual_seed(options.seed)
        model = make_model(options.model, bags.dim, task.outputs, **options.hparams())
        model = model.to(device=device, dtype=dtype)
        weights = class_weights(task, labels[train]) if options.balanced else None
        if weights is not None:
            weights = [w.to(device) for w in weights]
        loss_fn = loss_for(task, weights)
        step_loss = getattr(model, "training_loss", None) or _bag_loss(model)
        optimiser = torch.optim.AdamW(
            model.parameters(), lr=options.lr, weight_decay=options.weight_decay
        )
        steps = options.epochs * -(-len(train) // options.batch_size)
        scheduler = (
            torch.optim.lr_scheduler.OneCycleLR(optimiser, max_lr=options.lr, total_steps=steps)
            if options.schedule == "one-cycle" and steps > 1
            else None
        )
        y_all = torch.as_tensor(labels, dtype=torch.float32, device=device)
        rng = np.random.default_rng(options.seed)
        best = (float("inf"), -1, None)
        history: list[tuple[float, float]] = []
        started = time.monotonic()
        epoch = 0
        for epoch in range(options.epochs):
            model.train()
            order = rng.permutation(train)
            total = 0.0
            for start in range(0, len(order), options.batch_size):
                chosen = [int(p) for p in order[start : start + options.batch_size]]
                x, mask = _sampled(bags, chosen, options.max_tiles, rng)
                optimiser.zero_grad(set_to_none=True)
                loss = step_loss(x, mask, y_all[chosen], loss_fn)
                loss.backward()
                optimiser.step()
                if scheduler is not None:
                    scheduler.step()
                total += float(loss.detach()) * len(chosen)
            train_loss = total / max(1, len(order))
            valid_loss = _loss_on(model, bags, valid, y_all, loss_fn, options.batch_size)
            history.append((train_loss, valid_loss))
            score = valid_loss if valid else -epoch  # no validation: keep the last epoch
            if score < best[0]:
                state = {k: v.detach().clone() for k, v in model.state_dict().items()}
                best = (score, epoch, state)
            if progress:
                progress(
                    f"{label}: epoch {epoch + 1}/{options.epochs}: train loss "
                    f"{train_loss:.4f}, valid loss {valid_loss:.4f} "
                    f"({time.monotonic() - started:.1f} s)"
                )
            if epoch - best[1] >= options.patience:
                break
        model.load_state_dict(best[2])
        model.eval()
    valid_best = history[best[1]][1] if history else float("nan")
    return Fitted(model, best[1], epoch + 1, valid_best, tuple(history))


def _bag_loss(model: Any) -> Callable[..., Any]:
    """The training loss of a model without one of its own: the task's loss of its logits."""

    def loss(x: Any, mask: Any, y: Any, loss_fn: Callable[..., Any]) -> Any:
        return loss_fn(model(x, mask).logits.float(), y)

    return loss


def _sampled(bags: Bags, patients: list[int], max_tiles: int | None, rng) -> tuple[Any, Any]:
    """A training batch, each bag sampled down to `max_tiles` tiles (None: whole)."""
    if max_tiles is None or all(bags.tiles(p) <= max_tiles for p in patients):
        return bags.batch(patients)
    import torch

    picked = []
    for p in patients:
        bag = bags.bag(p)
        if len(bag) > max_tiles:
            keep = np.sort(rng.choice(len(bag), max_tiles, replace=False))
            bag = bag[torch.as_tensor(keep, device=bag.device)]
        picked.append(bag)
    if len(picked) == 1:
        return picked[0].unsqueeze(0), None
    longest = max(len(b) for b in picked)
    x = picked[0].new_zeros((len(picked), longest, bags.dim))
    mask = torch.zeros((len(picked), longest), dtype=torch.bool, device=x.device)
    for i, b in enumerate(picked):
        x[i, : len(b)], mask[i, : len(b)] = b, True
    return x, mask


def _loss_on(model, bags: Bags, patients: list[int], y_all, loss_fn, batch: int) -> float:
    """The mean loss on `patients` (NaN for none), in eval mode, no gradients."""
    import torch

    if not patients:
        return float("nan")
    model.eval()
    with torch.no_grad():
        outputs = []
        for start in range(0, len(patients), batch):
            x, mask = bags.batch(patients[start : start + batch])
            outputs.append(model(x, mask).logits.float())
        return float(loss_fn(torch.cat(outputs), y_all[patients]))
