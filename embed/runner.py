"""The GPU loop and the writer: the model on its device, fed by `tilestore.embed.produce`.

The main thread copies a host batch to the GPU on a copy stream while the previous batch
computes, transforms it there, runs the model (`tilestore.embed.forward`) and starts the copy of the
features back to pinned memory, and behind it one flag: whether every value of the batch
is finite as stored (reduced on the device, after the cast to the stored dtype). A writer
thread waits for that copy and writes the batch into the store, or, where the flag says
no, fails the slide: a non-finite batch is never written nor marked done. Only per-batch
CUDA events synchronise; nothing waits per tile.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from tilestore import stopping
from tilestore.embed import nvtx
from tilestore.embed.assemble import Batch, Piece
from tilestore.embed.buffers import SlotPool
from tilestore.embed.compilecache import CompileCache, Waiting, cache_key
from tilestore.embed.forward import Forward
from tilestore.embed.jobs import Job, JobEnd, JobFailed, JobStart
from tilestore.embed.lanes import Lanes
from tilestore.embed.models import ModelError
from tilestore.embed.nvjpeg import GpuJpeg
from tilestore.embed.procdecode import ProcessDecoder
from tilestore.embed.produce import Producer
from tilestore.embed.queues import DONE, drain
from tilestore.embed.report import RunReport, Stats
from tilestore.embed.settings import Settings
from tilestore.embeddings.groups import non_finite_rows
from tilestore.errors import DeviceError, StoreError, TilestoreError, WriteFailed
from tilestore.format.store import WriteFault

# threads writing slides' batches and finishing them, each slide's steps in order (`Lanes`):
# mostly waiting for a store process (`tilestore.embed.storeside`)
STORE_LANES = 8


class Runner:
    """Drives the producer, the GPU loop and the writer for one model and its decoders.

    Kept across runs (an `Embedder` holds one): the model warms up once, at the first run
    that has tiles to embed; on a GPU, uncompiled, at its first run, on its own tile side,
    before any slide is ready (`_guess_warm_up`), and again only for a first slide read at
    another side.
    """

    def __init__(
        self,
        forward: Forward,
        settings: Settings,
        processes: ProcessDecoder | None,
        gpu_jpeg: GpuJpeg | None,
    ) -> None:
        self.forward, self.settings = forward, settings
        self.processes, self.gpu_jpeg = processes, gpu_jpeg
        self.warm = False  # the model has run once at the run's batch size, the first read
        self.warm_read: int | None = None  # the tile side that run was on (or a guess's)
        self.waiting = Waiting()  # how a warm-up waits for another process compiling
        self.compiled_s: float | None = None  # seconds the warm-up compiled (None: it did not)
        self.notes: list[str] = []  # what the warm-up did with the compile cache
        self.marks: nvtx.Nvtx | nvtx.TorchMarks | None = None  # named ranges, when profiling
        if settings.profile == "torch":
            self.marks = nvtx.TorchMarks()
        if settings.profile == "nvtx":
            self.marks = nvtx.load()
            if self.marks is None:
                raise DeviceError(
                    "--profile nvtx: no NVTX library found (it comes with CUDA builds of "
                    "torch, as the nvidia-nvtx package)"
                )

    def _warm_up(
        self, stats: Stats, batch: int, read: int, say: Callable[[str], None] | None = None
    ) -> None:
        """Run the model once on a batch shaped as the first slide's tiles (batch, read,
        read, 3) while the producer fills the pipeline: the first batch's set-up (CUDA
        kernel choice, lazy module loads, or compilation, which takes the transform and so
        the tile size too) then overlaps the first reads and decodes instead of following
        them. Compiled, done when the first slide with work is ready, so a run whose stores
        all fail compiles nothing (uncompiled on a GPU, a guess runs before: one batch).
        With the compile cache, the graphs are loaded, or compiled by this process alone
        while others of the array wait (`CompileCache.claim`); `say` hears each step as it
        happens (a compile is silent for up to minutes)."""
        settings, tell = self.settings, say or _nothing_said
        cache = self.compile_cache(batch, read)
        if cache is not None:
            with stats.span("compile_cache_wait", "wait for another process's compile"):
                self.notes.append(cache.claim(tell))
        try:
            with stats.span("warm_up", "warm-up (CUDA set-up, compilation)"):
                if settings.cuda or cache is not None:
                    self._first_call(batch, read, cache, tell)
            if cache is not None:
                saved = cache.save()
                if saved:
                    self.notes.append(saved)
        finally:
            if cache is not None:
                cache.release()
        self.warm, self.warm_read = True, read

    def _guess_warm_up(self, stats: Stats, say: Callable[[str], None] | None) -> None:
        """Warm up before any slide is ready, on the model's own tile side (the read of a
        plan at its native um/px on a level of that um/px): the warm-up then overlaps the
        first slide's conversion and plan instead of following them (0.5 s of ViT-L's first
        batch on an H100). On a GPU, uncompiled only: a guess compiled for another read
        would be compiled again."""
        settings = self.settings
        if self.warm or self.warm_read is not None or not settings.cuda or settings.compile:
            return
        self._warm_up(stats, settings.batch_size, self.forward.loaded.spec.tile, say)
        self.warm = False  # until the first slide's read is known to be the guess

    def _warm_for(self, stats: Stats, read: int, say: Callable[[str], None] | None) -> None:
        """Warm up for the first slide with tiles, read x read, unless a guess did."""
        if self.warm:
            return
        if read == self.warm_read:  # guessed right
            self.warm = True
            return
        self._warm_up(stats, self.settings.batch_size, read, say)

    def compile_cache(self, batch: int, read: int) -> CompileCache | None:
        """The compile cache entry for the model on (batch, read, read, 3) tiles; None
        where the run does not compile or keeps no cache."""
        settings = self.settings
        if not (settings.compile and settings.compile_cache):
            return None
        key = cache_key(
            self.forward.loaded.describe(), batch, read, settings.precision, settings.device
        )
        return CompileCache(Path(settings.compile_cache), key, self.waiting)

    def _first_call(
        self, batch: int, read: int, cache: CompileCache | None, say: Callable[[str], None]
    ) -> None:
        """The model's first call on the run's shape, said where it compiles."""
        tiles = torch.zeros((batch, read, read, 3), dtype=torch.uint8, device=self.settings.device)
        compiles = self.settings.compile and (cache is None or not cache.loaded)
        if compiles:
            name = self.forward.loaded.spec.name
            say(
                f"compiling {name} for batch {batch} of {read} px tiles (torch.compile; "
                "10-130 s the first time) ..."
            )
        elif cache is not None:
            say(f"loaded compiled graphs from {cache.path}")
        started = time.perf_counter()
        with _compile_workers(cache, self.notes):
            self.forward(tiles, batch)
        if compiles:
            self.compiled_s = time.perf_counter() - started
            say(f"compiled {name} in {self.compiled_s:.1f} s")

    # -- the run ------------------------------------------------------------------------------

    def run(
        self,
        jobs: Iterator[Job],
        report: RunReport,
        progress: Callable[[int, int], None] | None = None,
        say: Callable[[str], None] | None = None,
        stop: threading.Event | None = None,
    ) -> Stats:
        """Embed the jobs' tiles, writing each batch as it is done; return the stage times.
        say: told what the run does before its first batch (compiling, waiting for a
        compile), as it happens. stop: set when the run stops (its jobs' too)."""
        settings = self.settings
        slots = settings.prefetch + 2 + STORE_LANES  # a lane holds its batch's slot as it writes
        run = _Run(
            stats=Stats(self.marks),
            report=report,
            progress=progress,
            say=say,
            ready=queue.Queue(maxsize=settings.prefetch),
            written=queue.Queue(maxsize=slots),
            outputs=SlotPool(
                slots,
                (settings.batch_size, self.forward.width),
                pin=settings.cuda,
                dtype=self.forward.row_dtype(getattr(torch, settings.dtype)),
            ),
            finite=[
                torch.ones((), dtype=torch.bool, pin_memory=settings.cuda) for _ in range(slots)
            ],
            failed={},
            stop=stop if stop is not None else threading.Event(),
            open_jobs=[],
            copy_stream=torch.cuda.Stream(settings.device) if settings.cuda else None,
            lanes=Lanes(STORE_LANES, limit=slots),
            lock=threading.Lock(),
        )
        source = Producer(settings, run.stats, self.processes, self.gpu_jpeg, run.open_jobs.append)
        producer = threading.Thread(
            target=source.run,
            name="tilestore-producer",
            daemon=True,
            args=(jobs, report, run.ready, run.stop),
        )
        writer = threading.Thread(
            target=self._write, name="tilestore-writer", daemon=True, args=(run,)
        )
        # the model runs on a stream of its own, not the legacy default stream, which
        # waits for and holds up every blocking stream (nvJPEG's inside torchvision):
        # decode="gpu" ran ViT-S 8% faster on an H100, the GPU idle 0.58 -> 0.43 s
        compute_stream = torch.cuda.Stream(settings.device) if settings.cuda else None
        started = time.perf_counter()
        producer.start()
        writer.start()
        stopped = False
        try:
            with (
                torch.cuda.stream(compute_stream) if settings.cuda else contextlib.nullcontext(),
                _torch_trace(settings) as trace,
                _timed_collector(run.stats),
                stopping.at_batches(),  # a stop asked (SIGUSR1) is taken at the next batch
            ):
                self._guess_warm_up(run.stats, run.say)  # while the first slide is prepared
                self._consume(run, started, trace.step if trace is not None else _nothing)
        except torch.OutOfMemoryError as exc:
            raise ModelError(
                f"out of GPU memory at batch size {settings.batch_size}; pass a smaller batch_size"
            ) from exc
        except stopping.Stopped:
            stopped = True
            raise
        finally:
            run.stop.set()
            drain(run.ready)
            run.written.put(DONE)
            writer.join()  # every batch computed is written (a partial shard waits in memory)
            run.lanes.close()
            producer.join(timeout=60)
            run.stats.add("loop", time.perf_counter() - started)
            if (note := self.forward.graph_note) is not None:  # the model's batches ran as is
                report.notes.append(note)
            left = []
            for job in run.open_jobs:  # an interrupted run: keep what is done, free the lock
                said = job.writer.abandon()  # writes the shard still partly filled, marks it
                report.kept[str(job.store)] = job.writer.tiles_done()
                if said and not said.startswith("nothing"):
                    left.append(f"{job.store}: {said}")
            if stopped:
                stopping.kept(_kept(report, left))
        if report.writer_error is not None:
            raise report.writer_error
        return run.stats

    def _consume(self, run: _Run, started: float, step: Callable[[], None]) -> None:
        """Compute the producer's batches in order until it is DONE (re-raising its error),
        handing each job's start and end to the writer: each bundle (`Bundle`: a model
        batch, the starts before it, the ends after it) as one item there too."""
        run.stats.name_thread("tilestore-gpu-loop")
        waited = 0.0  # the loop's wait for items since its last batch (slide switches)
        while True:
            asked = time.perf_counter()
            with run.stats.span("waiting_for_tiles", "wait for tiles"):
                bundle = _next(run.ready)
            waited += time.perf_counter() - asked
            if bundle is DONE:
                return
            if isinstance(bundle, BaseException):
                raise bundle
            out: list[object] = []  # what goes on to the writer, in order, as one
            try:
                for item in bundle:
                    if self._take(run, item, started, waited, out):
                        waited = 0.0
                        step()  # the torch profiler's schedule counts batches
            finally:
                if out:
                    run.written.put(out)

    def _take(self, run: _Run, item: object, started: float, waited: float, out: list) -> bool:
        """One item of a bundle: a job's start or end on to the writer (`out`), or a batch
        computed; whether it was."""
        if stopping.asked() and not isinstance(item, JobEnd | JobFailed):
            raise stopping.Stopped  # the batches computed go to the writer; no new one
        if isinstance(item, JobStart | JobEnd | JobFailed):
            if isinstance(item, JobStart) and run.report.filesystems.refusal(item.job.store):
                run.failed[id(item.job)] = item.job  # not computed: the writer says why
            out.append(item)
            computed = id(item.job) not in run.failed
            if isinstance(item, JobStart) and len(item.job.todo) and computed and not self.warm:
                run.written.put(out[:])  # its group made while the model warms up
                out.clear()
                self._warm_for(run.stats, item.job.plan.spec.read, run.say)
                run.report.notes.extend(self.notes)
                self.notes.clear()
            return False
        if all(id(piece.job) in run.failed for piece in item.pieces()):
            # its slide (each slide packed in it) failed at a batch before: not computed
            if item.pool is not None:
                item.pool.release(item.slot)
            return False
        if run.report.first_batch_s is None:
            run.report.first_batch_s = round(time.perf_counter() - started, 3)
        out.append(self._compute_batch(run, item, waited))
        return True

    def _compute_batch(self, run: _Run, item: Batch, waited: float) -> tuple:
        """Launch a batch's transfer, model and copy back; what the writer waits on."""
        start = end = done = None
        cuda, device = self.settings.cuda, self.settings.device
        if cuda:
            current = torch.cuda.current_stream(device)
            if item.pool is not None:  # host tiles: copy on the side stream
                with run.stats.span("transfer_issue", "H2D copy"):
                    with torch.cuda.stream(run.copy_stream):
                        tiles = item.tiles.to(device, non_blocking=True)
                        copied = torch.cuda.Event()
                        copied.record(run.copy_stream)
                    current.wait_event(copied)
                    item.pool.release(item.slot, copied)  # reused once the copy is done
            else:  # tiles decoded and cut on the GPU by the producer's stream
                current.wait_event(item.ready)
                tiles = item.tiles
            tiles.record_stream(current)
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
        else:
            tiles = item.tiles
        t0 = time.perf_counter()
        with run.stats.span("launch", "forward (preprocess, model)"):  # CPU time to launch
            features = self.forward(tiles, item.count)
        slot = run.outputs.acquire()
        out = run.outputs.buffers[slot][: item.count]
        with run.stats.mark("D2H copy"):
            rows = features.to(out.dtype)
            out.copy_(rows, non_blocking=cuda)
            # behind the features in the stream: the writer reads it after `done`, no sync here
            run.finite[slot].copy_(self._finite(rows), non_blocking=cuda)
        if cuda:
            end.record()
            done = torch.cuda.Event()
            done.record()
        else:
            run.stats.add("compute", time.perf_counter() - t0)
            if item.pool is not None:
                item.pool.release(item.slot)
        return (item, slot, done, start, end, waited)

    def _finite(self, rows: torch.Tensor) -> torch.Tensor:
        """Whether every value of a batch's rows is finite as stored, on their device: the
        features (and tokens) cast to the stored dtype first, since float16 makes an
        infinity of what bf16 or fp32 hold past 65504 (a no-op cast where the rows are of
        that dtype already: no measures ride along)."""
        stored = rows[:, : self.forward.stored_width].to(getattr(torch, self.settings.dtype))
        return torch.isfinite(stored).all()

    def _not_finite(self, piece: Piece, rows: torch.Tensor) -> str | None:
        """Why a plan batch is not written: its store, the model, and the tiles whose
        features are not finite as stored (plan indices, level-0 x, y of the first few, and
        how many); None where its own rows are all finite (packed beside one that is not)."""
        dtype = self.settings.dtype
        stored = rows[:, : self.forward.stored_width].to(getattr(torch, dtype)).numpy()
        bad = non_finite_rows(stored)
        if not len(bad):
            return None
        batch = piece
        tiles = batch.block * self.settings.batch_size + bad
        plan = batch.job.plan
        shown = ", ".join(f"{t} at ({plan.x[t]}, {plan.y[t]})" for t in tiles[:3].tolist())
        # a NaN is the model's; infinities alone in float16 are most likely values past its
        # range, finite as computed (the host has only the stored values to tell by)
        overflow = (
            "; infinities, no NaN: float16 stores so what passes its range (65504), "
            "dtype='float32' would keep them"
            if dtype == "float16" and not np.isnan(stored[bad]).any()
            else ""
        )
        return (
            f"{batch.job.store}: {self.forward.loaded.spec.name} made NaN or infinite features "
            f"for {len(tiles)} tile(s) of batch {batch.block} (plan tile, level-0 x, y: "
            f"{shown}{', ...' if len(tiles) > 3 else ''}){overflow}; that batch and the rest "
            "of the slide are not written"
        )

    def _fail(self, run: _Run, job: Job, error: str, fault: WriteFault | None = None) -> None:
        """A slide failed (its data, or a batch not finite): its later batches are dropped,
        what is done stays done (a later run resumes from it), the report says why. On its
        lane (`_write`)."""
        run.failed[id(job)] = job
        left = job.writer.abandon()
        with run.lock:
            if job in run.open_jobs:
                run.open_jobs.remove(job)
            run.report.failed(job.store, error + (f" ({left})" if left else ""), fault)

    def _stop(self, run: _Run, job: Job, error: WriteFailed) -> None:
        """A write into the job's store failed (a full disk, a read-only folder, a file in
        the way): its slide stops at once, as a failed one; where the file system is at
        fault, the stores on it not begun are not attempted (`FileSystems`)."""
        with run.lock:
            run.report.filesystems.hit(job.store, error)
        self._fail(run, job, str(error), error.fault)

    def _write(self, run: _Run) -> None:
        """The writer thread: takes the GPU loop's items in order (a bundle's at a time),
        waits for each batch's features to reach the host (timing the GPU's work and its
        idling between batches), and hands each slide's steps (its group made, its batches
        written, its finish, or its failure) to the slide's lane (`Lanes`): a slide's steps
        in order, the slides' side by side, so one slide's finish never holds up the next's
        batches."""
        report, lanes = run.report, run.lanes
        seen = _Seen()
        run.stats.name_thread("tilestore-writer")
        try:
            while (items := run.written.get()) is not DONE:
                for item in items:
                    try:
                        self._hand_on(run, item, seen)
                    except BaseException as exc:
                        report.writer_error = exc
        finally:
            lanes.join()
            if lanes.error is not None and report.writer_error is None:
                report.writer_error = lanes.error

    def _hand_on(self, run: _Run, item: object, seen: _Seen) -> None:
        """One item to its slide's lane: a start, an end, a failure, or a computed batch's
        rows (each slide's on its lane; the output slot given back by the last)."""
        report, lanes, stats = run.report, run.lanes, run.stats
        if isinstance(item, JobStart):
            lanes.submit(id(item.job), functools.partial(self._start, run, item.job))
            return
        if isinstance(item, JobEnd):
            if len(item.job.todo) and id(item.job) not in run.failed:
                with run.lock:
                    report.end(item.job)  # its wall ends with its last batch here
            lanes.submit(id(item.job), functools.partial(self._finish, run, item.job))
            return
        if isinstance(item, JobFailed):
            fail = functools.partial(self._data_failed, run, item.job, item.error)
            lanes.submit(id(item.job), fail)
            return
        batch, held, done, start, end, waited = item
        try:
            idle = waited  # without a GPU: the loop's wait for this batch
            if done is not None:
                with stats.span("writer_waits_gpu", "wait for the GPU"):
                    done.synchronize()  # the feature copy (and so the batch) has finished
                stats.add("compute", start.elapsed_time(end) / 1000)
                idle = seen.last_end.elapsed_time(start) / 1000 if seen.last_end else None
                if idle is not None:
                    stats.add("gpu_idle", idle)
                seen.last_end = end
            pieces = batch.pieces()
            # the slides whose first rows this batch holds: the GPU's wait for it is their
            # switch, shared among them (the run's fill aside)
            new = [p.job for p in pieces if id(p.job) not in seen.firsts]
            fill = not seen.firsts
            seen.firsts.update(id(job) for job in new)
            if new and not fill and idle is not None:
                with run.lock:
                    for job in new:
                        report.switched(job, idle / len(new))
            slot, held = _Held(held, len(pieces)), None
            for piece in pieces:  # each slide's rows on its own lane
                lanes.submit(id(piece.job), functools.partial(self._batch, run, piece, slot))
        finally:
            if held is not None:  # not handed to a lane: given back here
                run.outputs.release(held)

    def _data_failed(self, run: _Run, job: Job, error: TilestoreError) -> None:
        """A job's data failed (the producer's `JobFailed`): failed, unless a batch of it
        failed before (said then)."""
        if id(job) not in run.failed:
            self._fail(run, job, str(error), getattr(error, "fault", None))

    def _start(self, run: _Run, job: Job) -> None:
        """A job's first step on its lane: its group made where the opening did not (a store
        on a file system found full or read-only since: not attempted)."""
        refused = run.report.filesystems.refusal(job.store)
        if refused is not None:
            self._fail(run, job, str(refused), refused.fault)
            return
        try:  # a store it cannot write into (read-only, full): its slide fails
            job.writer.create()
        except WriteFailed as exc:
            self._stop(run, job, exc)
        except TilestoreError as exc:
            self._fail(run, job, str(exc))

    def _batch(self, run: _Run, piece: Piece, slot: _Held) -> None:
        """A plan batch's rows written into its store from the output slot (given back once
        every slide's rows in it are), or, where they are not finite as stored, its slide
        failed."""
        outputs, job = run.outputs, piece.job
        try:
            rows = outputs.buffers[slot.slot][piece.start : piece.start + piece.count]
            if id(job) in run.failed:  # its slide failed at a batch before
                return
            if not run.finite[slot.slot]:  # copied before `done`: read without a sync
                error = self._not_finite(piece, rows)
                if error is not None:
                    self._fail(run, job, error)
                    return
            with run.stats.span("write"):
                try:
                    job.writer.write(piece.block, rows.numpy())
                except WriteFailed as exc:  # its slide stops here, the run goes on
                    self._stop(run, job, exc)
                    return
                except StoreError as exc:  # its store process died: the slide alone fails
                    self._fail(run, job, str(exc))
                    return
        finally:
            if slot.done():
                outputs.release(slot.slot)
        with run.lock:
            run.report.count(job, piece.count)
            if run.progress:
                run.progress(piece.count, run.report.progress_total())

    def _finish(self, run: _Run, job: Job) -> None:
        """A job's last step on its lane: its last writes and record, its lock released."""
        if id(job) in run.failed:  # failed at a batch: released, and reported, then
            return
        started = time.perf_counter()
        with run.stats.span("finish_slide", "finish a slide (last writes, summary)"):
            with run.lock:
                summary = run.report.slide_summary(job)
            try:
                job.writer.finish(summary)
            except WriteFailed as exc:  # its last shards, or its record
                self._stop(run, job, exc)
                return
            except StoreError as exc:  # its store process died
                self._fail(run, job, str(exc))
                return
            quality = job.writer.quality_summary()
        with run.lock:
            run.report.quality(job, quality)
            if job in run.open_jobs:
                run.open_jobs.remove(job)
            run.report.completed(job, time.perf_counter() - started)


@dataclass
class _Seen:
    """What the writer keeps between batches: the previous batch's end on the GPU (the gap
    to the next start is idle) and the jobs whose first batch came."""

    last_end: torch.cuda.Event | None = None
    firsts: set[int] = field(default_factory=set)


class _Held:
    """An output slot held by the slides whose rows it carries, given back by the last."""

    def __init__(self, slot: int, holders: int) -> None:
        self.slot, self._left, self._lock = slot, holders, threading.Lock()

    def done(self) -> bool:
        """One holder is through with it; whether it was the last."""
        with self._lock:
            self._left -= 1
            return self._left == 0


@dataclass(frozen=True)
class _Run:
    """What one run's threads share: its queues, buffers, stop flag, stage times, report."""

    stats: Stats
    report: RunReport
    progress: Callable[[int, int], None] | None
    say: Callable[[str], None] | None
    ready: queue.Queue  # producer -> GPU loop: bundles (`Bundle`), then DONE
    written: queue.Queue  # GPU loop -> writer: each bundle's items, in a list
    outputs: SlotPool  # feature buffers the GPU copies into and the writer reads
    finite: list[torch.Tensor]  # per output slot: its batch is finite as stored (pinned)
    failed: dict[int, Job]  # id -> job the writer failed: its later batches are dropped
    stop: threading.Event
    open_jobs: list[Job]  # opened by the producer and not finished: released at the end
    copy_stream: torch.cuda.Stream | None
    lanes: Lanes  # each slide's writes, in order; the slides' side by side
    lock: threading.Lock  # the report and open_jobs, as the lanes change them


def _next(ready: queue.Queue) -> object:
    """The producer's next item; a stop asked meanwhile (`tilestore.stopping`) while none
    comes is taken without waiting for one."""
    while True:
        try:
            return ready.get(timeout=0.5)
        except queue.Empty:
            if stopping.asked():
                raise stopping.Stopped from None


def _kept(report: RunReport, left: list[str]) -> str:
    """What a run stopped at a batch kept: its tiles written (and done), the stores it
    finished, and each store it was in the middle of."""
    finished = sum(1 for s in report.slides if "seconds" in s and not s.get("failed"))
    return (
        f"{report.tiles:,} tiles embedded by this run are written and marked done "
        f"({finished} store(s) finished)" + "".join(f"; {line}" for line in left)
    )


def _nothing() -> None:
    pass


def _nothing_said(line: str) -> None:
    pass


def _torch_trace(settings: Settings) -> contextlib.AbstractContextManager:
    """With profile="torch", a torch.profiler that skips 2 batches, warms up on 2 and
    records `profile_batches`, then writes a Chrome/Perfetto trace to `profile_out`; else
    nothing."""
    if settings.profile != "torch":
        return contextlib.nullcontext(None)
    from torch.profiler import ProfilerActivity, profile, schedule

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if settings.cuda else [])
    return profile(
        activities=activities,
        schedule=schedule(wait=2, warmup=2, active=settings.profile_batches, repeat=1),
        on_trace_ready=lambda p: p.export_chrome_trace(settings.profile_out),
    )


