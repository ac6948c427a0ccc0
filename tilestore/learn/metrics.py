"""How good predictions are, with bootstrap 95% intervals over patients: AUROC, AUPRC,
balanced accuracy and F1 (classification), Pearson's r and R² (regression), Harrell's
c-index (survival). Each metric is written out here (ranks, sorts, pairs, in numpy) so a
thousand bootstrap draws cost milliseconds; each equals its reference on the same
predictions (scikit-learn's roc_auc_score, average_precision_score, balanced_accuracy_score,
f1_score, r2_score, scipy's pearsonr, lifelines' concordance_index: tests/learn/
test_metrics.py). A metric a draw leaves undefined (one class drawn) is left out of that
draw's interval; a metric undefined on the predictions themselves is NaN.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from tilestore.errors import LabelError
from tilestore.learn.task import Task

CONFIDENCE = 0.95
PAIRWISE_DRAWS = 4000  # patients up to which a c-index's draws are counted at once (memory)


@dataclass(frozen=True)
class Metric:
    """A metric's value on the predictions and its bootstrap 95% interval over patients."""

    name: str
    value: float
    low: float
    high: float


def probabilities(logits: np.ndarray) -> np.ndarray:
    """A head's class probabilities: its rows as given where they are probabilities already
    (non-negative, summing to 1), else their softmax."""
    logits = np.asarray(logits, dtype=np.float64)
    if (logits >= 0).all() and np.allclose(logits.sum(axis=1), 1.0, atol=1e-6):
        return logits
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True)


def _ranks(values: np.ndarray) -> np.ndarray:
    """Average ranks from 1, ties sharing their mean rank (scipy's rankdata 'average')."""
    order = np.argsort(values, kind="mergesort")
    ordered = values[order]
    starts = np.r_[True, ordered[1:] != ordered[:-1]]
    group = np.cumsum(starts) - 1
    first = np.flatnonzero(starts)
    ends = np.r_[first[1:], len(values)]
    mean_rank = (first + ends + 1) / 2.0  # ranks first+1 .. end, averaged
    out = np.empty(len(values))
    out[order] = mean_rank[group]
    return out


def auroc(y: np.ndarray, score: np.ndarray) -> float:
    """Area under the ROC curve of a binary target (y in 0/1): the Mann-Whitney U of the
    scores' ranks, ties counting half."""
    y = np.asarray(y).astype(bool)
    positives, negatives = int(y.sum()), int((~y).sum())
    if positives == 0 or negatives == 0:
        return float("nan")
    rank_sum = _ranks(np.asarray(score, dtype=np.float64))[y].sum()
    return float((rank_sum - positives * (positives + 1) / 2) / (positives * negatives))


def average_precision(y: np.ndarray, score: np.ndarray) -> float:
    """Area under the precision-recall curve as a step sum over the distinct thresholds
    (scikit-learn's average_precision_score)."""
    y = np.asarray(y).astype(np.float64)
    if y.sum() == 0:
        return float("nan")
    order = np.argsort(-np.asarray(score, dtype=np.float64), kind="mergesort")
    score, y = np.asarray(score, dtype=np.float64)[order], y[order]
    last = np.r_[np.flatnonzero(np.diff(score)), len(y) - 1]  # the end of each distinct score
    tps = np.cumsum(y)[last]
    precision = tps / (last + 1)
    recall = tps / tps[-1]
    return float(np.sum(np.diff(np.r_[0.0, recall]) * precision))


def balanced_accuracy(y: np.ndarray, predicted: np.ndarray) -> float:
    """The mean recall of the classes present in y."""
    present = np.unique(y)
    return float(np.mean([np.mean(predicted[y == c] == c) for c in present]))


def f1(y: np.ndarray, predicted: np.ndarray, classes: int) -> float:
    """F1 of the positive class (binary) or the mean F1 over the classes (multi-class),
    0 where a class is neither predicted nor present."""
    scores = []
    for c in [1] if classes == 2 else range(classes):
        tp = np.sum((predicted == c) & (y == c))
        denominator = np.sum(predicted == c) + np.sum(y == c)
        scores.append(2 * tp / denominator if denominator else 0.0)
    return float(np.mean(scores))


def pearson(y: np.ndarray, predicted: np.ndarray) -> float:
    """Pearson's correlation coefficient."""
    a, b = y - y.mean(), predicted - predicted.mean()
    denominator = np.sqrt(np.dot(a, a) * np.dot(b, b))
    return float(np.dot(a, b) / denominator) if denominator else float("nan")


def r2(y: np.ndarray, predicted: np.ndarray) -> float:
    """The coefficient of determination, 1 - SS_res / SS_tot."""
    total = np.sum((y - y.mean()) ** 2)
    return float(1 - np.sum((y - predicted) ** 2) / total) if total else float("nan")


def c_index(time: np.ndarray, event: np.ndarray, risk: np.ndarray) -> float:
    """Harrell's concordance index (higher risk: earlier event), ties as lifelines counts
    them: a pair is comparable where the earlier time is an event (and a censored time equal
    to an event's is later than it); concordant where the earlier has the higher risk, half
    where the risks are equal. NaN where no pair is comparable."""
    time = np.asarray(time, dtype=np.float64)
    event = np.asarray(event).astype(bool)
    risk = np.asarray(risk, dtype=np.float64)
    died = np.flatnonzero(event)
    t_i, r_i = time[died][:, None], risk[died][:, None]
    comparable = (t_i < time[None, :]) | ((t_i == time[None, :]) & ~event[None, :])
    pairs = comparable.sum()
    if pairs == 0:
        return float("nan")
    concordant = np.sum(comparable & (r_i > risk[None, :]))
    tied = np.sum(comparable & (r_i == risk[None, :]))
    return float((concordant + 0.5 * tied) / pairs)


