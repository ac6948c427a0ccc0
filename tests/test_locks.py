"""Lock files: taken by one process at a time, their holder read back and kept beating, and
taken for gone only where that is known (this host's dead pid) or where the heartbeat has
stopped (any host), past `locks.STALE`; the clock stood in for, never slept on."""

from __future__ import annotations

import datetime as dt
import json
import os
import socket
import subprocess
import sys
import threading
import warnings
from dataclasses import asdict, replace
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


def _beating(host: str, pid: int, age: float, silent: float) -> locks.Holder:
    """A holder that took its lock `age` seconds before NOW and last beat `silent` before."""
    iso = dt.datetime.fromtimestamp(NOW - silent, dt.UTC).isoformat(timespec="seconds")
    return replace(_holder(host, pid, age), beat=iso)


def _write(path: Path, holder: locks.Holder) -> None:
    path.write_text(json.dumps(asdict(holder)))


class Clock:
    """A wall clock that moves only when told."""

    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> float:
        return self.now


def test_a_live_holder_of_this_host_is_never_gone_whatever_its_silence():
    """A job SLURM suspended keeps its lock: this host can see its process is there."""
    me = _beating(socket.gethostname(), os.getpid(), age=10_000, silent=10_000)
    assert locks.gone(me, NOW) is None and locks.gone(me, NOW, 600) is None
    assert locks.gone(_holder(socket.gethostname(), os.getpid(), age=10_000), NOW) is None


def test_a_dead_pid_of_this_host_is_gone_at_once():
    dead = _beating(socket.gethostname(), _dead_pid(), age=1, silent=1)
    assert locks.gone(dead, NOW) == "its process is gone"
    assert locks.gone(dead, NOW, 600) == "its process is gone"


def test_another_hosts_lock_is_trusted_while_it_beats_and_gone_once_silent_past_stale():
    """Its pid cannot be asked here (a pid of this machine with the same number says
    nothing): its heartbeat is, whatever its age."""
    assert locks.STALE == 300 and locks.HEARTBEAT * 10 == locks.STALE
    long_running = _beating("node12", os.getpid(), age=7200, silent=30)
    assert locks.gone(long_running, NOW) is None
    assert locks.gone(_beating("node12", 4711, age=7200, silent=300), NOW) is None
    assert locks.gone(_beating("node12", 4711, age=7200, silent=301), NOW) == (
        "no heartbeat for 5 min"
    )
    assert locks.gone(_beating("node12", 4711, age=600, silent=420), NOW) == (
        "no heartbeat for 7 min"
    )
    # the compile cache's own limit, on the same heartbeat
    assert locks.gone(_beating("node-3", 99, age=7200, silent=599), NOW, 600) is None
    assert locks.gone(_beating("node-3", 99, age=7200, silent=601), NOW, 600) is not None


def test_a_lock_without_a_heartbeat_ages_by_when_it_was_taken():
    """A lock written before heartbeats (or by hand)."""
    assert locks.gone(_holder("node12", 4711, age=299), NOW) is None
    assert locks.gone(_holder("node12", 4711, age=301), NOW) == "taken 301 s ago, more than 300 s"
    assert locks.gone(_holder("node-3", 99, age=601), NOW, 600) == (
        "taken 601 s ago, more than 600 s"
    )


def test_a_damaged_lock_ages_by_its_files_time(tmp_path):
    path = tmp_path / "x.lock"
    path.write_text("{half a")
    os.utime(path, (NOW - 700, NOW - 700))
    holder = locks.read(path)
    assert holder.host is None and holder.age(NOW) == 700 and holder.silent(NOW) == 700
    assert locks.gone(holder, NOW, 800) is None
    assert locks.gone(holder, NOW) == "taken 700 s ago, more than 300 s"


def test_a_lock_written_by_hand_without_a_time_has_no_age(tmp_path):
    path = tmp_path / "x.lock"
    path.write_text(json.dumps({"host": "elsewhere", "pid": 1, "since": "now"}))
    holder = locks.read(path)
    assert holder.age(NOW) is None and locks.gone(holder, NOW, 1) is None


def test_a_held_lock_beats_with_the_holders_clock_and_stays_live(tmp_path):
    clock, path = Clock(), tmp_path / "x.lock"
    held = locks.hold(path, clock, every=3600)  # its thread sleeps: beats by hand here
    try:
        first = locks.read(path)
        assert first.beat == first.since and first.pid == os.getpid()
        clock.now += 400  # 13 beats missed would make it stale, were it another host's
        as_elsewhere = replace(first, host="node12")
        assert locks.gone(as_elsewhere, clock.now) == "no heartbeat for 7 min"
        assert held.beat() and held.lost is None
        beat = locks.read(path)
        assert (beat.since, beat.host, beat.pid) == (first.since, first.host, first.pid)
        assert beat.silent(clock.now) == 0 and beat.age(clock.now) == 400
        assert locks.gone(replace(beat, host="node12"), clock.now) is None
        assert not list(tmp_path.glob("*beat*"))  # written beside it, renamed over it
        assert locks.hold(path, clock) is None  # held: nobody else takes it
    finally:
        held.release()
    assert not path.exists()


def test_the_heartbeat_thread_beats_until_released(tmp_path):
    """The thread, not a test's hand: its beats show in the file (every 10 ms here)."""
    clock, path = Clock(), tmp_path / "x.lock"
    held = locks.hold(path, clock, every=0.01)
    clock.now += 60
    seen = threading.Event()
    for _ in range(1000):  # at most 10 s: a correctness check, not a timing one
        if locks.read(path).beat == locks.read(path).since:
            seen.wait(0.01)
            continue
        break
    assert locks.read(path).silent(clock.now) == 0
    held.release()
    assert not held._thread.is_alive() and not path.exists()


