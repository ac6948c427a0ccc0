"""The compile cache's entries: keyed, checked before use, replaced when bad, never trusted
blindly. torch's artifact functions are stood in for here; tests/embed/test_engine.py runs
the real ones through a compiled run."""

from __future__ import annotations

import datetime as dt
import json
import os
import socket
import subprocess
import sys

import pytest
import torch

from tilestore import locks
from tilestore.embed.compilecache import CompileCache, Waiting, cache_key

MODEL = {"name": "timm:vit_tiny", "repo": None, "revision": None, "weights": "w", "transform": {}}


@pytest.fixture
def artifacts(monkeypatch):
    loaded = []
    monkeypatch.setattr(torch.compiler, "save_cache_artifacts", lambda: (b"compiled graphs", {}))
    monkeypatch.setattr(torch.compiler, "load_cache_artifacts", lambda data: loaded.append(data))
    return loaded


def test_saved_then_loaded_by_the_next_process(tmp_path, artifacts):
    key = cache_key(MODEL, 64, 224, "bf16", "cpu")
    first = CompileCache(tmp_path, key)
    assert first.load() == f"compile cache: none yet at {tmp_path}"
    assert first.save().startswith(f"compile cache: saved {first.path}")
    sidecar = json.loads(first.sidecar.read_text())
    assert sidecar["key"] == key and sidecar["bytes"] == len(b"compiled graphs")
    second = CompileCache(tmp_path, key)
    assert second.load().startswith(f"compile cache: loaded {first.path}")
    assert artifacts == [b"compiled graphs"] and second.save() is None  # nothing new


def test_other_shapes_precision_or_software_are_other_entries(tmp_path, artifacts):
    base = cache_key(MODEL, 64, 224, "bf16", "cpu")
    CompileCache(tmp_path, base).save()
    for other in (
        cache_key(MODEL, 128, 224, "bf16", "cpu"),
        cache_key(MODEL, 64, 256, "bf16", "cpu"),
        cache_key(MODEL, 64, 224, "fp32", "cpu"),
        {**base, "torch": "2.0.0"},
        {**base, "model": {**MODEL, "weights": "other"}},
    ):
        assert CompileCache(tmp_path, other).load().startswith("compile cache: none yet")
    assert torch.__version__ == base["torch"] and base["input"] == [64, 224, 224, 3]


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        (lambda c: c.path.write_bytes(b"other bytes"), "its bytes changed since written"),
        (lambda c: c.sidecar.write_text("{"), "unreadable"),
        (
            lambda c: c.sidecar.write_text(json.dumps({"key": {"model": "x"}, "sha256": ""})),
            "made for another model, shape or software",
        ),
    ],
)
def test_a_bad_entry_is_ignored_with_a_note_and_replaced(tmp_path, artifacts, damage, why):
    key = cache_key(MODEL, 64, 224, "bf16", "cpu")
    CompileCache(tmp_path, key).save()
    damage(CompileCache(tmp_path, key))
    cache = CompileCache(tmp_path, key)
    assert why in cache.load() and artifacts == [] and not cache.loaded
    assert cache.save().startswith("compile cache: saved")  # the next run's entry is good
    assert CompileCache(tmp_path, key).load().startswith("compile cache: loaded")


def test_an_entry_torch_refuses_is_ignored(tmp_path, monkeypatch, artifacts):
    key = cache_key(MODEL, 64, 224, "bf16", "cpu")
    CompileCache(tmp_path, key).save()

    def refuse(data):
        raise RuntimeError("artifacts of another torch build")

    monkeypatch.setattr(torch.compiler, "load_cache_artifacts", refuse)
    note = CompileCache(tmp_path, key).load()
    assert "ignored (torch refused it: artifacts of another torch build)" in note


# -- one compile per array: the lock beside the entry ----------------------------------------


class Clock:
    """A wall clock that moves only when a waiter sleeps; `on_sleep` plays the other
    processes (called with the clock's time after each sleep)."""

    def __init__(self, on_sleep=None) -> None:
        self.now, self.slept, self.on_sleep = 1_700_000_000.0, 0, on_sleep

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.slept += 1
        if self.on_sleep is not None:
            self.on_sleep(self.now)

    def waiting(self, **limits) -> Waiting:
        return Waiting(clock=lambda: self.now, sleep=self.sleep, **limits)


def _lock_of(cache: CompileCache, host: str, pid: int, taken: float) -> None:
    since = dt.datetime.fromtimestamp(taken, dt.UTC).isoformat()
    cache.lock.write_text(json.dumps({"host": host, "pid": pid, "since": since}))


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _entry(tmp_path, clock: Clock) -> CompileCache:
    return CompileCache(tmp_path, cache_key(MODEL, 64, 224, "bf16", "cpu"), clock.waiting())


