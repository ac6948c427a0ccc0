"""A labelled cohort, declared once: a clinical table (a row per patient, its targets), the
stores of its slides, and how slides belong to patients; checked whole before anything is
learnt, and every row of the tables accounted for.

A slide belongs to a patient by the slide table (`slides`: its `slide_column` names the
store's slide, as `tilestore.embeddings.groups.slide_name` gives it, or the store's file
name), or else by a rule on the slide's name (`patient_from`: "tcga", a TCGA barcode's first
12 characters, or a regular expression with one group), or else the slide is its patient.
The stores' features go through the one compatibility check (`tilestore.embeddings.recipe.
combine`): one model, one recipe, one scale (or the `scale` kept), or one line refusing.

What each row of the tables became (`Row`, `Cohort.rows`, one line in `Cohort.summary`):

- a clinical row (a patient): "used", "no slide used" (its slides are all accounted below),
  or "other class" (a label outside `categories`);
- a slide-table row, or a store no slide-table row names (a slide): "used", "no store" (no
  store given holds it), "no embeddings" (its store has no finished group of the model),
  "missing label" (its patient has no clinical row), "no patient" (no patient by the rule),
  "other scale" (left out by `scale`).

Refused in one line (`LabelTableError`, `LabelError`, `MixedResults`; exit 2), before any
store is read where the tables alone show it: a column missing, a patient or slide listed
twice, a label empty or NaN (drop the row to leave the patient out), survival times <= 0,
events other than 0/1, a patient without slides in the slide table, no stores, no patient
left, one class (or a class of `categories` no patient has), no event.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import pandas as pd

from tilestore.embeddings.groups import expand_stores, refuse_shared_names
from tilestore.embeddings.groups import slide_name as store_slide_name
from tilestore.embeddings.recipe import Recipe, combine, parse_scale
from tilestore.errors import LabelError, LabelTableError, NotEmbedded, OptionError
from tilestore.format.store import STORE_SUFFIX
from tilestore.learn.task import KINDS, Task
from tilestore.options import Opt, checked

READERS = {  # a table's suffix -> how pandas reads it
    ".csv": lambda p: pd.read_csv(p),
    ".tsv": lambda p: pd.read_csv(p, sep="\t"),
    ".txt": lambda p: pd.read_csv(p, sep="\t"),
    ".parquet": lambda p: pd.read_parquet(p),
    ".xlsx": lambda p: pd.read_excel(p),
    ".xls": lambda p: pd.read_excel(p),
}
# the order statuses are listed in, `Cohort.summary`
STATUSES = (
    "used",
    "no slide used",
    "other class",
    "no store",
    "no embeddings",
    "missing label",
    "no patient",
    "other scale",
)
TCGA_PATIENT = 12  # a TCGA barcode's patient: TCGA-XX-XXXX


def read_table(path: str | os.PathLike) -> pd.DataFrame:
    """A table by its suffix (.csv, .tsv, .parquet, .xlsx, .xls); LabelTableError naming the
    file and the cause where it cannot be read."""
    path = Path(path)
    reader = READERS.get(path.suffix.lower())
    if reader is None:
        raise LabelTableError(
            f"{path}: a table is a {', '.join(READERS)} file (its suffix says which)"
        )
    if not path.is_file():
        raise LabelTableError(f"{path}: no such table")
    try:
        table = reader(path)
    except ImportError as exc:  # Excel without openpyxl, Parquet without pyarrow
        raise LabelTableError(f"{path}: cannot be read here ({exc})") from exc
    except Exception as exc:  # pandas' parsers raise many kinds; each is this file's fault
        raise LabelTableError(
            f"{path}: cannot be read as a table ({exc})".replace("\n", " ")
        ) from exc
    table.columns = [str(c).strip() for c in table.columns]
    return table


@dataclass(frozen=True)
class CohortSlide:
    """A slide used: its store, its name, its patient."""

    store: str
    slide: str
    patient: str


@dataclass(frozen=True)
class Row:
    """What a row of the tables became. source: "clinical", "slides" or "store"; key: the
    patient, the slide or the store; status: one of `STATUSES`; reason: why, for people."""

    source: str
    key: str
    status: str
    reason: str = ""


@dataclass(frozen=True)
class Cohort:
    """A checked cohort: the task, the features' model, plan, encoder and recipe, the slides
    used (by patient, then slide), the patients (sorted) and their labels (patients,
    len(targets)): the class index (classification), the value (regression), (time, event)
    (survival); and every row of the tables accounted for."""

    task: Task
    model: str
    plan: str | None
    slide_encoder: str | None
    recipe: dict[str, Any]
    slides: tuple[CohortSlide, ...]
    patients: tuple[str, ...]
    labels: np.ndarray
    rows: tuple[Row, ...]
    _index: dict[str, tuple[int, ...]] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        index: dict[str, list[int]] = {}
        for i, s in enumerate(self.slides):
            index.setdefault(s.patient, []).append(i)
        self._index.update({p: tuple(v) for p, v in index.items()})

    @classmethod
    def from_labels(
        cls, task: Task, patients: Sequence[str], labels: np.ndarray, *, source: str = "memory"
    ) -> Cohort:
        """A cohort of features held in memory (`Bags.from_arrays`), not read from stores: a
        slide a patient, each used, `labels` as `labels` holds them; its recipe names the
        `source` only, so `predict` refuses every store against it."""
        patients = tuple(map(str, patients))
        labels = np.asarray(labels, dtype=np.float64).reshape(len(patients), len(task.targets))
        return cls(
            task=task,
            model=source,
            plan=None,
            slide_encoder=None,
            recipe={"source": source},
            slides=tuple(CohortSlide(source, p, p) for p in patients),
            patients=patients,
            labels=labels,
            rows=tuple(Row("clinical", p, "used") for p in patients),
        )

    def slides_of(self, patient: str) -> tuple[int, ...]:
        """The indices in `slides` of a patient's slides."""
        return self._index[patient]

    def summary(self) -> str:
        """The one-line accounting: "4 patients used (6 slides); 1 no store; 1 missing
        label" (the other statuses counted in rows of the tables, `STATUSES`' order)."""
        counts = Counter(r.status for r in self.rows if r.status != "used")
        parts = [f"{len(self.patients)} patients used ({len(self.slides)} slides)"]
        parts += [f"{counts[s]} {s}" for s in STATUSES if counts.get(s)]
        return "; ".join(parts)


