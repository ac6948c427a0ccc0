"""Cohorts on many GPUs and nodes: slides (or slices of them) as Dask tasks.

The coordinator (this process) opens each store, makes or loads its plan and creates (or
resumes) its embeddings group, holding the group's lock; it then submits the store's
batches still to do as `Slice` tasks, largest slides first. Each Dask worker loads the
model once (`EmbedderPlugin`) and runs the slices it is handed through the usual
streaming engine. Slices are cut at shard boundaries, so two workers never write one
shard. When every slice of a store is done the coordinator marks it complete.

The coordinator hands the slices out as workers free, largest first, each to a worker it
picks (`_Feed`: the last ones go to the first GPU free, none queued behind another on a busy
one); Dask runs them: a task on a worker that
dies is run again elsewhere, and since a batch is marked done only after its features
are written, the rerun redoes exactly the batches the dead worker had not finished.
A slide that fails for its own reasons (a corrupt chunk) is reported and the cohort goes
on; rerunning the command skips every complete store.

Slide files (with `into`, a folder every worker reaches) are made ready on the workers:
each converted, with the tissue mask its plan reads, by a task (`make_ready`) that leaves
its worker's thread pool, in that worker's slide process (`SlidesPlugin`), as many at a
time as there are workers, the first ones sent before the workers load their model; the
coordinator plans each store as it lands and hands out its slices. So every worker's next
slide is made while its GPU embeds: what makes a cohort cost its model's time plus about
one slide's preparation in one process (1.02-1.05x on an H100, bench/RESULTS.md), here on
each worker (bench/embed_cohort.py --inputs stores,slides measures it).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import CancelledError
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from distributed import wait

from tilestore.conversion import pixel_count
from tilestore.cpus import usable_cpus
from tilestore.embed.daskworker import (
    PLUGIN,
    PREPARER,
    EmbedderPlugin,
    SlidesPlugin,
    make_ready,
    run_slices,
    worker_identity,
)
from tilestore.embed.filesystems import FileSystems
from tilestore.embed.inputs import Preparation, staged_from
from tilestore.embed.jobs import Slice
from tilestore.embed.membership import Membership
from tilestore.embed.models import ModelSpec, model_record
from tilestore.embed.opening import PlanChoice, prepare, tiles_of
from tilestore.embed.outcome import exit_code
from tilestore.embed.preflight import check_stores
from tilestore.embed.report import preparation_lines, quality_line
from tilestore.embed.settings import SLICE_TILES, TASK_SLICES, TASK_TILES, Options, SliceTiles
from tilestore.embed.shares import shard  # noqa: F401 (here before it moved: the light module)
from tilestore.embeddings import AlreadyComplete, EmbeddingWriter
from tilestore.errors import DeviceError, OptionError, StoreError, TilestoreError, WriteFailed
from tilestore.format.store import fault_named
from tilestore.options import Workers, checked
from tilestore.progress import AtLeast, LogLines, to_stderr
from tilestore.reading.resolution import OverrideMpp, ScanMpp
from tilestore.urls import is_url


def _size(store: str) -> int:
    """Level-0 pixels of a store or slide file (a cheap proxy for its work), read without
    writing anything; 0 if it cannot be opened, or is named by URL (not fetched here: its
    worker stages it)."""
    return 0 if is_url(store) else pixel_count(store)


def _given(path: str) -> Path | str:
    """An input as `Preparation` takes it: a path, or a slide's URL as its text."""
    return path if is_url(path) else Path(path)


# -- the coordinator ----------------------------------------------------------------------------


