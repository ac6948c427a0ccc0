"""The GPU loop and the writer: the model on its device, fed by `embed.produce`.

The main thread copies a host batch to the GPU on a copy stream while the previous batch
computes, transforms it there, runs the model (bf16 autocast, inference mode,
channels_last, optionally compiled: a CUDA graph on a GPU) and starts the copy of the
features back to pinned memory. A writer thread waits for that copy and writes the batch
into the store. Only per-batch CUDA events synchronise; nothing waits per tile.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import torch

from embed.assemble import Batch, SlotPool
from embed.graphs import GraphedForward
from embed.models import LoadedModel
from embed.nvjpeg import GpuJpeg
from embed.procdecode import ProcessDecoder
from embed.produce import DONE, JobEnd, JobStart, Producer
from embed.report import RunReport, Stats
from tilestore.cpus import usable_cpus
from tilestore.errors import ModelError, TilestoreError

if TYPE_CHECKING:
    from embed.engine import Job, Options

# From this many CPUs on, `--decode auto` decodes on the CPU (CPUs - 2 worker processes),
# below it with nvJPEG. ViT-B on an H100, compiled, the job's CPUs set by taskset
# (bench/results/probe2-few4.json, probe2-few8.json, embed-h100-bl-parts.json), tiles/s:
#   CPUs | CPU, 240 px | CPU, 512 px | nvJPEG, 240 px | nvJPEG, 512 px | nvJPEG, 1,024 px
#      4 |       4,217 |       3,823 |          6,649 |          8,684 |            8,952
#      8 |       9,834 |       9,581 |          6,880 |          8,950 |            9,088
#     16 |       9,796 |       9,442 |              - |          8,828 |            9,386
# nvJPEG beside a model that keeps the GPU busy decodes in the model's gaps (README): where
# the CPUs keep up, they leave the GPU to the model. A model much faster than ViT-B (ViT-S:
# 28,000 tiles/s) still outruns 6 decoder processes: pass --decode gpu on 8-12 CPUs there.
AUTO_CPU_DECODE_CPUS = 8


class Runner:
    """Holds the model on its device and drives the producer, the GPU loop and the writer."""

    def __init__(
        self, loaded: LoadedModel, device: torch.device, precision: str, options: Options
    ) -> None:
        self.loaded, self.device, self.precision, self.options = loaded, device, precision, options
        self.cuda = device.type == "cuda"
        # compiled, the transform is fused with the model's first layers (uint8 in, no
        # float32 copy of the batch in between); on a GPU each batch is one graph replay
        self.compiled = None
        if options.compile:
            loaded.transform.prepare(device)  # not inside the first compiled call
            compiled = torch.compile(self._forward)
            self.compiled = GraphedForward(compiled) if self.cuda else compiled
        self.stats = Stats()
        self.open_jobs: list[Job] = []
        self.processes: ProcessDecoder | None = None
        self.gpu_jpeg: GpuJpeg | None = None  # nvJPEG on this GPU (opened by the Embedder)
        self.warm = False  # the model has run once at the run's batch size

    def close(self) -> None:
        """Stop the decoder processes."""
        if self.processes is not None:
            self.processes.close()
            self.processes = None

    def _forward(self, tiles: torch.Tensor) -> torch.Tensor:
        return self.loaded.features(self.loaded.transform(tiles))

    def compute(self, tiles: torch.Tensor, count: int, eager: bool = False) -> torch.Tensor:
        """Features of the first `count` tiles of a batch buffer ((n, h, w, c) uint8, on the
        device)."""
        compiled = self.compiled is not None and not eager
        if not compiled:
            tiles = tiles[:count]  # compiled: keep the full buffer, one graph for every batch
        forward = self.compiled if compiled else self._forward
        autocast = (
            torch.autocast(self.device.type, dtype=torch.bfloat16)
            if self.precision == "bf16"
            else contextlib.nullcontext()
        )
        with torch.inference_mode(), autocast:
            return forward(tiles)[:count]

    def _warm_up(self, batch: int, read: int) -> None:
        """Run the model once on a batch shaped as the first slide's tiles (batch, read,
        read, 3) while the producer fills the pipeline: the first batch's set-up (CUDA
        kernel choice, lazy module loads, or compilation, which takes the transform and so
        the tile size too) then overlaps the first reads and decodes instead of following
        them. Done when the first slide with work is ready, so a run whose stores all fail
        compiles nothing."""
        t0 = time.perf_counter()
        if self.cuda:
            tiles = torch.zeros((batch, read, read, 3), dtype=torch.uint8, device=self.device)
            self.compute(tiles, batch)
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
                self.compute(tiles, batch, eager=True)
                torch.cuda.synchronize(self.device)
                t0 = time.perf_counter()
                for _ in range(3):
                    self.compute(tiles, batch, eager=True)
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
        report.decode = self.decode_mode()
        report.gpu_decoder = self.gpu_jpeg.name if self.gpu_jpeg is not None else None
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
        if self.cuda and self.processes is None:  # kept for later runs: spawning costs ~1 s
            self.processes = ProcessDecoder(self.options.decoders)
        source = Producer(
            self.options,
            self.device,
            self.stats,
            self.processes,
            self.gpu_jpeg,
            self.open_jobs.append,
        )
        producer = threading.Thread(
            target=source.run,
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
        # the model runs on a stream of its own, not the legacy default stream, which
        # waits for and holds up every blocking stream (nvJPEG's inside torchvision):
        # --decode gpu ran ViT-S 8% faster on an H100, the GPU idle 0.58 -> 0.43 s
        compute_stream = torch.cuda.Stream(self.device) if self.cuda else None
        loop_started = time.perf_counter()
        producer.start()
        writer.start()
        try:
            with torch.cuda.stream(compute_stream) if self.cuda else contextlib.nullcontext():
                self._consume(ready, written, outputs, copy_stream, batch, report, loop_started)
        except torch.OutOfMemoryError as exc:
            raise ModelError(
                f"out of GPU memory at batch size {batch}; pass a smaller --batch-size"
            ) from exc
        finally:
            stop.set()
            _drain(ready)
            written.put(DONE)
            writer.join()
            producer.join(timeout=60)
            self.stats.add("loop", time.perf_counter() - loop_started)
            for job in self.open_jobs:  # an interrupted run: keep what is done, free the lock
                job.writer.abandon()
        if report.writer_error is not None:
            raise report.writer_error

    def _consume(self, ready, written, outputs, copy_stream, batch, report, started) -> None:
        """Compute the producer's batches in order until it is DONE (re-raising its error),
        handing each job's start and end to the writer."""
        while True:
            t0 = time.perf_counter()
            item = ready.get()
            self.stats.add("waiting_for_tiles", time.perf_counter() - t0)
            if item is DONE:
                return
            if isinstance(item, BaseException):
                raise item
            if isinstance(item, JobStart | JobEnd):
                written.put(item)
                if isinstance(item, JobStart) and len(item.job.todo) and not self.warm:
                    self._warm_up(batch, item.job.plan.spec.read)  # while the pipeline fills
                continue
            if report.first_batch_s is None:
                report.first_batch_s = round(time.perf_counter() - started, 3)
            self._compute_batch(item, outputs, copy_stream, written)

    def decode_mode(self) -> str:
        return decode_mode(self.options.decode, self.cuda, self.gpu_jpeg is not None)

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
        features = self.compute(tiles, item.count)
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

    def _write(self, written: queue.Queue, outputs: SlotPool, report: RunReport, progress) -> None:
        last_end = None  # the previous batch's end on the GPU: the gap to the next start is idle
        while (item := written.get()) is not DONE:
            try:
                if isinstance(item, JobStart):
                    item.job.writer.create()
                    continue
                if isinstance(item, JobEnd):
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
                    if last_end is not None:
                        self.stats.add("gpu_idle", last_end.elapsed_time(start) / 1000)
                    last_end = end
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
                if not isinstance(item, JobStart | JobEnd):
                    outputs.release(item[1])


def _drain(q: queue.Queue) -> None:
    with contextlib.suppress(queue.Empty):
        while True:
            q.get_nowait()


def decode_mode(option: str, cuda: bool, nvjpeg: bool = True) -> str:
    """The run's --decode, cpu or gpu, from the option (auto, cpu, gpu). Auto is CPU
    decoding without CUDA or where no nvJPEG decoder runs on the GPU (`nvjpeg` False),
    nvJPEG where the job has fewer than `AUTO_CPU_DECODE_CPUS` CPUs, else CPU decoding."""
    if option not in ("auto", "cpu", "gpu"):
        raise TilestoreError(f"--decode {option}: choose auto, cpu or gpu")
    if option == "gpu" and not cuda:
        raise TilestoreError("--decode gpu needs a CUDA device")
    if option == "auto" and not (cuda and nvjpeg):
        return "cpu"
    if option == "auto":
        return "gpu" if usable_cpus() < AUTO_CPU_DECODE_CPUS else "cpu"
    return option
