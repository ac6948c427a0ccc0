"""Patient-grouped stratified folds (placeholder of learn-data's module)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class Fold:
    train: tuple[str, ...]
    valid: tuple[str, ...]
    test: tuple[str, ...]


@dataclass(frozen=True)
class Splits:
    folds: tuple[Fold, ...]
    seed: int
    test: tuple[str, ...] = ()


def make_splits(cohort, k=5, *, seed=0, test=None, valid=0.2) -> Splits:
    from sklearn.model_selection import StratifiedGroupKFold, train_test_split

    patients = np.array(cohort.patients)
    strata = cohort.labels[:, -1 if cohort.task.kind == "survival" else 0]
    if cohort.task.kind == "regression":
        strata = np.digitize(strata, np.quantile(strata, [0.25, 0.5, 0.75]))
    folds = []
    splitter = StratifiedGroupKFold(n_splits=k, shuffle=True, random_state=seed)
    for tr, te in splitter.split(patients, strata, groups=patients):
        tr_p, va_p = train_test_split(
            patients[tr], test_size=valid, random_state=seed, stratify=strata[tr]
        )
        folds.append(Fold(tuple(sorted(tr_p)), tuple(sorted(va_p)), tuple(patients[te])))
    return Splits(tuple(folds), seed, ())


def write_splits(splits: Splits, path) -> None:
    data = {
        "seed": splits.seed,
        "test": list(splits.test),
        "folds": [
            {"train": list(f.train), "valid": list(f.valid), "test": list(f.test)}
            for f in splits.folds
        ],
    }
    Path(path).write_text(json.dumps(data, indent=1))


def read_splits(path, cohort) -> Splits:
    data = json.loads(Path(path).read_text())
    folds = tuple(
        Fold(tuple(f["train"]), tuple(f["valid"]), tuple(f["test"])) for f in data["folds"]
    )
    return Splits(folds, int(data["seed"]), tuple(data.get("test", ())))
