"""Ctrl-C and SIGTERM stop a command with one line saying what is kept, in a log too, and
embed's report written with the same facts.

`tilestore embed` runs on the real CMU store with its output in a file (as under SLURM or
nohup), and gets the signal once it has written a batch. Before, typer turned the
KeyboardInterrupt into a silent exit 130 and SIGTERM killed the process without a word."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import zarr

from tests.conftest import CMU, group_of

INTERRUPTED = (
    "tilestore: interrupted ({signal}): 0 of 1 store(s) finished; {kept:,} tiles of cmu.ome.zarr "
    "kept; the same command carries on from there"
)


def _done(group) -> int:
    return int(np.asarray(zarr.open_array(group / "done", mode="r")[:]).sum())


def _default_sigint() -> None:
    """SIGINT as a terminal delivers it: a shell starts a background job (`cmd &`) with
    SIGINT ignored, its children inherit that, and Python then never raises
    KeyboardInterrupt (a suite run in the background would see the signal ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_stops_embed_saying_what_is_kept(tmp_path, stores, signum):
    store = tmp_path / "cmu.ome.zarr"
    shutil.copytree(stores(CMU), store)
    log = tmp_path / "log"
    command = [sys.executable, "-m", "tilestore.cli", "embed", store, "--model"]
    command += ["efficientnet-lite0", "--device", "cpu", "--batch-size", "2"]
    command += ["--min-tissue", "0", "--stride", "56"]  # 1,800 tiles: minutes to run whole
    command += ["--report", tmp_path / "reports" / "run.json"]
    with log.open("w") as out:
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=env, preexec_fn=_default_sigint
        )
    try:  # the first progress line of a log comes 30 s into the run
        deadline = time.monotonic() + 240
        while "done in" not in log.read_text() and time.monotonic() < deadline:
            assert process.poll() is None, log.read_text()
            time.sleep(0.1)
        process.send_signal(signum)
        code = process.wait(timeout=180)  # the batch in flight ends first; a busy CI is slow
    finally:
        process.kill()
    lines = log.read_text().strip().splitlines()
    assert code == 128 + signum, lines
    group = store / group_of(store, "efficientnet-lite0")
    kept = _done(group) * 2  # batches of 2 tiles, the last one (short) never reached
    assert kept > 0
    # the line says what was finished and what was kept, the report says the same
    assert lines[-1] == INTERRUPTED.format(signal=signal.Signals(signum).name, kept=kept)
    report = json.loads((tmp_path / "reports" / "run.json").read_text())
    assert (report["outcome"], report["exit_code"]) == ("interrupted", 128 + signum)
    assert report["interrupted"] == signal.Signals(signum).name
    assert report["finished"] == [] and report["kept"] == {str(store): kept}
    progress = re.match(r"embedding with efficientnet-lite0: ([\d,]+) of ([\d,]+) done", lines[0])
    tiles, total = (int(n.replace(",", "")) for n in progress.groups())
    # the batches done before the signal are kept, for the same command to resume from
    assert tiles // 2 <= _done(group) < total // 2
    assert not zarr.open_group(group, mode="r").attrs["tilestore"]["complete"]
