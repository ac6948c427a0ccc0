"""Folds of patients: over random cohorts (patients with 1 to 4 slides, random labels of each
kind) no patient is in two parts of a fold, every patient is tested in exactly one fold, a
patient's slides all fall on one side, and each stratum keeps its share of every test fold;
splits written are read back equal, STAMP's splits.json is read as STAMP writes it, and a
splits file that does not fit the cohort is refused in one line."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tilestore.errors import LabelError, OptionError
from tilestore.learn.cohort import Cohort, CohortSlide
from tilestore.learn.splits import (
    Fold,
    Splits,
    make_splits,
    read_splits,
    read_stamp_splits,
    strata,
    write_splits,
)
from tilestore.learn.task import Task


def _cohort(slide_counts: list[int], labels: np.ndarray, kind: str) -> Cohort:
    """A cohort as `build_cohort` returns it, without stores (splits read only patients)."""
    patients = tuple(f"P{i:03d}" for i in range(len(slide_counts)))
    slides = tuple(
        CohortSlide(f"/s/{p}-{j}.ome.zarr", f"{p}-{j}", p)
        for p, n in zip(patients, slide_counts, strict=True)
        for j in range(n)
    )
    if kind == "classification":
        classes = tuple(tuple(str(c) for c in range(int(labels[:, j].max()) + 1))
                        for j in range(labels.shape[1]))  # fmt: skip
        task = Task(kind, tuple(f"t{j}" for j in range(labels.shape[1])), classes)
    elif kind == "survival":
        task = Task(kind, ("time", "event"))
    else:
        task = Task(kind, ("y",))
    return Cohort(task, "m", None, None, {}, slides, patients, labels.astype(float), ())


@st.composite
def cohorts(draw):
    n = draw(st.integers(12, 40))
    counts = draw(st.lists(st.integers(1, 4), min_size=n, max_size=n))
    kind = draw(st.sampled_from(["classification", "survival", "regression"]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if kind == "classification":
        classes = draw(st.integers(2, 4))
        labels = rng.integers(0, classes, (n, draw(st.integers(1, 2))))
    elif kind == "survival":
        labels = np.c_[rng.exponential(size=n) + 0.1, rng.integers(0, 2, n)]
    else:
        labels = rng.normal(size=(n, 1))
    return _cohort(counts, labels, kind)


@settings(max_examples=150, deadline=None)
@given(
    cohort=cohorts(),
    k=st.integers(2, 5),
    seed=st.integers(0, 1000),
    valid=st.sampled_from([0.0, 0.2, 0.3]),
    fixed=st.sampled_from([None, 0.2]),
)
def test_no_patient_leaks_and_every_patient_is_tested_once(cohort, k, seed, valid, fixed):
    splits = make_splits(cohort, k, seed=seed, valid=valid, test=fixed)
    assert len(splits.folds) == k and splits.seed == seed
    held = set(splits.test)
    assert bool(held) == (fixed is not None)
    rest = set(cohort.patients) - held
    tested = [p for fold in splits.folds for p in fold.test]
    assert sorted(tested) == sorted(rest)  # every patient (but the fixed set) tested once
    side = {}
    for i, fold in enumerate(splits.folds):
        parts = [set(fold.train), set(fold.valid), set(fold.test), held]
        assert sum(map(len, parts)) == len(set().union(*parts)) == len(cohort.patients)
        assert fold.test and fold.train and (valid == 0) == (not fold.valid)
        for name, part in zip(("train", "valid", "test", "held"), parts, strict=True):
            for p in part:  # a patient's slides are all on its side
                side.update({(i, cohort.slides[s].slide): name for s in cohort.slides_of(p)})
    assert len(side) == k * len(cohort.slides)
    # strata kept: each stratum's count in each test fold within 1 of its share
    levels = dict(zip(cohort.patients, strata(cohort), strict=True))
    counts = np.bincount([levels[p] for p in rest])
    if counts.max() >= k:  # stratified (else a shuffled deal: no stratum can be)
        for fold in splits.folds:
            mine = np.bincount([levels[p] for p in fold.test], minlength=len(counts))
            assert np.all(np.abs(mine - counts / k) < 1)


def test_the_same_seed_makes_the_same_splits_and_another_other_ones():
    rng = np.random.default_rng(0)
    cohort = _cohort([1, 2, 3] * 10, rng.integers(0, 2, (30, 1)), "classification")
    assert make_splits(cohort, 5, seed=3) == make_splits(cohort, 5, seed=3)
    assert make_splits(cohort, 5, seed=3) != make_splits(cohort, 5, seed=4)


def test_a_fixed_test_set_with_one_fold():
    rng = np.random.default_rng(1)
    cohort = _cohort([1] * 20, rng.integers(0, 2, (20, 1)), "classification")
    fixed = cohort.patients[:5]
    splits = make_splits(cohort, 1, test=list(fixed), valid=0.25)
    (fold,) = splits.folds
    assert splits.test == fold.test == fixed
    assert len(fold.valid) == 4 and len(fold.train) == 11
    with pytest.raises(OptionError, match="k=1 needs a fixed test set"):
        make_splits(cohort, 1)
    with pytest.raises(LabelError, match="test set: patient 'X' is not in the cohort"):
        make_splits(cohort, 2, test=["X"])
    with pytest.raises(LabelError, match="20 patients to split into k=21 folds"):
        make_splits(cohort, 21)


def test_splits_written_are_read_back_equal(tmp_path):
    rng = np.random.default_rng(2)
    cohort = _cohort([2] * 12, np.c_[rng.exponential(size=12) + 1, [1, 0] * 6], "survival")
    splits = make_splits(cohort, 3, seed=7, test=0.25)
    assert read_splits(write_splits(splits, tmp_path / "splits.json"), cohort) == splits


def _written(tmp_path, splits: Splits):
    return write_splits(splits, tmp_path / "s.json")


def test_splits_that_do_not_fit_the_cohort_are_refused(tmp_path):
    cohort = _cohort([1] * 6, np.array([[0], [1]] * 3), "classification")
    a, b, c, d, e, f = cohort.patients
    cases = {
        "is in its train and its test: a patient in two parts of a fold would leak": Splits(
            (Fold((a, b, c), (), (a, d, e, f)),), 0
        ),
        "patient 'P999' is not in the cohort": Splits((Fold((a, b, c, "P999"), (), (d, e, f)),), 0),
        r"patient 'P000' is in the test part of folds 0 and 1": Splits(
            (Fold((d, e, f), (), (a, b, c)), Fold((b, c), (), (a, d, e, f))), 0
        ),
        r"1 patient\(s\) of the cohort are in no part of the splits \('P005'": Splits(
            (Fold((a, b), (c,), (d, e)),), 0
        ),
    }
    for message, splits in cases.items():
        with pytest.raises(LabelError, match=message) as refused:
            read_splits(_written(tmp_path, splits), cohort)
        assert "\n" not in str(refused.value)
    (tmp_path / "x.json").write_text("{")
    with pytest.raises(LabelError, match=r"x.json: not a splits file"):
        read_splits(tmp_path / "x.json", cohort)
    with pytest.raises(LabelError, match=r"nothing.json: no such splits file"):
        read_splits(tmp_path / "nothing.json", cohort)


def _stamp_json(folds: list[tuple[set[str], set[str]]]) -> str:
    """splits.json as STAMP's crossval writes it: its pydantic model of sets of patients,
    dumped with model_dump_json(indent=4) (pydantic where installed, its output else)."""
    try:
        from pydantic import BaseModel
    except ImportError:
        return json.dumps(
            {"splits": [{"train_patients": sorted(t), "test_patients": sorted(s)}
                        for t, s in folds]}, indent=4)  # fmt: skip

    class Split(BaseModel):
        train_patients: set[str]
        test_patients: set[str]

    class Stamp(BaseModel):
        splits: list[Split]

    return Stamp(
        splits=[Split(train_patients=t, test_patients=s) for t, s in folds]
    ).model_dump_json(indent=4)


def test_stamps_splits_are_read_as_stamp_writes_them(tmp_path):
    rng = np.random.default_rng(3)
    cohort = _cohort([1, 2] * 10, rng.integers(0, 2, (20, 1)), "classification")
    patients = list(cohort.patients)
    tests = [set(patients[i::4]) for i in range(4)]
    folds = [(set(patients) - t, t) for t in tests]
    path = tmp_path / "splits.json"
    path.write_text(_stamp_json(folds))
    splits = read_stamp_splits(path, cohort)
    assert [set(f.test) for f in splits.folds] == tests
    for fold, (train, _) in zip(splits.folds, folds, strict=True):
        assert set(fold.train) | set(fold.valid) == train and not set(fold.train) & set(fold.valid)
        assert len(fold.valid) == 3  # about 0.2 of the 15 training patients, for early stopping
    assert read_stamp_splits(path, cohort) == splits  # repeatable
    leaking = [(set(patients), tests[0])]
    path.write_text(_stamp_json(leaking))
    with pytest.raises(LabelError, match=r"splits.json: fold 0: patient 'P0\d\d' is in its"):
        read_stamp_splits(path, cohort)
    path.write_text(_stamp_json([(set(patients[1:]) | {"TCGA-XX"}, {patients[0]})]))
    with pytest.raises(LabelError, match="split 0: patient 'TCGA-XX' is not in the cohort"):
        read_stamp_splits(path, cohort)
    path.write_text(json.dumps({"folds": []}))
    with pytest.raises(LabelError, match="not STAMP's splits"):
        read_stamp_splits(path, cohort)
