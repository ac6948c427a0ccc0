"""The streaming embedder: the GPU should be the only thing anyone waits for.

A producer thread walks each slide's plan in chunk order (`tilestore.tiles.chunk_schedule`):
chunk bytes are read ahead on threads and decoded either on CPU threads (imagecodecs frees
the GIL) or on the GPU with nvJPEG, one batched call per grid row on a side stream; whole
plan batches of uint8 tiles are cut from them (`embed.assemble`). The main thread copies a
host batch to the GPU on a copy stream while the previous batch computes, transforms it
there, runs the model (bf16 autocast, inference mode, channels_last, optionally compiled)
and starts the copy of the features back to pinned memory. A writer thread waits for that
copy and writes the batch into the store. Slides follow each other in the same stream, so
the next slide's tiles are in flight while the previous slide's last batch computes. Only
per-batch CUDA events synchronise; nothing waits per tile.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from embed.assemble import (
    Batch,
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
from embed.models import LoadedModel, ModelSpec, load_model
from embed.procdecode import ProcessDecoder
from embed.report import RunReport, Sampler, Stats
from embed.writer import AlreadyComplete, EmbeddingWriter
from tilestore.cpus import usable_cpus
from tilestore.errors import ModelError, TilestoreError
from tilestore.plan import TilePlan
from tilestore.plans import list_plans, load_plan, plan_slide, save_plan
from tilestore.slide import Slide, open_slide
from tilestore.tiles import chunk_schedule

_DONE = object()


@dataclass(frozen=True)
class Options:
    """How to run; each `tilestore embed` option maps onto one field."""

    batch_size: int | None = None  # None: "auto", the largest that fits and still helps
    device: str = "auto"  # auto, cuda, cuda:N, cpu
    # auto: CPU decoder processes, unless the job has under 4 CPUs. nvJPEG takes GPU time
    # from the model: on an H100 with 16 CPUs, CPU decoding beat it for ViT-S, -B and -L.
    decode: str = "auto"  # auto, cpu, gpu
    precision: str = "auto"  # auto (bf16 on CUDA, fp32 on CPU), bf16, fp32
    dtype: str = "float16"  # of the stored features
    compile: bool = False
    readers: int = 4  # threads reading chunk rows ahead (GPU decode) or cutting tiles (CPU)
    decoders: int = max(2, usable_cpus() - 2)  # processes (or threads) decoding JPEG
    prefetch: int = 4  # batches of tiles ready ahead of the GPU
    overwrite: bool = False
    hf_token: str | None = None


@dataclass
class Job:
    """One slide's share of the run."""

    store: Path
    slide: Slide | None = None
    plan: TilePlan | None = None
    writer: EmbeddingWriter | None = None
    todo: np.ndarray | None = None  # global plan indices still to embed
    pool: SlotPool | None = None  # host tile buffers (CPU decode)
    tiles: int = 0
    started: float = 0.0


@dataclass(frozen=True)
class _JobStart:
    """Sent before a job's first batch: the writer makes its group while tiles are read."""

    job: Job


@dataclass(frozen=True)
class _JobEnd:
    """Sent after a job's last batch: the writer finishes the job when it gets here."""

    job: Job


