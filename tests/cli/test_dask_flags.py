"""`--cluster` and `--scheduler` are declared once (`tilestore.cli.dask`) for `embed` and `qc`:
the same flags, and the same one-line refusal of both at once, before any store is read."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest

from tilestore.cli.dask import CLUSTER, SCHEDULER
from tilestore.cli.embed import embed
from tilestore.cli.qc import qc


def test_embed_and_qc_take_the_one_declaration():
    for command in (embed, qc):
        parameters = inspect.signature(command).parameters
        assert parameters["cluster"].default is CLUSTER
        assert parameters["scheduler"].default is SCHEDULER


@pytest.mark.parametrize("command", [["qc"], ["embed", "--model", "efficientnet-lite0"]])
def test_both_at_once_is_one_line(command, tmp_path):
    run = subprocess.run(
        [sys.executable, "-m", "tilestore.cli", command[0], str(tmp_path / "none.ome.zarr"),
         *command[1:], "--cluster", "local", "--scheduler", "tcp://x:1"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 2
    assert run.stderr.strip().splitlines()[-1] == (
        "tilestore: error: --cluster starts a cluster, --scheduler joins one: give one"
    )
