"""A compiled model kept between processes: torch's portable cache artifacts, one file per
model, shapes, precision, GPU and software versions.

`torch.compile` spends 10-20 s on a ViT before the first batch; a SLURM array whose tasks
each embed one slide would pay that in every task. After the first compilation the
artifacts (Inductor's compiled graphs and autotuning results, `torch.compiler.
save_cache_artifacts`) are written to the cache folder; a later process loads them before
compiling (`load_cache_artifacts`), so Inductor finds its work done. The folder defaults to
the user's cache; on a cluster, a shared file system (`--compile-cache DIR`) serves every
node. Each file has a JSON sidecar with its key and the artifacts' SHA-256: an entry whose
key or bytes do not match, or that torch refuses, is ignored with a note and replaced.

One compile per array: the first process to find no entry takes a lock beside it
(`<entry>.lock`, `tilestore.locks`), compiles, saves and releases it; the others say once
that they wait for it, then load what it saved. A holder that died (this host: its pid
gone; another host: no heartbeat in its lock for `Waiting.stale_after`, `tilestore.locks`
deciding) is taken over by one waiter; a wait past `Waiting.limit` compiles anyway, with a
note.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tilestore import locks


def cache_key(model: dict[str, Any], batch: int, read: int, precision: str, device) -> dict:
    """Everything a compiled graph depends on: the model and its weights' identity, the
    batch's shape, precision, the device and the software that compiled it."""
    cuda = torch.device(device).type == "cuda"
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    return {
        "model": {k: model.get(k) for k in ("name", "repo", "revision", "weights", "transform")},
        "input": [batch, read, read, 3],
        "precision": precision,
        "device": torch.cuda.get_device_name(device) if cuda else "cpu",
        "capability": list(torch.cuda.get_device_capability(device)) if cuda else None,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": triton_version,
    }


@dataclass(frozen=True)
class Waiting:
    """How a process waits for another compiling the same entry.

    stale_after: a lock without a heartbeat for this long is taken for its holder's, dead
    (another host's pid cannot be asked; `tilestore.locks.gone`): its holder beats it every
    `locks.HEARTBEAT` seconds however long it compiles, so ten minutes is generous. limit: a
    waiter gives up after this and compiles itself. clock and sleep: stood in for in
    tests."""

    stale_after: float = 600.0
    limit: float = 1200.0
    poll: float = 1.0
    clock: Callable[[], float] = time.time
    sleep: Callable[[float], None] = time.sleep


