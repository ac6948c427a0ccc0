"""tilestore.learn's metrics against their references, and what their bootstrap costs.

For each metric, the largest absolute difference from its reference (scikit-learn's
roc_auc_score, average_precision_score, balanced_accuracy_score, f1_score, r2_score, scipy's
pearsonr, lifelines' concordance_index) over `--draws` random sets of predictions with ties;
then the seconds `evaluate` takes with 1,000 bootstrap draws for 100 and 1,000 patients.
Prints a table and writes bench/results/learn_metrics.json.

    python bench/learn_metrics.py
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import numpy as np
from lifelines.utils import concordance_index
from scipy.stats import pearsonr
from sklearn.metrics import (
    average_precision_score,
    balanced_accuracy_score,
    f1_score,
    r2_score,
    roc_auc_score,
)

from tilestore.learn import Task, c_index, evaluate
from tilestore.learn.metrics import (
    auroc,
    average_precision,
    balanced_accuracy,
    f1,
    pearson,
    probabilities,
    r2,
)

HERE = Path(__file__).resolve().parent


def differences(draws: int) -> dict[str, float]:
    rng = np.random.default_rng(0)
    worst: dict[str, float] = {}

    def keep(name: str, ours: float, theirs: float) -> None:
        worst[name] = max(worst.get(name, 0.0), abs(ours - theirs))

    for _ in range(draws):
        n = int(rng.integers(10, 500))
        y = rng.integers(0, 2, n)
        y[:2] = [0, 1]
        score = np.round(rng.normal(size=n) + y, 1)
        chosen = (score > 0.5).astype(int)
        keep("auroc", auroc(y, score), roc_auc_score(y, score))
        keep("auprc", average_precision(y, score), average_precision_score(y, score))
        keep("balanced_accuracy", balanced_accuracy(y, chosen), balanced_accuracy_score(y, chosen))
        keep("f1", f1(y, chosen, 2), f1_score(y, chosen))
        y3 = rng.integers(0, 3, n)
        y3[:3] = [0, 1, 2]
        p3 = probabilities(rng.normal(size=(n, 3)) + np.eye(3)[y3])
        macro = np.mean([auroc(y3 == c, p3[:, c]) for c in range(3)])
        keep("auroc (3 classes, ovr)", macro, roc_auc_score(y3, p3, multi_class="ovr"))
        v = rng.normal(size=n)
        w = v + rng.normal(size=n)
        keep("pearson", pearson(v, w), pearsonr(v, w)[0])
        keep("r2", r2(v, w), r2_score(v, w))
        time_ = np.round(rng.exponential(3, n), 0) + 1
        event = rng.integers(0, 2, n)
        risk = np.round(rng.normal(size=n), 1)
        keep("c_index", c_index(time_, event, risk), concordance_index(time_, -risk, event))
    return worst


def timings() -> dict[str, float]:
    rng = np.random.default_rng(1)
    out = {}
    for n in (100, 1000):
        y = rng.integers(0, 2, (n, 1))
        logits = rng.normal(size=(n, 2)) + np.c_[-y, y]
        task = Task("classification", ("y",), (("0", "1"),))
        start = time.perf_counter()
        evaluate(task, y, logits, n_boot=1000)
        out[f"classification, {n} patients (4 metrics)"] = time.perf_counter() - start
        t = np.c_[rng.exponential(size=n) + 0.1, rng.integers(0, 2, n)]
        start = time.perf_counter()
        evaluate(Task("survival", ("t", "e")), t, rng.normal(size=(n, 1)), n_boot=1000)
        out[f"survival, {n} patients (c-index)"] = time.perf_counter() - start
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=200)
    args = parser.parse_args()
    worst = differences(args.draws)
    seconds = timings()
    print(f"{'metric':<28} max |ours - reference| over {args.draws} draws")
    for name, value in worst.items():
        print(f"{name:<28} {value:.2e}")
    print(f"\n{'evaluate, 1,000 bootstrap draws':<44} seconds")
    for name, value in seconds.items():
        print(f"{name:<44} {value:.2f}")
    results = HERE / "results"
    results.mkdir(exist_ok=True)
    (results / "learn_metrics.json").write_text(
        json.dumps(
            {
                "max_abs_difference": worst,
                "seconds": seconds,
                "draws": args.draws,
                "machine": platform.node(),
                "cpu": platform.processor(),
            },
            indent=1,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
