# ruff: noqa
"""Metrics with bootstrap intervals over patients (placeholder of learn-data's module)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Metric:
    name: str
    value: float
    low: float
    high: float


def evaluate(task, y_true, y_pred, *, n_boot=1000, seed=0) -> dict[str, Metric]:
    from sklearn.metrics import roc_auc_score

    y_true, y_pred = np.asarray(y_true), np.asarray(y_pred)
    out = {}
    if task.kind != "classification":
        return out
    for j, (t, head) in enumerate(zip(task.targets, task.heads())):
        y, p = y_true[:, j].astype(int), y_pred[:, head]
        score = p[:, 1] - p[:, 0] if p.shape[1] == 2 else p

        def auc(i):
            if p.shape[1] == 2:
                from scipy.stats import rankdata

                r = rankdata(score[i])
                pos = y[i] == 1
                n1, n0 = pos.sum(), (~pos).sum()
                return (r[pos].sum() - n1 * (n1 + 1) / 2) / (n1 * n0)
            e = np.exp(p[i] - p[i].max(1, keepdims=True))
            return roc_auc_score(y[i], e / e.sum(1, keepdims=True), multi_class="ovr")

        rng = np.random.default_rng(seed)
        boots = []
        for _ in range(n_boot):
            i = rng.integers(0, len(y), len(y))
            if len(set(y[i])) == len(task.classes[j]):
                boots.append(auc(i))
        name = "auroc" if len(task.targets) == 1 else f"{t}:auroc"
        lo, hi = np.percentile(boots, [2.5, 97.5]) if boots else (np.nan, np.nan)
        out[name] = Metric(name, float(auc(np.arange(len(y)))), float(lo), float(hi))
    return out
