"""A run folder's report page: the cohort line, the metrics of each fold and pooled with their
intervals (the run's metrics.json where there is one, else computed from the predictions:
the same numbers), and its figures as real PNGs."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from tilestore.errors import LabelError
from tilestore.learn import Task, evaluate, write_page
from tilestore.learn.page import (
    from_frame,
    metrics_of,
    prediction_frame,
    read_metrics,
    write_metrics,
)
from tilestore.learn.plots import kaplan_meier

SUMMARY = "40 patients used (55 slides); 1 no store; 2 missing label"


def _run(tmp_path, task: Task, y: np.ndarray, out: np.ndarray, folds: int = 2):
    run = tmp_path / "run"
    run.mkdir()
    config = {"task": task.to_json(), "cohort": {"summary": SUMMARY}, "options": {"model": "abmil"}}
    (run / "config.json").write_text(json.dumps(config))
    patients = [f"P{i:02d}" for i in range(len(y))]
    frame = prediction_frame(task, patients, np.arange(len(y)) % folds, y, out)
    frame.to_csv(run / "predictions.csv", index=False)
    return run, frame


def test_a_classification_run_has_its_metrics_and_curves(tmp_path):
    rng = np.random.default_rng(0)
    task = Task("classification", ("MSI",), (("MSI-H", "MSS"),))
    y = rng.integers(0, 2, (40, 1))
    logits = rng.normal(size=(40, 2)) + np.c_[-y, y]
    run, frame = _run(tmp_path, task, y, logits)
    assert list(frame.columns) == ["patient", "fold", "MSI", "MSI:MSI-H", "MSI:MSS"]
    assert set(frame["MSI"]) == {"MSI-H", "MSS"}
    y_back, p_back = from_frame(task, frame)  # the table read back is what was evaluated
    assert (y_back == y).all()
    assert evaluate(task, y_back, p_back, n_boot=0)["auroc"].value == pytest.approx(
        evaluate(task, y, logits, n_boot=0)["auroc"].value, abs=1e-12
    )
    page = write_page(run)
    text = page.read_text()
    pooled = evaluate(task, y, logits, n_boot=1000, seed=0)["auroc"]
    assert f"Cohort: {SUMMARY}" in text
    assert (
        f"| pooled | {pooled.value:.3f} ({pooled.low:.3f}–{pooled.high:.3f}) |" in text
    )  # pooled row, first column: AUROC with its interval
    assert "| fold 0 |" in text and "| fold 1 |" in text
    for name in ("roc-MSI-MSS.png", "pr-MSI-MSS.png"):
        assert f"]({name})" in text
        with Image.open(run / name) as image:
            assert image.format == "PNG" and image.size[0] > 200
    html = (run / "report.html").read_text()
    assert "<img src='roc-MSI-MSS.png'" in html and SUMMARY in html and "abmil" in html


def test_the_runs_metrics_json_is_what_the_page_shows(tmp_path):
    rng = np.random.default_rng(1)
    task = Task("regression", ("age",))
    y = rng.normal(50, 10, (30, 1))
    run, frame = _run(tmp_path, task, y, y + rng.normal(0, 5, (30, 1)), folds=3)
    parts = metrics_of(task, frame, n_boot=200)
    assert sorted(parts) == ["0", "1", "2", "pooled"]
    write_metrics(run / "metrics.json", parts)
    assert read_metrics(run / "metrics.json") == parts
    text = write_page(run).read_text()
    r2 = parts["pooled"]["r2"]
    assert f"| pooled | {parts['pooled']['pearson'].value:.3f}" in text
    assert f"{r2.value:.3f} ({r2.low:.3f}–{r2.high:.3f})" in text


def test_a_survival_run_draws_kaplan_meier_by_risk(tmp_path):
    rng = np.random.default_rng(2)
    task = Task("survival", ("OS", "DEAD"))
    time = rng.exponential(10, 60) + 0.5
    y = np.c_[time, rng.integers(0, 2, 60)]
    run, _ = _run(tmp_path, task, y, (-time + rng.normal(0, 3, 60))[:, None])
    text = write_page(run).read_text()
    assert "c_index" in text and "![km](km.png)" in text
    with Image.open(run / "km.png") as image:
        assert image.format == "PNG"


def test_kaplan_meier_is_the_product_limit_estimate():
    # 5 patients: deaths at 1 and 3 (two), censored at 2 and 4
    times, survival = kaplan_meier([1, 2, 3, 3, 4], [1, 0, 1, 1, 0])
    assert times.tolist() == [0, 1, 3]
    assert survival == pytest.approx([1, 4 / 5, 4 / 5 * (1 - 2 / 3)])


def test_a_folder_that_is_not_a_run_is_refused(tmp_path):
    with pytest.raises(LabelError, match=r"not a run folder \(config.json"):
        write_page(tmp_path)
    (tmp_path / "config.json").write_text(
        json.dumps({"task": Task("regression", ("y",)).to_json()})
    )
    with pytest.raises(LabelError, match=r"no metrics.json and no predictions"):
        write_page(tmp_path)
