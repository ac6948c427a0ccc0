"""Lock files: taken by one process at a time, their holder read back, and taken for gone
only where that is known (this host's dead pid) or, with an age limit, past it."""

from __future__ import annotations

import datetime as dt
import json
import os
import socket
import subprocess
import sys

from tilestore import locks

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