def test_the_first_process_takes_the_lock_compiles_and_gives_it_back(tmp_path, artifacts):
    clock = Clock()
    cache, said = _entry(tmp_path, clock), []
    note = cache.claim(said.append)
    assert (
        note
        == f"compile cache: none yet at {tmp_path}; compiled here (others wait on {cache.lock})"
    )
    holder = locks.read(cache.lock)
    assert cache.holding and holder.pid == os.getpid() and holder.age(clock.now) == 0
    cache.save()
    cache.release()
    assert not cache.lock.exists() and said == [] and clock.slept == 0


def test_a_waiter_says_once_whom_it_waits_for_then_loads_what_it_saved(tmp_path, artifacts):
    clock = Clock()
    holder = _entry(tmp_path, clock)
    _lock_of(holder, "node-7", 4242, clock.now - 12)  # compiling for 12 s already

    def compiled_at_30_s(now):
        if clock.slept == 30:
            holder.save()
            locks.release(holder.lock)

    clock.on_sleep = compiled_at_30_s
    waiter, said = _entry(tmp_path, clock), []
    note = waiter.claim(said.append)
    assert said == [f"waiting for node-7:4242 compiling {waiter.path} (for 12 s so far)"]
    assert note == f"compile cache: waited 30 s for node-7:4242, then loaded {waiter.path}"
    assert waiter.loaded and not waiter.holding and artifacts == [b"compiled graphs"]


def test_a_lock_left_by_a_dead_process_of_this_host_is_taken_over(tmp_path, artifacts):
    clock = Clock()
    cache = _entry(tmp_path, clock)
    dead = _dead_pid()
    _lock_of(cache, socket.gethostname(), dead, clock.now - 5)
    note = cache.claim()
    host = socket.gethostname()
    assert note.endswith(f"compiled here, {host}:{dead}'s lock taken over (its process is gone)")
    assert cache.holding and locks.read(cache.lock).pid == os.getpid() and clock.slept == 0


def test_a_holder_that_dies_while_others_wait_leaves_one_of_them_to_compile(tmp_path, artifacts):
    clock = Clock()
    cache = _entry(tmp_path, clock)
    _lock_of(cache, socket.gethostname(), os.getppid(), clock.now)  # alive, for now
    dead = _dead_pid()
    clock.on_sleep = lambda now: _lock_of(cache, socket.gethostname(), dead, now - 3)
    note = _entry(tmp_path, clock).claim()
    assert "compiled here" in note and "taken over (its process is gone)" in note
    assert clock.slept == 1


def test_another_hosts_lock_is_waited_on_and_past_the_limit_compiled_anyway(tmp_path, artifacts):
    clock = Clock()
    cache = _entry(tmp_path, clock)
    _lock_of(cache, "node-3", 99, clock.now - 1)
    waiter = CompileCache(tmp_path, cache.key, clock.waiting(stale_after=600, limit=60, poll=5))
    said = []
    note = waiter.claim(said.append)
    assert said == [f"waiting for node-3:99 compiling {waiter.path} (for 1 s so far)"]
    assert note == (
        f"compile cache: waited 65 s for node-3:99 compiling {waiter.path}; compiled here "
        "anyway (past the wait limit, 60 s)"
    )
    assert not waiter.holding and locks.read(cache.lock).host == "node-3"  # not its to take
    waiter.release()
    assert cache.lock.exists()


def test_another_hosts_lock_older_than_the_limit_is_taken_over(tmp_path, artifacts):
    clock = Clock()
    cache = _entry(tmp_path, clock)
    _lock_of(cache, "node-3", 99, clock.now - 601)
    note = cache.claim()
    assert note.endswith("node-3:99's lock taken over (taken 601 s ago, more than 600 s)")
    assert cache.holding


def test_an_entry_written_just_before_the_lock_was_taken_is_loaded(tmp_path, artifacts):
    """Between a process's look (no entry) and its lock, the holder saved and released."""
    clock = Clock()
    cache = _entry(tmp_path, clock)
    real_take = locks.take

    def slow_take(path, now, caller=None):
        if not cache.path.exists():
            _entry(tmp_path, Clock()).save()
        return real_take(path, now, caller)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(locks, "take", slow_take)
        note = cache.claim()
    assert note.startswith("compile cache: waited 0 s, then loaded") and cache.loaded
    assert not cache.holding and not cache.lock.exists()


def test_models_compile_without_a_cache_is_refused_before_the_model_loads(monkeypatch):
    from tilestore.embed import Options, compile_ahead, compileahead
    from tilestore.errors import OptionError

    monkeypatch.setattr(compileahead, "Embedder", None)  # the model is never loaded
    with pytest.raises(OptionError, match=r"compile_cache='off': there is no cache to fill"):
        compile_ahead("random:test_vit", Options(compile_cache="off"))
