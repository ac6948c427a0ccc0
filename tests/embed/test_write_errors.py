"""Write errors in a run (issue 63): a full disk, a read-only folder, a file where a folder
must be. The slide hit stops at once, in one line naming the store, the group and the cause
and the fix (`tilestore.format.store.write_fault`); the stores on a file system found full or
read-only are not attempted, each named; the others go on; the exit status and the report
count what was completed; nothing left reads as complete. The same line and exit status in
one process and on Dask. Real file systems: a tmpfs (`small_disk`), a read-only bind mount,
a file where the model's folder must be; each test skips where it cannot make its own."""

from __future__ import annotations

import errno
import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import zarr

from tests.conftest import CMU, fill, run_cli
from tilestore import locks
from tilestore.embeddings.write import EmbeddingWriter
from tilestore.errors import EmbeddingError, TilestoreWarning, WriteFailed
from tilestore.format.store import write_fault

LITE = "efficientnet-lite0"
PLAN = "0.5mpp-224px"
GROUP = f"embeddings/{LITE}/{PLAN}"
COMMON = ("--model", LITE, "--device", "cpu", "--batch-size", "8")
HOW = {"one process": (), "dask": ("--cluster", "local", "--workers", "1")}
FULL = "No space left on device; free space (or raise the quota), then run the same command"


def _copy(stores, folder: Path, name: str) -> Path:
    """A planned copy of the CMU store (its plan stored: only the embeddings are written)."""
    target = folder / f"{name}.ome.zarr"
    shutil.copytree(stores(CMU), target)
    assert run_cli("plan", target, "--mpp", "0.5", "--tile", "224").returncode == 0
    return target


def _errors(run) -> list[str]:
    return [line for line in run.stderr.splitlines() if "error" in line]


def _complete(store: Path) -> bool:
    try:
        group = zarr.open_group(store / GROUP, mode="r")
    except (FileNotFoundError, zarr.errors.GroupNotFoundError, NotADirectoryError):
        return False
    # a group whose making stopped has no record yet: the next run makes it again
    return bool(group.attrs.get("tilestore", {}).get("complete"))


def _status(*stores: Path) -> dict[str, dict]:
    run = run_cli("status", *stores, "--model", LITE, "--json")
    return {row["store"]: row for row in json.loads(run.stdout)["stores"]}


# -- the one judgement -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "fix", "filesystem"),
    [
        (errno.ENOSPC, "free space (or raise the quota), then run", True),
        (errno.EDQUOT, "raise the quota (or free space), then run", True),
        (errno.EROFS, "write on a writable file system", True),
        (errno.EACCES, "give this user write permission there", False),
        (errno.EPERM, "chattr -i", False),
        (errno.ENOTDIR, "move that file aside", False),
        (errno.EEXIST, "move that file aside", False),
        (errno.EISDIR, "move that folder aside", False),
        (errno.EIO, "", False),
    ],
)
def test_each_write_error_has_its_cause_fix_and_owner(tmp_path, code, fix, filesystem):
    (tmp_path / "embeddings").write_text("")  # in the way, for the blocked paths
    error = OSError(code, errno.errorcode[code], str(tmp_path / "embeddings" / "m" / "zarr.json"))
    fault = write_fault(error)
    assert fault.code == errno.errorcode[code]
    assert fault.filesystem is filesystem and (fault.state != "") is filesystem
    assert fix in fault.fix if fix else fault.fix == ""
    if code == errno.ENOTDIR:  # the file in the way named, not the file written
        assert f"({tmp_path / 'embeddings'} is a file where a folder must be)" in fault.cause


def test_a_writer_whose_group_was_not_made_refuses_to_write(tmp_path, stores):
    """The cause of "AttributeError: 'EmbeddingWriter' object has no attribute 'per_shard'":
    a writer used after its group's making failed; now one line saying so."""
    from tilestore.embeddings import RunIdentity
    from tilestore.plan import load_plan
    from tilestore.reading.opening import open_slide

    store = _copy(stores, tmp_path, "a")
    (store / "embeddings").mkdir()
    (store / "embeddings" / LITE).write_text("in the way")
    slide = open_slide(store)
    plan, uid = load_plan(slide, PLAN)
    identity = RunIdentity({"name": LITE, "output_dim": 4}, 8, "float32", "fp32", False)
    writer = EmbeddingWriter(slide, plan, uid, identity, create=False)
    with pytest.raises(WriteFailed, match=r"Not a directory \(.* is a file where a folder"):
        writer.create()
    with pytest.raises(EmbeddingError, match=r"was not made \(its making failed\)"):
        writer.write(0, __import__("numpy").zeros((8, 4), "float32"))
    assert writer.abandon() == ""  # nothing made: nothing to say, the lock released
    assert not list(tmp_path.glob(".a.ome.zarr.*.lock"))