class CompileCache:
    """The cache entry for one key in `folder`, and the lock of whoever compiles it."""

    def __init__(self, folder: Path, key: dict, waiting: Waiting | None = None) -> None:
        self.key = key
        digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
        self.path = Path(folder) / f"{key['model']['name'].replace('/', '-')}-{digest}.bin"
        self.sidecar = self.path.with_suffix(".json")
        self.lock = self.path.with_name(self.path.name + ".lock")
        self.waiting = waiting or Waiting()
        self.loaded = False
        self.held: locks.Held | None = None  # this process's lock: it compiles, saves, releases

    def claim(self, say: Callable[[str], None] | None = None) -> str:
        """Load the entry, or make this process the one that compiles it: where another
        holds the lock, wait (saying so once, through `say`) until its entry is written or
        its holder is gone. Say what happened, for the report; `release` after saving."""
        seen = self._written()
        note = self.load()
        if self.loaded:
            return note
        wait = self.waiting
        started, told, taken_over = wait.clock(), None, None
        while True:
            if self._written() not in (seen, None):  # written since: load it
                seen = self._written()
                if self._load_new():
                    return self._waited(told, started)
            self.held = locks.hold(self.lock, wait.clock)
            if self.held is not None:
                if self._written() not in (seen, None) and self._load_new():
                    return self._waited(told, started)
                return _compiles_here(note, self.lock, taken_over)
            holder = locks.read(self.lock)
            if holder is None:  # released meanwhile: look again
                continue
            now = wait.clock()
            why = locks.gone(holder, now, wait.stale_after)
            if why is not None:
                locks.clear(self.lock, holder)
                taken_over = f"{holder.name}'s lock taken over ({why})"
                continue
            if now - started > wait.limit:
                return (
                    f"compile cache: waited {now - started:.0f} s for {holder.name} compiling "
                    f"{self.path}; compiled here anyway (past the wait limit, "
                    f"{wait.limit:.0f} s)"
                )
            if told is None:
                told = holder
                age = holder.age(now)
                since = f" (for {age:.0f} s so far)" if age is not None else ""
                if say is not None:
                    say(f"waiting for {holder.name} compiling {self.path}{since}")
            wait.sleep(wait.poll)

    def release(self) -> None:
        """Give the lock back (after saving, or after the compile failed)."""
        if self.held is not None:
            self.held.release()
            self.held = None

    @property
    def holding(self) -> bool:
        """Whether this process holds the lock (it compiles, saves, releases)."""
        return self.held is not None

    def _load_new(self) -> bool:
        """Load an entry another process has just written; the lock, if held, is not
        needed then."""
        self.load()
        if self.loaded:
            self.release()
        return self.loaded

    def _written(self) -> tuple | None:
        """The entry's files' times and sizes (None: not both there): a change means a
        process wrote it."""
        try:
            stats = self.path.stat(), self.sidecar.stat()
        except FileNotFoundError:
            return None
        return tuple((s.st_mtime_ns, s.st_size) for s in stats)

    def _waited(self, holder: locks.Holder | None, started: float) -> str:
        waited = self.waiting.clock() - started
        by = f" for {holder.name}" if holder is not None else ""
        return f"compile cache: waited {waited:.0f} s{by}, then loaded {self.path}"

    def load(self) -> str:
        """Load the entry's artifacts into torch's caches (before compiling); say what
        happened, for the report."""
        if not self.path.exists():
            return f"compile cache: none yet at {self.path.parent}"
        try:
            meta = json.loads(self.sidecar.read_text())
            data = self.path.read_bytes()
        except (OSError, ValueError) as exc:
            return f"compile cache: {self.path} ignored (unreadable: {exc}); compiled afresh"
        if meta.get("key") != self.key:
            return f"compile cache: {self.path} ignored (made for another model, shape or software)"
        if meta.get("sha256") != hashlib.sha256(data).hexdigest():
            return f"compile cache: {self.path} ignored (its bytes changed since written)"
        try:
            torch.compiler.load_cache_artifacts(data)
        except Exception as exc:  # torch's own checks (versions, format) refuse it
            return f"compile cache: {self.path} ignored (torch refused it: {exc})"
        self.loaded = True
        return f"compile cache: loaded {self.path} (made {meta.get('made', '?')})"

    def save(self) -> str | None:
        """After the first compilation: write the artifacts (atomically; another task may
        write the same entry at once). None where there is nothing new to write."""
        if self.loaded:
            return None
        try:
            artifacts = torch.compiler.save_cache_artifacts()
        except Exception as exc:
            return f"compile cache: not saved ({type(exc).__name__}: {exc})"
        if not artifacts:
            return "compile cache: torch had no artifacts to save"
        data = artifacts[0]
        meta = {
            "key": self.key,
            "sha256": hashlib.sha256(data).hexdigest(),
            "made": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "bytes": len(data),
        }
        with contextlib.suppress(OSError):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            for target, content in ((self.path, data), (self.sidecar, json.dumps(meta, indent=1))):
                tmp = target.with_name(f".{target.name}.{os.getpid()}")
                tmp.write_bytes(content if isinstance(content, bytes) else content.encode())
                os.replace(tmp, target)
            return f"compile cache: saved {self.path} ({len(data) / 2**20:.1f} MB)"
        return f"compile cache: could not write {self.path}"


def _compiles_here(note: str, lock: Path, taken_over: str | None) -> str:
    """The note of the process that compiles: why (no entry, a bad one) and its lock."""
    if taken_over is None:
        return f"{note}; compiled here (others wait on {lock})"
    return f"{note}; compiled here, {taken_over}"
