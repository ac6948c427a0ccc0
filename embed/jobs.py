"""The work of a run: one `Job` per slide (or `Slice` of a slide's plan), ready to stream.

A job is opened when the producer reaches it, while the GPU works on the one before: the
store is opened, its plan loaded or made (`plan_for`), its embeddings group checked and
locked, and the batches still to do listed. A store that cannot be embedded is reported
and skipped; the run goes on with the next.
"""

from __future__ import annotations

import collections
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tilestore.embed.inputs import Staged
from tilestore.embed.models import ModelSpec
from tilestore.embed.opening import PlanChoice, open_for_run, tiles_of
from tilestore.embed.preflight import rgb_input
from tilestore.embed.readout import ReadOut
from tilestore.embed.report import RunReport
from tilestore.embed.storeside import Request, StoreProcesses
from tilestore.embeddings import AlreadyComplete, EmbeddingWriter, RunIdentity
from tilestore.errors import TilestoreError, WriteFailed
from tilestore.plan import ResolvedPlan, TilePlan, load_plan
from tilestore.reading import Slide, open_slide


@dataclass(frozen=True)
class Job:
    """One slide's share of a run: its plan, its writer and the plan tiles still to embed."""

    store: Path
    slide: Slide  # as the model reads it (`rgb_input`)
    plan: TilePlan
    writer: EmbeddingWriter
    todo: np.ndarray  # global plan indices, ascending, whole batches
    left: int = 0  # tiles still to do after this run (a trial, max_tiles, leaves some)
    reading: dict = field(default_factory=dict)  # how the model reads its tiles (`reading`)
    read_out: ReadOut | None = None  # its steps (and chunks) made where it was opened


@dataclass(frozen=True)
class JobStart:
    """Sent before a job's first batch: the writer makes its group while tiles are read."""

    job: Job


@dataclass(frozen=True)
class JobEnd:
    """Sent after a job's last batch: the writer finishes the job when it gets here."""

    job: Job


@dataclass(frozen=True)
class JobFailed:
    """Sent instead of JobEnd where a job's data failed: the writer releases the job, keeping
    the batches written before, and the report names the store and the cause."""

    job: Job
    error: TilestoreError


@dataclass(frozen=True)
class Slice:
    """A unit of distributed work: batches [start, stop) of a store's plan.

    Its embeddings group must exist already (`tilestore.embed.cohort` creates it); the batches are
    whole chunks of the features array, so slices of one store never share a chunk.
    """

    store: str
    plan: str
    start: int  # first batch (block) index
    stop: int  # one past the last
    tiles: int  # tiles in these batches


# stores opened, planned and given their group at once, ahead of the GPU: in store processes,
# and on the run's threads where the groups alone are made elsewhere (`Embedder._store_side`)
STORES_AHEAD = 24
THREADS_AHEAD = 8


@dataclass(frozen=True)
class _Opened:
    """One input as `_open_job` left it: a job to stream, or why there is none."""

    staged: Staged
    store: Path
    job: Job | None = None
    skipped: str | None = None  # complete already
    error: TilestoreError | None = None
    refused: bool = False  # on a file system found full or read-only: not attempted
    seconds: dict[str, float] = field(default_factory=dict)  # its steps, for the report


def store_jobs(
    stores: Iterable[Staged],
    spec: ModelSpec,
    plan: PlanChoice,
    identity: RunIdentity,
    overwrite: bool,
    report: RunReport,
    max_tiles: int | None = None,
    any_scale: bool = False,
    break_lock: bool = False,
    resolved: Mapping[str, ResolvedPlan] | None = None,
    ahead: int = STORES_AHEAD,
    makers: Callable[..., Any] | None = None,
    stop: threading.Event | None = None,
) -> Iterator[Job]:
    """Jobs for whole stores, in the order given, each opened, planned and given its
    embeddings group (`_open_job`) on one of `ahead` threads while the GPU embeds the
    stores before it: a small slide's fixed cost is paid beside the model, not between its
    batches. A store already complete is reported as skipped, one that fails as failed;
    the others go on. A lock taken over (`EmbeddingWriter`, break_lock or a silent holder)
    is said in the report's warnings too. resolved: each store's plan options as the checks
    before the run resolved them (`tilestore.embed.preflight.Preflight.plans`, by the
    input's path): taken as they are, never resolved again. makers: worker processes that
    make the groups (`EmbeddingWriter.create`'s maker: `tilestore.workers.Calls`); None:
    the opening threads do. stop: the run's; once set, no more is opened and the jobs end
    (the run has stopped: it takes no more). The report hears of each input in order,
    from this generator's thread alone."""

    closed = threading.Event()  # the jobs are closed: an input not yet opened never is
    run = uuid.uuid4().hex  # these jobs' stores, as store processes know them (`halt`)

    def stopped() -> bool:
        return closed.is_set() or (stop is not None and stop.is_set())

    def open_one(staged: Staged) -> _Opened:
        chosen = (resolved or {}).get(str(staged.given), plan)
        return _open_job(
            staged,
            spec,
            chosen,
            identity,
            overwrite,
            report,
            max_tiles,
            any_scale,
            break_lock,
            makers,
            stopped,
            run,
        )

    pending: collections.deque[Future] = collections.deque()
    inputs = iter(stores)
    held: Staged | None = None  # waits for those before it: its file system is not proven
    with ThreadPoolExecutor(max(1, ahead), "tilestore-open") as pool:
        try:
            while True:
                while len(pending) < max(1, ahead):  # a Stager's next slide may be converting
                    if stopped():
                        return  # the run stopped: nothing more is opened
                    staged, held = held or next(inputs, None), None
                    if staged is None:
                        break
                    if pending and not report.filesystems.proven(staged.store or staged.given):
                        held = staged  # opened alone: a full disk is found once, not 8 times
                        break
                    pending.append(pool.submit(open_one, staged))
                if not pending:
                    if held is None:
                        return
                    continue
                if not _waited(pending[0], stop):
                    return  # the run stopped while this store was opened
                opened = pending.popleft().result()
                if _reported(opened, report):
                    yield opened.job
        finally:  # stopped early: the stores opened ahead release their locks
            closed.set()  # those being opened stop at their next step
            for future in pending:
                future.cancel()
            if isinstance(makers, StoreProcesses) and any(not f.done() for f in pending):
                makers.halt(run)  # and those being opened in store processes
            for future in pending:
                if not future.cancelled() and future.exception() is None:
                    job = future.result().job
                    if job is not None:
                        job.writer.abandon()