@dataclass
class CohortReport:
    """A cohort run: per slide, per worker, failures."""

    model: str
    workers: int
    tiles: int = 0
    wall_s: float = 0.0
    setup_s: float = 0.0  # until every worker had its model (and the batch size was known)
    slides: list[dict[str, Any]] = field(default_factory=list)
    per_worker: dict[str, dict[str, Any]] = field(default_factory=dict)
    failures: list[dict[str, str]] = field(default_factory=list)
    skipped_complete: list[str] = field(default_factory=list)
    workers_at_end: int = 0
    lost: list[dict[str, Any]] = field(default_factory=list)  # workers lost, what they ran
    joined: list[dict[str, Any]] = field(default_factory=list)  # workers that came later
    # slide files made ready on the workers, as one process's run reports them
    converted: list[dict[str, Any]] = field(default_factory=list)
    prepared: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    # each task done (a slice, or several small ones: `slices`, `stores`): worker, store,
    # tiles, began_s (since the cohort began), seconds, its first batch and its wait for
    # tiles: where each GPU was busy, and where not
    timeline: list[dict[str, Any]] = field(default_factory=list)

    @property
    def tiles_per_s(self) -> float:
        return self.tiles / self.wall_s if self.wall_s else 0.0

    @property
    def ran_short(self) -> bool:
        """Workers were lost and fewer than at the start were left at the end."""
        return bool(self.lost) and self.workers_at_end < self.workers

    @property
    def exit_code(self) -> int:
        """The process's exit status for this run (`tilestore.embed.outcome`)."""
        return exit_code(len(self.slides) + len(self.skipped_complete), len(self.failures))

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "workers": self.workers,
            "tiles": self.tiles,
            "wall_s": round(self.wall_s, 3),
            "setup_s": round(self.setup_s, 3),
            "tiles_per_s": round(self.tiles_per_s, 1),
            "slides": self.slides,
            "per_worker": self.per_worker,
            "failures": self.failures,
            "skipped_complete": self.skipped_complete,
            "workers_at_end": self.workers_at_end,
            "lost": self.lost,
            "joined": self.joined,
            "converted": self.converted,
            "prepared": self.prepared,
            "warnings": self.warnings,
            "timeline": self.timeline,
            "idle": self.idle(),
            "exit_code": self.exit_code,
        }

    def idle(self) -> dict[str, dict[str, float]]:
        """Per worker that finished a slice, the seconds after the set-up it ran none that
        finished: before its first began, between them (threads' spans merged), after its
        last ended until the cohort's end. A failed slice's time counts as idle, and so does
        time before a worker joined or after it was lost (`joined`, `lost` say when)."""
        out = {}
        for worker in sorted({t["worker"] for t in self.timeline}):
            spans = sorted((t["began_s"], t["began_s"] + t["seconds"])
                           for t in self.timeline if t["worker"] == worker)  # fmt: skip
            between, latest = 0.0, spans[0][1]
            for began, ended in spans[1:]:
                between += max(began - latest, 0.0)
                latest = max(latest, ended)
            out[worker] = {
                "start": round(max(spans[0][0] - self.setup_s, 0.0), 3),
                "between": round(between, 3),
                "end": round(max(self.wall_s - latest, 0.0), 3),
            }
        return out


@dataclass
class _Store:
    path: str
    writer: EmbeddingWriter
    slices: list[Slice]
    pending: int
    futures: list = field(default_factory=list)
    tiles: int = 0
    seconds: float = 0.0
    workers: set = field(default_factory=set)
    failed: bool = False
    ready_s: float = 0.0  # since the cohort began: when its slices went to the feed
    planned_s: float = 0.0  # the coordinator's time planning it


@checked
def embed_cohort(
    stores: Sequence[str | os.PathLike],
    model: str | ModelSpec,
    client,
    *,
    plan: PlanChoice = None,
    options: Options = Options(),
    into: str | os.PathLike | None = None,
    scan_mpp: ScanMpp = None,
    override_mpp: OverrideMpp = False,
    slice_tiles: SliceTiles = SLICE_TILES,
    cpus_per_worker: Workers = None,
    progress: Callable[[int, int], None] | None = None,
    replace_lost: bool = True,
    say: Callable[[str], None] | None = to_stderr,
) -> CohortReport:
    """Embed every store (or slide file, with `into`) on the workers of a Dask `client`;
    return the cohort report.

    model: a name, or its record (`ModelSpec`) resolved already; resolved here once, and
    the record sent to every worker (`EmbedderPlugin`). plan: as `tilestore.embed.engine.embed`
    takes it. into: the folder slide files are
    converted into, on the workers (every worker must reach it: a shared filesystem), with
    the tissue mask the plan reads; a store there from an earlier run is reused. scan_mpp:
    the slides' level-0 um/px where their files record none (override_mpp: over what they
    record, as `convert` takes them). slice_tiles: at most this many
    tiles per task (big slides spread over workers). cpus_per_worker: the CPUs each worker
    may use for decoding and for converting its slides (None: each worker's own affinity;
    `cpu_share` for workers sharing a machine).
    progress: called with (tiles, total) as slices finish; None: a line every 30 s through
    `say` (tiles done, rate, time left, workers alive). replace_lost: ask the client's
    cluster (dask-jobqueue's SLURMCluster...) for a new worker in place of each one lost.
    say: where the run's lines go (stderr; None: nowhere): progress, workers lost and joined.
    The report's `exit_code` is what the process should exit with.
    """
    started, began = time.perf_counter(), time.time()  # the wall clock: the workers'
    spec = model_record(model)  # once; an unknown model refused before the cluster is asked
    # the workers find the folder, wherever they run (the slides' paths: `_Inputs.send`)
    folder = None if into is None else Path(into).absolute()
    how = Preparation.of(
        folder, plan, scan_mpp=scan_mpp, cpus=cpus_per_worker, override_mpp=override_mpp
    )
    inputs = _Inputs(client, how, stores)
    if inputs.slides:
        client.register_plugin(SlidesPlugin(), name=PREPARER)
        inputs.start()  # the first slides are converted while the workers load their model
    # the workers receive the record, never the name to resolve again
    client.register_plugin(EmbedderPlugin(spec, options, cpus_per_worker), name=PLUGIN)
    members = Membership(client, replace=replace_lost, say=say)
    try:
        identity = client.submit(worker_identity, pure=False).result()
        report = CohortReport(
            spec.name, len(members.at_start), setup_s=time.perf_counter() - started
        )
        lines = None
        if progress is None and say is not None:
            progress = lines = LogLines(f"{spec.name} on Dask", status=members.status, write=say)
        owner, kept = _run(
            inputs, spec, client, plan, options, slice_tiles, identity, progress, report, began
        )
        if lines is not None:
            lines.finish()
    finally:
        members.stop()
        if inputs.slides:  # a slide still being made (the run stopped early) is stopped
            with contextlib.suppress(Exception):
                client.unregister_worker_plugin(PREPARER)
    report.workers_at_end = len(members.alive)
    report.lost = [_lost(e, owner, kept) for e in members.lost]
    report.joined = [{"name": e.name, "address": e.address, "after_s": e.after_s}
                     for e in members.joined]  # fmt: skip
    report.wall_s = time.perf_counter() - started
    return report