def _measures(task: Task, y_true: np.ndarray, y_pred: np.ndarray) -> dict[str, Callable]:
    """{name: f(rows) -> value on those patients' rows}."""
    out: dict[str, Callable] = {}
    if task.kind == "classification":
        for j, (head, names) in enumerate(zip(task.heads(), _per_target(task), strict=True)):
            y = y_true[:, j].astype(int)
            p = probabilities(y_pred[:, head])
            n = p.shape[1]
            chosen = p.argmax(axis=1)
            if n == 2:
                out[names["auroc"]] = lambda i, y=y, p=p: auroc(y[i], p[i, 1])
                out[names["auprc"]] = lambda i, y=y, p=p: average_precision(y[i], p[i, 1])
            else:
                out[names["auroc"]] = lambda i, y=y, p=p, n=n: _macro(auroc, y[i], p[i], n)
                out[names["auprc"]] = lambda i, y=y, p=p, n=n: _macro(
                    average_precision, y[i], p[i], n
                )
            out[names["balanced_accuracy"]] = lambda i, y=y, c=chosen: balanced_accuracy(y[i], c[i])
            out[names["f1"]] = lambda i, y=y, c=chosen, n=n: f1(y[i], c[i], n)
    elif task.kind == "regression":
        for j, names in enumerate(_per_target(task)):
            y, p = y_true[:, j], y_pred[:, j]
            out[names["pearson"]] = lambda i, y=y, p=p: pearson(y[i], p[i])
            out[names["r2"]] = lambda i, y=y, p=p: r2(y[i], p[i])
    else:
        time, event, risk = y_true[:, 0], y_true[:, 1], y_pred[:, 0]
        out["c_index"] = lambda i: c_index(time[i], event[i], risk[i])
        if len(time) <= PAIRWISE_DRAWS:
            out["c_index"].draws = lambda draws: _c_index_draws(time, event, risk, draws)
    return out


def _c_index_draws(
    time: np.ndarray, event: np.ndarray, risk: np.ndarray, draws: np.ndarray
) -> np.ndarray:
    """`c_index` of each draw of patients at once: a draw counts each pair of patients as
    often as the product of their counts in it (a patient drawn twice is never paired with
    itself: equal times, both events or neither), so its concordant and comparable pairs
    are w'Kw and w'Cw; sums of halves, exact in float64, as the draws one by one."""
    event = event.astype(bool)
    died = np.flatnonzero(event)
    t_i, r_i = time[died][:, None], risk[died][:, None]
    comparable = (t_i < time[None, :]) | ((t_i == time[None, :]) & ~event[None, :])
    score = comparable * ((r_i > risk[None, :]) + 0.5 * (r_i == risk[None, :]))
    counts = np.stack([np.bincount(d, minlength=len(time)) for d in draws]).astype(np.float64)
    pairs = ((counts[:, died] @ comparable) * counts).sum(axis=1)
    concordant = ((counts[:, died] @ score) * counts).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(pairs > 0, concordant / pairs, np.nan)


def _per_target(task: Task) -> list[dict[str, str]]:
    metrics = (
        ("auroc", "auprc", "balanced_accuracy", "f1")
        if task.kind == "classification"
        else ("pearson", "r2")
    )
    several = len(task.targets) > 1
    return [{m: f"{t}:{m}" if several else m for m in metrics} for t in task.targets]


def _macro(metric: Callable, y: np.ndarray, p: np.ndarray, classes: int) -> float:
    """A binary metric one class against the rest, averaged over the classes (NaN where a
    class is absent, as scikit-learn refuses it)."""
    values = [metric(y == c, p[:, c]) for c in range(classes)]
    return float(np.mean(values))


def evaluate(
    task: Task, y_true: np.ndarray, y_pred: np.ndarray, *, n_boot: int = 1000, seed: int = 0
) -> dict[str, Metric]:
    """The task's metrics of predictions, each with its bootstrap 95% interval (`n_boot`
    draws of the patients with replacement, from `seed`: repeatable).

    y_true: labels as in `Cohort.labels` (patients, targets); y_pred: the model's outputs
    (patients, task.outputs): logits or probabilities per classification head, values
    (regression), the risk (survival: higher, earlier)."""
    y_true = np.asarray(y_true, dtype=np.float64)
    y_pred = np.asarray(y_pred, dtype=np.float64)
    width = 2 if task.kind == "survival" else len(task.targets)
    if y_true.ndim != 2 or y_true.shape[1] != width:
        raise LabelError(f"labels of shape {y_true.shape}, not (patients, {width})")
    if y_pred.shape != (len(y_true), task.outputs):
        raise LabelError(
            f"predictions of shape {y_pred.shape}, not ({len(y_true)}, {task.outputs})"
        )
    if not np.isfinite(y_pred).all():
        raise LabelError("predictions hold NaN or infinite values")
    measures = _measures(task, y_true, y_pred)
    everyone = np.arange(len(y_true))
    draws = np.random.default_rng(seed).integers(0, len(y_true), size=(n_boot, len(y_true)))
    tail = (1 - CONFIDENCE) / 2 * 100
    out = {}
    for name, measure in measures.items():
        value = measure(everyone)
        if not n_boot:
            booted = np.array([])
        elif hasattr(measure, "draws"):  # all draws at once
            booted = measure.draws(draws)
        else:
            booted = np.array([measure(d) for d in draws])
        booted = booted[np.isfinite(booted)]
        low, high = np.percentile(booted, [tail, 100 - tail]) if len(booted) else (np.nan, np.nan)
        out[name] = Metric(name, value, float(low), float(high))
    return out