def as_recipe(described: Mapping[str, Any]) -> Recipe:
    """The `Recipe` a cohort's `recipe` dict stands for (what `combine` compares), for
    checking new stores against a run's features."""
    scale = described.get("scale")
    return Recipe(
        dict(described.get("facts") or {}),
        tuple(described["channels"]) if described.get("channels") else None,
        None if scale is None else parse_scale(scale),
        described.get("unknown_weights"),
    )


def _described(found: Recipe, model: str, plan: str | None, encoder: str | None) -> dict:
    return {
        "model": model,
        "plan": plan,
        "slide_encoder": encoder,
        "facts": found.facts,
        "channels": list(found.channels) if found.channels else None,
        "scale": None if found.scale is None else found.scale.label,
        "unknown_weights": found.unknown_weights,
    }


@checked
def build_cohort(
    clinical: str | os.PathLike | pd.DataFrame,
    stores: Any,
    model: Annotated[str, Opt("The embeddings' model (as given to `tilestore embed`).")],
    *,
    targets: str | Sequence[str] = (),
    kind: Annotated[
        str,
        Opt("The task.", pattern="|".join(KINDS), shape=" or ".join(map(repr, KINDS))),
    ] = "classification",
    patient: Annotated[str, Opt("The patient column of the tables.")] = "PATIENT",
    slides: Annotated[
        str | os.PathLike | pd.DataFrame | None,
        Opt("A slide table linking slides (stores) to patients.", none="a slide a patient"),
    ] = None,
    slide_column: Annotated[str, Opt("The slide table's slide column.")] = "FILENAME",
    patient_from: Annotated[
        str | None,
        Opt(
            "Without a slide table: 'tcga' (a barcode's first 12 characters) or a regular "
            "expression whose one group is the patient.",
            none="the slide's name",
        ),
    ] = None,
    time: Annotated[str | None, Opt("Survival: the time column.")] = None,
    event: Annotated[str | None, Opt("Survival: the event column (0/1).")] = None,
    plan: Annotated[
        str | None, Opt("The plan whose embeddings are read.", none="the only one")
    ] = None,
    scale: Annotated[
        str | None, Opt("Keep the stores at this scale (e.g. 0.5mpp-224px).", none="the one")
    ] = None,
    slide_encoder: Annotated[
        str | None,
        Opt(
            "Learn from this slide encoder's stored vector, one per slide, instead of the "
            "tiles (with --arch linear).",
            none="the tile features",
        ),
    ] = None,
    categories: Sequence[str] | Mapping[str, Sequence[str]] | None = None,
) -> Cohort:
    """The cohort of a clinical table and stores (see the module's docstring).

    targets: the label column(s) (classification, regression); survival: `time` and
    `event` (or targets=(time, event)). categories: the classes kept (of the one target, or
    {target: classes}); a patient of another class is left out ("other class"). plan, scale:
    as `open_embeddings`; slide_encoder: one stored slide vector per slide instead of bags of
    tile features."""
    columns = _targets(kind, targets, time, event)
    table, where = _table(clinical, "clinical table")
    _columns(table, where, (patient, *columns))
    raw = _clinical_labels(table, where, patient, columns, kind)
    if kind == "survival":
        _check_survival(raw, columns, where)
    slide_table = None
    if slides is not None:
        frame, swhere = _table(slides, "slide table")
        _columns(frame, swhere, (slide_column, patient))
        slide_table = _slide_rows(frame, swhere, slide_column, patient)
        missing = sorted(set(raw) - {p for _, p, _ in slide_table.values()})
        if missing:
            raise LabelError(
                f"{where}: patient {missing[0]!r} has no slides in {swhere}"
                f"{f' ({len(missing)} patients have none)' if len(missing) > 1 else ''}: add "
                "its slides to the slide table or remove its row"
            )
    rule = _patient_rule(patient_from) if slide_table is None else None

    found = _open_stores(stores, model, plan, slide_encoder)
    refuse_shared_names([f[0] for f in found])
    embedded = [f for f in found if f[2] is not None]
    kept_idx = (
        combine(
            [(store, r) for _, store, r, _ in embedded],
            f"{slide_encoder or model!r} {'slide ' if slide_encoder else ''}embeddings",
            scale,
        )
        if embedded
        else []
    )
    kept = {embedded[i][0]: embedded[i] for i in kept_idx}
    state = {name: ("no embeddings" if r is None else "other scale") for name, _, r, _ in found}
    state.update(dict.fromkeys(kept, "used"))

    # each slide's row (of the slide table, or its store's): (source, key, status, where, patient)
    entries: list[tuple[str, str, str, str, str | None, str]] = []
    if slide_table is not None:
        for slide, (line, who, given) in slide_table.items():
            status = state.get(slide, "no store")
            entries.append(("slides", given, status, f" ({swhere}, row {line})", who, slide))
        listed = set(slide_table)
        entries += [
            ("store", store, "no patient", f" ({swhere} does not list it)", None, name)
            for name, store, _, _ in found
            if name not in listed
        ]
    else:
        for name, store, _, _ in found:
            who = rule(name)
            status = state[name] if who is not None else "no patient"
            entries.append(("store", store, status, "", who, name))
    entries = [
        (src, key, "missing label" if st == "used" and who not in raw else st, at, who, name)
        for src, key, st, at, who, name in entries
    ]
    candidate: dict[str, list[str]] = {}  # patient -> its slides used
    for _, _, status, _, who, name in entries:
        if status == "used":
            candidate.setdefault(who, []).append(name)

    task, labels_of = _task(kind, columns, raw, candidate, categories, where)
    patients = tuple(sorted(p for p in candidate if p in labels_of))
    rows = [
        Row(src, key, st, _why(st, who, where) + at)
        for src, key, status, at, who, _ in entries
        for st in ["other class" if status == "used" and who not in labels_of else status]
    ]
    for who in raw:
        if who in patients:
            rows.append(Row("clinical", who, "used", f"{len(candidate[who])} slide(s)"))
        elif who in labels_of:
            rows.append(Row("clinical", who, "no slide used", "its slides: see their rows"))
        else:
            rows.append(Row("clinical", who, "other class", "its label is not among categories"))
    rows.sort(key=lambda r: (r.source, r.key))
    if not patients:
        accounted = Counter(r.status for r in rows)
        raise LabelError(
            f"{where}: no patient left to learn from ("
            + "; ".join(f"{accounted[s]} {s}" for s in STATUSES if accounted.get(s))
            + ")"
        )
    labels = np.array([labels_of[p] for p in patients], dtype=np.float64)
    _check_labels(task, labels, where)
    chosen = tuple(
        CohortSlide(kept[slide][1], slide, who)
        for who in patients
        for slide in sorted(candidate[who])
    )
    first = kept[chosen[0].slide][2]
    plans = {kept[s.slide][3] for s in chosen}
    used_plan = plan if plan is not None else (plans.pop() if len(plans) == 1 else None)
    return Cohort(
        task=task,
        model=model,
        plan=used_plan,
        slide_encoder=slide_encoder,
        recipe=_described(first, model, used_plan, slide_encoder),
        slides=chosen,
        patients=patients,
        labels=labels,
        rows=tuple(rows),
    )