# -- a file where the model's folder must be ------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("how", HOW, ids=list(HOW))
def test_a_blocked_group_path_fails_that_store_alone_in_one_line(tmp_path, stores, how):
    blocked, good = _copy(stores, tmp_path, "a"), _copy(stores, tmp_path, "b")
    (blocked / "embeddings").mkdir()
    (blocked / "embeddings" / LITE).write_text("in the way")
    immutable = subprocess.run(["chattr", "+i", str(blocked / "embeddings" / LITE)],
                               capture_output=True).returncode == 0  # fmt: skip
    try:
        report = tmp_path / "run.json"
        run = run_cli("embed", blocked, good, *COMMON, "--plan", PLAN, *HOW[how],
                      "--report", report)  # fmt: skip
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(blocked / "embeddings" / LITE)], check=True)
    assert run.returncode == 3, run.stdout + run.stderr  # one complete, one failed
    assert "internal error" not in run.stderr
    (line,) = _errors(run)
    assert re.fullmatch(
        rf"tilestore: error: {re.escape(str(blocked))}: writing embeddings/{LITE}/{PLAN}: Not "
        rf"a directory \({re.escape(str(blocked / 'embeddings' / LITE))} is a file where a "
        r"folder must be\); move that file aside, then run the same command: what was "
        r"written before is kept",
        line,
    ), line
    assert _complete(good) and not _complete(blocked)
    failures = json.loads(report.read_text())["failures"]
    assert [(f["store"], f["cause"]) for f in failures] == [(str(blocked), "ENOTDIR")]
    status = _status(blocked, good)
    assert status[str(blocked)]["state"] == "blocked"  # not "not started"
    assert str(blocked / "embeddings" / LITE) in status[str(blocked)]["note"]


# -- a full disk: its stores stop, the others go on ---------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("how", HOW, ids=list(HOW))
def test_a_full_disk_stops_its_stores_and_the_others_go_on(tmp_path, stores, small_disk, how):
    first, second = _copy(stores, small_disk, "a"), _copy(stores, small_disk, "b")
    other = _copy(stores, tmp_path, "c")  # another file system
    filler = fill(small_disk, leave_kb=8)  # the first group's making fills it
    report = tmp_path / "run.json"
    run = run_cli("embed", first, second, other, *COMMON, "--plan", PLAN, *HOW[how],
                  "--report", report)  # fmt: skip
    assert run.returncode == 3, run.stdout + run.stderr
    assert "internal error" not in run.stderr
    lines = _errors(run)
    assert len(lines) == 2, lines
    assert re.fullmatch(
        rf"tilestore: error: {re.escape(str(first))}: writing (embeddings/{LITE}/{PLAN}"
        rf"( \(its shard \d+\))?|its lock \S+): {re.escape(FULL)}: what was written before "
        r"is kept.*",
        lines[0],
    ), lines[0]
    assert lines[1] == (
        f"tilestore: error: {second}: not attempted: its file system is full (writing into "
        f"{first} failed: No space left on device); {FULL.split('; ', 1)[1]}"
    )
    assert _complete(other) and not _complete(first) and not _complete(second)
    done = json.loads(report.read_text())
    assert [(f["store"], f["cause"]) for f in done["failures"]] == [
        (str(first), "ENOSPC"),
        (str(second), "ENOSPC"),
    ]
    embedded = [s for s in done["slides"] if not s.get("failed")]
    assert [s["store"] for s in embedded] == [str(other)]
    status = _status(first, second, other)
    assert status[str(other)]["state"] == "complete"
    for store in (first, second):  # nothing reads as complete; why a run would fail, said
        assert status[str(store)]["state"] in ("partial", "not started")
        assert "its file system is full" in status[str(store)]["note"]
    filler.unlink()
    again = run_cli("embed", first, second, other, *COMMON, "--plan", PLAN)
    assert again.returncode == 0, again.stderr
    assert _complete(first) and _complete(second)


# -- a folder made read-only mid-run: the slide stops at once ------------------------------------


