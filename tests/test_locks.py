"""Lock files: taken by one process at a time, their holder read back, and taken for gone
only where that is known (this host's dead pid) or, with an age limit, past it."""

from __future__ import annotations

import datetime as dt
import json
import os
import socket
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from tests.conftest import CMU, run_cli
from tilestore import locks
from tilestore.errors import StoreError, TilestoreWarning

NOW = 1_700_000_000.0


def _dead_pid() -> int:
    """The pid of a process of this host that has exited."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _holder(host: str, pid: int, age: float) -> locks.Holder:
    """A holder that took its lock `age` seconds before NOW."""
    return locks.Holder(host, pid, dt.datetime.fromtimestamp(NOW - age, dt.UTC).isoformat())


def test_one_process_takes_a_lock_and_the_file_says_who(tmp_path):
    path = tmp_path / "entry.bin.lock"
    assert locks.take(path, lambda: NOW)
    assert not locks.take(path)  # held: nobody else takes it
    holder = locks.read(path)
    assert (holder.host, holder.pid) == (socket.gethostname(), os.getpid())
    assert holder.age(NOW + 5) == 5 and holder.name == f"{socket.gethostname()}:{os.getpid()}"
    locks.release(path)
    assert locks.read(path) is None and locks.take(path)


def test_a_live_holder_of_this_host_is_never_gone_whatever_its_age_without_a_limit():
    me = _holder(socket.gethostname(), os.getpid(), age=10_000)
    assert locks.gone(me, NOW) is None
    assert locks.gone(me, NOW, max_age=600) == "taken 10000 s ago, more than 600 s"


def test_a_dead_pid_of_this_host_is_gone_at_once():
    dead = _holder(socket.gethostname(), _dead_pid(), age=1)
    assert locks.gone(dead, NOW) == "its process is gone"
    assert locks.gone(dead, NOW, max_age=600) == "its process is gone"


def test_another_hosts_lock_is_trusted_until_the_age_limit():
    """Its pid cannot be asked here: a pid of this machine with the same number says nothing."""
    other = _holder("another-node", os.getpid(), age=599)
    assert locks.gone(other, NOW) is None  # no limit: trusted for ever (embeddings)
    assert locks.gone(other, NOW, max_age=600) is None
    assert locks.gone(_holder("another-node", 1, age=601), NOW, max_age=600) is not None


def test_a_damaged_lock_ages_by_its_files_time(tmp_path):
    path = tmp_path / "x.lock"
    path.write_text("{half a")
    os.utime(path, (NOW - 700, NOW - 700))
    holder = locks.read(path)
    assert holder.host is None and holder.age(NOW) == 700
    assert locks.gone(holder, NOW) is None and locks.gone(holder, NOW, max_age=600)


def test_a_lock_written_by_hand_without_a_time_has_no_age(tmp_path):
    path = tmp_path / "x.lock"
    path.write_text(json.dumps({"host": "elsewhere", "pid": 1, "since": "now"}))
    holder = locks.read(path)
    assert holder.age(NOW) is None and locks.gone(holder, NOW, max_age=1) is None


def test_a_stale_lock_taken_over_by_another_meanwhile_is_left_alone(tmp_path):
    path = tmp_path / "x.lock"
    dead = _holder(socket.gethostname(), _dead_pid(), age=1)
    assert locks.take(path)  # the lock now: a live process's, not the dead one read before
    locks.clear(path, dead)
    assert path.exists()
    locks.release(path)


# A second process holding an embeddings group's lock on a store, as a run does while it
# writes: the real writer, made and left open until its stdin closes.
HOLD = """
import sys
from tilestore.embeddings.write import EmbeddingWriter, RunIdentity
from tilestore.plan import load_plan
from tilestore.reading import open_slide