def test_a_stale_lock_is_claimed_with_a_line_saying_whose_and_why(tmp_path):
    clock, path = Clock(), tmp_path / ".s.ome.zarr.m.p.lock"
    _write(path, _beating("node12", 4711, age=3600, silent=420))
    held = locks.claim(path, clock=clock, every=3600)
    try:
        assert held.took_over == (
            f"took over the lock of node12:4711 (no heartbeat for 7 min): {path}"
        )
        assert locks.read(path).pid == os.getpid()
    finally:
        held.release()


def test_a_beating_lock_is_refused_unless_broken(tmp_path):
    clock, path = Clock(), tmp_path / ".s.ome.zarr.m.p.lock"
    live = _beating("node12", 4711, age=3600, silent=20)
    _write(path, live)
    with pytest.raises(locks.Locked) as refused:
        locks.claim(path, clock=clock, every=3600)
    assert refused.value.holder == live and refused.value.path == path
    assert locks.read(path) == live  # untouched
    held = locks.claim(path, force=True, clock=clock, every=3600)
    try:
        assert held.took_over == (
            f"took over the lock of node12:4711 (break_lock=True, its last heartbeat 20 s "
            f"ago): {path}"
        )
    finally:
        held.release()


def test_a_holder_whose_lock_was_taken_over_finds_it_lost_and_leaves_the_new_one(tmp_path):
    """A holder that comes back (a suspended job resumed) after its lock was broken."""
    clock, path = Clock(), tmp_path / "x.lock"
    held = locks.hold(path, clock, every=3600)
    taker = subprocess.run(
        [sys.executable, "-c", TAKE_OVER, str(path)], capture_output=True, text=True, check=True
    )
    new = locks.read(path)
    assert new.pid == int(taker.stdout) and "break_lock=True" in taker.stderr
    assert not held.beat() and held.lost == f"{path} was taken over by {new.name}"
    held.release()
    assert locks.read(path) == new  # the other's, left in place


TAKE_OVER = """
import sys, os
from pathlib import Path
from tilestore import locks
held = locks.claim(Path(sys.argv[1]), force=True, every=3600)
print(os.getpid()); print(held.took_over, file=sys.stderr)
os._exit(0)  # its lock left behind, as a process that died holding it
"""


def test_a_lock_held_for_a_run_that_is_gone_is_taken_over_once_its_holder_has_ended(tmp_path):
    """A store process holds a slide's lock for its run (`caller`): while both run, the lock
    is theirs; the run killed, it is gone though its holder may run on for a moment (a store
    process ends a tenth of a second after its run), and it is taken over once the holder
    has ended, never while it may still write."""
    run = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.0)"])
    threading.Thread(target=holder.wait, daemon=True).start()  # reaped as it ends
    path = tmp_path / "store.lock"
    taken = dt.datetime.now(dt.UTC).isoformat()
    mine = locks.Holder(socket.gethostname(), holder.pid, taken, taken, caller=run.pid)
    path.write_text(json.dumps(asdict(mine)))
    try:
        assert locks.read(path) == mine
        assert locks.gone(mine, locks.time.time()) is None
        with pytest.raises(locks.Locked):
            locks.claim(path)
    finally:
        run.kill()
        run.wait()
    why = locks.gone(mine, locks.time.time())
    assert why == f"the run it wrote for, pid {run.pid}, is gone" and holder.poll() is None
    held = locks.claim(path)
    try:
        assert holder.poll() is not None  # waited for: it had ended first
        assert held.took_over.startswith(f"took over the lock of {mine.name} ({why})")
        assert locks.read(path).pid == os.getpid() and locks.read(path).caller is None
    finally:
        held.release()


def test_a_holder_whose_run_is_gone_but_that_does_not_end_keeps_its_lock(tmp_path, monkeypatch):
    """Its run gone, a holder still running past `locks.ENDING_S` (stopped, stuck in I/O)
    may still write: the lock is refused, not taken over under it."""
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        taken = dt.datetime.now(dt.UTC).isoformat()
        path = tmp_path / "store.lock"
        stuck = locks.Holder(socket.gethostname(), holder.pid, taken, taken, _dead_pid())
        path.write_text(json.dumps(asdict(stuck)))
        monkeypatch.setattr(locks, "ENDING_S", 0.3)
        assert locks.gone(stuck, locks.time.time()).startswith("the run it wrote for")
        with pytest.raises(locks.Locked):
            locks.claim(path)
        assert locks.read(path) == stuck  # left as it was
    finally:
        holder.kill()
        holder.wait()


def test_a_lock_that_beat_since_it_was_read_is_not_cleared(tmp_path):
    path = tmp_path / "x.lock"
    silent = _beating("node12", 4711, age=3600, silent=400)
    _write(path, silent)
    _write(path, replace(silent, beat=dt.datetime.fromtimestamp(NOW, dt.UTC).isoformat()))
    locks.clear(path, silent)
    assert path.exists()


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
    from tilestore.plan import PlanOptions, plan_over_tissue, save_plan
    from tilestore.reading import open_slide

    slide = open_slide(store_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TilestoreWarning)
        save_plan(slide, plan_over_tissue(slide, PlanOptions(mpp=0.5, tile=224)))
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
    from tilestore.plan import PlanOptions, plan_over_tissue, save_plan
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
        again = plan_over_tissue(
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