def _run(inputs, spec, client, plan, options, slice_tiles, identity, progress, report, began):
    """Take the inputs largest first (`_Inputs`): a store is planned here and its slices
    handed to the workers as they free (the first workers start at once); a slide file is
    first made ready on a worker, and planned once it lands. Then follow the slices as they
    finish; return which store each task key belongs to, and the tiles each task found
    kept (written by a worker lost while running it)."""
    owner: dict[str, list[tuple[_Store, Slice]]] = {}  # task key -> its slices, their stores
    # (task key, store) -> the tiles of its slice a lost worker had written
    kept: dict[tuple[str, str], int] = {}
    feed = _Feed(client)
    sent: dict[str, float] = {}  # task key -> when it was submitted, since the cohort began
    # the cohort's tiles to do, counted up front from the stores' metadata (a slide file,
    # or a plan the run makes: known once planned; until then the total is a floor)
    checked = check_stores(inputs.paths, spec, plan, options)
    expected = checked.tiles
    total = sum(t for t in expected.values() if t is not None)

    def counted(given: str, tiles: int) -> None:
        """An input planned (or dropped: 0 tiles): its count in the total made exact."""
        nonlocal total
        total += tiles - (expected.pop(str(Path(given)), None) or 0)

    def shown() -> int:
        unknown = sum(1 for t in expected.values() if t is None)
        return AtLeast(total, unknown) if unknown else total

    filesystems = FileSystems()  # those a write found full or read-only, as in one process
    states: list[_Store] = []  # every store planned, in order

    def take(path: str, given: str) -> None:
        """A store ready: planned, its slices to the feed (or it is reported)."""
        clock = time.perf_counter()
        try:
            refused = filesystems.refusal(path)
            if refused is not None:  # on a file system found full or read-only
                raise refused
            # the plan options as the checks resolved them, once (a slide file: here)
            chosen = checked.plans.get(str(Path(given)), plan)
            state = _prepare(path, spec, chosen, identity, options, slice_tiles)
        except AlreadyComplete:
            report.skipped_complete.append(path)
            inputs.release(path)
            counted(given, 0)
            return
        except TilestoreError as exc:
            _failure(report, path, exc)
            if isinstance(exc, WriteFailed):
                filesystems.hit(path, exc)
            inputs.release(path)
            counted(given, 0)
            return
        states.append(state)
        counted(given, sum(s.tiles for s in state.slices))
        state.planned_s = time.perf_counter() - clock
        state.ready_s = time.time() - began
        if not state.slices:
            _finish(state, report)
            inputs.release(path)
            return
        feed.add(state, state.slices)

    def landed(future) -> None:
        """A slide file made ready on a worker: its store taken, or its failure reported."""
        given = inputs.landed(future)
        named = os.path.abspath(given)  # as the worker was asked, and says it
        try:
            reply = future.result()
            died = reply.get("died")
            staged = staged_from(Path(named), None if died is not None else reply, died or 0)
        except Exception as exc:  # the task failed (its worker lost too often), or a bug
            report.failures.append({"store": given, "error": _cause(exc, named)})
            inputs.release(inputs.how.target(Path(given)))
            return
        if staged.store is not None and not staged.store.exists():  # on the worker's disk
            staged = replace(staged, error=StoreError(
                f"{staged.store}: made on a worker, not seen here: give --into (into=) a "
                "folder the workers and this machine share"
            ))  # fmt: skip
        if staged.converted:
            report.converted.append({**staged.converted, "slide": given})
        if staged.seconds is not None:
            report.prepared.append({
                "slide": given, "store": str(staged.store), "seconds": staged.seconds,
                "landed_s": round(time.time() - began, 3),  # since the cohort began
            })  # fmt: skip
        report.warnings.extend(staged.warnings)
        if staged.error:
            report.failures.append({"store": given, "error": _cause(staged.error, named)})
            inputs.release(inputs.how.target(Path(given)))
        else:
            take(str(staged.store), given)

    def finished(future) -> None:
        group = owner[str(future.key)]
        try:
            result = future.result()
        except CancelledError:  # cancelled: every store in it had failed already
            for state, _ in group:
                failed(state, StoreError(f"{state.path}: cancelled"), future)
            return
        except Exception as exc:  # the task itself failed (a worker lost too often, a bug)
            if len(group) > 1:  # whose slide? each slice again, alone: it fails on its own
                for state, piece in group:
                    if not state.failed:
                        feed.add(state, [piece], alone=True)
                    elif _one_less(state, report):
                        inputs.release(state.path)
                return
            for state, _ in group:
                failed(state, exc, future)
            return
        outcomes = list(zip(group, result["pieces"], strict=True))
        done_here = [  # its stores whose slices were done (a store failed meanwhile: not)
            (state, piece, outcome)
            for (state, piece), outcome in outcomes
            if "error" not in outcome and not state.failed
        ]
        if done_here:  # a task none of whose slices counts is not the worker's work
            _per_worker(report, result)
        # the task's seconds shared among its slices by their tiles
        tiles_done = sum(outcome["tiles"] for _, _, outcome in done_here)
        for (state, piece), outcome in outcomes:
            if "error" in outcome:  # its slide's own data, or its file system refused it
                error, cause = outcome["error"], outcome.get("cause")
                exc = WriteFailed(error, fault_named(cause)) if cause else StoreError(error)
                failed(state, exc, future)
                continue
            if not state.failed:
                # tiles a lost worker wrote of this slice count once, as the cohort's (not
                # the worker's): the summary and the progress agree with the stores
                kept[(str(future.key), piece.store)] = outcome.get("kept", 0)
                done = outcome["tiles"] + outcome.get("kept", 0)
                state.tiles += done
                share = outcome["tiles"] / tiles_done if tiles_done else 1 / len(done_here)
                state.seconds += result["seconds"] * share
                state.workers.add(result["worker"])
                report.tiles += done
                if progress:
                    progress(done, shown())
            if _one_less(state, report):
                inputs.release(state.path)
        if done_here:  # the task on its worker's timeline: one span, its slices' stores
            report.timeline.append({
                "worker": result["worker"], "store": done_here[0][0].path,
                "tiles": tiles_done,
                "sent_s": round(sent[str(future.key)], 3),
                "began_s": round(result["began"] - began, 3), "seconds": result["seconds"],
                "first_batch_s": result["first_batch_s"], "waiting_s": result["waiting_s"],
                **({"slices": len(done_here), "stores": [s.path for s, _, _ in done_here]}
                   if len(done_here) > 1 else {}),
            })  # fmt: skip

    def failed(state: _Store, exc: BaseException, future) -> None:
        """A slice failed: its slide's own problem drops its other slices (a full file
        system: the other stores on it too)."""
        if not state.failed:
            give_up(state, exc, future)
            if isinstance(exc, WriteFailed):  # a full file system: its other stores too
                filesystems.hit(state.path, exc)
                for other in states:
                    refused = filesystems.refusal(other.path)
                    if refused is not None and not other.failed and other.pending:
                        give_up(other, refused)
        if _one_less(state, report):
            inputs.release(state.path)

    def give_up(state: _Store, exc: BaseException, running=None) -> None:
        """A store failed: said once, its slices running cancelled (but `running`), those
        waiting never sent."""
        state.failed = True
        _failure(report, state.path, exc)
        # its tasks not done are cancelled, but one holding other stores' slices too
        client.cancel([
            f for f in state.futures
            if f is not running and not f.done() and all(s.failed for s, _ in owner[str(f.key)])
        ])  # fmt: skip
        for _ in range(feed.drop(state)):  # those not sent: never sent
            if _one_less(state, report):
                inputs.release(state.path)

    def hand_out() -> None:
        for group, worker in feed.take():
            future = _submit(client, run_slices, [piece for _, piece in group], worker)
            for state, _ in group:
                state.futures.append(future)
            owner[str(future.key)] = group
            sent[str(future.key)] = time.time() - began
            feed.running[future] = worker

    while inputs.waiting or inputs.out or feed.running or feed.waiting:
        startable = inputs.next()
        if startable is not None:
            path, slide = startable
            if slide:
                inputs.send(path)
            else:
                take(path, path)
        for future in [f for f in inputs.out if f.done()]:
            landed(future)
        hand_out()
        # wait (a second at most: workers that join get work) unless an input started now
        out = [*feed.running, *inputs.out]
        if out and startable is None:
            with contextlib.suppress(TimeoutError, CancelledError):
                wait(out, timeout=1.0, return_when="FIRST_COMPLETED")
        for future in feed.finished(timeout=0):
            finished(future)
    return owner, kept


