"""A lock left by a dead job on another node (a SLURM task requeued elsewhere after a node
failure): taken over by the next run once its heartbeat has stopped for `locks.STALE`, with
a line saying whose; refused while it beats, `status` naming its path and the command that
breaks it (`--break-lock`), which does."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import sys
import time
from pathlib import Path

from tests.cli.test_status import RUN, _cohort
from tests.conftest import group_of
from tests.conftest import run_cli as tilestore
from tests.tilestore.test_embeddings_status import LITE
from tilestore.embeddings.write import lock_file

CPU = ("--device", "cpu")
OFFLINE = {**os.environ, "HF_HUB_OFFLINE": "1"}


def _lock_of_node12(store: Path, silent: float) -> Path:
    """The store's embeddings lock as a job on node12 left it, its last beat `silent` s ago."""
    lock = lock_file(store, group_of(store, LITE))
    now = time.time()
    iso = lambda t: dt.datetime.fromtimestamp(t, dt.UTC).isoformat(timespec="seconds")  # noqa: E731
    lock.write_text(json.dumps({"host": "node12", "pid": 4711, "since": iso(now - 7200),
                                "beat": iso(now - silent)}))  # fmt: skip
    return lock


def _embed(*args) -> object:
    return tilestore("embed", *args, *CPU, env=OFFLINE)


def test_a_lock_whose_heartbeat_stopped_is_taken_over_with_a_line(
    embedded_cohort, stores, tmp_path
):
    done, half, _ = _cohort(embedded_cohort, stores, tmp_path / "cohort")
    lock = _lock_of_node12(half, silent=600)
    status = tilestore("status", done, half, "--model", LITE)
    assert status.returncode == 1 and "0 running" in status.stdout  # a dead job's: partial
    command = f"tilestore embed {half} --model {LITE} {RUN} --plan classes"
    assert command in status.stdout
    ran = _embed(half, "--model", LITE, *RUN.split(), "--plan", "classes")
    assert ran.returncode == 0, ran.stderr
    said = [line for line in ran.stderr.splitlines() if "took over" in line]
    took = (
        rf"took over the lock of node12:4711 \(no heartbeat for 1\d min\): {re.escape(str(lock))}"
    )
    assert len(said) == 2, ran.stderr  # said as it happens, and in the run's summary
    assert re.fullmatch(rf"tilestore: warning: b\.ome\.zarr: {took}", said[0]), said
    assert re.fullmatch(rf"WARNING: {re.escape(str(half))}: {took}", said[1]), said
    assert not lock.exists()  # released at the end, as its own
    after = tilestore("status", done, half, "--model", LITE)
    assert after.returncode == 0 and "2 stores: 2 complete," in after.stdout


def test_a_beating_lock_is_refused_named_and_broken_by_the_command_status_prints(
    embedded_cohort, stores, tmp_path
):
    done, half, _ = _cohort(embedded_cohort, stores, tmp_path / "cohort")
    lock = _lock_of_node12(half, silent=20)
    status = tilestore("status", done, half, "--model", LITE)
    assert status.returncode == 1, status.stderr
    (row,) = [line for line in status.stdout.splitlines() if line.startswith(str(half))]
    assert " running " in row and "written by pid 4711 on node12 for 120 min" in row
    assert re.search(r", its last heartbeat \d+ s ago; its lock: ", row)  # 20 s, and the wait
    assert row.endswith(f"its lock: {lock}")
    breaking = f"tilestore embed {half} --model {LITE} {RUN} --plan classes --break-lock"
    lines = status.stdout.splitlines()
    at = lines.index(f"  {breaking}")
    assert lines[at - 1].startswith("1 running: they finish on their own") and lines[
        at - 1
    ].endswith("if that job is dead, now:")
    as_json = json.loads(tilestore("status", done, half, "--model", LITE, "--json").stdout)
    assert as_json["if_dead"] == [breaking]
    assert as_json["stores"][1]["lock"]["path"] == str(lock)
    # without --break-lock: refused, in one line naming the lock and the flag
    refused = _embed(half, "--model", LITE, *RUN.split(), "--plan", "classes")
    assert refused.returncode == 2, refused.stderr
    (line,) = [line for line in refused.stderr.splitlines() if "node12" in line]
    assert "is being written by pid 4711 on node12" in line and "last heartbeat" in line
    assert f"rerun with --break-lock (or delete {lock})" in line
    assert json.loads(lock.read_text())["pid"] == 4711  # untouched
    # the command status printed, as a user pastes it
    broke = tilestore(*breaking.split()[1:], *CPU, env=OFFLINE)
    assert broke.returncode == 0, broke.stderr
    said = [line for line in broke.stderr.splitlines() if "took over" in line]
    assert len(said) == 2 and said[0].startswith(
        "tilestore: warning: b.ome.zarr: took over the lock of node12:4711 (--break-lock, its last "
        "heartbeat "
    )
    assert said[0].endswith(f"): {lock}") and not lock.exists()
    assert tilestore("status", done, half, "--model", LITE).returncode == 0
    assert sys.executable  # the CLI ran under this interpreter (run_cli)
