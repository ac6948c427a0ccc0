"""A run: cross-validation (`crossval`) or one model on all the training patients (`train`),
written to a run folder that `tilestore.learn.prediction` and `.explanation` read back.

The folder::

    config.json          options, task, cohort (model, plan, recipe, accounting), the
                         features' recipe (`tilestore.learn.bags.features_of`), outputs
    splits.json          the folds' patients (`tilestore.learn.splits.write_splits`)
    fold_<k>/            model.safetensors, predictions.csv (its test patients), fold.json
    predictions.csv/.parquet        each test patient's outputs and fold
    predictions-slides.csv          each test slide's outputs alone
    metrics.json         per fold and pooled, with bootstrap intervals
    report.md            the report page (`tilestore.learn.page.write_page`)
    finished.json        written last: a folder without it is no finished run

A fold is made in ``.fold_<k>`` and renamed into place with its ``fold.json`` inside, so a
run killed mid-fold resumes (``resume=True``) at that fold: finished folds are read back,
not trained again. A folder that exists is refused unless `resume` or `overwrite`, before
any training.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import pandas as pd

from tilestore.errors import RunError
from tilestore.learn.bags import Bags, features_of, load_bags
from tilestore.learn.options import LearnOptions, resolve_device
from tilestore.learn.splits import Fold, Splits, read_splits, write_splits
from tilestore.options import Opt, checked
from tilestore.urls import written_here

CONFIG, SPLITS, FINISHED, FOLD_DONE, WEIGHTS = (
    "config.json",
    "splits.json",
    "finished.json",
    "fold.json",
    "model.safetensors",
)
Progress = Callable[[str], None]


@dataclass(frozen=True)
class RunResult:
    """A finished run: its folder, pooled metrics (name -> Metric, over every fold's test
    patients), each fold's, and the per-patient predictions (patient, fold, labels,
    outputs)."""

    run_dir: Path
    metrics: dict[str, Any]
    fold_metrics: tuple[dict[str, Any], ...]
    predictions: pd.DataFrame


def output_names(task: Any) -> list[str]:
    """The model outputs' names in every table of a run (`tilestore.learn.page.output_columns`):
    ``<target>:<class>`` (a probability), ``<target>:predicted``, ``risk``."""
    from tilestore.learn.page import output_columns

    return output_columns(task)


def check_run_dir(out_dir: str | Path, *, resume: bool = False, overwrite: bool = False) -> Path:
    """The run folder, refused (RunError, one line) where it exists and neither `resume` nor
    `overwrite` is given, or where `overwrite` would remove a folder that is not a run."""
    out = Path(out_dir)
    if resume and overwrite:
        raise RunError(f"{out}: resume and overwrite: choose one")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        if overwrite:
            if not (out / CONFIG).exists():
                raise RunError(
                    f"{out}: exists and is not a run folder (no {CONFIG}); "
                    "not removed: give another folder"
                )
        elif not resume:
            raise RunError(
                f"{out}: exists; give another folder, or resume=True (--resume) "
                "to finish it, or overwrite=True (--overwrite)"
            )
    elif resume:
        raise RunError(f"{out}: no run to resume")
    return out


def crossval(
    cohort: Any,
    splits: Splits,
    options: LearnOptions,
    out_dir: str | Path,
    *,
    bags: Bags | None = None,
    resume: bool = False,
    overwrite: bool = False,
    progress: Progress | None = None,
) -> RunResult:
    """Train and test a model per fold of `splits` on the cohort's bags (read from its
    stores once, `load_bags`, unless given) and write the run folder `out_dir`."""
    return _run("crossval", cohort, splits, options, out_dir, bags, resume, overwrite, progress)


@checked
def train(
    cohort: Any,
    options: LearnOptions,
    out_dir: str | Path,
    *,
    valid: Annotated[
        float, Opt("Share of the patients held for early stopping.", low=0.05, high=0.5)
    ] = 0.2,
    bags: Bags | None = None,
    overwrite: bool = False,
    progress: Progress | None = None,
) -> RunResult:
    """One model on all the cohort's patients, `valid` of them held for early stopping;
    written as a run of one fold with no test patients (for `predict` on new stores)."""
    from sklearn.model_selection import train_test_split

    patients = np.array(cohort.patients)
    strata = cohort.labels[:, 0] if cohort.task.kind == "classification" else None
    fit_p, valid_p = train_test_split(
        patients, test_size=valid, random_state=options.seed, stratify=strata
    )
    fold = Fold(tuple(sorted(map(str, fit_p))), tuple(sorted(map(str, valid_p))), ())
    splits = Splits((fold,), options.seed, ())
    return _run("train", cohort, splits, options, out_dir, bags, False, overwrite, progress)


def _run(
    kind: str,
    cohort: Any,
    splits: Splits,
    options: LearnOptions,
    out_dir: str | Path,
    bags: Bags | None,
    resume: bool,
    overwrite: bool,
    progress: Progress | None,
) -> RunResult:
    from tilestore.learn.metrics import evaluate
    from tilestore.learn.models import check_model
    from tilestore.learn.page import POOLED, write_metrics, write_page

    out = check_run_dir(written_here(out_dir, "out_dir"), resume=resume, overwrite=overwrite)
    check_model(options.model, cohort.task, cohort.slide_encoder is not None)
    _check_splits(cohort, splits)
    device = resolve_device(options.device)
    options = replace(options, device=device)
    features = features_of(cohort) if bags is None else None
    config = _config(kind, cohort, options, features)
    if resume and (out / CONFIG).exists():
        _same_config(out, config)
        splits = read_splits(out / SPLITS, cohort)
    if overwrite and out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / FINISHED).unlink(missing_ok=True)
    _write_json(out / CONFIG, config)
    write_splits(splits, out / SPLITS)
    if bags is None:
        bags = load_bags(cohort, device=device, dtype=options.dtype, progress=progress)
    config = {**config, "dim": bags.dim}
    _write_json(out / CONFIG, config)
    index = {p: i for i, p in enumerate(cohort.patients)}
    names = output_names(cohort.task)
    parts, fold_metrics = [], []
    for k, fold in enumerate(splits.folds):
        label = f"fold {k + 1}/{len(splits.folds)}"
        done = out / f"fold_{k}"
        if (done / FOLD_DONE).exists():
            if progress:
                progress(f"{label}: finished before, read back")
        else:
            _fit_fold(cohort, bags, fold, index, options, done, label, names, progress)
        table = pd.read_csv(done / "predictions.csv", dtype={"patient": str})
        parts.append(table)
        if len(table):
            fold_metrics.append(_metrics(cohort, table, names, evaluate))
        else:
            fold_metrics.append({})
    predictions = pd.concat(parts, ignore_index=True)
    pooled = _metrics(cohort, predictions, names, evaluate) if len(predictions) else {}
    if len(predictions):
        predictions.to_csv(out / "predictions.csv", index=False)
        predictions.to_parquet(out / "predictions.parquet", index=False)
        slides = [
            pd.read_csv(out / f"fold_{k}" / "predictions-slides.csv", dtype=str)
            for k in range(len(splits.folds))
        ]
        pd.concat(slides, ignore_index=True).to_csv(out / "predictions-slides.csv", index=False)
    write_metrics(
        out / "metrics.json",
        {
            **{str(k): m for k, m in enumerate(fold_metrics) if m},
            **({POOLED: pooled} if pooled else {}),
        },
    )
    write_page(out)
    _write_json(out / FINISHED, {"folds": len(splits.folds), "kind": kind})  # last
    if progress:
        said = ", ".join(
            f"{m.name} {m.value:.3f} [{m.low:.3f}, {m.high:.3f}]" for m in pooled.values()
        )
        progress(f"{kind}: finished {len(splits.folds)} fold(s){': ' + said if said else ''}")
    return RunResult(out, pooled, tuple(fold_metrics), predictions)


def _fit_fold(cohort, bags, fold, index, options, done: Path, label: str, names, progress):
    """Fit one fold, predict its test patients and slides, write it in place whole."""
    import torch
    from safetensors.torch import save_file

    from tilestore.learn.page import prediction_frame
    from tilestore.learn.training import fit, predict_bags

    if progress:
        progress(
            f"{label}: {len(fold.train)} training, {len(fold.valid)} validation, "
            f"{len(fold.test)} test patients"
        )
    train = [index[p] for p in fold.train]
    valid = [index[p] for p in fold.valid]
    test = [index[p] for p in fold.test]
    fitted = fit(
        cohort.task, bags, cohort.labels, train, valid, options, progress=progress, label=label
    )
    k = int(done.name.split("_")[-1])
    outputs = predict_bags(fitted.model, bags, test)
    if not test:
        outputs = np.zeros((0, cohort.task.outputs))
    table = prediction_frame(cohort.task, fold.test, [k] * len(test), cohort.labels[test], outputs)
    slides, patients, logits = [], [], []
    with torch.no_grad():  # a patient of one slide: that slide's outputs are the patient's
        for j, i in enumerate(test):
            for s in bags.members[i]:
                slides.append(bags.slide_names[s])
                patients.append(i)
                logits.append(
                    outputs[j]
                    if len(bags.members[i]) == 1
                    else fitted.model(bags.slide(s).unsqueeze(0)).logits.float().cpu().numpy()[0]
                )
    slide_table = prediction_frame(
        cohort.task,
        [cohort.patients[i] for i in patients],
        [k] * len(slides),
        cohort.labels[patients],
        np.array(logits).reshape(len(slides), -1) if slides else np.zeros((0, cohort.task.outputs)),
    )
    slide_table.insert(0, "slide", slides)
    hidden = done.parent / f".{done.name}"
    shutil.rmtree(hidden, ignore_errors=True)
    hidden.mkdir(parents=True)
    state = {k: v.detach().contiguous().cpu() for k, v in fitted.model.state_dict().items()}
    save_file(state, str(hidden / WEIGHTS))
    table.to_csv(hidden / "predictions.csv", index=False)
    slide_table.to_csv(hidden / "predictions-slides.csv", index=False)
    _write_json(
        hidden / FOLD_DONE,
        {
            "best_epoch": fitted.best_epoch,
            "epochs": fitted.epochs,
            "valid_loss": fitted.valid_loss,
            "history": [list(h) for h in fitted.history],
        },
    )
    shutil.rmtree(done, ignore_errors=True)
    hidden.rename(done)


def _metrics(cohort, table: pd.DataFrame, names: list[str], evaluate) -> dict[str, Any]:
    from tilestore.learn.page import from_frame

    return evaluate(cohort.task, *from_frame(cohort.task, table))


def _check_splits(cohort: Any, splits: Splits) -> None:
    """RunError where a fold names a patient the cohort lacks or one patient twice."""
    known = set(cohort.patients)
    for k, fold in enumerate(splits.folds):
        parts = (*fold.train, *fold.valid, *fold.test)
        unknown = sorted(set(parts) - known)
        if unknown:
            raise RunError(f"splits: fold {k} names patients not in the cohort ({unknown[:3]})")
        if len(set(parts)) < len(parts):
            raise RunError(f"splits: fold {k} has a patient in two of train/valid/test")


def _config(kind: str, cohort: Any, options: LearnOptions, features: dict | None) -> dict:
    task = cohort.task
    return {
        "kind": kind,
        "options": options.to_json(),
        "task": task.to_json(),
        "cohort": {
            "model": cohort.model,
            "plan": cohort.plan,
            "slide_encoder": cohort.slide_encoder,
            "recipe": _plain(cohort.recipe),
            "summary": cohort.summary(),
            "patients": len(cohort.patients),
            "slides": len(cohort.slides),
        },
        "features": features,
        "outputs": output_names(task),
    }


def _same_config(out: Path, config: dict) -> None:
    was = json.loads((out / CONFIG).read_text())
    was.pop("dim", None)
    for key in ("kind", "options", "task", "cohort", "features"):
        if _plain(was.get(key)) != _plain(config.get(key)):
            raise RunError(
                f"{out}: resume with other {key} than the run was started with; "
                "give the same, or another folder"
            )


def _plain(value: Any) -> Any:
    """JSON's own types (a Metric, numpy numbers, tuples made plain)."""
    if hasattr(value, "__dataclass_fields__"):
        return {k: _plain(getattr(value, k)) for k in value.__dataclass_fields__}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def _write_json(path: Path, data: Any) -> None:
    hidden = path.with_name(f".{path.name}")
    hidden.write_text(json.dumps(_plain(data), indent=1))
    hidden.replace(path)


