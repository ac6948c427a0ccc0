"""Lock files: one process makes a thing while others keep off it or wait for it.

A lock is a small JSON file created atomically (O_CREAT | O_EXCL, which NFS 3 and later
honour): the host, pid and start time of its holder. Taken by the writer of an embeddings
group (`tilestore.embeddings.write`: one writer per store and model) and by the process
compiling a compile cache entry (`tilestore.embed.compilecache`: one compile per SLURM
array). A lock whose holder is known to be gone is stale and may be taken over: one from
this host whose pid is dead; with an age limit, one older than it, from any host (another
host's pid cannot be asked, so its lock is trusted until then; the time is the holder's
clock, written in the lock, so hosts' clocks must roughly agree, as NTP keeps them).
Whether a store is being written (`store_writer`) is asked of the locks beside it by every
command that would replace or change it under a run (`refuse_while_written`).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import socket
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from tilestore.errors import StoreError


@dataclass(frozen=True)
class Holder:
    """Who holds a lock, as its file says (None: the file did not say, or was unreadable)."""

    host: str | None
    pid: int | None
    since: str | None  # ISO 8601, UTC

    @classmethod
    def me(cls, clock: Callable[[], float] = time.time) -> Holder:
        """This process, from now."""
        now = dt.datetime.fromtimestamp(clock(), dt.UTC)
        return cls(socket.gethostname(), os.getpid(), now.isoformat(timespec="seconds"))

    @property
    def name(self) -> str:
        """host:pid, as a log names it."""
        return f"{self.host or '?'}:{self.pid or '?'}"

    def age(self, now: float) -> float | None:
        """Seconds since the lock was taken (None: its time is not known)."""
        try:
            since = dt.datetime.fromisoformat(self.since or "")
        except ValueError:
            return None
        if since.tzinfo is None:
            since = since.replace(tzinfo=dt.UTC)
        return now - since.timestamp()


def take(path: Path, clock: Callable[[], float] = time.time) -> bool:
    """Create the lock at `path` with this process as its holder; False where it exists."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as fh:
        json.dump(asdict(Holder.me(clock)), fh)
    return True


def read(path: Path) -> Holder | None:
    """The lock's holder; None where there is no lock. A lock being written, or damaged,
    says nothing but its file's time."""
    try:
        text = path.read_text()
        mtime = path.stat().st_mtime
    except FileNotFoundError:
        return None
    except OSError:
        return Holder(None, None, None)
    try:
        fields = json.loads(text)
        pid = fields.get("pid")
        return Holder(fields.get("host"), int(pid) if pid else None, fields.get("since"))
    except (ValueError, TypeError, AttributeError):
        written = dt.datetime.fromtimestamp(mtime, dt.UTC).isoformat(timespec="seconds")
        return Holder(None, None, written)


def gone(holder: Holder, now: float, max_age: float | None = None) -> str | None:
    """Why the holder is taken for gone (the lock stale, to be taken over), or None where it
    may still hold it: a process of this host no longer running, or (with max_age) a lock
    older than max_age seconds, from any host."""
    age = holder.age(now)
    if max_age is not None and age is not None and age > max_age:
        return f"taken {age:.0f} s ago, more than {max_age:.0f} s"
    if holder.host != socket.gethostname() or not holder.pid:
        return None
    try:
        os.kill(holder.pid, 0)
    except ProcessLookupError:
        return "its process is gone"
    except PermissionError:  # alive, another user's
        return None
    return None


def clear(path: Path, holder: Holder) -> None:
    """Remove a stale lock, unless it changed hands since it was read (another process took
    it over first: that lock is live)."""
    if read(path) == holder:
        path.unlink(missing_ok=True)


def release(path: Path) -> None:
    """Remove our lock."""
    path.unlink(missing_ok=True)


def store_writer(
    store: str | os.PathLike, clock: Callable[[], float] = time.time
) -> tuple[Path, Holder] | None:
    """The live lock of another process writing into the store at `store`, and its holder;
    None where none does. The one answer to "is this store being written" that every command
    replacing or changing a store asks (`refuse_while_written`).

    The locks are those beside the store, ``.<store>.*.lock`` (an embeddings group's writer,
    `tilestore.embeddings.write.lock_file`, whatever the group's name), except those of a
    store whose name only starts with this one's (``<store>.x``). A lock whose holder is
    gone (this host's dead pid: `gone`) is not a writer, nor one this process holds (its own
    run: a plan or mask it saves before its groups)."""
    target = Path(store)
    name = target.name
    others = [
        p.name for p in target.parent.glob(f"{glob_escape(name)}.*") if p.name != name
    ]  # sibling stores whose locks the glob below would match too
    now = clock()
    for lock in sorted(target.parent.glob(f".{glob_escape(name)}.*.lock")):
        if any(lock.name.startswith(f".{other}.") for other in others):
            continue
        holder = read(lock)
        if holder is None or gone(holder, now):
            continue
        if holder.host == socket.gethostname() and holder.pid == os.getpid():
            continue
        return lock, holder
    return None


def refuse_while_written(store: str | os.PathLike | None, doing: str) -> None:
    """StoreError, one line naming the lock and its holder, where another process is writing
    into the store (`store_writer`); `doing`: what was refused ("replacing it"). store None:
    a store that is not a local folder, which no lock guards."""
    if store is None:
        return
    found = store_writer(store)
    if found is None:
        return
    lock, holder = found
    raise StoreError(
        f"{store}: a run is writing into it (pid {holder.pid or '?'} on {holder.host or '?'} "
        f"since {holder.since or '?'}, {lock.name}); {doing} is refused while it runs: wait "
        f"for it to finish, or if that job is dead, delete {lock}"
    )


def glob_escape(name: str) -> str:
    """A file name as a glob pattern that matches it alone."""
    return "".join(f"[{c}]" if c in "*?[" else c for c in name)
