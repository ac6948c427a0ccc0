"""The streaming embedder: the GPU should be the only thing anyone waits for.

`embed` (or an `Embedder` kept across runs) loads the model once and streams the plan
tiles of every store through three stages that overlap: the producer (`embed.produce`)
reads chunks ahead and decodes them (worker processes, CPU threads or nvJPEG) into whole
plan batches of uint8 tiles; the GPU loop (`embed.runner`) transforms and embeds each batch
while the next is copied in; a writer thread stores finished batches in the store's
embeddings group. Slides follow each other in the same stream, so the next slide's tiles
are in flight while the previous slide's last batch computes.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from embed import nvjpeg
from embed.assemble import SlotPool
from embed.models import LoadedModel, ModelSpec, load_model
from embed.procdecode import ProcessDecoder
from embed.report import RunReport, Sampler, Stats
from embed.runner import Runner, decode_mode
from embed.writer import AlreadyComplete, EmbeddingWriter
from tilestore.cpus import usable_cpus
from tilestore.errors import TilestoreError
from tilestore.plan import TilePlan
from tilestore.plans import list_plans, load_plan, plan_slide, save_plan
from tilestore.slide import Slide, open_slide


@dataclass(frozen=True)
class Options:
    """How to run; each `tilestore embed` option maps onto one field."""

    batch_size: int | None = None  # None: "auto", the largest that fits and still helps
    device: str = "auto"  # auto, cuda, cuda:N, cpu
    # auto: nvJPEG where the job has fewer than 8 CPUs, else CPU decoder processes
    # (embed.runner.AUTO_CPU_DECODE_CPUS says what that rests on)
    decode: str = "auto"  # auto, cpu, gpu
    precision: str = "auto"  # auto (bf16 on CUDA, fp32 on CPU), bf16, fp32
    dtype: str = "float16"  # of the stored features
    compile: bool = False
    readers: int = 4  # threads reading chunk rows ahead (GPU decode) or cutting tiles (CPU)
    decoders: int | None = None  # processes (or threads) decoding JPEG; None: CPUs - 2
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
        if options.decoders is None:  # the CPUs this process may use, where it runs
            options = replace(options, decoders=max(2, usable_cpus() - 2))
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
            self.runner = Runner(self.loaded, self.device, self.precision, options)
            self.runner.processes = decoders
            mode = decode_mode(options.decode, self.device.type == "cuda")
            if mode == "gpu":  # auto only uses nvJPEG where it runs
                required = options.decode == "gpu"
                self.runner.gpu_jpeg = nvjpeg.open_decoder(self.device, required=required)
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
    """The device, with its index: nvJPEG keeps one decoder per device as named."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise TilestoreError("--device cuda: no CUDA device is visible (CUDA_VISIBLE_DEVICES?)")
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
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
