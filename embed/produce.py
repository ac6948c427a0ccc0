"""The producer: walks each slide's plan in chunk order and hands whole batches of tiles on.

Chunks are read ahead on threads and decoded by worker processes (local stores), CPU
threads or nvJPEG; the decoded grid rows go to the GPU, where their tiles are cut (or, with
no GPU or a zstd level, tiles are cut on CPU threads into pinned batches). The GPU loop
(`tilestore.embed.runner`) gets, in order: a job's `JobStart`, its batches, its `JobEnd` (or
`JobFailed` where the slide's data fails: a damaged chunk), in bundles of a model batch each
(`tilestore.embed.packing`), and `DONE` once every job is
through. A job that fails does not stop the others.
"""

from __future__ import annotations

import collections
import contextlib
import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

from tilestore.embed.assemble import Batch, BatchBuilder, CpuAssembler, cut_tiles
from tilestore.embed.buffers import SlotPool
from tilestore.embed.decodeplan import DecodePath, DecodePlan, decode_plan, slide_decoding
from tilestore.embed.jobs import Job, JobEnd, JobFailed, JobStart
from tilestore.embed.nvjpeg import GpuDecodeFailed, GpuJpeg
from tilestore.embed.packing import Packer
from tilestore.embed.procdecode import ProcessDecoder
from tilestore.embed.queues import DONE, Stopped, put
from tilestore.embed.readout import gpu_steps
from tilestore.embed.report import RunReport, Stats
from tilestore.embed.rows import BothRows, NvjpegRows, ProcessRows, ThreadRows, early_rows
from tilestore.embed.settings import Settings
from tilestore.errors import TilestoreError
from tilestore.plan.tiles import chunk_schedule

# slides whose rows are asked of the decoder processes before their turn, at most
EARLY_SLIDES = 8


@dataclass
class Early:
    """A job decided before its turn, and perhaps read by the decoder processes then
    (`early_rows`); or its data's failure there, raised at its turn."""

    job: Job
    reader: object = None  # its level's ChunkReader
    decoding: DecodePlan | None = None
    sub: object = None  # the plan of its tiles to do
    steps: list | None = None  # the processes' path: the steps its rows are read by
    located: list | None = None  # and where their chunks lie, if found where it was opened
    rows: ProcessRows | None = None  # None: read at its turn (or when blocks free)
    error: TilestoreError | None = None  # its data failed while it was decided


