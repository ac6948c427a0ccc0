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


def test_each_test_slide_is_predicted_alone_and_a_one_slide_patient_as_its_patient(tmp_path):
    """predictions-slides.csv: a row per test slide; a patient of one slide has its patient's
    outputs; a patient of two has each slide's own, the fold's model on that slide alone."""
    import dataclasses

    import pandas as pd
    import torch

    from tilestore.learn.cohort import CohortSlide
    from tilestore.learn.run import load_models

    rng = np.random.default_rng(1)
    feats = [rng.standard_normal((6 + i % 3, 8)).astype(np.float32) for i in range(30)]
    for i, f in enumerate(feats):
        f[:, 0] += 1.0 if (i // 2) % 2 else -1.0
    # patients P00..P09 of two slides each (slides 0-19), P10..P19 of one (slides 20-29)
    members = [[2 * p, 2 * p + 1] for p in range(10)] + [[20 + p] for p in range(10)]
    patients = [f"P{p:02d}" for p in range(20)]
    names = [f"S{s:02d}" for s in range(30)]
    task = Task("classification", ("label",), (("0", "1"),))
    labels = np.array([[p % 2] for p in range(10)] + [[p % 2] for p in range(10)], float)
    labels[10:, 0] = [(20 + p) // 2 % 2 for p in range(10)]
    base = Cohort.from_labels(task, patients, labels)
    slides = tuple(
        CohortSlide("memory", names[s], patients[p]) for p, m in enumerate(members) for s in m
    )
    cohort = dataclasses.replace(base, slides=slides)
    bags = Bags.from_arrays(feats, members, names=names)
    options = LearnOptions(device="cpu", epochs=3, hidden=8, threads=1, batch_size=4)
    crossval(cohort, make_splits(cohort, 2, seed=0), options, tmp_path / "run", bags=bags)
    per_slide = pd.read_csv(tmp_path / "run" / "predictions-slides.csv", dtype=str)
    per_patient = pd.read_csv(tmp_path / "run" / "predictions.csv", dtype={"patient": str})
    assert sorted(per_slide["slide"]) == names  # every slide tested once
    for fold in (0, 1):
        (model,) = load_models(tmp_path / "run", "cpu", fold)
        rows = per_slide[per_slide["fold"] == str(fold)]
        for _, row in rows.iterrows():
            s = names.index(row["slide"])
            p = next(i for i, m in enumerate(members) if s in m)
            if len(members[p]) == 1:
                want = per_patient.set_index("patient").loc[patients[p], "label:1"]
            else:
                with torch.no_grad():
                    logits = model(torch.as_tensor(feats[s])[None]).logits[0]
                want = float(torch.softmax(logits.double(), 0)[1])
            assert abs(float(row["label:1"]) - float(want)) < 1e-6, row["slide"]