slide = open_slide(sys.argv[1])
plan, uid = load_plan(slide, None)
model = {"name": "held", "weights": "w", "weights_sha256": "0" * 64, "output_dim": 4}
writer = EmbeddingWriter(slide, plan, uid, RunIdentity(model, 8, "float32", "fp32", False))
print("holding", flush=True)
sys.stdin.read()
writer.abandon()
"""


def _planned(store_path: Path) -> Path:
    from tilestore.plan import PlanOptions, plan_slide, save_plan
    from tilestore.reading import open_slide

    slide = open_slide(store_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TilestoreWarning)
        save_plan(slide, plan_slide(slide, PlanOptions(mpp=0.5, tile=224)))
    return store_path


def _tree(folder: Path) -> list[tuple[str, int, int]]:
    """Every file of a folder with its size and time: what "untouched" means."""
    return sorted(
        (str(p.relative_to(folder)), p.stat().st_size, p.stat().st_mtime_ns)
        for p in folder.rglob("*")
        if p.is_file()
    )


@pytest.fixture
def held(store):
    """A store (CMU, planned) whose embeddings lock a live second process holds, and that
    process; the lock released at the end."""
    path = _planned(store())
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "holding"
        yield path, holder
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)


def test_a_store_being_embedded_is_named_by_its_lock_whatever_the_groups_name(held, tmp_path):
    path, holder = held
    found = locks.store_writer(path)
    assert found is not None
    lock, who = found
    assert lock.name.startswith(f".{path.name}.") and lock.parent == path.parent
    assert (who.pid, who.host) == (holder.pid, socket.gethostname())
    # a store whose name only begins with this one's is not being written
    assert locks.store_writer(path.parent / path.name.removesuffix(".zarr")) is None
    # nor is a store whose lock's holder died (this host, its pid gone)
    other = tmp_path / "other.ome.zarr"
    other.mkdir()
    dead = tmp_path / ".other.ome.zarr.some-model.some-plan.lock"
    dead.write_text(json.dumps({"host": socket.gethostname(), "pid": _dead_pid(), "since": "x"}))
    assert locks.store_writer(other) is None


def test_convert_overwrite_reshard_plan_and_tissue_refuse_a_store_being_embedded(held, slide_path):
    """The reproducer: `convert --overwrite` while `embed` wrote the store lost its data and
    the run reported success. Now each command that would replace or change the store
    refuses in one line naming the holder, before any work, and the store is untouched."""
    from tilestore.conversion import convert, reshard
    from tilestore.masks import compute_tissue, write_tissue
    from tilestore.plan import PlanOptions, plan_slide, save_plan
    from tilestore.reading import open_slide

    path, holder = held
    before = _tree(path)
    named = rf"a run is writing into it \(pid {holder.pid} on {socket.gethostname()} since "
    with pytest.raises(StoreError, match=named):
        convert(slide_path(CMU), path, overwrite=True)
    with pytest.raises(StoreError, match=named):
        reshard(path)
    slide = open_slide(path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TilestoreWarning)
        again = plan_slide(
            slide, PlanOptions(mpp=0.5, tile=224, min_tissue=0.9, name="0.5mpp-224px")
        )
        mask = compute_tissue(slide)
    with pytest.raises(StoreError, match=named):
        save_plan(slide, again, overwrite=True)
    with pytest.raises(StoreError, match=named):
        write_tissue(slide, mask)
    assert _tree(path) == before
    assert list(path.parent.glob(".*partial*")) == []  # nothing left behind
    # the command as a user runs it: one line, exit 2
    done = run_cli("convert", slide_path(CMU), "-o", path, "--overwrite")
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and f"pid {holder.pid}" in done.stderr
    assert _tree(path) == before


def test_once_the_run_has_ended_convert_overwrite_replaces_the_store(held, slide_path):
    from tilestore.conversion import convert

    path, holder = held
    holder.stdin.close()
    holder.wait(timeout=60)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TilestoreWarning)
        assert convert(slide_path(CMU), path, overwrite=True).store == path
    assert locks.store_writer(path) is None
