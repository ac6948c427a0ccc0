"""A run's report as a file (`tilestore.embed.reportfile`): whole or not at all, replacing the
one before, its failure a warning naming the report; and the words of an interrupted run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from tilestore.embed.outcome import OUTCOMES, interrupted_code, outcome
from tilestore.embed.reportfile import brief_report, ended, kept_said, write_report
from tilestore.errors import TilestoreWarning


def test_a_report_replaces_the_one_before_whole_and_leaves_no_part(tmp_path):
    path = tmp_path / "run-3.json"
    path.write_text('{"attempt": 1}')  # a requeued task's previous attempt
    assert write_report(path, ended(brief_report("m"), 0)) is True
    assert json.loads(path.read_text())["outcome"] == "complete"
    assert [p.name for p in tmp_path.iterdir()] == ["run-3.json"]
    assert oct(path.stat().st_mode & 0o777) == oct(0o666 & ~_umask())  # as any file made


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_a_report_on_a_full_disk_is_a_warning_naming_it_and_leaves_the_old_one(
    small_disk, tmp_path
):
    from tests.conftest import fill

    path = small_disk / "run.json"
    path.write_text('{"attempt": 1}')
    fill(small_disk, leave_kb=0)
    with pytest.warns(TilestoreWarning) as said:
        assert write_report(path, ended(brief_report("m", note="x" * 100_000), 0)) is False
    assert [str(w.message) for w in said] == [
        f"{path}: the run's report was not written (No space left on device); the run's "
        "outcome stands as its exit status says"
    ]
    assert sorted(p.name for p in small_disk.iterdir()) == ["filler", "run.json"]
    assert json.loads(path.read_text()) == {"attempt": 1}  # whole, the old one


def test_the_report_says_how_the_run_ended_in_the_tables_words():
    assert [ended({}, code)["outcome"] for code in (0, 3, 2, 130, 143)] == [
        "complete", "partial", "nothing done", "interrupted", "interrupted",
    ]  # fmt: skip
    assert ended({}, 2, refused=True)["outcome"] == "damaged input"
    assert (interrupted_code("SIGINT"), interrupted_code("SIGTERM")) == (130, 143)
    assert outcome(interrupted_code("SIGTERM")) == "interrupted"
    assert set(OUTCOMES) == {0, 2, 3}


def test_an_interrupted_run_names_the_stores_finished_and_the_tiles_kept():
    data = {
        "finished": ["/c/b.ome.zarr"],
        "skipped": [{"store": "/c/a.ome.zarr", "why": "complete"}],
        "kept": {"/c/c.ome.zarr": 312, "/c/d.ome.zarr": 0},  # d: opened, nothing done
    }
    assert kept_said(data, 5) == (
        "2 of 5 store(s) finished (a.ome.zarr, b.ome.zarr); 312 tiles of c.ome.zarr kept"
    )
    assert kept_said(brief_report("m"), 3) == "0 of 3 store(s) finished"
    many = {"finished": [f"/c/{i}.ome.zarr" for i in range(7)]}
    assert kept_said(many, 9).startswith("7 of 9 store(s) finished (0.ome.zarr, ")
    assert kept_said(many, 9).endswith("4.ome.zarr, ...)")


def test_the_report_module_and_the_share_split_import_no_torch():
    """What an empty share or an all-skipped task runs before it ends."""
    code = (
        "import sys, tilestore.embed.reportfile, tilestore.embed.shares, "
        "tilestore.embed.preflight, tilestore.embed.outcome; "
        "print(sorted(m for m in ('torch', 'distributed', 'timm') if m in sys.modules))"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.strip() == "[]"


def test_signals_exit_128_plus_their_number():
    assert interrupted_code(signal.SIGTERM.name) == 128 + signal.SIGTERM