def read_config(run_dir: str | Path) -> dict:
    """A finished run's config; RunError where the folder is no finished run."""
    run = Path(run_dir)
    if not (run / FINISHED).exists():
        raise RunError(f"{run}: not a finished run (no {FINISHED}); finish it with --resume")
    return json.loads((run / CONFIG).read_text())


def load_models(run_dir: str | Path, device: str, fold: int | None = None) -> list[Any]:
    """The run's fold models (one where `fold` is given), on `device`, in eval mode."""
    import torch
    from safetensors.torch import load_file

    from tilestore.learn.models import make_model

    run = Path(run_dir)
    config = read_config(run)
    folds = int(json.loads((run / FINISHED).read_text())["folds"])
    chosen = range(folds) if fold is None else [fold]
    if fold is not None and not 0 <= fold < folds:
        raise RunError(f"fold={fold}: {run} has folds 0-{folds - 1}")
    options = LearnOptions(**{**config["options"], "device": None})
    models = []
    for k in chosen:
        model = make_model(
            options.model, int(config["dim"]), len(config["outputs"]), **options.hparams()
        )
        state = load_file(str(run / f"fold_{k}" / WEIGHTS))
        model.load_state_dict(state)
        models.append(model.to(device=device, dtype=getattr(torch, options.dtype)).eval())
    return models