def _why(status: str, who: str | None, clinical: str) -> str:
    return {
        "used": f"patient {who}",
        "no store": "no store given holds it",
        "no embeddings": "its store has no finished embeddings of the model",
        "missing label": f"patient {who!r} has no row in {clinical}",
        "no patient": "no patient by the rule",
        "other scale": "left out: not at the scale kept",
        "other class": f"patient {who!r}: its label is not among categories",
    }.get(status, "")


def _targets(
    kind: str, targets: str | Sequence[str], time: str | None, event: str | None
) -> tuple[str, ...]:
    """The label columns of the task."""
    named = (targets,) if isinstance(targets, str) else tuple(targets)
    if kind == "survival":
        if time is not None or event is not None:
            if time is None or event is None or named:
                raise OptionError(
                    "a survival cohort names time= and event= (or targets=(time, event))"
                )
            named = (time, event)
        if len(named) != 2:
            raise OptionError("a survival cohort names time= and event= columns")
        return named
    if time is not None or event is not None:
        raise OptionError(f"time= and event= are for survival, not {kind}")
    if not named:
        raise OptionError(f"a {kind} cohort names its label column(s): targets=")
    if len(set(named)) != len(named):
        raise OptionError(f"targets={list(named)}: a column named twice")
    return named


def _table(given: Any, what: str) -> tuple[pd.DataFrame, str]:
    if isinstance(given, pd.DataFrame):
        frame = given.copy()
        frame.columns = [str(c).strip() for c in frame.columns]
        return frame, f"the {what}"
    return read_table(given), str(given)