def _open_job(
    staged: Staged,
    spec: ModelSpec,
    plan: PlanChoice,
    identity: RunIdentity,
    overwrite: bool,
    report: RunReport,
    max_tiles: int | None,
    any_scale: bool,
    break_lock: bool,
    makers: Callable[..., Any] | StoreProcesses | None = None,
    stopped: Callable[[], bool] | None = None,
    run: str = "",
) -> _Opened:
    """One input opened for the run (`open_for_run`: its store prepared, its writer made, the
    lock taken, its group made), or why not: in a store process where `makers` are
    `StoreProcesses` (the slide's writes then go there too), else here, its group made by
    `makers` (worker processes) where given. Of the report, reads and tells its file
    systems only (`FileSystems`: one set or dict operation a change, safe on threads).
    stopped: once true, no step is begun (`_StoppedOpening`); whatever ends it early
    (that, a KeyboardInterrupt) releases the lock it took."""
    if staged.store is None and staged.error is not None:  # never a store (a URL: no Path)
        return _Opened(staged, staged.given, error=staged.error)
    store = Path(staged.store or staged.given)
    refused = report.filesystems.refusal(store)
    if refused is not None:  # on a file system a write found full or read-only
        return _Opened(staged, store, error=refused, refused=True)

    def go_on() -> None:
        if stopped is not None and stopped():
            raise _StoppedOpening

    try:
        if staged.error:
            raise staged.error
        if isinstance(makers, StoreProcesses):
            request = Request(  # as given: messages name it so (the processes share our cwd)
                str(store), spec, plan, identity, overwrite, max_tiles, any_scale, break_lock, run
            )
            opening = makers.open(request, go_on)
        else:
            opening = open_for_run(
                store,
                spec,
                plan,
                identity,
                overwrite=overwrite,
                max_tiles=max_tiles,
                any_scale=any_scale,
                break_lock=break_lock,
                go_on=go_on,
                maker=makers,
            )
    except AlreadyComplete as exc:
        return _Opened(staged, store, skipped=str(exc))
    except TilestoreError as exc:  # WriteFailed too: its plan, lock or group, as a batch's
        return _Opened(staged, store, error=exc)
    report.filesystems.wrote(store)
    ready = opening.ready
    job = Job(
        store,
        ready.pixels,
        ready.plan,
        opening.writer,
        opening.todo,
        opening.left,
        ready.reading,
        opening.read_out,
    )
    return _Opened(staged, store, job=job, seconds=opening.seconds)


STOP_POLL_S = 0.05  # how often a wait for a store being opened looks at the run's stop


def _waited(future: Future, stop: threading.Event | None) -> bool:
    """Wait for the future: True once it is done, False once `stop` is set first."""
    while not future.done():
        if stop is not None and stop.is_set():
            return False
        wait([future], timeout=STOP_POLL_S if stop is not None else None)
    return True


class _StoppedOpening(Exception):
    """The jobs were closed while this input was being opened (`store_jobs`)."""


def _reported(opened: _Opened, report: RunReport) -> bool:
    """Tell the report of one input as it comes in order; True where it has a job."""
    staged, store = opened.staged, opened.store
    if staged.converted:
        report.converted.append(staged.converted)
    if staged.seconds is not None:
        report.prepared.append(
            {"slide": str(staged.given), "store": str(store), "seconds": staged.seconds}
        )
    report.warnings.extend(staged.warnings)
    if opened.skipped is not None:
        report.skip(store, opened.skipped)
        report.planned(staged.given, store, 0)
        return False
    error = opened.error
    if opened.refused:  # said already where its file system was found full or read-only
        report.failed(store, str(error), error.fault)
        return False
    if isinstance(error, WriteFailed):  # its plan, lock or group: as a batch's write
        report.filesystems.hit(store, error)
        report.failed(store, str(error), error.fault)
        return False
    if error is not None:
        report.failed(store, str(error))
        report.planned(staged.given, store, 0)
        return False
    job = opened.job
    if job.writer.took_over:
        report.warnings.append(f"{store}: {job.writer.took_over}")
    report.planned(staged.given, store, len(job.todo))
    report.opened(job, opened.seconds)
    return True


def slice_jobs(slices: list[Slice], identity: RunIdentity) -> Iterator[Job]:
    """Jobs for slices: the group exists; only the slice's batches not yet done are run."""
    batch = identity.batch_size
    for piece in slices:
        slide = open_slide(piece.store)
        pixels = rgb_input(slide, identity.channels)
        tile_plan, uid = load_plan(slide, piece.plan)
        writer = EmbeddingWriter.attach(slide, tile_plan, uid, identity)
        blocks = writer.todo()
        blocks = blocks[(blocks >= piece.start) & (blocks < piece.stop)]
        yield Job(
            Path(piece.store), pixels, tile_plan, writer, tiles_of(blocks, batch, len(tile_plan))
        )