def _submit(client, task, argument, worker: str | None, **options):
    """A task sent to `worker` (preferred: another runs it if that one is gone), or to any
    where none is named (Dask refuses allow_other_workers without workers)."""
    where = {} if worker is None else {"workers": [worker], "allow_other_workers": True}
    return client.submit(task, argument, pure=False, **where, **options)


class _Inputs:
    """The cohort's inputs, each path once, largest first: stores, taken as they come, and
    slide files made ready on the workers (`make_ready`, a task that leaves its worker's
    thread), one at a time per worker (sent to one making none) and one per store made (a
    file whose store is being made or embedded, by a file of the same name or given as a
    store, waits its turn, then finds the store there). A slide waiting lets a store behind
    it go first. Each slide is sent before the slices waiting (a higher priority), so it
    starts where a worker frees."""

    def __init__(self, client, how: Preparation, paths: Sequence[str | os.PathLike]) -> None:
        self.client, self.how = client, how
        once = {_absolute(p): str(p) for p in paths}.values()  # the same file given twice
        order = sorted(once, key=lambda s: (-_size(s), s))
        self.waiting = [(p, how.wants(_given(p))) for p in order]  # (path as given, a slide?)
        self.paths = [p for p, _ in self.waiting]  # every input, once
        self.slides = sum(slide for _, slide in self.waiting)
        self.out: dict = {}  # make_ready future -> the slide file given
        self._making: dict[str, tuple[str | None, str | None]] = {}  # slide -> (store, worker)
        self._held: set[str] = set()  # stores (absolute) made or taken, not yet done with

    def room(self) -> bool:
        return len(self.out) < max(len(self.client.nthreads()), 1)

    def next(self, stores: bool = True) -> tuple[str, bool] | None:
        """The first input that may start now (taken off the waiting list): a store (if
        `stores`), held until released; a slide where a worker is free to make it and its
        store is neither being made nor worked on."""
        room = self.room()
        made = {store for store, _ in self._making.values()}
        for i, (path, slide) in enumerate(self.waiting):
            if slide and room:
                target = _absolute(self.how.target(_given(path)))
                if target not in made and target not in self._held:
                    return self.waiting.pop(i)
            elif not slide and stores and _absolute(path) not in self._held:
                self._held.add(_absolute(path))
                return self.waiting.pop(i)
        return None

    def send(self, path: str) -> None:
        busy = {worker for _, worker in self._making.values()}
        free = [w for w in sorted(self.client.nthreads()) if w not in busy]
        where = free[0] if free else None  # preferred; another if it is gone
        # named absolutely: a worker's working folder is not this one's
        request = self.how.request(_absolute(path))
        future = _submit(self.client, make_ready, request, where, priority=1)
        self.out[future] = path
        self._making[path] = (_absolute(self.how.target(_given(path))), where)

    def landed(self, future) -> str:
        """The slide a finished make_ready was for; its store is held until `release`."""
        path = self.out.pop(future)
        target, _ = self._making.pop(path)
        if target is not None:
            self._held.add(target)
        return path

    def release(self, store: str | os.PathLike | None) -> None:
        """A store is done with (finished, failed or skipped): a twin may be sent now."""
        self._held.discard(_absolute(store))

    def start(self) -> None:
        """Send the first slide files, while there is room (before any store is taken)."""
        while (first := self.next(stores=False)) is not None:
            self.send(first[0])


