"""Which patients each fold trains, validates and tests on: patient-grouped stratified K
folds, made once (`make_splits`), written and read back (`write_splits`, `read_splits`) or
read as STAMP writes them (`read_stamp_splits`).

A fold's parts are sets of patients, never of slides, so a patient's slides are all on one
side (scikit-learn's StratifiedGroupKFold, each patient its own group). Strata: the
classes of the targets (classification), the event (survival), quantile bins of the first
target (regression). Each fold's `test` is its held-out fold; `valid` is a stratified part
of its training patients for early stopping; a fixed test set (`test=`) is held out of every
fold (with k=1, it is the one fold's test). Every splits file read is checked against the
cohort: a patient it does not know, a patient in two parts of a fold or in two folds' tests,
a patient of the cohort in none: one line (`LabelError`).
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tilestore.errors import LabelError, OptionError

FORMAT = "tilestore.learn splits"
REGRESSION_BINS = 4  # quantile bins a regression target is stratified on (fewer if few patients)


@dataclass(frozen=True)
class Fold:
    """A fold's patients: trained on, validated on (early stopping), tested on."""

    train: tuple[str, ...]
    valid: tuple[str, ...]
    test: tuple[str, ...]


@dataclass(frozen=True)
class Splits:
    """The folds, the seed they were drawn with, and a fixed test set held out of every fold
    (empty where there is none)."""

    folds: tuple[Fold, ...]
    seed: int
    test: tuple[str, ...] = ()


