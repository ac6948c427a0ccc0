"""One exit-status rule for every way a cohort runs (`tilestore.embed.outcome`)."""

from __future__ import annotations

import json
import shutil

import pytest
import zarr
from hypothesis import given
from hypothesis import strategies as st

from tests.conftest import CMU, IHC, group_of, run_cli
from tests.corpus import rewrite_chunk
from tilestore.embed.outcome import exit_code
from tilestore.reading.opening import open_slide


@given(st.integers(0, 50), st.integers(0, 50))
def test_the_rule(done, failed):
    code = exit_code(done, failed)
    if failed == 0:
        assert code == 0  # nothing failed (an empty share included)
    elif done == 0:
        assert code == 2  # nothing done: as a refused command
    else:
        assert code == 3  # some done, some failed


@pytest.mark.slow
def test_one_corrupt_store_of_two_exits_3_and_names_it(tmp_path, stores):
    good, bad = tmp_path / "good.ome.zarr", tmp_path / "bad.ome.zarr"
    shutil.copytree(stores(IHC, mpp=0.5), good)
    shutil.copytree(stores(CMU), bad)
    reader = open_slide(bad).chunks(0)
    for row in range(reader.grid[0]):
        for col in range(reader.grid[1]):
            rewrite_chunk(bad, lambda _: b"\xff\xd8 not a jpeg", row=row, col=col)
    run = run_cli("embed", good, bad, "--model", "efficientnet-lite0", "--device", "cpu",
                  "--batch-size", "8", "--report", tmp_path / "run.json")  # fmt: skip
    assert run.returncode == 3, run.stderr
    report = json.loads((tmp_path / "run.json").read_text())
    assert (report["outcome"], report["exit_code"]) == ("partial", 3)
    assert report["finished"] == [str(good)]
    assert [f["store"] for f in report["failures"]] == [str(bad)]
    errors = [line for line in run.stderr.splitlines() if line.startswith("tilestore: error")]
    assert len(errors) == 1 and errors[0].startswith(f"tilestore: error: {bad}")
    group = zarr.open_group(good / group_of(good, "efficientnet-lite0"), mode="r")
    assert group.attrs["tilestore"]["complete"]


def test_every_store_refused_is_nothing_done_in_the_exit_status_and_the_report(tmp_path, stores):
    """Refused from their metadata, before a model is loaded: exit 2, each store named."""
    given = [tmp_path / "a.ome.zarr", tmp_path / "b.ome.zarr"]
    for store in given:
        shutil.copytree(stores(CMU), store)
    run = run_cli("embed", *given, "--model", "efficientnet-lite0", "--plan", "none-such",
                  "--report", tmp_path / "run.json")  # fmt: skip
    assert run.returncode == 2
    assert [line.split(": ")[2] for line in run.stderr.splitlines()] == [str(s) for s in given]
    report = json.loads((tmp_path / "run.json").read_text())
    assert (report["outcome"], report["exit_code"]) == ("nothing done", 2)
    assert [f["store"] for f in report["failures"]] == [str(s) for s in given]
    assert report["finished"] == report["slides"] == []
