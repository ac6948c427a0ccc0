"""The streaming embedder: the GPU should be the only thing anyone waits for.

`embed` (or an `Embedder` kept across runs) loads the model once and streams the plan
tiles of every store through three stages that overlap: the producer (`tilestore.embed.produce`)
reads chunks ahead and decodes them (worker processes, CPU threads or nvJPEG) into whole
plan batches of uint8 tiles; the GPU loop (`tilestore.embed.runner`) transforms and embeds each
batch while the next is copied in; a writer thread stores finished batches in the store's
embeddings group. Slides follow each other in the same stream, so the next slide's tiles
are in flight while the previous slide's last batch computes.

Every setting is decided once, by `tilestore.embed.settings.resolve`, when the Embedder is made.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from tilestore.cpus import usable_cpus
from tilestore.embed import nvjpeg, readout
from tilestore.embed.forward import Forward, QualityLayout, place, token_layout
from tilestore.embed.inputs import SlidesAtOnce, Stager, as_staged
from tilestore.embed.jobs import (
    STORES_AHEAD,
    THREADS_AHEAD,
    Job,
    Slice,
    slice_jobs,
    store_jobs,
)
from tilestore.embed.models import LoadedModel, ModelSpec, load_model, model_record
from tilestore.embed.nvjpeg import GpuJpeg
from tilestore.embed.opening import PlanChoice
from tilestore.embed.preflight import Preflight, check_stores
from tilestore.embed.procdecode import ProcessDecoder
from tilestore.embed.readout import Wanted
from tilestore.embed.report import RunReport, Sampler, Stats
from tilestore.embed.runner import Runner
from tilestore.embed.settings import Options, Precision, Settings, resolve
from tilestore.embed.sizing import choose_batch, remembered_rate
from tilestore.embed.storeside import ROWS_BYTES, StoreProcesses
from tilestore.embeddings import RunIdentity
from tilestore.errors import Interrupted
from tilestore.options import checked as checked_options
from tilestore.plan.options import DEFAULT_MPP
from tilestore.reading.resolution import OverrideMpp, ScanMpp
from tilestore.urls import written_here
from tilestore.workers import Calls

# the most processes doing stores' work beside the run (`Embedder._store_side`): three in
# four of the CPUs, the rest left to the run's process and its decoders
STORE_PROCESSES = 12


def _ahead(side) -> int:
    """How many stores a run opens ahead of the GPU: two a store process (each answers
    four calls at once: the rest of its threads write and finish slides, never queued
    behind openings), at most `STORES_AHEAD`; where the run opens them itself, fewer."""
    if isinstance(side, StoreProcesses):
        return min(STORES_AHEAD, 2 * side.count)
    return THREADS_AHEAD


@checked_options
def embed(
    stores: list[str | os.PathLike] | Stager,
    model: str | ModelSpec | LoadedModel,
    *,
    plan: PlanChoice = None,
    options: Options = Options(),
    report_path: str | os.PathLike | None = None,
    progress: Callable[[int, int], None] | None = None,
    convert_into: str | os.PathLike | None = None,
    in_place: bool = False,
    sidecars: str | os.PathLike | None = None,
    scan_mpp: ScanMpp = None,
    override_mpp: OverrideMpp = False,
    at_once: SlidesAtOnce = 1,
    checked: Preflight | None = None,
    say: Callable[[str], None] | None = None,
) -> RunReport:
    """Embed each store's plan tiles with one model, writing embeddings/<model>/<plan> into the
    store. A store already embedded with this model is skipped unless options.overwrite; an
    interrupted one resumes. A store that fails is reported in the returned report and the
    others go on.

    Parameters
    ----------
    stores : list of str or path, or Stager
        Stores (or slide files, with `convert_into` or `in_place`); or a `Stager` made
        already (the command makes it before it imports torch, so the first slide converts
        meanwhile): `convert_into`, `in_place` and `sidecars` are then its own.
    model : str, ModelSpec or LoadedModel
        A registered name, timm:<arch>, local:<dir>, random:<name>; its record (`ModelSpec`,
        resolved once by the caller: the command does); or a model loaded. A name is
        resolved here, once, and the record passed along.
    plan : str, PlanOptions or None
        A stored plan's name; `PlanOptions` to make one (its unset mpp and tile are the
        model's); None for the store's only plan, else one made at the model's native mpp
        and tile size (`tilestore.embed.opening.plan_for`).
    options : Options
        How to run (device, precision, batch size, decode, overwrite...): `resolve`d once.
    report_path : str or path, optional
        Where the run's JSON report is written (whole or not at all).
    progress : callable, optional
        Called with (tiles done, total) as batches are written.
    convert_into : str or path, optional
        A folder where inputs that are slide files rather than stores are converted first
        (`tilestore.embed.inputs.Stager`, in a worker process: the first while the model
        loads, each next one while the GPU embeds the one before).
    in_place : bool
        Slide files are read where they are instead, through sidecars in `sidecars` (None:
        beside each slide; `tilestore.conversion.open_in_place`). With neither this nor
        `convert_into`, every input must be a store.
    scan_mpp, override_mpp
        The level-0 um/px of slide files given where their files record none; with
        override_mpp, over what they record (as ``convert(mpp=..., override_mpp=...)``).
    at_once : int or "auto"
        Slide files made ready at once, each in a worker process of its own (1: one after
        another, a slide ahead of the GPU; "auto": one per 2 CPUs): a cohort of small slides.
    checked : Preflight, optional
        What `tilestore.embed.preflight` found of these stores before (the command checks
        them before it imports torch); else they are checked here, before the model loads:
        refused and complete stores go into the report without costing a model load.
    say : callable, optional
        Called with a line for each step before the first batch that may take long
        (compiling, or waiting for another process compiling the same graphs), as it
        happens.

    Returns
    -------
    RunReport
        Each store's outcome (embedded, skipped, failed and why), the run's settings and
        timings; ``exit_code`` is the command's exit status (`tilestore.embed.outcome`).
    """
    if report_path is not None:  # before the model loads
        written_here(report_path, "report_path")
    if not isinstance(model, LoadedModel):
        model = model_record(model)  # the one resolution of the name in this run
    if checked is None and not isinstance(stores, Stager):
        spec = model.spec if isinstance(model, LoadedModel) else model
        checked = check_stores(list(stores), spec, plan, options)
        stores = checked.kept
    if isinstance(stores, Stager):
        inputs = stores
    else:
        inputs = Stager(
            stores,
            convert_into,
            plan,
            in_place=in_place,
            sidecars=sidecars,
            scan_mpp=scan_mpp,
            override_mpp=override_mpp,
            at_once=at_once,
        )
    try:
        with Embedder(model, options) as embedder:
            return embedder.embed(
                inputs,
                plan=plan,
                report_path=report_path,
                progress=progress,
                checked=checked,
                say=say,
            )
    finally:
        inputs.close()


class Embedder:
    """A model loaded once on its device, embedding whole stores or slices of their plans.

    cpus: the CPUs this embedder may use (None: its process's affinity); a local Dask
    cluster gives each worker its share. Used as a context manager (or `close()`d): it
    keeps its decoder processes between runs.
    """

    def __init__(
        self,
        model: str | ModelSpec | LoadedModel,
        options: Options = Options(),
        *,
        cpus: int | None = None,
    ) -> None:
        started = time.perf_counter()
        host = _Host(model, options.hf_token, cpus)
        try:
            self.settings: Settings = resolve(options, host)
            self.processes = host.processes  # started by resolve, kept between runs
            self.loaded = host.model_on(self.settings.device)
            tokens = self.settings.tokens
            self.tokens = (
                None if tokens is None else token_layout(self.loaded, self.settings.device, tokens)
            )
            self.quality = (
                QualityLayout(self.loaded.spec.native_mpp or DEFAULT_MPP, self.loaded.spec.tile)
                if self.settings.quality
                else None
            )
            forward = Forward(
                self.loaded,
                self.settings.device,
                self.settings.precision,
                self.settings.compile,
                self.tokens,
                self.quality,
            )
            self.gpu_jpeg = host.decoder  # opened by resolve, kept between runs
            self.runner = Runner(forward, self.settings, self.processes, host.decoder)
            if self.processes is not None:
                with host.timed("waiting for decoder processes"):
                    self.processes.wait_ready()  # usually are: started before the model loaded
        except BaseException:
            if host.processes is not None:
                host.processes.close()
            if host.decoder is not None:
                host.decoder.close()
            raise
        self._setup_s = time.perf_counter() - started  # reported by the first run
        self._setup = {"before the engine (process start, imports)": _since_process_start(started)}
        self._setup |= {k: round(v, 3) for k, v in host.timings.items()}
        self._batch_note = host.batch_note
        self.model_mb = host.model_mb
        self._side: StoreProcesses | Calls | None = None  # `_store_side`

    def writer_identity(self) -> RunIdentity:
        """What an embeddings group records of the run that writes it."""
        return RunIdentity(
            model=self.loaded.describe(),
            batch_size=self.settings.batch_size,
            dtype=self.settings.dtype,
            precision=self.settings.precision,
            compile=self.settings.compile,
            channels=self.settings.channels,
            shard_tiles=self.settings.shard_tiles,
            tokens=self.tokens.record() if self.tokens else None,
            quality=self.quality.record() if self.quality else None,
        )

    def warm_up(self, read: int, say: Callable[[str], None] | None = None) -> list[str]:
        """Run the model once on tiles read as `read` px windows, at the run's batch size,
        as a run does for its first slide (with compile: compiled, through the compile
        cache); the notes it made. A later run on such tiles starts warm."""
        self.runner._warm_up(Stats(), self.settings.batch_size, read, say)
        notes, self.runner.notes = self.runner.notes, []
        graphs = self.runner.forward.graph_note  # a model its batches are not replayed for
        return notes + ([graphs] if graphs is not None else [])

    def __enter__(self) -> Embedder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _store_side(self) -> StoreProcesses | Calls:
        """Where each store's work is done beside the run (`store_jobs`), started as the first
        run needs it and kept between runs: store processes (`tilestore.embed.storeside`),
        which open each store, make its group, write its rows and finish it, so the run's
        process never holds the GIL for zarr's calls (75 ms a small slide); where a batch's
        rows are too large for a pipe (token grids: `storeside.ROWS_BYTES`), processes that
        only make each group (some 30 zarr arrays, 200 ms of a CPU), the rest done here."""
        if self._side is None:
            count = max(2, min(STORE_PROCESSES, usable_cpus() * 3 // 4))
            forward, settings = self.runner.forward, self.settings
            itemsize = forward.row_dtype(getattr(torch, settings.dtype)).itemsize
            if settings.batch_size * forward.width * itemsize <= ROWS_BYTES:
                # on a GPU each slide's steps are made there, with its chunks located where
                # the decoder processes read them (`tilestore.embed.readout`)
                wanted = Wanted(self.processes is not None, readout.JOIN_PIXELS)
                self._side = StoreProcesses(count, wanted if settings.cuda else None)
            else:
                self._side = Calls(count, keep_on_stop=True)
        return self._side

    def close(self) -> None:
        """Stop the decoder processes and release the GPU JPEG decoder."""
        if self._side is not None:
            self._side.close()
            self._side = None
        if self.processes is not None:
            self.processes.close()
            self.processes = None
        if self.gpu_jpeg is not None:
            self.gpu_jpeg.close()
            self.gpu_jpeg = None

    def embed(
        self,
        stores: list[str | os.PathLike] | Stager,
        *,
        plan: PlanChoice = None,
        report_path: str | os.PathLike | None = None,
        progress: Callable[[int, int], None] | None = None,
        checked: Preflight | None = None,
        say: Callable[[str], None] | None = None,
    ) -> RunReport:
        """Embed whole stores, or the slides a Stager converts (see `embed`); checked: what
        was refused or skipped of them before (`tilestore.embed.preflight`), for the report."""
        identity = self.writer_identity()
        spec, overwrite, most = self.loaded.spec, self.settings.overwrite, self.settings.max_tiles
        side = self._store_side()
        return self._run(
            lambda report, stop: store_jobs(
                as_staged(stores),
                spec,
                plan,
                identity,
                overwrite,
                report,
                most,
                self.settings.any_scale,
                self.settings.break_lock,
                checked.plans if checked is not None else None,  # resolved once, by the checks
                ahead=_ahead(side),
                makers=side,
                stop=stop,
            ),
            report_path,
            progress,
            checked,
            say,
        )

    def embed_slices(
        self,
        slices: list[Slice],
        *,
        progress: Callable[[int, int], None] | None = None,
        say: Callable[[str], None] | None = None,
    ) -> RunReport:
        """Embed the batches of each slice still to do, into groups made beforehand. say:
        called with a line as the run does something worth a log line (compiling)."""
        identity = self.writer_identity()
        return self._run(lambda report, stop: slice_jobs(slices, identity), None, progress, say=say)

    def _run(
        self,
        make_jobs: Callable[[RunReport, threading.Event], Iterator[Job]],
        report_path: str | os.PathLike | None,
        progress: Callable[[int, int], None] | None,
        checked: Preflight | None = None,
        say: Callable[[str], None] | None = None,
    ) -> RunReport:
        started, wall_started = time.perf_counter(), time.time()
        if report_path is not None:  # a URL refused before any work, not written to "s3:"
            report_path = written_here(report_path, "report_path")
        report = RunReport.start(self.loaded.describe(), self.settings)
        for store, why in checked.refused if checked else ():
            report.failed(store, why)
        for store, why in checked.skipped if checked else ():
            report.skip(store, why)
        if checked is not None:
            report.expect(checked.tiles)
        report.setup_s, self._setup_s = self._setup_s, 0.0
        report.setup_parts, self._setup = self._setup, {}
        report.batch_note, report.model_mb = self._batch_note, self.model_mb
        if self.settings.cuda:  # the run's peak, not the batch search's
            torch.cuda.reset_peak_memory_stats(self.settings.device)
        try:
            with Sampler(self.settings.device) as sampler:
                halt = threading.Event()  # the run's stop: its jobs stop opening stores too
                stats = self.runner.run(make_jobs(report, halt), report, progress, say, halt)
        except KeyboardInterrupt as stop:  # Ctrl-C, SIGTERM: what was done is kept, and said
            report.stopped(str(stop) or "SIGINT")
            report.wall_s = time.perf_counter() - started + report.setup_s
            if report_path:
                report.save(report_path)
            raise Interrupted(report.interrupted, report) from stop
        report.finish(time.perf_counter() - started + report.setup_s, sampler, stats)
        if self.settings.profile == "torch":
            trace = Path(self.settings.profile_out)
            if trace.exists() and trace.stat().st_mtime >= wall_started:
                report.notes.append(f"torch profiler trace: {trace}")
            else:
                report.warnings.append(
                    f"--profile torch: no trace written; the run had fewer than the "
                    f"{4 + self.settings.profile_batches} batches it needs (2 skipped, 2 to "
                    "warm up, --profile-batches recorded)"
                )
        if report_path:
            report.save(report_path)
        return report


def _since_process_start(now: float) -> float:
    """Seconds from this process's start to the clock reading `now` (perf_counter)."""
    return round(max(_process_age() - (time.perf_counter() - now), 0.0), 3)


def _process_age() -> float:
    """Seconds since this process started. On Linux from the kernel's own clock: its start
    in ticks since boot (/proc/self/stat) against the time since boot. psutil's
    create_time adds the boot time, which /proc/stat gives in whole seconds, so an age
    taken from it is late by the boot's fraction of a second, the same for every process
    of a machine: up to 1 s more "before the engine" on one host than on another."""
    try:
        with open("/proc/self/stat") as stat:  # the name field may hold spaces: after ')'
            started = int(stat.read().rsplit(")", 1)[1].split()[19])
        return time.clock_gettime(time.CLOCK_BOOTTIME) - started / os.sysconf("SC_CLK_TCK")
    except (OSError, AttributeError):  # no /proc, or no CLOCK_BOOTTIME (macOS, Windows)
        import psutil

        return time.time() - psutil.Process().create_time()


class _Host:
    """The machine as `resolve` asks about it (`tilestore.embed.settings.Machine`). It starts the
    decoder processes and the GPU JPEG decoder when told to or when an answer needs them,
    loads the model when an answer needs it, and keeps all three for the Embedder."""

    def __init__(
        self, model: str | ModelSpec | LoadedModel, token: str | None, cpus: int | None
    ) -> None:
        # a name resolved here once (an Embedder made from a name); a record as it is
        self._model = model if isinstance(model, LoadedModel) else model_record(model)
        self._token, self._cpus = token, cpus
        self._placed: LoadedModel | None = None
        self.processes: ProcessDecoder | None = None
        self.decoder: GpuJpeg | None = None
        self.batch_note: str | None = None  # how --batch-size auto was decided
        self.timings: dict[str, float] = {}  # set-up parts, seconds
        self.model_mb: float | None = None  # GPU memory of the model alone

    def cuda_device(self) -> int | None:
        return torch.cuda.current_device() if torch.cuda.is_available() else None

    def cpus(self) -> int:
        return self._cpus or usable_cpus()

    def start_decoders(self, count: int, nvtx_marks: bool) -> None:
        self.processes = ProcessDecoder(count, nvtx_marks)

    def gpu_jpeg(self, device: torch.device, required: bool) -> str | None:
        self.decoder = nvjpeg.open_decoder(device, required=required)
        return self.decoder.name if self.decoder is not None else None

    def jpeg_engines(self) -> int:
        return getattr(self.decoder, "engines", (0, 0))[0]

    def model_rate(self, device: torch.device, precision: Precision) -> float | None:
        return remembered_rate(self.model_on(device), device, precision)

    def best_batch(self, device: torch.device, precision: Precision) -> int:
        loaded = self.model_on(device)
        with self.timed("batch size"):
            batch, self.batch_note = choose_batch(loaded, device, precision)
        return batch

    @contextlib.contextmanager
    def timed(self, part: str) -> Iterator[None]:
        """Add the block's seconds to `timings[part]` (the report's set-up breakdown)."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self.timings[part] = self.timings.get(part, 0.0) + time.perf_counter() - started

    def model_on(self, device: torch.device) -> LoadedModel:
        """The model with its weights, on `device` (loaded the first time it is asked for)."""
        if self._placed is None:
            model = self._model
            with self.timed("model load (build, weights)"):
                loaded = (
                    model
                    if isinstance(model, LoadedModel)
                    else load_model(model, token=self._token, device=device)
                )
            with self.timed("model to device"):
                self._placed = place(loaded, device)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                    self.model_mb = round(torch.cuda.memory_allocated(device) / 2**20, 1)
        return self._placed
