"""A run folder's one-page report, in Markdown and HTML: the cohort's accounting line, the
metrics of each fold and of the folds pooled with their bootstrap 95% intervals, and the
figures (ROC and PR curves, or Kaplan-Meier curves by predicted risk).

What it reads of the run folder (what `prediction_frame` and `write_metrics` make):

- ``config.json``: ``task`` (`Task.to_json`), ``cohort`` (``summary``: the accounting
  line), and anything else (shown as given under "Options" where it is ``options``);
- ``predictions.csv`` (or ``.parquet``): a row per patient and fold tested, the columns of
  `prediction_frame`: ``patient``, ``fold``, the labels (a classification target's class
  name, a regression target's value, survival's time and event columns) and the outputs
  (``<target>:<class>`` probabilities, ``<target>:predicted``, ``risk``);
- ``metrics.json`` where present (`write_metrics`), else the metrics are computed from the
  predictions (`tilestore.learn.metrics.evaluate`).
"""

from __future__ import annotations

import html
import json
import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd

from tilestore.errors import LabelError
from tilestore.learn.metrics import Metric, evaluate, probabilities
from tilestore.learn.task import Task

POOLED = "pooled"
PAGE = "report"  # report.md, report.html


def output_columns(task: Task) -> list[str]:
    """The names of a model's outputs in a predictions table."""
    if task.kind == "classification":
        return [f"{t}:{c}" for t, classes in zip(task.targets, task.classes, strict=True)
                for c in classes]  # fmt: skip
    if task.kind == "regression":
        return [f"{t}:predicted" for t in task.targets]
    return ["risk"]


def prediction_frame(
    task: Task, patients, folds, y_true: np.ndarray, y_pred: np.ndarray
) -> pd.DataFrame:
    """A predictions table (a row per patient tested): patient, fold, the labels as the
    clinical table says them, the outputs (a classification head's as probabilities)."""
    y_true = np.asarray(y_true, dtype=np.float64)
    y_pred = np.asarray(y_pred, dtype=np.float64)
    frame = pd.DataFrame({"patient": list(map(str, patients)), "fold": list(folds)})
    for j, target in enumerate(task.targets):
        if task.kind == "classification":
            frame[target] = [task.classes[j][int(i)] for i in y_true[:, j]]
        else:
            frame[target] = y_true[:, j]
    if task.kind == "classification":
        outputs = np.concatenate([probabilities(y_pred[:, h]) for h in task.heads()], axis=1)
    else:
        outputs = y_pred
    for name, column in zip(output_columns(task), outputs.T, strict=True):
        frame[name] = column
    return frame


