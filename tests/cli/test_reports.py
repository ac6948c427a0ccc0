"""`tilestore embed --report`: a report however the run ends (an empty share, every store
skipped, refused, interrupted: tests/cli/test_interrupt.py), whole or not at all, replacing
the one before; its folder checked before any work; a report that cannot be written a
warning that leaves the run's exit status as it was. An empty share ends without torch."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import zarr

from tests.conftest import CMU, IHC, fill, group_of, run_cli

LITE = "efficientnet-lite0"
RUN = ["--model", LITE, "--device", "cpu", "--batch-size", "8"]


def _imports_torch(stderr: str) -> bool:
    """Whether `python -X importtime`'s lines (stderr) show torch imported."""
    return any(line.rstrip().endswith("| torch") for line in stderr.splitlines())


def _embed_timed(*argv) -> subprocess.CompletedProcess:
    """`tilestore embed ARGV` with Python's import times on stderr."""
    command = [sys.executable, "-X", "importtime", "-m", "tilestore.cli", "embed", *argv]
    return subprocess.run(list(map(str, command)), capture_output=True, text=True, timeout=600)


def _said(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if not line.startswith("import time:")]


@pytest.fixture
def cohort(tmp_path, stores):
    folder = tmp_path / "stores"
    folder.mkdir()
    shutil.copytree(stores(CMU), folder / "a.ome.zarr")
    shutil.copytree(stores(IHC, mpp=0.5), folder / "b.ome.zarr")
    return sorted(folder.glob("*.ome.zarr"))


def test_an_empty_share_writes_its_report_and_ends_without_torch(cohort, tmp_path):
    report = tmp_path / "reports" / "run-3.json"
    report.parent.mkdir()
    report.write_text('{"attempt": 1}')  # a requeued task's previous attempt
    run = _embed_timed(*cohort, *RUN, "--shard", "3/4", "--report", report)
    assert run.returncode == 0, _said(run.stderr)
    assert "shard 3/4: 0 store(s)" in run.stdout
    assert not _imports_torch(run.stderr)  # the split and the report need no model
    saved = json.loads(report.read_text())
    assert (saved["outcome"], saved["exit_code"]) == ("complete", 0)
    assert saved["share"] == {"k": 3, "n": 4, "stores": 0, "of": 2}
    assert saved["notes"] == ["share 3/4 is empty: the 2 store(s) given fall to the others"]
    assert saved["slides"] == saved["skipped"] == saved["failures"] == []
    assert [p.name for p in report.parent.iterdir()] == ["run-3.json"]  # no part left


def test_an_all_skipped_rerun_replaces_the_report_and_imports_no_torch(cohort, tmp_path):
    report = tmp_path / "run-0.json"
    first = run_cli("embed", *cohort, *RUN, "--report", report)
    assert first.returncode == 0, first.stderr
    made = json.loads(report.read_text())
    assert made["outcome"] == "complete" and made["exit_code"] == 0
    assert sorted(made["finished"]) == [str(p) for p in cohort]
    assert sorted(s["store"] for s in made["slides"]) == [str(p) for p in cohort]
    again = _embed_timed(*cohort, *RUN, "--report", report)  # a requeued task, all done
    assert again.returncode == 0, _said(again.stderr)
    assert not _imports_torch(again.stderr)  # each store's plan and group say it is complete
    redone = json.loads(report.read_text())
    assert redone["outcome"] == "complete" and redone["slides"] == []
    assert sorted(s["store"] for s in redone["skipped"]) == [str(p) for p in cohort]


def test_a_report_folder_that_cannot_be_written_is_refused_before_any_work(cohort, tmp_path):
    """Root writes where permissions say not: an immutable folder is what stops it too."""
    folder = tmp_path / "locked"
    folder.mkdir()
    if subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode:
        pytest.skip("chattr +i is not available here")
    try:
        run = run_cli("embed", *cohort, *RUN, "--report", folder / "run.json")
    finally:
        subprocess.run(["chattr", "-i", str(folder)], check=True)
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        f"tilestore: error: {folder / 'run.json'}: the folder {folder} is not writable"
    ]
    assert not any((store / "embeddings").exists() for store in cohort)  # nothing was done


def test_a_report_that_cannot_be_written_is_a_warning_and_the_work_stands(
    cohort, small_disk, tmp_path
):
    """The report's disk fills during the run: the stores are complete, the exit status
    says so, one warning names the report (not its temporary file) and the cause."""
    report = small_disk / "run.json"
    fill(small_disk, leave_kb=0)
    run = run_cli("embed", *cohort, *RUN, "--report", report)
    assert run.returncode == 0, run.stderr
    said = [line for line in run.stderr.splitlines() if line.startswith("tilestore:")]
    assert said == [
        f"tilestore: warning: {report}: the run's report was not written (No space left on "
        "device); the run's outcome stands as its exit status says"
    ]
    assert "report:" not in run.stdout
    for store in cohort:
        group = zarr.open_group(store / group_of(store, LITE), mode="r")
        assert group.attrs["tilestore"]["complete"]
    assert sorted(p.name for p in small_disk.iterdir()) == ["filler"]


def test_a_run_refused_after_the_door_writes_its_report_saying_so(cohort, tmp_path):
    report = tmp_path / "run.json"
    run = run_cli("embed", *cohort, *RUN, "--shard", "4/4", "--report", report)
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        "tilestore: error: --shard 4/4: K must be in 0..N-1 (e.g. $SLURM_ARRAY_TASK_ID)"
    ]
    saved = json.loads(report.read_text())
    assert (saved["outcome"], saved["exit_code"]) == ("damaged input", 2)
    assert saved["error"] == "shard='4/4': K must be in 0..N-1 (e.g. $SLURM_ARRAY_TASK_ID)"
