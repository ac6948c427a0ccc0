"""A full disk while a command writes into a store: one line naming the store and what was
being written, nothing half-made left behind (a half-saved plan was once taken for a plan,
and the rerun refused), every file the store had as it was, and the same command finishing
once there is space. On a tmpfs of its own (skipped where none can be mounted)."""

from __future__ import annotations

import shutil

import pytest

from tests.conftest import CMU, fill, run_cli

FIX = "No space left on device; free space (or raise the quota), then run the same command"


def _files(store):
    return {str(p.relative_to(store)): p.read_bytes() for p in store.rglob("*") if p.is_file()}


@pytest.mark.parametrize(
    ("command", "written", "made"),
    [
        (["tissue"], "labels/tissue", "labels/tissue"),
        (["plan", "--mpp", "0.5", "--tile", "224"], "plan '0.5mpp-224px'", "plans/0.5mpp-224px"),
    ],
    ids=["tissue", "plan"],
)
def test_a_full_disk_is_one_line_and_leaves_nothing_half_made(
    small_disk, stores, command, written, made
):
    store = shutil.copytree(stores(CMU), small_disk / "cmu.ome.zarr")
    if command[0] == "plan":  # the mask first: the plan's write is the one that fails
        assert run_cli("tissue", store).returncode == 0
    before = _files(store)
    filler = fill(small_disk, leave_kb=8)
    run = run_cli(command[0], store, *command[1:])
    assert run.returncode == 2, run.stdout + run.stderr
    errors = [line for line in run.stderr.splitlines() if line]
    assert errors == [f"tilestore: error: cmu.ome.zarr: writing {written}: {FIX}: what was "
                      "written before is kept"]  # fmt: skip
    assert not (store / made).exists()  # nothing half-made to be taken for one
    after = _files(store)
    assert {k: after.get(k) for k in before} == before  # what the store had, as it was
    filler.unlink()
    again = run_cli(command[0], store, *command[1:])
    assert again.returncode == 0, again.stderr
    assert (store / made / "zarr.json").exists()
