"""The producer: walks each slide's plan in chunk order and hands whole batches of tiles on.

Chunks are read ahead on threads and decoded by worker processes (local stores), CPU
threads or nvJPEG; the decoded grid rows go to the GPU, where their tiles are cut (or, with
no GPU or a zstd level, tiles are cut on CPU threads into pinned batches). The GPU loop
(`embed.runner`) gets, in order: a job's `JobStart`, its batches, its `JobEnd`, and `DONE`
once every job is through.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from embed.assemble import (
    BatchBuilder,
    CpuAssembler,
    SlotPool,
    Stopped,
    cut_row,
    decode_gpu,
    decode_row_cpu,
    gpu_decode_agrees,
    put,
)
from embed.procdecode import ProcessDecoder
from embed.report import RunReport, Stats
from tilestore.plan import TilePlan
from tilestore.tiles import chunk_schedule

if TYPE_CHECKING:
    from embed.engine import Job, Options

DONE = object()


@dataclass(frozen=True)
class JobStart:
    """Sent before a job's first batch: the writer makes its group while tiles are read."""

    job: Job


@dataclass(frozen=True)
class JobEnd:
    """Sent after a job's last batch: the writer finishes the job when it gets here."""

    job: Job


class Producer:
    """Fills the GPU loop's queue from a stream of jobs (run on a thread of its own)."""

    def __init__(
        self,
        options: Options,
        device: torch.device,
        stats: Stats,
        processes: ProcessDecoder | None,
        prepared: Callable[[Job], None],
    ) -> None:
        self.options, self.device, self.stats = options, device, stats
        self.cuda = device.type == "cuda"
        self.processes = processes
        self.prepared = prepared  # told of each job once it is open (so it can be released)

    def run(self, jobs, batch, report, ready, stop) -> None:
        try:
            stream = torch.cuda.Stream(self.device) if self.cuda else None
            with (
                ThreadPoolExecutor(self.options.decoders, "tilestore-decode") as decoders,
                ThreadPoolExecutor(self.options.readers, "tilestore-cut") as cutters,
            ):
                for job in _ahead(jobs, stop, self.prepared):
                    put(ready, JobStart(job), stop)
                    if len(job.todo):
                        with torch.cuda.stream(stream) if stream else contextlib.nullcontext():
                            self._job(job, batch, report, decoders, cutters, ready, stop)
                    put(ready, JobEnd(job), stop)
            put(ready, DONE, stop)
        except Stopped:
            return
        except BaseException as exc:  # handed to the main thread, which raises it
            with contextlib.suppress(Stopped):
                put(ready, exc, stop)

    def _job(self, job: Job, batch: int, report: RunReport, decoders, cutters, ready, stop) -> None:
        plan = job.plan
        reader = job.slide.chunks(plan.spec.level)
        gpu = report.decode == "gpu" and reader.is_jpeg
        if gpu:
            sample = [tuple(rc) for rc in plan.needed_chunks()[:3].tolist()]
            difference = gpu_decode_agrees(reader, sample, self.device)
            if difference > 2.0:
                gpu = False
                report.warnings.append(
                    f"{job.store}: nvJPEG decodes this store's JPEG chunks differently from "
                    f"libjpeg (mean |difference| {difference:.1f} levels): decoded on the CPU"
                )
        job.started = time.perf_counter()
        report.begin(job)
        sub = _subset(plan, job.todo)
        steps = chunk_schedule(sub)
        emit = lambda b: put(ready, b, stop)  # noqa: E731 - a callback, named for reading
        t0 = time.perf_counter()
        if self.cuda and reader.is_jpeg:  # decode (GPU or CPU threads), cut on the GPU
            self._on_device(job, reader, sub, steps, batch, emit, stop, decoders, gpu)
        else:  # no GPU, or a zstd level: cut on CPU threads into (pinned) batches
            read = plan.spec.read
            job.pool = SlotPool(
                self.options.prefetch + self.options.readers + 2,
                (batch, read, read, reader.channels),
                pin=self.cuda,
            )
            assembler = CpuAssembler(
                reader,
                decoders,
                cutters,
                job.pool,
                window=2 * self.options.decoders,
                timed=self.stats.add,
            )
            assembler.run(job, sub, job.todo, steps, batch, len(plan), emit, stop)
        self.stats.add("produce", time.perf_counter() - t0)

    def _on_device(
        self, job, reader, sub, steps, batch, emit, stop, decoders, nvjpeg: bool
    ) -> None:
        """Grid rows' chunks are decoded ahead: by nvJPEG (one batched call per row), by
        worker processes into shared memory (local stores), or by decoder threads; the
        decoded row goes to the GPU in one copy, where its band is stitched and its tiles
        gathered (a few kernels per row, no Python per tile)."""
        read, chunk = sub.spec.read, (reader.chunk_h, reader.chunk_w)
        shape = (reader.chunk_h, reader.chunk_w, reader.channels)
        builder = BatchBuilder(job, batch, len(job.plan), emit, None, nvjpeg, self.device, stop)
        procs = self.processes if not nvjpeg and reader.paths([]) is not None else None
        if procs is not None:
            most = max((len(s.load) for s in steps), default=1)
            procs.reserve(self.options.decoders + 2, most * int(np.prod(shape)), pin=True)
        ahead = self.options.decoders if procs is not None else self.options.readers
        # the rows the first batch needs are split among the decoders (in one round: a row in
        # p parts is ready in about 1/p of the time), so the GPU starts sooner
        first_rows = int(np.searchsorted(np.cumsum([len(s.tiles) for s in steps]), batch)) + 1
        first_parts = max(1, self.options.decoders // first_rows)

        def load(coords_array):  # on a reader thread
            coords = [tuple(rc) for rc in coords_array.tolist()]
            t0 = time.perf_counter()
            payload = (
                (reader.fetch(coords) if nvjpeg else decode_row_cpu(reader, coords, decoders))
                if coords
                else None
            )
            self.stats.add("read" if nvjpeg else "read_decode", time.perf_counter() - t0)
            return coords, payload

        def submit(index):
            step = steps[index]
            coords = [tuple(rc) for rc in step.load.tolist()]
            if procs is None or not coords:
                return readers.submit(load, step.load)
            parts = first_parts if index < first_rows else 1
            return coords, procs.submit(reader.paths(coords), shape, reader.background, stop, parts)

        cache: dict[tuple[int, int], torch.Tensor] = {}
        futures: dict[int, object] = {}
        with ThreadPoolExecutor(self.options.readers, "tilestore-read") as readers:
            for index, step in enumerate(steps):
                if stop.is_set():
                    raise Stopped
                for k in range(index, min(index + ahead, len(steps))):
                    if k not in futures:
                        futures[k] = submit(k)
                t0 = time.perf_counter()
                pending = futures.pop(index)
                if isinstance(pending, tuple):  # a worker process decoded into shared memory
                    coords, (block, parts) = pending
                    for part in parts:
                        part.result()
                    self.stats.add("wait_decode", time.perf_counter() - t0)
                    rows = torch.from_numpy(procs.view(block, len(coords), shape))
                    on_device = rows.to(self.device, non_blocking=True)  # pinned: DMA
                    copied = torch.cuda.Event()
                    copied.record()
                    procs.release(block, copied)  # reused once the copy is done
                    cache.update(zip(coords, on_device.unbind(0), strict=True))
                else:
                    coords, payload = pending.result()
                    if coords and nvjpeg:
                        cache.update(
                            zip(coords, decode_gpu(reader, payload, self.device), strict=True)
                        )
                    elif coords:
                        on_device = torch.from_numpy(payload).to(self.device, non_blocking=True)
                        cache.update(zip(coords, on_device.unbind(0), strict=True))
                y, xs = int(sub.level_y[step.tiles[0]]), sub.level_x[step.tiles]
                tiles = cut_row(cache, y, xs, read, sub.spec.read_stride, chunk, nvjpeg)
                builder.add(job.todo[step.tiles], tiles)
                self.stats.add("assemble", time.perf_counter() - t0)
                if procs is not None and index + 1 >= first_rows:
                    procs.start_pinning()  # the first batch is out: pinning no longer delays it
                for rc in step.drop.tolist():
                    cache.pop(tuple(rc), None)

    # -- writer -------------------------------------------------------------------------------


def _ahead(
    jobs: Iterator[Job], stop: threading.Event, prepared: Callable[[Job], None]
) -> Iterator[Job]:
    """Prepare the next slide (open, plan, writer) on a thread while this one streams.

    `prepared` is told of each job at once, so a failure releases its lock even if it never
    streamed."""
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

    threading.Thread(target=prepare, name="tilestore-prepare", daemon=True).start()
    while (item := box.get()) is not DONE:
        if isinstance(item, BaseException):
            raise item
        yield item


def _subset(plan: TilePlan, indices: np.ndarray) -> TilePlan:
    return TilePlan(
        plan.name,
        plan.spec,
        plan.row[indices],
        plan.col[indices],
        plan.tissue[indices],
        plan.roi[indices],
        plan.roi_class[indices],
        plan.classes,
        plan.chunk_shape,
        plan.params,
        plan.notes,
    )
