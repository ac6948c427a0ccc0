"""Lock files: one process makes a thing while others keep off it or wait for it.

A lock is a small JSON file created atomically (O_CREAT | O_EXCL, which NFS 3 and later
honour): the host, pid and start time of its holder, and its heartbeat. Taken by the
writer of an embeddings group (`tilestore.embeddings.write`: one writer per store and
model) and by the process compiling a compile cache entry (`tilestore.embed.compilecache`:
one compile per SLURM array), each through `hold`, which keeps it beating.

The heartbeat: while it holds the lock, a daemon thread of its `Held` rewrites it every
`HEARTBEAT` seconds with ``beat``, the time now (written whole beside it and renamed over
it: a reader never sees half a lock). The beat is a field in the file, not the file's
mtime: the mtime of a file on NFS is the server's clock and a stat() may answer from the
client's attribute cache (up to a minute old), whereas the file's text is read fresh on
open (close-to-open consistency) and its times are the holder's clock, as ``since`` always
was: hosts' clocks must roughly agree, as NTP keeps them. The beat also makes `clear` safe:
a lock that beat again since it was read is not the one judged stale, and is left.

Whether its holder is gone, so the lock may be taken over, is decided here alone (`gone`):
a process of this host no longer running; or, from any host, a lock whose last beat is
older than `STALE` (ten missed beats; a lock of a version before heartbeats, by its start
time or, unreadable, its file's time). A process of this host still running is never
taken for gone (a job SLURM suspended keeps its lock; another host cannot see that). An
embeddings run with break_lock=True takes over whatever lock it finds (`claim`: the user's
word that its holder is dead). A holder whose lock was taken over finds so at its next beat
(`Held.lost`) and stops beating it. Whether a store is being written (`store_writer`) is
asked of the locks beside it by every command that would replace or change it under a run
(`refuse_while_written`).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from tilestore.errors import StoreError

HEARTBEAT = 30.0  # seconds between a holder's beats
STALE = 300.0  # a lock silent this long (ten missed beats) is taken for its holder's, dead


@dataclass(frozen=True)
class Holder:
    """Who holds a lock, as its file says (None: the file did not say, or was unreadable).
    beat: the holder's last heartbeat (None: a lock of a version before heartbeats)."""

    host: str | None
    pid: int | None
    since: str | None  # ISO 8601, UTC
    beat: str | None = None  # ISO 8601, UTC
    # the process this one holds it for (a run's store process holds its slides' locks for
    # the run): gone with it (None: it holds it for itself)
    caller: int | None = None

    @classmethod
    def me(cls, clock: Callable[[], float] = time.time, caller: int | None = None) -> Holder:
        """This process, from now (for `caller`, where given)."""
        now = _iso(clock())
        return cls(socket.gethostname(), os.getpid(), now, now, caller)

    @property
    def name(self) -> str:
        """host:pid, as a log names it."""
        return f"{self.host or '?'}:{self.pid or '?'}"

    def age(self, now: float) -> float | None:
        """Seconds since the lock was taken (None: its time is not known)."""
        return _seconds_since(self.since, now)

    def silent(self, now: float) -> float | None:
        """Seconds since the holder's last heartbeat; a lock without one (written before
        heartbeats, or damaged), since it was taken. None: neither time is known."""
        if self.beat is not None:
            return _seconds_since(self.beat, now)
        return self.age(now)

    def same_taking(self, other: Holder | None) -> bool:
        """Whether `other` is this holder's lock (whatever its beat since)."""
        return other is not None and (other.host, other.pid, other.since) == (
            self.host,
            self.pid,
            self.since,
        )


def take(path: Path, clock: Callable[[], float] = time.time, caller: int | None = None) -> bool:
    """Create the lock at `path` with this process as its holder (for `caller`); False where
    it exists. Nothing beats it: `hold` does that."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as fh:
        json.dump(asdict(Holder.me(clock, caller)), fh)
    return True


class Held:
    """A lock this process holds, and the daemon thread that beats it every `every`
    seconds until `release`. took_over: the line saying whose lock was taken over to get
    it (None: it was free). lost: why it is no longer ours (taken over by another, who
    found it silent or was told to break it; None while it is ours)."""

    def __init__(
        self,
        path: Path,
        clock: Callable[[], float] = time.time,
        every: float = HEARTBEAT,
        took_over: str | None = None,
    ) -> None:
        self.path, self.clock, self.every, self.took_over = path, clock, every, took_over
        self.holder = read(path) or Holder.me(clock)
        self.lost: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._beating, name=f"heartbeat {path.name}", daemon=True
        )
        self._thread.start()

    def beat(self) -> bool:
        """Write a fresh heartbeat into the lock, if it is still ours; False (and `lost`
        said) where another has taken it over or removed it."""
        found = read(self.path)
        if not self.holder.same_taking(found):
            who = f"by {found.name}" if found is not None else "(removed)"
            self.lost = f"{self.path} was taken over {who}"
            return False
        beating = replace(self.holder, beat=_iso(self.clock()))
        written = self.path.with_name(f"{self.path.name}.beat-{os.getpid()}")
        written.write_text(json.dumps(asdict(beating)))
        os.replace(written, self.path)
        self.holder = beating
        return True

    def _beating(self) -> None:
        while not self._stop.wait(self.every):
            try:
                if not self.beat():
                    return
            except OSError:  # a full disk, a file server away: the next beat tries again
                continue

    def release(self) -> None:
        """Stop beating and remove the lock (unless another took it over: then it is theirs)."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join()
        if self.lost is None and self.holder.same_taking(read(self.path)):
            self.path.unlink(missing_ok=True)


