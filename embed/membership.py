"""Which Dask workers a cohort had: those at the start, those lost (and the slices they were
running, which Dask runs again elsewhere), those that joined, and replacements asked for.

A worker lost on a cluster of SLURM jobs (a job cancelled, preempted, out of time) does not
come back by itself: dask-jobqueue's cluster still counts the dead job in its spec, so
neither `scale(jobs=N)` nor `adapt()` asks for another. `Membership` watches the scheduler
from a thread; when a worker goes and its cluster started it as a job, the dead job is
dropped from the cluster's spec and the cluster scaled back to what it had: SLURM gets a
new job. Not at once: a job's own nanny (dask-jobqueue starts one in each) restarts a worker
that died inside a healthy job (a memory limit, a crash), under the same name at a new
address; so a replacement is asked only if the name is not back within the cluster's
lost-worker timeout (``distributed.deploy.lost-worker-timeout``, 15 s), SpecCluster's own
rule for closing a job whose worker is gone. A worker the cluster started as a nanny
restarts by itself; where the client has no cluster object (a scheduler address), nothing
can be asked and the report says the cohort ran short.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class WorkerEvent:
    """A worker lost or joined, `after_s` seconds into the cohort."""

    name: str
    address: str
    after_s: float
    running: list[str] = field(default_factory=list)  # its task keys when it was lost
    replacement: str | None = None  # what was asked of the cluster for a lost one


@dataclass
class Membership:
    """The workers of a cohort run, followed every `every` seconds until `stop()`.

    client: the cohort's Dask client. replace: ask the client's cluster for a new worker for
    each one lost and not back within `grace` seconds (None: the cluster's lost-worker
    timeout). say: where a line about a loss or a join goes (None: nowhere). clock: seconds
    that only go up (a test passes a fake one to move past the grace without waiting).
    """

    client: Any
    replace: bool = True
    say: Callable[[str], None] | None = None
    every: float = 1.0
    grace: float | None = None
    clock: Callable[[], float] = time.perf_counter
    started: float | None = None  # None: the clock's time when made
    at_start: dict[str, str] = field(default_factory=dict)  # address -> name
    alive: dict[str, str] = field(default_factory=dict)
    lost: list[WorkerEvent] = field(default_factory=list)
    joined: list[WorkerEvent] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.grace is None:
            import dask

            timeout = dask.config.get("distributed.deploy.lost-worker-timeout", "15s")
            self.grace = dask.utils.parse_timedelta(timeout)
        if not 0 <= self.grace < float("inf"):  # NaN too: a loss would never be acted on
            raise ValueError(f"grace={self.grace!r}: seconds, 0 or more")
        if self.started is None:
            self.started = self.clock()
        self.at_start = self._workers()
        self.alive = dict(self.at_start)
        self._running: dict[str, list[str]] = {}
        self._pending: dict[str, tuple[WorkerEvent, float]] = {}  # name -> (loss, when to ask)
        self._replaced: dict[Any, str] = {}  # a dead job's key -> the worker it was asked for
        self._stop = threading.Event()
        self._unreachable = False
        self._thread = threading.Thread(target=self._follow, name="tilestore-workers", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop following (the cohort is done); take a last look."""
        self._stop.set()
        self._thread.join(timeout=10)
        self._look_or_say()
        for event, _ in self._pending.values():  # the cohort ended before it was asked
            event.replacement = f"not asked: the cohort ended within {self.grace:g} s of the loss"
        self._pending.clear()

    def _follow(self) -> None:
        while not self._stop.wait(self.every):
            self._look_or_say()

    def _look_or_say(self) -> None:
        try:
            self.look()
        except (OSError, TimeoutError, RuntimeError) as exc:  # the scheduler unreachable
            if not self._unreachable:
                self._unreachable = True  # said once, not every second
                self._say(f"cannot ask the scheduler for its workers ({exc}); trying on")
        else:
            self._unreachable = False

    def look(self) -> None:
        """Compare the scheduler's workers with the last look: losses, joins, replacements."""
        now = self._workers()
        running = self.client.processing()
        for address in sorted(set(self.alive) - set(now)):
            name = self.alive.pop(address)
            event = WorkerEvent(name, address, self._after(), self._running.get(address, []))
            self.lost.append(event)  # kept whatever asking for a replacement does
            if self.replace:  # asked once it has not come back (a job's nanny restarts it)
                event.replacement = self._unaskable(name)
                if event.replacement is None:
                    self._pending[name] = (event, self.clock() + self.grace)
            self._say(self.line_lost(event))
        for address in sorted(set(now) - set(self.alive)):
            self.alive[address] = now[address]
            event = WorkerEvent(now[address], address, self._after())
            self.joined.append(event)
            self._say(f"worker {event.name} ({address}) joined; {len(self.alive)} alive")
        self._running = {a: list(keys) for a, keys in running.items()}
        self._settle(set(now.values()))

    def _settle(self, names: set[str]) -> None:
        """The losses waiting for their name to come back: back (its nanny restarted it in
        its job), or past the grace: a replacement asked."""
        for name, (event, due) in list(self._pending.items()):
            if name in names:
                event.replacement = "none needed: its nanny restarted it"
            elif self.clock() >= due:
                event.replacement = self._replace(name)
            else:
                continue
            del self._pending[name]
            self._say(f"worker {name} ({event.address}): replacement: {event.replacement}")

    def _workers(self) -> dict[str, str]:
        """The scheduler's workers, asked of it: not through `client.scheduler_info()`,
        which races with the client's own refresh of the same cache (every 2 s, without
        workers); a look that lost the race took every worker for lost, and had healthy ones
        cancelled as dead (seen under the one-node SLURM; 15 of 300 reads short here)."""
        info = self.client.sync(self.client.scheduler.identity, n_workers=-1)["workers"]
        return {address: str(w.get("name", address)) for address, w in info.items()}

    def _after(self) -> float:
        return round(self.clock() - self.started, 1)

    def _replace(self, name: str) -> str:
        """Ask the cluster for a worker in place of `name`; say what was done."""
        unaskable = self._unaskable(name)
        if unaskable:
            return unaskable
        cluster = self.client.cluster
        key = self._key(name)
        cluster.loop.add_callback(_respec, cluster, key)  # the cluster's own thread
        self._replaced[key] = name
        return "a new worker asked of the cluster"

    def _unaskable(self, name: str) -> str | None:
        """Why no worker can be asked in place of `name` (said as its replacement), or None."""
        cluster = getattr(self.client, "cluster", None)
        if getattr(cluster, "worker_spec", None) is None:
            return "none: the client has no cluster object to ask (a scheduler address)"
        key = self._key(name)
        if key is None or key in self._replaced:  # a dead job's name is never given again
            key = next((k for k in self._replaced if name == str(k) or name.startswith(f"{k}-")),
                       None)  # fmt: skip
            if key is not None:  # another worker process of the same job asked for it
                return f"the new job asked for {self._replaced[key]} (its job's) stands for it"
            return "none: the cluster no longer plans this worker (scaled down)"
        from distributed import Nanny

        if isinstance(getattr(cluster, "workers", {}).get(key), Nanny):
            return "its nanny restarts it"
        if str(getattr(cluster, "status", "")).endswith(("closing", "closed")):
            return "none: the cluster is closing"
        if not all(hasattr(cluster, a) for a in ("_i", "_new_worker_name", "loop")):
            return "none: the cluster does not number its workers as SpecCluster does"
        return None

    def _key(self, name: str):
        """The cluster's plan entry (a job) that started the worker `name`, or None."""
        planned = list(self.client.cluster.worker_spec)  # a copy: its thread may change it
        return next((k for k in planned if name == str(k) or name.startswith(f"{k}-")), None)

    def _say(self, line: str) -> None:
        if self.say:
            self.say(line)

    def line_lost(self, event: WorkerEvent) -> str:
        tasks = (
            f", {len(event.running)} task(s) it was running go to others" if event.running else ""
        )
        if event.replacement:
            replacement = event.replacement
        elif event.name in self._pending:
            replacement = f"asked if it is not back within {self.grace:g} s"
        else:
            replacement = "not asked"
        return (
            f"worker {event.name} ({event.address}) lost after {event.after_s:g} s{tasks}; "
            f"replacement: {replacement}; {len(self.alive)} alive"
        )

    def status(self) -> str:
        """For a progress line: the workers alive, and lost if any."""
        lost = f", {len(self.lost)} lost" if self.lost else ""
        return f"{len(self.alive)} worker(s) alive{lost}"

    def to_json(self) -> dict[str, Any]:
        return {
            "at_start": len(self.at_start),
            "at_end": len(self.alive),
            "lost": [asdict(e) for e in self.lost],
            "joined": [asdict(e) for e in self.joined],
        }


def _respec(cluster, key) -> None:
    """Drop a dead worker's entry from a SpecCluster's plan and scale back to as many
    entries as before, the new one under a name the cluster does not hold: the dead job is
    closed and a new worker (a new SLURM job) started.

    SpecCluster names a new entry by the lowest number free in its plan, the dead job's own
    name: the cluster then took the entry for the dead job's object, still among its
    workers, and submitted nothing (found under the one-node SLURM). So the numbering skips
    every name the cluster holds, and the dead one's (whose object the cluster may have
    closed already): a name lost is never a live job's again."""
    from distributed.deploy.spec import SpecCluster

    planned = len(cluster.worker_spec)
    cluster.worker_spec.pop(key, None)
    held = set(cluster.worker_spec) | set(cluster.workers) | {key}  # the dead one's: never again
    while cluster._new_worker_name(cluster._i) in held:  # SpecCluster's own counter
        cluster._i += 1
    SpecCluster.scale(cluster, planned)  # entries (jobs), not workers: jobqueue's counts workers