class Producer:
    """Fills the GPU loop's queue from a stream of jobs (run on a thread of its own)."""

    def __init__(
        self,
        settings: Settings,
        stats: Stats,
        processes: ProcessDecoder | None,
        gpu_jpeg: GpuJpeg | None,
        prepared: Callable[[Job], None],
    ) -> None:
        self.settings, self.stats = settings, stats
        self.processes, self.gpu_jpeg = processes, gpu_jpeg
        self.prepared = prepared  # told of each job once it is open (so it can be released)
        self.nvjpeg_failed = False  # the decoder itself failed this run: the CPU decodes on
        self.early: collections.deque[Early] = collections.deque()  # the next jobs, in order

    def run(
        self, jobs: Iterator[Job], report: RunReport, ready: queue.Queue, stop: threading.Event
    ) -> None:
        """Put each job's JobStart, batches and JobEnd on `ready` in bundles (`Packer`),
        then DONE (or the error that stopped it)."""
        settings = self.settings
        # small slides' partial batches share model batches (`tilestore.embed.packing`)
        packer = Packer(settings.batch_size, lambda item: put(ready, item, stop))
        # the jobs opened wait here for the producer: as many as may be read early
        ahead = Ahead(jobs, stop, self.prepared, EARLY_SLIDES if self.processes else 1)
        self.ahead, self.report = ahead, report
        try:
            stream = torch.cuda.Stream(settings.device) if settings.cuda else None
            on_stream = lambda: torch.cuda.stream(stream) if stream else contextlib.nullcontext()  # noqa: E731
            with (
                ThreadPoolExecutor(settings.decoders, "tilestore-decode") as decoders,
                ThreadPoolExecutor(settings.readers, "tilestore-cut") as cutters,
            ):
                for job in ahead:
                    packer.put(JobStart(job))
                    early = self.early.popleft() if self.early else None
                    assert early is None or early.job is job  # read early in order
                    # on a file system a write found full or read-only: the writer fails it
                    refused = report.filesystems.refusal(job.store) is not None
                    try:
                        if len(job.todo) and not refused:
                            with on_stream():
                                self._job(job, report, decoders, cutters, packer.put, stop, early)
                    except TilestoreError as exc:  # this slide's data: the others go on
                        packer.put(JobFailed(job, exc))
                        continue
                    finally:
                        if early is not None and early.rows is not None:
                            early.rows.close()  # used or not (refused), its blocks go back
                    packer.put(JobEnd(job))
            with on_stream():
                packer.flush()
            put(ready, DONE, stop)
        except Stopped:
            return
        except BaseException as exc:  # handed to the main thread, which raises it
            with contextlib.suppress(Stopped):
                put(ready, exc, stop)
        finally:
            while self.early:
                if (rows := self.early.popleft().rows) is not None:
                    rows.close()
            ahead.close()

    def _job(
        self, job: Job, report: RunReport, decoders, cutters, hand_on: Callable, stop, early
    ) -> None:
        settings, plan, batch = self.settings, job.plan, self.settings.batch_size
        if early is not None and early.error is not None:  # found while it was decided
            raise early.error
        if early is not None:  # decided, and perhaps read, before its turn (`_read_early`)
            reader, decoding, sub = early.reader, early.decoding, early.sub
            steps, located = early.steps, early.located
            if steps is None and decoding.path != "cut":  # decided early for another path
                steps, located = _steps(job, sub)
        else:
            reader = job.slide.chunks(plan.spec.level)
            decoding = self._decode_plan(job, reader, report)
            sub = plan.subset(job.todo)
            steps, located = _steps(job, sub) if decoding.path != "cut" else (None, None)
        report.begin(job, decoding.record())
        path = decoding.path
        emit = hand_on  # each batch to the GPU loop, through the packer
        t0 = time.perf_counter()
        if path in ("nvjpeg", "both"):  # the CPU takes over where nvJPEG fails
            emitted: set[int] = set()

            def emit_gpu(b: Batch) -> None:
                emitted.add(b.block)
                hand_on(b)

            try:
                self._on_device(job, reader, sub, emit_gpu, stop, decoders, path, steps=steps)
            except GpuDecodeFailed as exc:
                self.nvjpeg_failed = self.nvjpeg_failed or exc.decoder_fault
                report.warnings.append(
                    f"{job.store}: {exc}; the rest of the slide was decoded on the CPU"
                    + ("; nvJPEG is not used again in this run" if exc.decoder_fault else "")
                )
                rest = job.todo[~np.isin(job.todo // batch, list(emitted))]
                rest_plan = plan.subset(rest)
                cpu = decode_plan(settings, reader, self.processes is not None, None).path
                # the same job (its batches on its lane, before its end), the rest of its tiles
                self._on_device(job, reader, rest_plan, emit, stop, decoders, cpu, todo=rest)
        elif path != "cut":  # decoder processes or threads, tiles cut on the GPU
            rows = None if early is None else early.rows
            where = {"rows": rows, "steps": steps, "located": located}
            self._on_device(job, reader, sub, emit, stop, decoders, path, **where)
        else:  # no GPU, or a zstd level: cut on CPU threads into (pinned) batches
            steps = chunk_schedule(sub)
            read = plan.spec.read
            pool = SlotPool(
                settings.prefetch + settings.readers + 2,
                (batch, read, read, reader.channels),
                pin=settings.cuda,
            )
            assembler = CpuAssembler(
                reader,
                decoders,
                cutters,
                pool,
                window=2 * settings.decoders,
                span=self.stats.span,
            )
            assembler.run(job, sub, job.todo, steps, batch, len(plan), emit, stop)
        self.stats.add("produce", time.perf_counter() - t0)

    def _decode_plan(self, job: Job, reader, report: RunReport) -> DecodePlan:
        """This slide's decoding (`slide_decoding`); a GPU decoder that fails on its sample
        is not used again in this run, and what the decision says is a warning."""
        gpu = None if self.nvjpeg_failed else self.gpu_jpeg
        decided = slide_decoding(self.settings, reader, self.processes is not None, gpu, job.plan)
        if decided.failure is not None:
            self.nvjpeg_failed = decided.failure.decoder_fault
        if decided.said:
            report.warnings.append(f"{job.store}: {decided.said}")
        return decided.plan

    def _on_device(
        self,
        job,
        reader,
        sub,
        emit,
        stop,
        decoders,
        path: DecodePath,
        todo=None,
        rows=None,
        steps=None,
        located=None,
    ) -> None:
        """Grid rows' chunks are decoded ahead (`tilestore.embed.rows`, the row source of
        `path`) and each step's band is stitched and its tiles gathered on the GPU: a few
        kernels per grid row (or per small slide: its rows `joined`), no Python per tile.
        todo: the job's tiles `sub` holds (None: all of its `todo`); rows: its rows read
        early (`early_rows`); steps: `sub`'s (`_steps`; None: made here); located: where
        each step's new chunks lie (None: found as they are asked)."""
        todo = job.todo if todo is None else todo
        read, chunk = sub.spec.read, (reader.chunk_h, reader.chunk_w)
        device, batch = self.settings.device, self.settings.batch_size
        builder = BatchBuilder(job, batch, len(job.plan), emit, None, device, stop)
        if steps is None:
            steps = rows.steps if rows is not None else gpu_steps(sub)
        common = (steps, self.settings, self.stats.span, reader)
        sources = {
            "nvjpeg": lambda: NvjpegRows(*common, self.gpu_jpeg),
            "processes": lambda: ProcessRows(*common, self.processes, stop, located=located),
            "both": lambda: BothRows(*common, self.processes, stop, self.gpu_jpeg),
            "threads": lambda: ThreadRows(*common, decoders),
        }
        nvjpeg = path in ("nvjpeg", "both")  # the chunks come (c, h, w)
        cache: dict[tuple[int, int], torch.Tensor] = {}
        with rows if rows is not None else sources[path]() as source:
            for index, step in enumerate(steps):
                if stop.is_set():
                    raise Stopped
                with self.stats.span("assemble", "assemble (cut tiles on the GPU)"):
                    cache.update(zip(*source.take(index), strict=True))
                    ys, xs = sub.level_y[step.tiles], sub.level_x[step.tiles]
                    tiles = cut_tiles(cache, ys, xs, read, sub.spec.read_stride, chunk, nvjpeg)
                    builder.add(todo[step.tiles], tiles)
                if path == "processes" and source.asked_all:
                    self._read_early(stop)  # every row of this slide asked: the next slides'
                dropped = (cache.pop(tuple(rc), None) for rc in step.drop.tolist())
                source.retire([chunk for chunk in dropped if chunk is not None])
            source.retire(list(cache.values()))

    def _read_early(self, stop: threading.Event) -> None:
        """Decide the next slides' decoding, in order, up to `EARLY_SLIDES` of those opened
        and waiting, and have the decoder processes read their rows now (`early_rows`),
        stopping at the first they do not: each decision is kept for the slide's turn. A
        slide that did not fit the blocks free before is tried again; a slide whose data
        fails here fails at its turn, alone (`Early.error`)."""
        waiting = self.ahead.opened(EARLY_SLIDES)
        if self.early and self.early[-1].rows is None:
            last = self.early[-1]
            if last.steps is None:  # its error, or not read by the processes: at its turn
                return
            last.rows = early_rows(last.steps, *self._early_with(last.reader, stop), last.located)
            if last.rows is None:
                return  # no room yet: the slides after it wait for theirs
        for job in waiting[len(self.early) :]:
            if not len(job.todo):
                return
            try:
                reader = job.slide.chunks(job.plan.spec.level)
                decoding = self._decode_plan(job, reader, self.report)
                sub = job.plan.subset(job.todo)
                steps, located = _steps(job, sub) if decoding.path == "processes" else (None, None)
                rows = (
                    None
                    if steps is None
                    else early_rows(steps, *self._early_with(reader, stop), located)
                )
            except TilestoreError as exc:  # the next slide's own data: its failure, not ours
                self.early.append(Early(job, error=exc))
                return
            self.early.append(Early(job, reader, decoding, sub, steps, located, rows))
            if rows is None:
                return

    def _early_with(self, reader, stop: threading.Event) -> tuple:
        return self.settings, self.stats.span, reader, self.processes, stop


def _steps(job: Job, sub) -> tuple[list, list | None]:
    """The steps the job's tiles to do (`sub`) are read and cut by on the GPU (`gpu_steps`)
    and where each step's new chunks lie (None: found as they are asked): as made where it
    was opened (`Job.read_out`), else here."""
    made = job.read_out
    if made is None:
        return gpu_steps(sub), None
    return made.steps, made.located


class Ahead:
    """The jobs, taken on a thread while the producer streams (`store_jobs` opens several
    ahead); `opened` shows those already waiting, without waiting for more.

    `prepared` is told of each job at once, so a failure releases its lock even if it never
    streamed; a stop closes the jobs, which release those opened and not yet taken."""

    def __init__(
        self,
        jobs: Iterator[Job],
        stop: threading.Event,
        prepared: Callable[[Job], None],
        waiting: int = 1,
    ) -> None:
        self.jobs, self.stop, self.prepared = jobs, stop, prepared
        # `waiting`: how many opened jobs wait (`opened` finds them there, not one a slide)
        self._box: queue.Queue = queue.Queue(maxsize=waiting)
        self._waiting: collections.deque = collections.deque()  # taken from the box
        self._thread = threading.Thread(target=self._prepare, name="tilestore-prepare", daemon=True)
        self._thread.start()

    def __iter__(self) -> Iterator[Job]:
        while True:
            item = self._waiting.popleft() if self._waiting else self._box.get()
            if item is DONE:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def opened(self, most: int) -> list[Job]:
        """Up to `most` of the next jobs, those opened already (no wait)."""
        while len(self._waiting) < most:
            if self._waiting and not isinstance(self._waiting[-1], Job):
                break  # the end, or an error: nothing after it
            try:
                self._waiting.append(self._box.get_nowait())
            except queue.Empty:
                break
        return [item for item in self._waiting if isinstance(item, Job)]

    def close(self) -> None:
        """Stopped: every job it opened is told (`prepared`) before the run releases them."""
        if self.stop.is_set():
            self._thread.join(PREPARE_JOIN_S)

    def _prepare(self) -> None:
        jobs, stop = self.jobs, self.stop
        try:
            for job in jobs:
                self.prepared(job)
                put(self._box, job, stop)
            put(self._box, DONE, stop)
        except Stopped:
            return
        except BaseException as exc:  # re-raised where the jobs are consumed
            with contextlib.suppress(Stopped):
                put(self._box, exc, stop)
        finally:
            close = getattr(jobs, "close", None)
            if close is not None:
                close()


# how long a stopped run waits for the jobs being opened (a group being made in a worker; a
# Stager's conversion is not waited for: its worker is stopped after)
PREPARE_JOIN_S = 30.0
