"""A run's figures as PNG: ROC and precision-recall curves (a curve per fold, and the folds
pooled), Kaplan-Meier curves of the patients split at the median predicted risk. Drawn on
matplotlib's Agg canvas, a figure made and dropped per call (no pyplot state)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np

Curves = Mapping[str, tuple[np.ndarray, np.ndarray]]  # label -> (y in 0/1, score)


def _figure():
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(4.2, 4.0), dpi=110)
    FigureCanvasAgg(figure)
    return figure, figure.add_subplot()


def _save(figure, path: str | os.PathLike) -> Path:
    path = Path(path)
    figure.tight_layout()
    figure.savefig(path, format="png")
    return path


def plot_roc(curves: Curves, path: str | os.PathLike, title: str = "ROC") -> Path:
    """ROC curves, one per label ({label: (y, score)}), with each one's AUROC."""
    from sklearn.metrics import roc_curve

    from tilestore.learn.metrics import auroc

    figure, ax = _figure()
    for label, (y, score) in curves.items():
        if len(np.unique(y)) < 2:
            continue  # no curve where one class is present
        fpr, tpr, _ = roc_curve(y, score)
        ax.plot(fpr, tpr, lw=1.2, label=f"{label} ({auroc(y, score):.3f})")
    ax.plot([0, 1], [0, 1], ls=":", c="grey", lw=0.8)
    ax.set(xlabel="false positive rate", ylabel="true positive rate", title=title)
    ax.set(xlim=(0, 1), ylim=(0, 1.01))
    ax.legend(loc="lower right", fontsize=7)
    return _save(figure, path)


def plot_pr(curves: Curves, path: str | os.PathLike, title: str = "Precision-recall") -> Path:
    """Precision-recall curves, one per label, with each one's average precision and the
    share of positives (a model without skill)."""
    from sklearn.metrics import precision_recall_curve

    from tilestore.learn.metrics import average_precision

    figure, ax = _figure()
    for label, (y, score) in curves.items():
        if not np.any(y):
            continue
        precision, recall, _ = precision_recall_curve(y, score)
        ax.step(recall, precision, where="post", lw=1.2,
                label=f"{label} ({average_precision(y, score):.3f})")  # fmt: skip
    pooled = np.concatenate([np.asarray(y) for y, _ in curves.values()]) if curves else []
    if len(pooled):
        ax.axhline(np.mean(pooled), ls=":", c="grey", lw=0.8)
    ax.set(xlabel="recall", ylabel="precision", title=title, xlim=(0, 1), ylim=(0, 1.01))
    ax.legend(loc="lower left", fontsize=7)
    return _save(figure, path)


def kaplan_meier(time: np.ndarray, event: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The product-limit estimate: (times from 0, survival just after each)."""
    time = np.asarray(time, dtype=np.float64)
    event = np.asarray(event).astype(bool)
    times = np.unique(time[event])
    at_risk = np.array([(time >= t).sum() for t in times])
    died = np.array([((time == t) & event).sum() for t in times])
    survival = np.cumprod(1 - died / at_risk)
    return np.r_[0.0, times], np.r_[1.0, survival]


def plot_km(
    time: np.ndarray,
    event: np.ndarray,
    risk: np.ndarray,
    path: str | os.PathLike,
    title: str = "Kaplan-Meier by predicted risk",
) -> Path:
    """Kaplan-Meier curves of the patients above and at or below the median predicted risk."""
    time, event, risk = (np.asarray(a, dtype=np.float64) for a in (time, event, risk))
    high = risk > np.median(risk)
    figure, ax = _figure()
    for name, members in (("low risk", ~high), ("high risk", high)):
        if members.any():
            x, s = kaplan_meier(time[members], event[members])
            ax.step(x, s, where="post", lw=1.2, label=f"{name} (n={int(members.sum())})")
    ax.set(xlabel="time", ylabel="survival", title=title, ylim=(0, 1.02))
    ax.legend(loc="lower left", fontsize=7)
    return _save(figure, path)
