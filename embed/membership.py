"""Which Dask workers a cohort had: those at the start, those lost (and the slices they were
running, which Dask runs again elsewhere), those that joined, and replacements asked for.

A worker lost on a cluster of SLURM jobs (a job cancelled, preempted, out of time) does not
come back by itself: dask-jobqueue's cluster still counts the dead job in its spec, so
neither `scale(jobs=N)` nor `adapt()` asks for another. `Membership` watches the scheduler
from a thread; when a worker goes and its cluster started it as a job (not a nanny, which
restarts its worker itself), the dead job is dropped from the cluster's spec and the
cluster scaled back to what it had: SLURM gets a new job. Where the client has no cluster
object (a scheduler address), nothing can be asked and the report says the cohort ran short.
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
    each one lost. say: where a line about a loss or a join goes (None: nowhere).
    """

    client: Any
    replace: bool = True
    say: Callable[[str], None] | None = None
    every: float = 1.0
    started: float = field(default_factory=time.perf_counter)
    at_start: dict[str, str] = field(default_factory=dict)  # address -> name
    alive: dict[str, str] = field(default_factory=dict)
    lost: list[WorkerEvent] = field(default_factory=list)
    joined: list[WorkerEvent] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.at_start = self._workers()
        self.alive = dict(self.at_start)
        self._running: dict[str, list[str]] = {}
        self._stop = threading.Event()
        self._unreachable = False
        self._thread = threading.Thread(target=self._follow, name="tilestore-workers", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop following (the cohort is done); take a last look."""
        self._stop.set()
        self._thread.join(timeout=10)
        self._look_or_say()

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
            event.replacement = self._replace(name) if self.replace else None
            self._say(self.line_lost(event))
        for address in sorted(set(now) - set(self.alive)):
            self.alive[address] = now[address]
            event = WorkerEvent(now[address], address, self._after())
            self.joined.append(event)
            self._say(f"worker {event.name} ({address}) joined; {len(self.alive)} alive")
        self._running = {a: list(keys) for a, keys in running.items()}

    def _workers(self) -> dict[str, str]:
        """The scheduler's workers, asked of it: not `client.scheduler_info()`, which returns
        the client's cache, and the client's own refresh writes that cache every 2 s
        without workers; a look that read it then took every worker for lost, and had
        healthy ones cancelled as dead (seen under the one-node SLURM, 15 of 300 reads)."""
        info = self.client.sync(self.client.scheduler.identity, n_workers=-1)["workers"]
        return {address: str(w.get("name", address)) for address, w in info.items()}

    def _after(self) -> float:
        return round(time.perf_counter() - self.started, 1)

    def _replace(self, name: str) -> str:
        """Ask the cluster for a worker in place of `name`; say what was done."""
        cluster = getattr(self.client, "cluster", None)
        spec = getattr(cluster, "worker_spec", None)
        if spec is None:
            return "none: the client has no cluster object to ask (a scheduler address)"
        planned = list(spec)  # a copy: the cluster's own thread may change the plan meanwhile
        key = next((k for k in planned if name == str(k) or name.startswith(f"{k}-")), None)
        if key is None:
            return "none: the cluster no longer plans this worker (scaled down)"
        from distributed import Nanny

        if isinstance(getattr(cluster, "workers", {}).get(key), Nanny):
            return "its nanny restarts it"
        if str(getattr(cluster, "status", "")).endswith(("closing", "closed")):
            return "none: the cluster is closing"
        cluster.loop.add_callback(_respec, cluster, key)  # the cluster's own thread
        return "a new worker asked of the cluster"

    def _say(self, line: str) -> None:
        if self.say:
            self.say(line)

    def line_lost(self, event: WorkerEvent) -> str:
        tasks = (
            f", {len(event.running)} task(s) it was running go to others" if event.running else ""
        )
        return (
            f"worker {event.name} ({event.address}) lost after {event.after_s:g} s{tasks}; "
            f"replacement: {event.replacement or 'not asked'}; {len(self.alive)} alive"
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
    every name the cluster holds."""
    from distributed.deploy.spec import SpecCluster

    planned = len(cluster.worker_spec)
    cluster.worker_spec.pop(key, None)
    held = set(cluster.worker_spec) | set(cluster.workers)
    while cluster._new_worker_name(cluster._i) in held:  # SpecCluster's own counter
        cluster._i += 1
    SpecCluster.scale(cluster, planned)  # entries (jobs), not workers: jobqueue's counts workers
