"""The producer: walks each slide's plan in chunk order and hands whole batches of tiles on.

Chunks are read ahead on threads and decoded by worker processes (local stores), CPU
threads or nvJPEG; the decoded grid rows go to the GPU, where their tiles are cut (or, with
no GPU or a zstd level, tiles are cut on CPU threads into pinned batches). The GPU loop
(`tilestore.embed.runner`) gets, in order: a job's `JobStart`, its batches, its `JobEnd` (or
`JobFailed` where the slide's data fails: a damaged chunk), and `DONE` once every job is
through. A job that fails does not stop the others.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

from tilestore.embed.assemble import Batch, BatchBuilder, CpuAssembler, cut_row
from tilestore.embed.buffers import SlotPool
from tilestore.embed.decodeplan import DecodePath, DecodePlan, decode_plan, slide_decoding
from tilestore.embed.jobs import Job
from tilestore.embed.nvjpeg import GpuDecodeFailed, GpuJpeg
from tilestore.embed.packing import Packer
from tilestore.embed.procdecode import ProcessDecoder
from tilestore.embed.queues import DONE, Stopped, put
from tilestore.embed.report import RunReport, Stats
from tilestore.embed.rows import BothRows, NvjpegRows, ProcessRows, ThreadRows
from tilestore.embed.settings import Settings
from tilestore.errors import TilestoreError
from tilestore.plan.tiles import chunk_schedule


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

    def run(
        self, jobs: Iterator[Job], report: RunReport, ready: queue.Queue, stop: threading.Event
    ) -> None:
        """Put each job's JobStart, batches and JobEnd on `ready`, then DONE (or the error
        that stopped it)."""
        settings = self.settings
        # small slides' partial batches share model batches (`tilestore.embed.packing`)
        packer = Packer(settings.batch_size, lambda item: put(ready, item, stop))
        ahead = _ahead(jobs, stop, self.prepared)
        try:
            stream = torch.cuda.Stream(settings.device) if settings.cuda else None
            on_stream = lambda: torch.cuda.stream(stream) if stream else contextlib.nullcontext()  # noqa: E731
            with (
                ThreadPoolExecutor(settings.decoders, "tilestore-decode") as decoders,
                ThreadPoolExecutor(settings.readers, "tilestore-cut") as cutters,
            ):
                for job in ahead:
                    packer.put(JobStart(job))
                    # on a file system a write found full or read-only: the writer fails it
                    refused = report.filesystems.refusal(job.store) is not None
                    try:
                        if len(job.todo) and not refused:
                            with on_stream():
                                self._job(job, report, decoders, cutters, packer.put, stop)
                    except TilestoreError as exc:  # this slide's data: the others go on
                        packer.put(JobFailed(job, exc))
                        continue
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
            ahead.close()

    def _job(self, job: Job, report: RunReport, decoders, cutters, hand_on: Callable, stop) -> None:
        settings, plan, batch = self.settings, job.plan, self.settings.batch_size
        reader = job.slide.chunks(plan.spec.level)
        decoding = self._decode_plan(job, reader, report)
        report.begin(job, decoding.record())
        path = decoding.path
        sub = plan.subset(job.todo)
        steps = chunk_schedule(sub)
        emit = hand_on  # each batch to the GPU loop, through the packer
        t0 = time.perf_counter()
        if path in ("nvjpeg", "both"):  # the CPU takes over where nvJPEG fails
            emitted: set[int] = set()

            def emit_gpu(b: Batch) -> None:
                emitted.add(b.block)
                hand_on(b)

            try:
                self._on_device(job, reader, sub, steps, emit_gpu, stop, decoders, path)
            except GpuDecodeFailed as exc:
                self.nvjpeg_failed = self.nvjpeg_failed or exc.decoder_fault
                report.warnings.append(
                    f"{job.store}: {exc}; the rest of the slide was decoded on the CPU"
                    + ("; nvJPEG is not used again in this run" if exc.decoder_fault else "")
                )
                rest = job.todo[~np.isin(job.todo // batch, list(emitted))]
                rest_plan = plan.subset(rest)
                cpu = decode_plan(settings, reader, self.processes is not None, None).path
                rest_steps = chunk_schedule(rest_plan)
                # the same job (its batches on its lane, before its end), the rest of its tiles
                self._on_device(
                    job, reader, rest_plan, rest_steps, emit, stop, decoders, cpu, todo=rest
                )
        elif path != "cut":  # decoder processes or threads, tiles cut on the GPU
            self._on_device(job, reader, sub, steps, emit, stop, decoders, path)
        else:  # no GPU, or a zstd level: cut on CPU threads into (pinned) batches
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
        self, job, reader, sub, steps, emit, stop, decoders, path: DecodePath, todo=None
    ) -> None:
        """Grid rows' chunks are decoded ahead (`tilestore.embed.rows`, the row source of
        `path`) and each row's band is stitched and its tiles gathered on the GPU: a few
        kernels per row, no Python per tile. todo: the job's tiles `sub` holds (None: all
        of its `todo`)."""
        todo = job.todo if todo is None else todo
        read, chunk = sub.spec.read, (reader.chunk_h, reader.chunk_w)
        device, batch = self.settings.device, self.settings.batch_size
        builder = BatchBuilder(job, batch, len(job.plan), emit, None, device, stop)
        common = (steps, self.settings, self.stats.span, reader)
        sources = {
            "nvjpeg": lambda: NvjpegRows(*common, self.gpu_jpeg),
            "processes": lambda: ProcessRows(*common, self.processes, stop),
            "both": lambda: BothRows(*common, self.processes, stop, self.gpu_jpeg),
            "threads": lambda: ThreadRows(*common, decoders),
        }
        nvjpeg = path in ("nvjpeg", "both")  # the chunks come (c, h, w)
        cache: dict[tuple[int, int], torch.Tensor] = {}
        with sources[path]() as source:
            for index, step in enumerate(steps):
                if stop.is_set():
                    raise Stopped
                with self.stats.span("assemble", "assemble (cut tiles on the GPU)"):
                    cache.update(zip(*source.take(index), strict=True))
                    y, xs = int(sub.level_y[step.tiles[0]]), sub.level_x[step.tiles]
                    tiles = cut_row(cache, y, xs, read, sub.spec.read_stride, chunk, nvjpeg)
                    builder.add(todo[step.tiles], tiles)
                dropped = (cache.pop(tuple(rc), None) for rc in step.drop.tolist())
                source.retire([chunk for chunk in dropped if chunk is not None])
            source.retire(list(cache.values()))


def _ahead(
    jobs: Iterator[Job], stop: threading.Event, prepared: Callable[[Job], None]
) -> Iterator[Job]:
    """Take the jobs on a thread while this one streams (`store_jobs` opens several ahead).

    `prepared` is told of each job at once, so a failure releases its lock even if it never
    streamed; a stop closes the jobs, which release those opened and not yet taken."""
    box: queue.Queue = queue.Queue(maxsize=1)

    def prepare() -> None:
        try:
            for job in jobs:
                prepared(job)
                put(box, job, stop)
            put(box, DONE, stop)
        except Stopped:
            return
        except BaseException as exc:  # re-raised where the jobs are consumed
            with contextlib.suppress(Stopped):
                put(box, exc, stop)
        finally:
            close = getattr(jobs, "close", None)
            if close is not None:
                close()

    thread = threading.Thread(target=prepare, name="tilestore-prepare", daemon=True)
    thread.start()
    try:
        while (item := box.get()) is not DONE:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:  # stopped: every job it opened is told (`prepared`) before the run releases them
        if stop.is_set():
            thread.join(PREPARE_JOIN_S)


# how long a stopped run waits for the jobs being opened (a group being made in a worker; a
# Stager's conversion is not waited for: its worker is stopped after)
PREPARE_JOIN_S = 30.0