def hold(
    path: Path,
    clock: Callable[[], float] = time.time,
    every: float = HEARTBEAT,
    caller: int | None = None,
) -> Held | None:
    """Take the lock at `path` (`take`, for `caller`) and keep it beating; None where it
    exists."""
    return Held(path, clock, every) if take(path, clock, caller) else None


class Locked(Exception):
    """The lock at `path` is held by `holder`, who is not known to be gone."""

    def __init__(self, path: Path, holder: Holder) -> None:
        super().__init__(f"{path} is held by {holder.name}")
        self.path, self.holder = path, holder


def claim(
    path: Path,
    *,
    force: bool = False,
    clock: Callable[[], float] = time.time,
    every: float = HEARTBEAT,
    caller: int | None = None,
) -> Held:
    """Take the lock at `path` (for `caller`: `Holder`), taking over one whose holder is
    gone (`gone`) or, with force, any (break_lock=True: the user's word that its holder is
    dead); its `took_over` says whose and why. Locked where a holder not known to be gone
    keeps it."""
    took_over = None
    for _ in range(3):
        held = hold(path, clock, every, caller)
        if held is not None:
            held.took_over = took_over
            return held
        holder = read(path)
        if holder is None:  # released meanwhile
            continue
        why = gone(holder, clock())
        if why is None and force:
            silent = holder.silent(clock())
            why = "break_lock=True" + (
                f", its last heartbeat {span(silent)} ago" if silent is not None else ""
            )
        if why is None or not _ended(holder):
            raise Locked(path, holder)
        clear(path, holder)
        took_over = f"took over the lock of {holder.name} ({why}): {path}"
    raise Locked(path, read(path) or Holder(None, None, None))


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
        pid, caller = fields.get("pid"), fields.get("caller")
        return Holder(
            fields.get("host"),
            int(pid) if pid else None,
            fields.get("since"),
            fields.get("beat"),
            int(caller) if caller else None,
        )
    except (ValueError, TypeError, AttributeError):
        return Holder(None, None, _iso(mtime))


def gone(holder: Holder, now: float, stale: float = STALE) -> str | None:
    """Why the holder is taken for gone (the lock stale, to be taken over), or None where it
    may still hold it: a process of this host no longer running, or whose caller (the run it
    holds it for) is not; one of another host (or unknown) whose lock is silent longer than
    `stale` seconds (no heartbeat; a lock without one: taken that long ago). A process of
    this host still running for a caller still running is never gone (a store process ends
    within a tenth of a second of its run: `tilestore.workers`)."""
    if holder.host == socket.gethostname() and holder.pid:
        if not _running(holder.pid):
            return "its process is gone"
        if holder.caller and not _running(holder.caller):
            return f"the run it wrote for, pid {holder.caller}, is gone"
        return None
    silent = holder.silent(now)
    if silent is None or silent <= stale:
        return None
    if holder.beat is None:  # written before heartbeats (or damaged): its age
        return f"taken {silent:.0f} s ago, more than {stale:.0f} s"
    return f"no heartbeat for {span(silent)}"


ENDING_S = 2.0  # how long a process whose run is gone is given to end (it ends in 0.1 s)


def _ended(holder: Holder) -> bool:
    """Whether the holder has ended (or is not of this host, or holds it for itself), after
    waiting up to `ENDING_S` for one whose caller is gone: a store process whose run was
    killed ends within a tenth of a second of it, and may be writing until then
    (`tilestore.workers`); one that has not by then (stopped, stuck) keeps its lock."""
    if holder.host != socket.gethostname() or not holder.pid or not holder.caller:
        return True
    deadline = time.monotonic() + ENDING_S
    while _running(holder.pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True


def _running(pid: int) -> bool:
    """Whether a process of this host is running (another user's too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def clear(path: Path, holder: Holder) -> None:
    """Remove a stale lock, unless it changed since it was read (it beat again, or
    another process took it over first: that lock is live)."""
    if read(path) == holder:
        path.unlink(missing_ok=True)


def release(path: Path) -> None:
    """Remove our lock (one taken by `take`; a `Held` lock: `Held.release`)."""
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
    gone (`gone`: this host's dead pid, or no heartbeat for `STALE`) is not a writer, nor
    one this process holds (its own run: a plan or mask it saves before its groups)."""
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
        f"for it to finish, or if that job is dead, delete {lock} (a lock without a "
        f"heartbeat for {span(STALE)} is taken for dead)"
    )


def describe(holder: Holder, now: float) -> str:
    """How long the holder has held its lock and when it last beat, for a status line."""
    age, silent = holder.age(now), holder.silent(now)
    held = f" for {span(age)}" if age is not None else ""
    if holder.beat is None:
        return f"{held}, no heartbeat (an older version's lock)"
    return f"{held}, its last heartbeat {span(silent)} ago" if silent is not None else held


def glob_escape(name: str) -> str:
    """A file name as a glob pattern that matches it alone."""
    return "".join(f"[{c}]" if c in "*?[" else c for c in name)


def _iso(seconds: float) -> str:
    return dt.datetime.fromtimestamp(seconds, dt.UTC).isoformat(timespec="seconds")


def _seconds_since(when: str | None, now: float) -> float | None:
    try:
        then = dt.datetime.fromisoformat(when or "")
    except ValueError:
        return None
    if then.tzinfo is None:
        then = then.replace(tzinfo=dt.UTC)
    return now - then.timestamp()


def span(seconds: float) -> str:
    """A duration as a log says it: 45 s, 7 min, 3.2 h."""
    if seconds < 120:
        return f"{max(seconds, 0):.0f} s"
    if seconds < 3 * 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