def _columns(table: pd.DataFrame, where: str, wanted: Sequence[str]) -> None:
    for column in wanted:
        if column not in table.columns:
            header = ", ".join(map(str, table.columns[:12])) or "none"
            raise LabelTableError(f"{where}: no column {column!r} (its columns: {header})")


def _cell(value: Any) -> str:
    """A label cell as a class name: 1.0 read by pandas from "1" is "1"."""
    if isinstance(value, float | np.floating) and float(value).is_integer():
        return str(int(value))
    return str(value).strip()


def _clinical_labels(
    table: pd.DataFrame, where: str, patient: str, columns: Sequence[str], kind: str
) -> dict[str, tuple]:
    """{patient: its raw labels}, every row checked: a patient, once; no empty label; numbers
    where numbers are learnt."""
    out: dict[str, tuple] = {}
    first: dict[str, int] = {}
    for i, row in enumerate(table.itertuples(index=False), start=2):  # 2: the header is 1
        values = dict(zip(table.columns, row, strict=True))
        who = values[patient]
        if pd.isna(who) or not str(who).strip():
            raise LabelTableError(f"{where}, row {i}: no patient in column {patient!r}")
        who = _cell(who)
        if who in first:
            raise LabelTableError(
                f"{where}, row {i}: patient {who!r} again (row {first[who]}): a clinical "
                "table has one row per patient"
            )
        first[who] = i
        labels = []
        for column in columns:
            value = values[column]
            if pd.isna(value) or (isinstance(value, str) and not value.strip()):
                raise LabelError(
                    f"{where}, row {i}: patient {who!r} has no {column!r} (empty or NaN); "
                    "remove the row to leave the patient out"
                )
            labels.append(
                _cell(value) if kind == "classification" else _number(value, where, i, column)
            )
        out[who] = tuple(labels)
    if not out:
        raise LabelTableError(f"{where}: no rows under its header")
    return out