def from_frame(task: Task, frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(y_true, y_pred) of a predictions table, as `evaluate` takes them."""
    missing = [c for c in (*task.targets, *output_columns(task)) if c not in frame.columns]
    if missing:
        raise LabelError(f"predictions: no column {missing[0]!r}")
    if task.kind == "classification":
        y_true = np.stack(
            [frame[t].astype(str).map({c: i for i, c in enumerate(classes)}).to_numpy(float)
             for t, classes in zip(task.targets, task.classes, strict=True)], axis=1)  # fmt: skip
    else:
        y_true = frame[list(task.targets)].to_numpy(np.float64)
    return y_true, frame[output_columns(task)].to_numpy(np.float64)


def write_metrics(path: str | os.PathLike, parts: Mapping[str, Mapping[str, Metric]]) -> Path:
    """metrics.json: {part (a fold, "pooled"): {metric: {value, low, high}}}."""
    document = {
        str(part): {m.name: {"value": m.value, "low": m.low, "high": m.high} for m in ms.values()}
        for part, ms in parts.items()
    }
    Path(path).write_text(json.dumps(document, indent=1, allow_nan=True) + "\n")
    return Path(path)


def read_metrics(path: str | os.PathLike) -> dict[str, dict[str, Metric]]:
    """metrics.json as `write_metrics` wrote it."""
    document = json.loads(Path(path).read_text())
    return {part: {name: Metric(name, v["value"], v["low"], v["high"]) for name, v in ms.items()}
            for part, ms in document.items()}  # fmt: skip


def _predictions(run: Path) -> pd.DataFrame | None:
    for name, read in (("predictions.parquet", pd.read_parquet), ("predictions.csv", pd.read_csv)):
        if (run / name).exists():
            return read(run / name)
    return None


def metrics_of(task: Task, frame: pd.DataFrame, n_boot: int = 1000, seed: int = 0):
    """{fold: metrics, "pooled": metrics} of a predictions table."""
    parts: dict[str, dict[str, Metric]] = {}
    for fold, rows in frame.groupby("fold", sort=True):
        parts[str(fold)] = evaluate(task, *from_frame(task, rows), n_boot=n_boot, seed=seed)
    if len(parts) > 1:
        parts[POOLED] = evaluate(task, *from_frame(task, frame), n_boot=n_boot, seed=seed)
    return parts


def _figures(task: Task, frame: pd.DataFrame, run: Path) -> list[Path]:
    from tilestore.learn.plots import plot_km, plot_pr, plot_roc

    y_true, y_pred = from_frame(task, frame)
    folds = frame["fold"].to_numpy()
    made = []
    if task.kind == "classification":
        for j, (target, head) in enumerate(zip(task.targets, task.heads(), strict=True)):
            classes = task.classes[j]
            positive = len(classes) - 1 if len(classes) == 2 else None  # binary: the last
            for c in [positive] if positive is not None else range(len(classes)):
                y = (y_true[:, j] == c).astype(int)
                score = y_pred[:, head][:, c]
                curves = {f"fold {f}": (y[folds == f], score[folds == f]) for f in np.unique(folds)}
                if len(curves) > 1:
                    curves[POOLED] = (y, score)
                stem = f"{target}-{classes[c]}".replace("/", "_").replace(" ", "_")
                title = f"{target} = {classes[c]}"
                made.append(plot_roc(curves, run / f"roc-{stem}.png", f"ROC: {title}"))
                made.append(plot_pr(curves, run / f"pr-{stem}.png", f"PR: {title}"))
    elif task.kind == "survival":
        made.append(plot_km(y_true[:, 0], y_true[:, 1], y_pred[:, 0], run / "km.png"))
    return made


def _cell(m: Metric) -> str:
    if not np.isfinite(m.value):
        return "n/a"
    interval = f" ({m.low:.3f}–{m.high:.3f})" if np.isfinite(m.low) else ""
    return f"{m.value:.3f}{interval}"


def write_page(run_dir: str | os.PathLike) -> Path:
    """report.md and report.html in the run folder (see the module's docstring); returns
    the Markdown's path."""
    run = Path(run_dir)
    try:
        config = json.loads((run / "config.json").read_text())
        task = Task.from_json(config["task"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise LabelError(f"{run}: not a run folder (config.json with its task: {exc})") from exc
    frame = _predictions(run)
    if (run / "metrics.json").exists():
        parts = read_metrics(run / "metrics.json")
    elif frame is not None:
        parts = metrics_of(task, frame)
    else:
        raise LabelError(f"{run}: no metrics.json and no predictions to report")
    figures = _figures(task, frame, run) if frame is not None else []
    summary = (config.get("cohort") or {}).get("summary", "")
    names = list(dict.fromkeys(n for ms in parts.values() for n in ms))
    title = f"Run {run.name}: {task.kind} of {', '.join(task.targets)}"
    rows = [[f"fold {p}" if p != POOLED else POOLED] + [_cell(parts[p][n]) if n in parts[p]
             else "" for n in names] for p in parts]  # fmt: skip
    options = config.get("options")

    md = [f"# {title}", ""]
    if summary:
        md += [f"Cohort: {summary}", ""]
    md += ["Metrics (95% bootstrap interval over patients):", ""]
    md += ["| part | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    md += ["| " + " | ".join(r) + " |" for r in rows]
    md += [""] + [f"![{f.stem}]({f.name})" for f in figures]
    if options:
        md += ["", "Options:", "", "```json", json.dumps(options, indent=1, default=str), "```"]
    (run / f"{PAGE}.md").write_text("\n".join(md) + "\n")

    e = html.escape
    page = [f"<!doctype html><meta charset='utf-8'><title>{e(title)}</title>",
            "<style>body{font-family:sans-serif;max-width:60em;margin:2em auto}"
            "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.2em .6em}"
            "img{width:32%}</style>", f"<h1>{e(title)}</h1>"]  # fmt: skip
    if summary:
        page.append(f"<p>Cohort: {e(summary)}</p>")
    page.append("<p>Metrics (95% bootstrap interval over patients):</p><table><tr><th>part</th>")
    page += [f"<th>{e(n)}</th>" for n in names] + ["</tr>"]
    page += ["<tr>" + "".join(f"<td>{e(c)}</td>" for c in r) + "</tr>" for r in rows]
    page += ["</table><p>"] + [f"<img src='{e(f.name)}' alt='{e(f.stem)}'>" for f in figures]
    if options:
        page.append(
            f"</p><h2>Options</h2><pre>{e(json.dumps(options, indent=1, default=str))}</pre>"
        )
    (run / f"{PAGE}.html").write_text("\n".join(page) + "\n")
    return run / f"{PAGE}.md"
