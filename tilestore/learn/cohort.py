# ruff: noqa
"""A labelled cohort of stores (placeholder of learn-data's module: the simplest working version)."""

from __future__ import annotations

import glob
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from tilestore.errors import PatientTableError
from tilestore.learn.task import Task


def read_table(path) -> pd.DataFrame:
    path = Path(path)
    if path.suffix == ".parquet":
        return pd.read_parquet(path)
    if path.suffix in (".xlsx", ".xls"):
        return pd.read_excel(path)
    return pd.read_csv(path, sep="\t" if path.suffix == ".tsv" else ",")


@dataclass(frozen=True)
class CohortSlide:
    store: str
    slide: str
    patient: str


@dataclass(frozen=True)
class Row:
    source: str
    key: str
    status: str
    reason: str = ""


@dataclass(frozen=True)
class Cohort:
    task: Task
    model: str
    plan: str | None
    slide_encoder: str | None
    recipe: dict
    slides: tuple[CohortSlide, ...]
    patients: tuple[str, ...]
    labels: np.ndarray = field(compare=False)
    rows: tuple[Row, ...] = ()

    def slides_of(self, patient: str) -> tuple[int, ...]:
        return tuple(i for i, s in enumerate(self.slides) if s.patient == patient)

    def summary(self) -> str:
        return f"{len(self.patients)} patients used ({len(self.slides)} slides)"


def _stores(stores) -> list[str]:
    if isinstance(stores, (str, Path)):
        p = Path(stores)
        if p.is_dir() and not str(p).endswith(".zarr"):
            return sorted(str(s) for s in p.glob("*.zarr"))
        if any(c in str(stores) for c in "*?["):
            return sorted(glob.glob(str(stores)))
        return [str(stores)]
    return [str(s) for s in stores]


def build_cohort(
    clinical,
    stores,
    model,
    *,
    targets,
    kind="classification",
    patient="PATIENT",
    slides=None,
    slide_column="FILENAME",
    patient_from=None,
    time=None,
    event=None,
    plan=None,
    scale=None,
    slide_encoder=None,
    categories=None,
) -> Cohort:
    from tilestore.embeddings.groups import open_finished, slide_name
    from tilestore.embeddings.recipe import combine, recipe

    table = clinical if isinstance(clinical, pd.DataFrame) else read_table(clinical)
    targets = (targets,) if isinstance(targets, str) else tuple(targets)
    if kind == "survival":
        targets = (time, event)
    for col in (patient, *targets):
        if col not in table.columns:
            raise PatientTableError(f"{clinical}: no column {col!r}")
    found = []
    for s in _stores(stores):
        g = open_finished(s, model, plan)
        found.append((s, recipe(g.meta), slide_name(s)))
    if not found:
        raise PatientTableError("no stores")
    combine([(s, r) for s, r, _ in found], f"{model!r} embeddings", scale)

    def patient_of(name: str) -> str:
        if patient_from == "tcga":
            return name[:12]
        if patient_from:
            m = re.search(patient_from, name)
            return m.group(1) if m else name
        return name

    if slides is not None:
        st = slides if isinstance(slides, pd.DataFrame) else read_table(slides)
        link = {str(r[slide_column]): str(r[patient]) for _, r in st.iterrows()}
    else:
        link = {}
    table = table.assign(**{patient: table[patient].astype(str)}).set_index(patient)
    classes = ()
    if kind == "classification":
        classes = tuple(tuple(sorted(str(v) for v in table[t].dropna().unique())) for t in targets)
        for t, c in zip(targets, classes):
            if len(c) < 2:
                raise PatientTableError(f"{clinical}: {t!r} has one class")
    task = Task(kind, targets, classes)
    chosen = []
    for s, _, name in found:
        p = link.get(name, link.get(Path(s).name, patient_of(name)))
        if p in table.index:
            chosen.append(CohortSlide(s, name, p))
    chosen.sort(key=lambda c: (c.patient, c.slide))
    patients = tuple(dict.fromkeys(c.patient for c in chosen))
    labels = np.zeros((len(patients), len(targets)))
    for i, p in enumerate(patients):
        for j, t in enumerate(targets):
            v = table.loc[p, t]
            labels[i, j] = classes[j].index(str(v)) if kind == "classification" else float(v)
    first = found[0][1]
    rec = {"model": model, "scale": getattr(getattr(first, "scale", None), "label", None)}
    return Cohort(task, model, plan, slide_encoder, rec, tuple(chosen), patients, labels)