@pytest.fixture
def bound(tmp_path):
    """A folder bound onto another of this file system (writable until `read_only()`), so
    a test can make it read-only mid-run as an archive's remount does; unbound after."""
    folder, under = tmp_path / "bound", tmp_path / "under"
    folder.mkdir()
    under.mkdir()
    made = subprocess.run(["mount", "--bind", str(under), str(folder)], capture_output=True)
    if made.returncode:
        pytest.skip(f"cannot bind-mount here: {made.stderr.decode().strip()}")
    yield folder
    subprocess.run(["umount", "-l", str(folder)], check=False)


@pytest.mark.slow
def test_a_folder_made_read_only_mid_run_stops_its_slide_at_once(
    tmp_path, stores, bound, lite, monkeypatch
):
    """Two stores on a bind mount made read-only after the first one's first shard, one
    beside it on the same device, writable: the first stops at its next shard (the batches
    after it not computed, but for those already in the pipeline), the second is written
    whole before or fails read-only (not attempted: not computed at all), the third
    completes."""
    from collections import Counter

    from tilestore.embed import runner
    from tilestore.embed.engine import embed
    from tilestore.embed.runner import Runner
    from tilestore.embed.settings import Options

    first, second = _copy(stores, bound, "a"), _copy(stores, bound, "b")
    other = _copy(stores, tmp_path, "c")
    computed: Counter = Counter()
    compute = Runner._compute_batch

    def counted(self, run, item, waited):
        for piece in item.pieces():  # a slide's batch, packed with others' or not
            computed[piece.job.store.name] += 1
        return compute(self, run, item, waited)

    shards = first / "embeddings" / LITE / PLAN / "features" / "c"

    def then_read_only(done, total):  # told after each batch is written (by a store process)
        if not computed["ro"] and shards.is_dir() and any(shards.iterdir()):
            computed["ro"] = 1  # the first's first shard is in place: the mount goes read-only
            subprocess.run(["mount", "-o", "remount,ro,bind", str(bound)], check=True)

    monkeypatch.setattr(Runner, "_compute_batch", counted)
    monkeypatch.setattr(runner, "STORE_LANES", 4)  # the pipeline shorter than the slide
    # 12 batches of 4 tiles a store, 2 a shard; a pipeline of prefetch + 2 = 3 batches
    options = Options(device="cpu", precision="fp32", dtype="float32", batch_size=4,
                      shard_tiles=8, prefetch=1)  # fmt: skip
    report = embed(
        [first, second, other], lite, plan=PLAN, options=options, progress=then_read_only
    )
    errors = {f["store"]: f for f in report.failures}
    assert set(errors) - {str(second)} == {str(first)}
    assert errors[str(first)]["cause"] == "EROFS"
    assert re.fullmatch(
        rf"writing embeddings/{LITE}/{PLAN} \(its shard 1\): Read-only file system; write on "
        r"a writable file system \(or remount this one read-write\), then run the same "
        r"command: what was written before is kept \(2 of 12 batches of .* are written and "
        r"kept: rerun the same command to resume\)",
        errors[str(first)]["error"],
    ), errors[str(first)]["error"]
    # the second is opened, and its batches written on a lane of their own, beside the
    # first's (`store_jobs`, `Lanes`): written whole before the remount, or found read-only
    # by its own group or writes, or, opened after the first's failure, not attempted (and
    # then not computed at all); never half-written and marked complete
    if str(second) in errors:
        said = errors[str(second)]["error"]
        assert "read-only file system" in said.lower(), said
        if said.startswith("not attempted"):
            assert computed[second.name] == 0
        assert not _complete(second)
    else:
        assert _complete(second), (report.finished, report.slides, report.warnings, report.kept)
    # at once: the shard that failed held batches 2-3; after it at most what the pipeline
    # holds (a batch ready, the output slots the GPU loop and the lanes hold)
    assert 4 <= computed[first.name] <= 4 + 1 + 2 + runner.STORE_LANES < 12
    assert computed[other.name] == 12
    assert _complete(other) and not _complete(first)
    subprocess.run(["mount", "-o", "remount,rw,bind", str(bound)], check=True)
    # the locks could not be removed from the read-only folder: they name the run's store
    # processes, ended with the run, so a later run on this host takes them over
    left = sorted(bound.glob(".*.lock"))
    assert left and all(locks.gone(locks.read(lock), time.time()) for lock in left)
    with pytest.warns(TilestoreWarning, match=r"took over the lock of .*\(its process is gone\)"):
        again = embed([first, second], lite, plan=PLAN, options=options)
    assert not again.failures and _complete(first) and _complete(second)
    assert again.slides[0]["skipped_done"] == 8  # the 2 batches kept of the first: resumed