def _number(value: Any, where: str, line: int, column: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise LabelError(f"{where}, row {line}: {column}={value!r} is not a number") from None
    if not np.isfinite(number):
        raise LabelError(f"{where}, row {line}: {column}={value!r} is not a finite number")
    return number


def _slide_rows(
    frame: pd.DataFrame, where: str, column: str, patient: str
) -> dict[str, tuple[int, str, str]]:
    """{slide name: (row, patient, the name as given)}: each slide once, in one patient."""
    out: dict[str, tuple[int, str, str]] = {}
    for i, (given, who) in enumerate(zip(frame[column], frame[patient], strict=True), start=2):
        if pd.isna(given) or pd.isna(who) or not str(given).strip() or not str(who).strip():
            raise LabelTableError(f"{where}, row {i}: no {column if pd.isna(given) else patient}")
        given, who = str(given).strip(), _cell(who)
        name = Path(given).name
        name = name[: -len(STORE_SUFFIX)] if name.endswith(STORE_SUFFIX) else name
        if name in out:
            line, was, _ = out[name]
            raise LabelTableError(
                f"{where}, row {i}: slide {name!r} again (row {line}, patient {was!r}): a "
                "slide belongs to one patient, once"
            )
        out[name] = (i, who, given)
    if not out:
        raise LabelTableError(f"{where}: no rows under its header")
    return out


def _patient_rule(patient_from: str | None):
    """slide name -> its patient (None: the rule finds none)."""
    if patient_from is None:
        return lambda name: name
    if patient_from == "tcga":
        return lambda name: name[:TCGA_PATIENT] if len(name) >= TCGA_PATIENT else None
    try:
        pattern = re.compile(patient_from)
    except re.error as exc:
        raise OptionError(
            f"patient_from={patient_from!r}: not a regular expression ({exc})"
        ) from exc
    if pattern.groups != 1:
        raise OptionError(
            f"patient_from={patient_from!r}: a regular expression with one group (the "
            f"patient), not {pattern.groups}"
        )

    def rule(name: str) -> str | None:
        found = pattern.search(name)
        return found.group(1) if found and found.group(1) else None

    return rule


def _store_list(stores: Any) -> list:
    """Stores given: a folder stands for the stores in it."""
    given = [stores] if isinstance(stores, str | os.PathLike) else list(stores or [])
    out: list = []
    for s in given:
        path = Path(s) if isinstance(s, str | os.PathLike) else None
        if path is not None and path.is_dir() and not (path / "zarr.json").exists():
            inside = sorted(str(p) for p in path.glob(f"*{STORE_SUFFIX}"))
            if not inside:
                raise LabelError(f"{path}: no stores (*{STORE_SUFFIX}) in this folder")
            out.extend(inside)
        else:
            out.append(s)
    if not out:
        raise LabelError("no stores given")
    return out


def _open_stores(
    stores: Any, model: str, plan: str | None, encoder: str | None
) -> list[tuple[str, str, Recipe | None, str | None]]:
    """(slide name, store, its features' recipe or None where not embedded, plan name): each
    store read as the run will read it (`Source`), several at once (opening checks each
    store's integrity)."""
    from concurrent.futures import ThreadPoolExecutor

    from tilestore.learn.bags import Source, read_workers

    source = Source(model, plan, encoder)

    def opened(store: Any) -> tuple[str, str, Recipe | None, str | None]:
        try:
            found = source.read(store)
        except NotEmbedded:
            return store_slide_name(store), str(store), None, None
        plan_name = found.group.record.plan_name if found.group is not None else plan
        return store_slide_name(store), str(store), found.recipe, plan_name

    paths = [store for store, _ in expand_stores(_store_list(stores))]
    with ThreadPoolExecutor(read_workers()) as pool:
        return list(pool.map(opened, paths))


def _task(
    kind: str,
    columns: tuple[str, ...],
    labels_of: dict[str, tuple],
    candidate: dict[str, list],
    categories: Sequence[str] | Mapping[str, Sequence[str]] | None,
    where: str,
) -> tuple[Task, dict[str, tuple]]:
    """The task, and the labels as numbers (class indices), of the patients with slides;
    patients of a class outside `categories` dropped."""
    if kind != "classification":
        if categories is not None:
            raise OptionError(f"categories= is for classification, not {kind}")
        return Task(kind, columns), labels_of
    if categories is None:
        wanted: dict[str, tuple[str, ...] | None] = dict.fromkeys(columns)
    elif isinstance(categories, Mapping):
        unknown = set(categories) - set(columns)
        if unknown:
            raise OptionError(f"categories: {sorted(unknown)[0]!r} is not a target")
        wanted = {c: tuple(map(str, categories[c])) if c in categories else None for c in columns}
    else:
        if len(columns) != 1:
            raise OptionError("categories for several targets: give {target: classes}")
        wanted = {columns[0]: tuple(map(str, categories))}
    keep = {
        p: v
        for p, v in labels_of.items()
        if all(w is None or v[j] in w for j, w in enumerate(wanted.values()))
    }
    used = [keep[p] for p in candidate if p in keep]
    classes = []
    for j, column in enumerate(columns):
        seen = sorted({v[j] for v in used})
        if wanted[column] is not None:
            absent = [c for c in wanted[column] if c not in seen]
            if absent:
                raise LabelError(
                    f"{where}: {column!r} class {absent[0]!r} (of categories) has no patient "
                    "with slides"
                )
            seen = sorted(wanted[column])
        if used and len(seen) < 2:
            raise LabelError(
                f"{where}: {column!r} has one class ({seen[0]!r}) among the {len(used)} "
                "patients with slides: nothing to tell apart"
            )
        classes.append(tuple(seen))
    indexed = {
        p: tuple(float(classes[j].index(x)) if x in classes[j] else np.nan for j, x in enumerate(v))
        for p, v in keep.items()
    }
    return Task(kind, columns, tuple(classes)), indexed


def _check_survival(raw: dict[str, tuple], columns: tuple[str, ...], where: str) -> None:
    """Every row's survival time above 0 and event 0 or 1, before a store is read."""
    time, event = columns
    for who, (t, e) in raw.items():
        if t <= 0:
            raise LabelError(
                f"{where}: patient {who!r} has {time}={t:g}: survival times must be above 0"
            )
        if e not in (0.0, 1.0):
            raise LabelError(f"{where}: patient {who!r} has {event}={e:g}: events are 0 or 1")


def _check_labels(task: Task, labels: np.ndarray, where: str) -> None:
    """The used patients' labels learnable: survival times above 0, events 0/1 with one
    event at least; a regression target that varies."""
    if task.kind == "survival":
        time, event = task.targets
        bad = np.flatnonzero(labels[:, 0] <= 0)
        if len(bad):
            raise LabelError(
                f"{where}: {time!r} must be above 0; {len(bad)} patient(s) have "
                f"{labels[bad[0], 0]:g} or less"
            )
        if not np.isin(labels[:, 1], (0.0, 1.0)).all():
            other = labels[~np.isin(labels[:, 1], (0.0, 1.0)), 1][0]
            raise LabelError(f"{where}: {event!r} must be 0 or 1, not {other:g}")
        if not labels[:, 1].any():
            raise LabelError(f"{where}: {event!r} has no event (all 0): no order to learn")
    elif task.kind == "regression":
        for j, column in enumerate(task.targets):
            if np.ptp(labels[:, j]) == 0:
                raise LabelError(
                    f"{where}: {column!r} is {labels[0, j]:g} for every patient: nothing to learn"
                )