@contextlib.contextmanager
def _timed_collector(stats: Stats) -> Iterator[None]:
    """The garbage collector's passes during the run, timed as the stage "gc" (a pass holds
    the GIL: every thread of the run waits for it).

    Freezing the heap the run starts with (gc.freeze: the model's and the compiler's
    600,000 objects out of the full passes) was tried and measured: the passes took 10 ms a
    run either way, and the frozen runs were 5-9% slower (bench/RESULTS.md, "the heap
    frozen")."""
    times: dict[int, float] = {}

    def timed(phase: str, info: dict) -> None:
        if phase == "start":
            times[info["generation"]] = time.perf_counter()
        elif info["generation"] in times:
            stats.add("gc", time.perf_counter() - times.pop(info["generation"]))

    gc.callbacks.append(timed)
    try:
        yield
    finally:
        gc.callbacks.remove(timed)


def _compile_workers(cache: CompileCache | None, notes: list[str]):
    """Inductor's pool of compile worker processes only where there is compiling to do.

    With the compile cache loaded the graphs come from it: a pool started for nothing is
    still starting (each worker importing torch) when a short run ends, and the process
    then waits for it at exit: 11 s of a 37 s compiled process on the lent H100
    (bench/RESULTS.md, "compile workers")."""
    if cache is None or not cache.loaded:
        return contextlib.nullcontext()
    from torch._inductor import config

    notes.append("compile cache hit: compiled in this process (no compile worker pool)")
    return config.patch(compile_threads=1)
