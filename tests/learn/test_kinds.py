"""Every kind of task end to end: regression, survival and several classification targets
at once, crossvalidated on bags held in memory whose labels follow a tile feature: each run
folder finished whole, and each learned (its held-out metric well past chance)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tilestore.learn import Bags, LearnOptions, Task, crossval, make_splits
from tilestore.learn.cohort import Cohort

N = 48
FAST = LearnOptions(
    device="cpu", epochs=40, patience=40, hidden=16, threads=1, batch_size=4, lr=1e-2
)


def _bags():
    rng = np.random.default_rng(0)
    feats = [rng.standard_normal((16, 8)).astype(np.float32) for _ in range(N)]
    for i, f in enumerate(feats):
        f[:, 0] += (i % 4) - 1.5  # the signal every task follows: the first feature's level
    patients = [f"P{i:02d}" for i in range(N)]
    return patients, Bags.from_arrays(feats, [[i] for i in range(N)], names=patients)


LEVEL = np.array([(i % 4) - 1.5 for i in range(N)])
KINDS = {
    "regression": (Task("regression", ("y",), ()), LEVEL[:, None] * 2 + 5, "pearson", 0.6),
    "survival": (
        Task("survival", ("time", "event"), ()),
        np.stack([np.exp(-LEVEL) * 10, (np.arange(N) % 5 > 0).astype(float)], 1),
        "c_index",
        0.75,
    ),
    "two targets": (
        Task("classification", ("a", "b"), (("lo", "hi"), ("x", "y", "z"))),
        np.stack([(LEVEL > 0).astype(float), np.arange(N) % 3], 1),
        "a:auroc",
        0.85,
    ),
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_each_kind_of_task_runs_whole_and_learns(kind, tmp_path):
    task, labels, metric, floor = KINDS[kind]
    patients, bags = _bags()
    cohort = Cohort.from_labels(task, patients, labels)
    result = crossval(cohort, make_splits(cohort, 3, seed=0), FAST, tmp_path / "run", bags=bags)
    run = tmp_path / "run"
    assert json.loads((run / "finished.json").read_text())["folds"] == 3
    for name in ("config.json", "splits.json", "metrics.json", "predictions.csv", "report.md"):
        assert (run / name).is_file(), name
    assert sorted(result.predictions["patient"]) == sorted(patients)  # each tested once
    assert result.metrics[metric].value >= floor, result.metrics
