"""`tilestore train` / `crossval` / `predict` as a user runs them: a run on real stores,
predicted and explained; every refusal one line, exit 2, before training, and nothing that
looks like a finished run left behind."""

from __future__ import annotations

import pandas as pd
import pytest

from tests.conftest import run_cli
from tests.learn.cohorts import copies

FAST = ("--device", "cpu", "--epochs", "2", "--hidden", "16", "--threads", "1")


@pytest.fixture(scope="module")
def cohort(embedded_cohort, tmp_path_factory):
    folder = tmp_path_factory.mktemp("cli-learn")
    return folder, *copies(embedded_cohort, folder)


def _refused(run, *, says: str) -> None:
    assert run.returncode == 2, run.stderr
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and says in lines[0], run.stderr
    assert "epoch" not in run.stderr  # refused before training


def test_train_then_predict_with_explain(cohort):
    folder, stores, table = cohort
    run = folder / "run"
    made = run_cli(
        "train",
        table,
        *stores,
        "--model",
        "efficientnet-lite0",
        "--target",
        "status",
        "--out",
        run,
        *FAST,
    )
    assert made.returncode == 0, made.stderr
    assert "epoch 1/2" in made.stderr and "cohort: 6 patients used" in made.stdout
    assert (run / "finished.json").exists() and (run / "fold_0" / "model.safetensors").exists()
    out = folder / "predictions.csv"
    told = run_cli("predict", run, stores[0], "--device", "cpu", "--output", out, "--explain")
    assert told.returncode == 0, told.stderr
    assert list(pd.read_csv(out)["slide"]) == ["P0"]
    assert "learned/run" in told.stdout
    png = folder / "attention.png"
    drawn = run_cli(
        "export",
        "heatmap",
        stores[0],
        "--model",
        "efficientnet-lite0",
        "--column",
        "run:attention",
        "--png",
        png,
    )
    assert drawn.returncode == 0, drawn.stderr
    assert png.stat().st_size > 0


def test_refusals_are_one_line_before_training(cohort, tmp_path):
    _, stores, table = cohort
    common = (table, *stores, "--model", "efficientnet-lite0", "--target", "status", *FAST)
    _refused(
        run_cli("crossval", *common, "--out", tmp_path / "a", "--arch", "nope"),
        says="no such model",
    )
    assert not (tmp_path / "a").exists()
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "x").write_text("")
    _refused(run_cli("crossval", *common, "--out", taken), says="exists")
    _refused(
        run_cli(
            "crossval",
            table,
            *stores,
            "--model",
            "efficientnet-lite0",
            "--target",
            "nope",
            "--out",
            tmp_path / "b",
            *FAST,
        ),
        says="nope",
    )
    assert not (tmp_path / "b" / "finished.json").exists()
    _refused(
        run_cli("crossval", *common, "--out", tmp_path / "c", "--arch", "linear"),
        says="reads one vector per slide",
    )
    _refused(
        run_cli("crossval", *common, "--out", tmp_path / "d", "--kind", "survivl"),
        says="kind",
    )
    assert not (tmp_path / "c").exists() and not (tmp_path / "d").exists()


def test_crossval_takes_stamps_splits_file(cohort, tmp_path):
    import json

    _, stores, table = cohort
    stamp = tmp_path / "splits.json"  # as STAMP's crossval writes it
    stamp.write_text(
        json.dumps(
            {
                "splits": [
                    {"train_patients": ["P0", "P1", "P2", "P3"], "test_patients": ["P4", "P5"]},
                    {"train_patients": ["P2", "P3", "P4", "P5"], "test_patients": ["P0", "P1"]},
                ]
            }
        )
    )
    run = tmp_path / "run"
    done = run_cli(
        "crossval", table, *stores, "--model", "efficientnet-lite0", "--target", "status",
        "--splits", stamp, "--out", run, *FAST,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    predictions = pd.read_csv(run / "predictions.csv", dtype={"patient": str})
    tested = predictions.groupby("fold")["patient"].apply(sorted).to_dict()
    assert tested == {0: ["P4", "P5"], 1: ["P0", "P1"]}
    written = json.loads((run / "splits.json").read_text())
    assert sorted(written["folds"][0]["train"] + written["folds"][0]["valid"]) == [
        "P0", "P1", "P2", "P3",
    ]  # fmt: skip