def _absolute(path: str | os.PathLike | None) -> str | None:
    """An input named once: a path absolutely (a worker's working folder is not this one's),
    a slide's URL as its text."""
    if path is None or is_url(path):
        return path
    return os.path.abspath(path)


class _Feed:
    """The slices handed out by the coordinator itself, the largest first, each to the worker
    with the fewest out per thread: two per thread while more than two per thread wait (each
    worker's next one ready on it, no round trip between slices), then one per thread, so the
    last ones go to whichever GPU frees first, none queued behind another on a busy one.

    Placed here, not by Dask's scheduler: it hands a one-thread worker a second task ahead
    (worker-saturation 1.1), and counts a slide being made ready there (a task that left the
    worker's thread) as work, so it queued a slide's two slices on one worker while another
    stood free (4 H200s, 10 slide files: that worker idle 1.8 s at the start). Largest first
    by slice, not by arrival: stores made from slide files land out of size order, and a big
    slice handed out last is the cohort's tail (the same run: three GPUs idle 1.4-2.7 s at
    the end)."""

    def __init__(self, client) -> None:
        self.client = client
        self.waiting: list[tuple[_Store, Slice]] = []  # largest slice first, then by arrival
        self.alone: set[Slice] = set()  # slices that go in a task of their own
        self.running: dict = {}  # submitted future -> the worker it went to (None: any)

    def add(self, state: _Store, pieces: Sequence[Slice], alone: bool = False) -> None:
        """A store's slices, each placed among those waiting by its size; `alone`: each to
        run in a task of its own (a task of several failed as a whole: whose slide it was
        is found so)."""
        if alone:
            self.alone.update(pieces)
        for piece in pieces:
            at = next(
                (i for i, (_, p) in enumerate(self.waiting) if p.tiles < piece.tiles),
                len(self.waiting),
            )
            self.waiting.insert(at, (state, piece))

    def take(self) -> Iterator[tuple[list[tuple[_Store, Slice]], str | None]]:
        """The tasks to submit now (`_group`: a slice, or several small ones), each with the
        worker it goes to (None: no worker yet, one task, to whichever joins)."""
        threads = self.client.nthreads()
        if not threads:
            if self.waiting and not self.running:
                yield self._group(0), None  # alone: the workers that join take the rest
            return
        slots = sum(max(n, 1) for n in threads.values())
        per_thread = 2 if len(self.waiting) > 2 * slots else 1
        out = self._out(threads)
        # a task holds at most a share of what waits now, one per task the workers may
        # have out: smaller tasks as the cohort ends, and even among the workers
        share = -(-sum(p.tiles for _, p in self.waiting) // (per_thread * slots))
        while self.waiting:
            worker = min(threads, key=lambda w: (out[w] / max(threads[w], 1), w))
            if out[worker] >= per_thread * max(threads[worker], 1):
                return
            out[worker] += 1
            yield self._group(min(TASK_TILES, share)), worker

    def _group(self, limit: int) -> list[tuple[_Store, Slice]]:
        """The next task: the largest slice waiting; if it has fewer than `limit` tiles,
        with the next slices of other stores that fit, up to `limit` tiles in all (0: no
        worker yet, alone)."""
        group = [self.waiting.pop(0)]
        tiles = group[0][1].tiles
        if tiles >= limit or group[0][1] in self.alone:
            return group
        stores, rest = {group[0][1].store}, []
        for state, piece in self.waiting:
            room = tiles + piece.tiles <= limit and len(group) < TASK_SLICES
            if room and piece.store not in stores and piece not in self.alone:
                group.append((state, piece))
                tiles += piece.tiles
                stores.add(piece.store)
            else:
                rest.append((state, piece))
        self.waiting = rest
        return group

    def _out(self, threads: dict[str, int]) -> Counter:
        """The slices out on each worker: where the scheduler has them (a slice stolen by
        another worker, or run again after its worker was lost), else where they were sent
        (not yet seen there). Only slices: a slide being made ready there is not one."""
        sent = {str(f.key): w for f, w in self.running.items()}
        where = {
            str(key): worker
            for worker, keys in self.client.processing().items()
            for key in keys
            if str(key) in sent
        }
        placed = (where.get(key, worker) for key, worker in sent.items())
        return Counter(worker for worker in placed if worker in threads)

    def drop(self, state: _Store) -> int:
        """A failed store's slices still waiting, taken off (never sent); how many."""
        kept = [(s, p) for s, p in self.waiting if s is not state]
        dropped = len(self.waiting) - len(kept)
        self.waiting = kept
        return dropped

    def finished(self, timeout: float) -> list:
        """The running futures that finished (waiting up to `timeout` s for the first)."""
        if not self.running:
            return []
        if timeout > 0:
            try:
                wait(list(self.running), timeout=timeout, return_when="FIRST_COMPLETED")
            except TimeoutError:
                return []
            except CancelledError:  # a slide's slices cancelled when one failed: done too
                pass
        done = [f for f in self.running if f.done()]
        for future in done:
            del self.running[future]
        return done


def _one_less(state: _Store, report: CohortReport) -> bool:
    """One of a store's slices is over (done, failed or never sent): the last one finishes
    the store, or gives it up where it failed; whether it was the last."""
    state.pending -= 1
    if state.pending == 0:
        (_give_up if state.failed else _finish)(state, report)
    return state.pending == 0


def _lost(event, owner, kept: dict[tuple[str, str], int]) -> dict[str, Any]:
    """A lost worker for the report: the slices it was running (run again elsewhere), each
    with the tiles it had written and that were kept, and those redone by another."""
    redone = []
    for key in event.running:
        for _, piece in owner.get(key, []):
            got = kept.get((key, piece.store))  # None: its rerun did not finish (store failed)
            redone.append({
                "store": piece.store, "start": piece.start, "stop": piece.stop,
                "tiles": piece.tiles, "kept": got,
                "redone": None if got is None else piece.tiles - got,
            })  # fmt: skip
    return {
        "name": event.name,
        "address": event.address,
        "after_s": event.after_s,
        "redone": redone,
        "replacement": event.replacement,
    }


def _prepare(path, spec, plan, identity, options, slice_tiles) -> _Store:
    # refused here, before any slice is sent
    ready = prepare(path, spec, plan, identity, any_scale=options.any_scale)
    tile_plan = ready.plan
    writer = EmbeddingWriter(
        ready.slide,
        tile_plan,
        ready.uid,
        identity,
        overwrite=options.overwrite,
        break_lock=options.break_lock,
    )
    batch = identity.batch_size
    slices = [
        Slice(path, tile_plan.name, int(blocks[0]), int(blocks[-1]) + 1, len(tiles))
        for blocks in slice_blocks(writer.todo(), writer.per_shard, max(1, slice_tiles // batch))
        for tiles in [tiles_of(blocks, batch, len(tile_plan))]
    ]
    return _Store(path, writer, slices, len(slices))


def slice_blocks(todo: np.ndarray, per_shard: int, per_slice: int) -> list[np.ndarray]:
    """The batches to do cut into as few slices of at most about `per_slice` batches as can
    be, of even sizes, at shard boundaries: a shard is rewritten whole, so two workers writing
    one shard would lose one's batches. Even: a slide of 2.1 slices' worth is three slices of
    0.7, not two full ones and a tenth, so the slices a cohort submits largest slide first
    come largest first, and no GPU is left with a full slice while the others run out
    (4 H100s, 10 slides of 15k-100k px: the workers' shares were 48,728 to 61,440 tiles)."""
    shards = np.split(todo, np.flatnonzero(np.diff(todo // per_shard)) + 1) if len(todo) else []
    count = -(-len(todo) // per_slice)  # slices needed
    slices, current, taken = [], [], 0
    for blocks in shards:
        current.append(blocks)
        taken += len(blocks)
        if taken * count >= len(todo) * (len(slices) + 1):  # this slice's even share reached
            slices.append(np.concatenate(current))
            current = []
    if current:
        slices.append(np.concatenate(current))
    return slices


def _finish(state: _Store, report: CohortReport) -> None:
    summary = {
        "tiles": state.tiles,
        "seconds": round(state.seconds, 3),
        "workers": sorted(state.workers),
    }
    state.writer.finish(summary)
    complete = len(state.writer.todo()) == 0
    report.slides.append(
        {
            "store": state.path,
            "tiles": state.tiles,
            "slices": len(state.slices),
            "seconds": round(state.seconds, 3),
            "tiles_per_s": round(state.tiles / state.seconds, 1) if state.seconds else None,
            "workers": sorted(state.workers),
            "ready_s": round(state.ready_s, 3),
            "planned_s": round(state.planned_s, 3),
            "complete": complete,
            **({"quality": q} if (q := state.writer.quality_summary()) else {}),
        }
    )


def _per_worker(report: CohortReport, result: dict[str, Any]) -> None:
    entry = report.per_worker.setdefault(
        result["worker"],
        {
            "device": result["device"],
            "decoders": result["decoders"],
            "tiles": 0,
            "seconds": 0.0,
            "tasks": 0,
            "gpu_util": [],
        },
    )
    entry["tiles"] += result["tiles"]
    entry["seconds"] = round(entry["seconds"] + result["seconds"], 3)
    entry["tasks"] += 1
    if result["gpu_util_mean"] is not None:
        entry["gpu_util"].append(result["gpu_util_mean"])


def _give_up(state: _Store, report: CohortReport) -> None:
    """Release a failed store; its failure says what the store holds now."""
    left = state.writer.abandon()
    for failure in report.failures:
        if failure["store"] == state.path:
            failure["error"] += f" ({left})"


def _failure(report: CohortReport, store: str, exc: BaseException) -> None:
    """A store's failure into the report, as one process's report has it (with the cause
    of a write the file system refused: ENOSPC...)."""
    failure = {"store": store, "error": _cause(exc, store)}
    fault = getattr(exc, "fault", None)
    if isinstance(exc, WriteFailed) and fault is not None:
        failure["cause"] = fault.code
    report.failures.append(failure)


def _cause(exc: BaseException, store: str) -> str:
    """One line saying why a store failed: our errors as they are (without the store's own
    name), anything else (a worker lost) with its type."""
    if not isinstance(exc, TilestoreError):
        said = str(exc).strip().splitlines()
        if any(line.startswith("Traceback (most recent call last)") for line in said):
            said = [said[0], said[-1]]  # a bug in a worker: what it was doing, and the error
        return f"{type(exc).__name__}: {' '.join(' '.join(said).split())}"
    message = " ".join(str(exc).split())
    for name in (store, Path(store).name):
        if message.startswith(f"{name}: "):
            return message[len(name) + 2 :]
    return message


def local_cluster(kind: str, workers: int | None = None):
    """A Dask client on this machine: 'local-cuda' (one worker per GPU) or 'local' (CPU).

    workers: how many (GPUs for local-cuda, the first ones visible; processes for local).
    Workers are not daemons, so each may start its own decoder processes.
    """
    import dask
    from distributed import Client

    dask.config.set({"distributed.worker.daemon": False})
    if kind == "local-cuda":
        import torch

        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        devices = (
            visible.split(",") if visible else [str(i) for i in range(torch.cuda.device_count())]
        )
        if not devices or devices == [""]:
            raise DeviceError("cluster='local-cuda': no GPU is visible")
        devices = devices[: workers or len(devices)]
        try:
            from dask_cuda import LocalCUDACluster
        except ImportError:  # one nanny per GPU, each seeing only its own
            from distributed import SpecCluster

            cluster = SpecCluster(gpu_workers(devices), scheduler=SCHEDULER)
        else:
            cluster = LocalCUDACluster(CUDA_VISIBLE_DEVICES=",".join(devices), threads_per_worker=1)
    elif kind == "local":
        from distributed import LocalCluster

        cluster = LocalCluster(
            n_workers=workers or max(1, usable_cpus() // 2),
            threads_per_worker=1,
            processes=True,
        )
    else:
        raise OptionError(f"cluster={kind!r}: choose 'local-cuda' or 'local'")
    return Client(cluster)


# the scheduler of a local cluster made without dask-cuda: in this machine, no dashboard port
SCHEDULER = {
    "cls": "distributed.Scheduler",
    "options": {"dashboard_address": ":0", "host": "127.0.0.1"},
}


def gpu_workers(devices: list[str]) -> dict[str, dict]:
    """A SpecCluster's workers, one nanny per GPU (`devices`: CUDA_VISIBLE_DEVICES entries),
    each worker process seeing only its GPU as cuda:0 (what dask-cuda's LocalCUDACluster
    does, without its dependencies: multi-GPU cohorts need only distributed), each with an
    even share of the machine's memory (a one-thread nanny's default is RAM/cores: 8 GiB on
    a 64-core host, under a worker's torch, CUDA context and pinned row blocks)."""
    from distributed.system import MEMORY_LIMIT

    share = MEMORY_LIMIT // max(len(devices), 1)
    return {
        f"gpu-{device}": {
            "cls": "distributed.Nanny",
            "options": {
                "nthreads": 1,
                "host": "127.0.0.1",
                "env": {"CUDA_VISIBLE_DEVICES": device},
                "name": f"gpu-{device}",
                "memory_limit": share,
            },
        }
        for device in devices
    }


def cpu_share(workers: int) -> int:
    """The CPUs each of `workers` workers sharing this machine may use."""
    return max(1, usable_cpus() // max(workers, 1))


def _redone(slice_: dict[str, Any]) -> str:
    """A lost worker's slice as its rerun found it: the tiles kept and those redone."""
    name = Path(slice_["store"]).name
    span = f"batches {slice_['start']}-{slice_.get('stop', slice_['start'] + 1) - 1}"
    if slice_.get("kept") is None:
        return f"{name} {span} ({slice_['tiles']} tiles)"
    return f"{name} {span} ({slice_['kept']} tiles kept, {slice_['redone']} redone)"


def summary_lines(report: CohortReport) -> list[str]:
    """The cohort report as lines a person reads."""
    lines = [
        f"{report.model}: {report.tiles} tiles on {report.workers} worker(s) in "
        f"{report.wall_s:.1f} s ({report.tiles_per_s:.1f} tiles/s)"
    ]
    for s in report.slides:
        lines.append(
            f"  {Path(s['store']).name}: {s['tiles']} tiles, {s['tiles_per_s'] or 0:.1f} tiles/s, "
            f"{s['slices']} slice(s) on {len(s['workers'])} worker(s)"
        )
        if s.get("quality"):
            lines.append(f"    quality: {quality_line(s['quality'])}")
    idle = report.idle()
    for address, w in report.per_worker.items():
        util = f", GPU util {np.mean(w['gpu_util']):.0f}%" if w["gpu_util"] else ""
        gaps = idle.get(address)
        waits = (
            f", idle {gaps['start']:.1f} s at the start, {gaps['between']:.1f} between "
            f"slices, {gaps['end']:.1f} at the end"
            if gaps
            else ""
        )
        lines.append(f"  worker {address} ({w['device']}): {w['tiles']} tiles{util}{waits}")
    for w in report.lost:
        redone = ", ".join(_redone(r) for r in w["redone"])
        lines.append(
            f"  worker {w['name']} ({w['address']}) lost after {w['after_s']:g} s"
            + (f"; run again on others: {redone}" if redone else "")
            + f"; replacement: {w['replacement'] or 'not asked'}"
        )
    lines.extend(
        f"  worker {w['name']} ({w['address']}) joined after {w['after_s']:g} s"
        for w in report.joined
    )
    if report.ran_short:
        lines.append(
            f"WARNING: the cohort ran short: {len(report.lost)} worker(s) lost, "
            f"{report.workers_at_end} of {report.workers} left at the end"
        )
    lines.extend(f"  skipped (complete): {Path(p).name}" for p in report.skipped_complete)
    lines.extend(preparation_lines(report.converted, report.prepared))
    lines.extend(f"tilestore: error: {f['store']}: {f['error']}" for f in report.failures)
    lines.extend(f"WARNING: {w}" for w in report.warnings)
    return lines