def strata(cohort) -> np.ndarray:
    """Each patient's stratum (an int), in `cohort.patients`' order."""
    labels = cohort.labels
    kind = cohort.task.kind
    if kind == "classification":
        _, out = np.unique(labels, axis=0, return_inverse=True)
        return out.reshape(-1)
    if kind == "survival":
        return labels[:, 1].astype(int)
    bins = max(1, min(REGRESSION_BINS, len(labels) // 2))
    edges = np.quantile(labels[:, 0], np.linspace(0, 1, bins + 1)[1:-1])
    return np.searchsorted(edges, labels[:, 0], side="right")


def _kfold(strata: np.ndarray, k: int, seed: int) -> list[np.ndarray]:
    """The test indices of k stratified folds, a patient a group."""
    from sklearn.model_selection import StratifiedGroupKFold

    groups = np.arange(len(strata))
    if np.bincount(np.unique(strata, return_inverse=True)[1]).max() < k:
        # no stratum has k patients (scikit-learn refuses): stratifying cannot hold, so a
        # shuffled deal, still a patient a group
        order = np.random.default_rng(seed).permutation(len(strata))
        return [np.sort(order[i::k]) for i in range(k)]
    folds = StratifiedGroupKFold(n_splits=k, shuffle=True, random_state=seed)
    with warnings.catch_warnings():  # a stratum of fewer than k patients: it cannot be in
        warnings.simplefilter("ignore", UserWarning)  # every fold, as the docstring says
        return [test for _, test in folds.split(groups, strata, groups)]


def _part(strata: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """A stratified part of about `fraction` of these patients (indices; none for 0)."""
    if fraction <= 0 or len(strata) < 2:
        return np.array([], dtype=int)
    k = min(len(strata), max(2, round(1 / fraction)))
    return _kfold(strata, k, seed)[0]


def make_splits(
    cohort,
    k: int = 5,
    *,
    seed: int = 0,
    test: float | Sequence[str] | None = None,
    valid: float = 0.2,
) -> Splits:
    """Patient-grouped stratified folds of a cohort (see the module's docstring).

    k: folds (1: train on all but the fixed test set, which must then be given). test: a
    fixed held-out set, as patients or as a fraction of them (drawn stratified). valid: the
    fraction of each fold's training patients kept for validation (0: none)."""
    if not isinstance(k, int) or k < 1:
        raise OptionError(f"k={k!r}: a whole number of folds from 1")
    if not 0 <= valid < 1:
        raise OptionError(f"valid={valid!r}: a fraction from 0 to below 1")
    patients = np.array(cohort.patients, dtype=object)
    levels = strata(cohort)
    held = np.zeros(len(patients), dtype=bool)
    if test is not None and not isinstance(test, str) and isinstance(test, Sequence):
        index = {p: i for i, p in enumerate(cohort.patients)}
        unknown = [p for p in test if p not in index]
        if unknown:
            raise LabelError(f"test set: patient {unknown[0]!r} is not in the cohort")
        held[[index[p] for p in test]] = True
    elif test is not None:
        if not (isinstance(test, float | int) and 0 < test < 1):
            raise OptionError(f"test={test!r}: a fraction above 0 and below 1, or patients")
        held[_part(levels, float(test), seed)] = True
    rest = np.flatnonzero(~held)
    if k == 1 and not held.any():
        raise OptionError("k=1 needs a fixed test set (test=): the one fold's test")
    if k > 1 and len(rest) < k:
        raise LabelError(f"{len(rest)} patients to split into k={k} folds: fewer than k")
    folds = []
    tests = [np.flatnonzero(held)] if k == 1 else [rest[t] for t in _kfold(levels[rest], k, seed)]
    for i, tested in enumerate(tests):
        if not len(tested):
            raise LabelError(f"fold {i} of {k} would test no patient: fewer folds (k=)")
        train = np.setdiff1d(rest, tested)
        inner = train[_part(levels[train], valid, seed + 1 + i)]
        folds.append(
            Fold(
                train=_sorted(patients[np.setdiff1d(train, inner)]),
                valid=_sorted(patients[inner]),
                test=_sorted(patients[tested]),
            )
        )
    made = Splits(tuple(folds), seed, _sorted(patients[held]))
    check_splits(made, cohort, "the splits made")
    return made


def _sorted(values: Any) -> tuple[str, ...]:
    return tuple(sorted(str(v) for v in values))


def check_splits(splits: Splits, cohort, where: str) -> None:
    """LabelError where the splits do not fit the cohort: a patient it does not know, in two
    parts of a fold (or in the fixed test set and a fold), in two folds' tests, or a
    patient of the cohort in none of the parts."""
    known = set(cohort.patients)
    fixed = set(splits.test)
    tested: dict[str, int] = {}
    seen = set(fixed)
    for i, fold in enumerate(splits.folds):
        parts = {"train": fold.train, "valid": fold.valid, "test": fold.test}
        owner: dict[str, str] = {p: "fixed test set" for p in fixed}
        for name, members in parts.items():
            for p in members:
                if p not in known:
                    raise LabelError(f"{where}: fold {i}: patient {p!r} is not in the cohort")
                if p in owner and not (name == "test" and owner[p] == "fixed test set" and
                                       len(splits.folds) == 1):  # fmt: skip
                    raise LabelError(
                        f"{where}: fold {i}: patient {p!r} is in its {owner[p]} and its {name}: "
                        "a patient in two parts of a fold would leak"
                    )
                owner[p] = name
        seen.update(owner)
        if len(splits.folds) > 1:
            for p in fold.test:
                if p in tested:
                    raise LabelError(
                        f"{where}: patient {p!r} is in the test part of folds {tested[p]} and "
                        f"{i}: each patient is tested once"
                    )
                tested[p] = i
    unknown = fixed - known
    if unknown:
        raise LabelError(f"{where}: test set: patient {sorted(unknown)[0]!r} is not in the cohort")
    left = known - seen
    if left:
        raise LabelError(
            f"{where}: {len(left)} patient(s) of the cohort are in no part of the splits "
            f"({sorted(left)[0]!r}...): make new splits for this cohort"
        )


def write_splits(splits: Splits, path: str | os.PathLike) -> Path:
    """The splits as JSON (`read_splits` reads them back)."""
    path = Path(path)
    document = {
        "format": FORMAT,
        "seed": splits.seed,
        "test": list(splits.test),
        "folds": [
            {"train": list(f.train), "valid": list(f.valid), "test": list(f.test)}
            for f in splits.folds
        ],
    }
    path.write_text(json.dumps(document, indent=1) + "\n")
    return path


def _load(path: str | os.PathLike) -> Any:
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise LabelError(f"{path}: no such splits file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise LabelError(f"{path}: not a splits file ({exc})") from exc


def _patients(value: Any, path: Any, what: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(p, str | int) for p in value):
        raise LabelError(f"{path}: {what} is not a list of patients")
    return tuple(str(p) for p in value)


def read_splits(path: str | os.PathLike, cohort, *, seed: int = 0) -> Splits:
    """Splits written by `write_splits`, or by STAMP's crossval (`read_stamp_splits`, its
    validation patients drawn with `seed`), checked against the cohort (`check_splits`)."""
    document = _load(path)
    if isinstance(document, dict) and "format" not in document and "splits" in document:
        return read_stamp_splits(path, cohort, seed=seed)
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise LabelError(
            f"{path}: neither a tilestore splits file (no format {FORMAT!r}) nor STAMP's "
            "(no list under 'splits')"
        )
    folds = document.get("folds")
    if not isinstance(folds, list) or not folds:
        raise LabelError(f"{path}: no folds")
    splits = Splits(
        tuple(
            Fold(
                *(
                    _patients(f.get(n) if isinstance(f, dict) else None, path, f"fold {i} {n}")
                    for n in ("train", "valid", "test")
                )
            )
            for i, f in enumerate(folds)
        ),
        int(document.get("seed", 0)),
        _patients(document.get("test", []), path, "test"),
    )
    check_splits(splits, cohort, str(path))
    return splits


def read_stamp_splits(
    path: str | os.PathLike, cohort, *, seed: int = 0, valid: float = 0.2
) -> Splits:
    """Splits as STAMP's crossval writes them (its splits.json: {"splits": [{"train_patients":
    [...], "test_patients": [...]}, ...]}); STAMP draws its validation patients from the
    training ones as it trains, so each fold's `valid` is drawn here, stratified (`seed`,
    `valid`), from its training patients. Checked against the cohort (`check_splits`)."""
    document = _load(path)
    folds = document.get("splits") if isinstance(document, dict) else None
    if not isinstance(folds, list) or not folds:
        raise LabelError(f"{path}: not STAMP's splits (no list under 'splits')")
    levels = dict(zip(cohort.patients, strata(cohort), strict=True))
    made = []
    for i, f in enumerate(folds):
        if not isinstance(f, dict):
            raise LabelError(f"{path}: split {i} is not an object")
        train = _patients(f.get("train_patients"), path, f"split {i} train_patients")
        test = _patients(f.get("test_patients"), path, f"split {i} test_patients")
        unknown = [p for p in (*train, *test) if p not in levels]
        if unknown:
            raise LabelError(f"{path}: split {i}: patient {unknown[0]!r} is not in the cohort")
        order = np.array(sorted(train), dtype=object)
        inner = order[_part(np.array([levels[p] for p in order]), valid, seed + 1 + i)]
        made.append(Fold(_sorted(np.setdiff1d(order, inner)), _sorted(inner), _sorted(test)))
    splits = Splits(tuple(made), seed)
    check_splits(splits, cohort, str(path))
    return splits