def embed(
    stores: list[str | os.PathLike],
    model: str | LoadedModel,
    *,
    plan: str | None = None,
    plan_options: dict | None = None,
    options: Options = Options(),
    report_path: str | os.PathLike | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> RunReport:
    """Embed each store's plan tiles with one model, writing embeddings/<model> into the store.

    plan: a stored plan's name; else the store's only plan; else one is made with
    plan_options (default: the model's native mpp and tile size) and saved. A store already
    embedded with this model is refused unless options.overwrite; an interrupted one resumes.
    """
    with Embedder(model, options) as embedder:
        return embedder.embed(
            stores, plan=plan, plan_options=plan_options, report_path=report_path, progress=progress
        )


@dataclass(frozen=True)
class Slice:
    """A unit of distributed work: batches [start, stop) of a store's plan.

    Its embeddings group must exist already (`embed.cohort` creates it); the batches are
    whole chunks of the features array, so slices of one store never share a chunk.
    """

    store: str
    plan: str
    start: int  # first batch (block) index
    stop: int  # one past the last
    tiles: int  # tiles in these batches


class Embedder:
    """A model loaded once on its device, embedding whole stores or slices of their plans.

    Used as a context manager (or `close()`d): it keeps decoder processes between runs.
    """

    def __init__(self, model: str | LoadedModel, options: Options = Options()) -> None:
        started = time.perf_counter()
        self.options = options
        self.device = _device(options.device)
        self.precision = _precision(options.precision, self.device)
        # decoder processes start first: they import while the model loads
        decoders = ProcessDecoder(options.decoders) if self.device.type == "cuda" else None
        try:
            self.loaded = (
                model
                if isinstance(model, LoadedModel)
                else load_model(model, token=options.hf_token)
            )
            self.loaded.module.to(self.device).eval()
            if self.device.type == "cuda":
                self.loaded.module.to(memory_format=torch.channels_last)
            self.runner = _Runner(self.loaded, self.device, self.precision, options)
            self.runner.processes = decoders
            self.batch = options.batch_size or self.runner.auto_batch_size()
            if decoders is not None:
                decoders.wait_ready()  # they started before the model loaded: usually are
        except BaseException:
            if decoders is not None:
                decoders.close()
            raise
        self.settings = {"precision": self.precision, "compile": options.compile}
        self._setup_s = time.perf_counter() - started  # reported by the first run

    def writer_identity(self) -> dict[str, Any]:
        """What an embeddings group records of the run that writes it (EmbeddingWriter args)."""
        return {
            "model": self.loaded.describe(),
            "batch_size": self.batch,
            "dtype": self.options.dtype,
            "settings": self.settings,
        }

    def __enter__(self) -> Embedder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.runner.close()

    def embed(
        self,
        stores: list[str | os.PathLike],
        *,
        plan: str | None = None,
        plan_options: dict | None = None,
        report_path: str | os.PathLike | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> RunReport:
        """Embed whole stores (see `embed`)."""
        paths = [Path(s) for s in stores]
        return self._run(
            lambda report: _jobs(paths, self, plan, plan_options or {}, report),
            report_path,
            progress,
        )

    def embed_slices(
        self,
        slices: list[Slice],
        *,
        progress: Callable[[int, int], None] | None = None,
    ) -> RunReport:
        """Embed the batches of each slice still to do, into groups made beforehand."""
        return self._run(lambda report: _slice_jobs(slices, self, report), None, progress)

    def _run(self, make_jobs, report_path, progress) -> RunReport:
        started = time.perf_counter()
        report = RunReport.start(self.loaded, self.device, self.batch, self.options, self.precision)
        report.setup_s, self._setup_s = self._setup_s, 0.0
        self.runner.stats = Stats()
        jobs = make_jobs(report)
        with Sampler(self.device) as sampler:
            self.runner.run(jobs, self.batch, report, progress)
        report.finish(time.perf_counter() - started + report.setup_s, sampler, self.runner.stats)
        if report_path:
            report.save(report_path)
        return report


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise TilestoreError("--device cuda: no CUDA device is visible (CUDA_VISIBLE_DEVICES?)")
    return device


def _precision(name: str, device: torch.device) -> str:
    if name == "auto":
        return "bf16" if device.type == "cuda" else "fp32"
    if name not in ("bf16", "fp32"):
        raise TilestoreError(f"--precision {name}: choose bf16 or fp32")
    return name


def _jobs(
    stores: list[Path],
    embedder: Embedder,
    plan_name: str | None,
    plan_options: dict,
    report: RunReport,
) -> Iterator[Job]:
    """Prepare each store when the producer reaches it (the GPU works meanwhile)."""
    for store in stores:
        job = Job(store)
        try:
            job.slide = open_slide(store)
            job.plan, uid = plan_for(job.slide, embedder.loaded.spec, plan_name, plan_options)
            job.writer = EmbeddingWriter(
                job.slide,
                job.plan,
                uid,
                **embedder.writer_identity(),
                overwrite=embedder.options.overwrite,
                create=False,  # made by the writer thread while the first tiles are read
            )
        except AlreadyComplete as exc:
            report.skip(store, str(exc))
            continue
        except TilestoreError as exc:
            report.failed(store, str(exc))
            continue
        job.todo = _tiles_of(job.writer.todo(), embedder.batch, len(job.plan))
        yield job


def _slice_jobs(slices: list[Slice], embedder: Embedder, report: RunReport) -> Iterator[Job]:
    """Jobs for slices: the group exists; only the slice's batches not yet done are run."""
    for piece in slices:
        job = Job(Path(piece.store))
        job.slide = open_slide(piece.store)
        job.plan, uid = load_plan(job.slide, piece.plan)
        job.writer = EmbeddingWriter.attach(job.slide, job.plan, uid, **embedder.writer_identity())
        blocks = job.writer.todo()
        blocks = blocks[(blocks >= piece.start) & (blocks < piece.stop)]
        job.todo = _tiles_of(blocks, embedder.batch, len(job.plan))
        yield job


def _tiles_of(blocks: np.ndarray, batch: int, n: int) -> np.ndarray:
    """Plan indices of the tiles in these batches."""
    tiles = (np.asarray(blocks, np.int64)[:, None] * batch + np.arange(batch)).ravel()
    return tiles[tiles < n]


def plan_for(slide: Slide, spec: ModelSpec, name: str | None, options: dict):
    """The plan a run uses and its uid: named, the only one, or made with options and saved."""
    if name is not None or (not options and len(list_plans(slide)) == 1):
        return load_plan(slide, name)
    options = {"mpp": spec.native_mpp or 0.5, "tile": spec.tile, **options}
    if slide.mpp is None:
        options["mpp"] = None
    made = plan_slide(slide, **options)
    if made.name in list_plans(slide):  # made before with the same options: reuse it
        stored, uid = load_plan(slide, made.name)
        if np.array_equal(stored.x, made.x) and np.array_equal(stored.y, made.y):
            return stored, uid
        return made, save_plan(slide, made, overwrite=True)
    return made, save_plan(slide, made)


class _Runner:
    """Holds the model on its device and drives the producer, the GPU loop and the writer."""

    def __init__(
        self, loaded: LoadedModel, device: torch.device, precision: str, options: Options
    ) -> None:
        self.loaded, self.device, self.precision, self.options = loaded, device, precision, options
        self.cuda = device.type == "cuda"
        self.features = torch.compile(loaded.features) if options.compile else loaded.features
        self.stats = Stats()
        self.open_jobs: list[Job] = []
        self.processes: ProcessDecoder | None = None
        self.warm = False  # the model has run once at the run's batch size

    def close(self) -> None:
        """Stop the decoder processes."""
        if self.processes is not None:
            self.processes.close()
            self.processes = None

    def compute(
        self, tiles: torch.Tensor, channels_first: bool, count: int, eager: bool = False
    ) -> torch.Tensor:
        """Features of the first `count` tiles of a batch buffer (uint8, on the device)."""
        compiled = self.options.compile and not eager
        if not compiled:
            tiles = tiles[:count]  # compiled: keep the full buffer, one graph for every batch
        features = self.features if compiled else self.loaded.features
        autocast = (
            torch.autocast(self.device.type, dtype=torch.bfloat16)
            if self.precision == "bf16"
            else contextlib.nullcontext()
        )
        with torch.inference_mode(), autocast:
            return features(self.loaded.transform(tiles, channels_first))[:count]

    def _warm_up(self, batch: int) -> None:
        """Run the model once at the run's batch size while the producer fills the pipeline:
        the first batch's set-up (CUDA kernel choice, lazy module loads, or compilation)
        then overlaps the first reads and decodes instead of following them. Done when the
        first slide with work is ready, so a run whose stores all fail compiles nothing."""
        t0 = time.perf_counter()
        if self.cuda:
            size = self.loaded.transform.resize
            tiles = torch.zeros((batch, size, size, 3), dtype=torch.uint8, device=self.device)
            self.compute(tiles, False, batch)
        self.warm = True
        self.stats.add("warm_up", time.perf_counter() - t0)

    def auto_batch_size(self) -> int:
        """The largest batch that fits, stopping when doubling gains under 5%.

        Measured on the eager model even for --compile: compiling at every size tried
        would cost a compilation each and leave a dynamic-shape graph behind."""
        if not self.cuda:
            return 32
        size = self.loaded.transform.resize
        best, best_rate = 32, 0.0
        for batch in (32, 64, 128, 256, 512, 1024):
            tiles = None
            try:
                tiles = torch.randint(
                    0, 255, (batch, size, size, 3), dtype=torch.uint8, device=self.device
                )
                self.compute(tiles, False, batch, eager=True)
                torch.cuda.synchronize(self.device)
                t0 = time.perf_counter()
                for _ in range(3):
                    self.compute(tiles, False, batch, eager=True)
                torch.cuda.synchronize(self.device)
                rate = 3 * batch / (time.perf_counter() - t0)
            except torch.OutOfMemoryError:
                break
            finally:
                del tiles
                torch.cuda.empty_cache()
            if rate < best_rate * 1.05:
                break
            best, best_rate = batch, rate
        return best

    # -- the run ------------------------------------------------------------------------------

    def run(
        self,
        jobs: Iterator[Job],
        batch: int,
        report: RunReport,
        progress: Callable[[int, int], None] | None,
    ) -> None:
        report.decode = self._decode_mode()
        ready: queue.Queue = queue.Queue(maxsize=self.options.prefetch)
        written: queue.Queue = queue.Queue(maxsize=self.options.prefetch + 2)
        outputs = SlotPool(self.options.prefetch + 2, (0,), pin=False)
        outputs.buffers = [
            torch.empty(
                (batch, self.loaded.output_dim),
                dtype=getattr(torch, self.options.dtype),
                pin_memory=self.cuda,
            )
            for _ in outputs.buffers
        ]
        stop = threading.Event()
        producer = threading.Thread(
            target=self._produce,
            name="tilestore-producer",
            daemon=True,
            args=(jobs, batch, report, ready, stop),
        )
        writer = threading.Thread(
            target=self._write,
            name="tilestore-writer",
            daemon=True,
            args=(written, outputs, report, progress),
        )
        copy_stream = torch.cuda.Stream(self.device) if self.cuda else None
        loop_started = time.perf_counter()
        producer.start()
        writer.start()
        try:
            while True:
                t0 = time.perf_counter()
                item = ready.get()
                self.stats.add("waiting_for_tiles", time.perf_counter() - t0)
                if item is _DONE:
                    break
                if isinstance(item, BaseException):
                    raise item
                if isinstance(item, _JobStart | _JobEnd):
                    written.put(item)
                    if isinstance(item, _JobStart) and len(item.job.todo) and not self.warm:
                        self._warm_up(batch)  # while the producer fills the pipeline
                    continue
                if report.first_batch_s is None:
                    report.first_batch_s = round(time.perf_counter() - loop_started, 3)
                self._compute_batch(item, outputs, copy_stream, written)
        except torch.OutOfMemoryError as exc:
            raise ModelError(
                f"out of GPU memory at batch size {batch}; pass a smaller --batch-size"
            ) from exc
        finally:
            stop.set()
            _drain(ready)
            written.put(_DONE)
            writer.join()
            producer.join(timeout=60)
            self.stats.add("loop", time.perf_counter() - loop_started)
            for job in self.open_jobs:  # an interrupted run: keep what is done, free the lock
                job.writer.abandon()
        if report.writer_error is not None:
            raise report.writer_error

    def _decode_mode(self) -> str:
        mode = self.options.decode
        if mode not in ("auto", "cpu", "gpu"):
            raise TilestoreError(f"--decode {mode}: choose auto, cpu or gpu")
        if mode == "gpu" and not self.cuda:
            raise TilestoreError("--decode gpu needs a CUDA device")
        if mode == "auto":
            return "gpu" if self.cuda and usable_cpus() < 4 else "cpu"
        return mode

    def _compute_batch(
        self, item: Batch, outputs: SlotPool, copy_stream, written: queue.Queue
    ) -> None:
        start = end = done = None
        if self.cuda:
            current = torch.cuda.current_stream(self.device)
            if item.slot is not None:  # host tiles: copy on the side stream
                t0 = time.perf_counter()
                with torch.cuda.stream(copy_stream):
                    tiles = item.tiles.to(self.device, non_blocking=True)
                    copied = torch.cuda.Event()
                    copied.record(copy_stream)
                current.wait_event(copied)
                item.job.pool.release(item.slot, copied)  # reused once the copy is done
                self.stats.add("transfer_issue", time.perf_counter() - t0)
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
        features = self.compute(tiles, item.channels_first, item.count)
        slot = outputs.acquire()
        out = outputs.buffers[slot][: item.count]
        out.copy_(features.to(out.dtype), non_blocking=self.cuda)
        if self.cuda:
            end.record()
            done = torch.cuda.Event()
            done.record()
        else:
            self.stats.add("compute", time.perf_counter() - t0)
            if item.slot is not None:
                item.job.pool.release(item.slot)
        written.put((item, slot, done, start, end))

    # -- producer -----------------------------------------------------------------------------

    def _produce(self, jobs, batch, report, ready, stop) -> None:
        if self.cuda and self.processes is None:  # kept for later runs: spawning costs ~1 s
            self.processes = ProcessDecoder(self.options.decoders)
        try:
            stream = torch.cuda.Stream(self.device) if self.cuda else None
            with (
                ThreadPoolExecutor(self.options.decoders, "tilestore-decode") as decoders,
                ThreadPoolExecutor(self.options.readers, "tilestore-cut") as cutters,
            ):
                for job in _ahead(jobs, stop, self.open_jobs.append):
                    put(ready, _JobStart(job), stop)
                    if len(job.todo):
                        with torch.cuda.stream(stream) if stream else contextlib.nullcontext():
                            self._produce_job(job, batch, report, decoders, cutters, ready, stop)
                    put(ready, _JobEnd(job), stop)
            put(ready, _DONE, stop)
        except Stopped:
            return
        except BaseException as exc:  # handed to the main thread, which raises it
            with contextlib.suppress(Stopped):
                put(ready, exc, stop)

    def _produce_job(
        self, job: Job, batch: int, report: RunReport, decoders, cutters, ready, stop
    ) -> None:
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
            self._produce_on_device(job, reader, sub, steps, batch, emit, stop, decoders, gpu)
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

    def _produce_on_device(
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

    def _write(self, written: queue.Queue, outputs: SlotPool, report: RunReport, progress) -> None:
        while (item := written.get()) is not _DONE:
            try:
                if isinstance(item, _JobStart):
                    item.job.writer.create()
                    continue
                if isinstance(item, _JobEnd):
                    job = item.job
                    if len(job.todo):
                        report.end(job)
                    job.writer.finish(report.slide_summary(job))
                    self.open_jobs.remove(job)
                    continue
                batch, slot, done, start, end = item
                if done is not None:
                    done.synchronize()  # the feature copy (and so the batch) has finished
                    self.stats.add("compute", start.elapsed_time(end) / 1000)
                t0 = time.perf_counter()
                batch.job.writer.write(batch.block, outputs.buffers[slot][: batch.count].numpy())
                outputs.release(slot)
                self.stats.add("write", time.perf_counter() - t0)
                batch.job.tiles += batch.count
                report.tiles += batch.count
                if progress:
                    progress(batch.count, report.total)
            except BaseException as exc:
                report.writer_error = exc
                if not isinstance(item, _JobStart | _JobEnd):
                    outputs.release(item[1])


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
            put(box, _DONE, stop)
        except Stopped:
            return
        except BaseException as exc:  # re-raised where the jobs are consumed
            with contextlib.suppress(Stopped):
                put(box, exc, stop)

    threading.Thread(target=prepare, name="tilestore-prepare", daemon=True).start()
    while (item := box.get()) is not _DONE:
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


def _drain(q: queue.Queue) -> None:
    with contextlib.suppress(queue.Empty):
        while True:
            q.get_nowait()
