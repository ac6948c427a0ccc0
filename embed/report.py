"""Where the time and memory of an embedding run went, printed and saved as JSON.

Wall time is explained as setup + the GPU loop + finishing; the loop is split into the
model's warm-up (overlapping the first reads), the time the GPU computed (CUDA events per
batch), the time the main thread waited for tiles (the producer was the bottleneck) and the
rest (launch overhead, waiting for the writer).
Producer and writer times are thread-seconds, overlapped with the loop, to say which stage
limits. GPU utilisation comes from NVML, sampled every 0.1 s; host RSS from psutil.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil
import torch

from tilestore.cpus import usable_cpus
from tilestore.embed.filesystems import FileSystems
from tilestore.embed.nvtx import Nvtx, TorchMarks
from tilestore.embed.outcome import exit_code, interrupted_code
from tilestore.embed.preflight import without_store
from tilestore.embed.reportfile import ended, write_report
from tilestore.embed.settings import Settings
from tilestore.format.store import WriteFault, software_versions
from tilestore.progress import AtLeast

# `Stats.span` as the stages take it: span(stage, mark=None) -> a context manager
Span = Callable[..., contextlib.AbstractContextManager]

# the stage of `RunReport.explained` a slow reader or decoder shows as
WAITING = "waiting for tiles (read/decode bound)"
# the warm-up waiting for another process of the array to compile the model's graphs
COMPILE_WAIT = "waiting for another process's compile (compile cache)"


def no_span(stage: str, mark: str | None = None) -> contextlib.AbstractContextManager:
    """A span that times and marks nothing (for stages used outside a run)."""
    return contextlib.nullcontext()


class Stats:
    """Thread-safe accumulators of seconds per stage; with `marks` (a profiler's named
    ranges: `tilestore.embed.nvtx`), each `span` is also a range of the stage's name on its
    thread."""

    def __init__(self, marks: Nvtx | TorchMarks | None = None) -> None:
        self._lock = threading.Lock()
        self.seconds: dict[str, float] = {}
        self.marks = marks

    def add(self, stage: str, seconds: float) -> None:
        with self._lock:
            self.seconds[stage] = self.seconds.get(stage, 0.0) + seconds

    def get(self, stage: str) -> float:
        return self.seconds.get(stage, 0.0)

    @contextlib.contextmanager
    def span(self, stage: str, mark: str | None = None) -> Iterator[None]:
        """Time the block as `stage` (and mark it `mark or stage` for the profiler)."""
        started = time.perf_counter()
        try:
            with self.mark(mark or stage):
                yield
        finally:
            self.add(stage, time.perf_counter() - started)

    @contextlib.contextmanager
    def mark(self, name: str) -> Iterator[None]:
        """A named range for the profiler, not timed (nothing when not profiling)."""
        marks = self.marks
        if marks is not None:
            marks.push(name)
        try:
            yield
        finally:
            if marks is not None:
                marks.pop()

    def name_thread(self, name: str) -> None:
        """Name the calling thread in the profiler's timeline (nothing when not profiling)."""
        if self.marks is not None:
            self.marks.name_thread(name)


class Sampler(threading.Thread):
    """Samples GPU utilisation and memory (NVML) and host RSS while the run lasts."""

    def __init__(self, device: torch.device, interval: float = 0.1) -> None:
        super().__init__(name="tilestore-sampler", daemon=True)
        self.device, self.interval = device, interval
        self.gpu_util: list[float] = []
        self.gpu_mem_mb = 0.0
        self.rss_mb = 0.0
        self._stop_event = threading.Event()
        self._handle = None
        self.nvml_error: str | None = None

    def __enter__(self) -> Sampler:
        if self.device.type == "cuda":
            try:
                import pynvml

                pynvml.nvmlInit()
                index = (
                    self.device.index
                    if self.device.index is not None
                    else torch.cuda.current_device()
                )
                self._handle = pynvml.nvmlDeviceGetHandleByIndex(_physical_index(index))
                self._nvml = pynvml
            except Exception as exc:
                self.nvml_error = f"{type(exc).__name__}: {exc}"
            torch.cuda.reset_peak_memory_stats(self.device)
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop_event.set()
        self.join()

    def run(self) -> None:
        process = psutil.Process()
        while not self._stop_event.wait(self.interval):
            self.rss_mb = max(self.rss_mb, process.memory_info().rss / 2**20)
            if self._handle is not None:
                util = self._nvml.nvmlDeviceGetUtilizationRates(self._handle)
                self.gpu_util.append(float(util.gpu))
                info = self._nvml.nvmlDeviceGetMemoryInfo(self._handle)
                self.gpu_mem_mb = max(self.gpu_mem_mb, info.used / 2**20)


def _physical_index(index: int) -> int:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        parts = [p.strip() for p in visible.split(",") if p.strip()]
        if index < len(parts) and parts[index].isdigit():
            return int(parts[index])
    return index


@dataclass
class RunReport:
    """One run of `tilestore embed`."""

    model: dict[str, Any]
    device: str
    device_name: str
    batch_size: int
    precision: str
    compile: bool
    decode: str = ""
    gpu_decoder: str | None = None  # the nvJPEG decoder a GPU-decoded slide goes through
    decode_why: str = ""  # why the run decodes as it does
    started: str = ""
    tiles: int = 0
    total: int = 0
    wall_s: float = 0.0
    setup_s: float = 0.0
    setup_parts: dict[str, float] = field(default_factory=dict)  # where the set-up went
    batch_note: str | None = None  # how --batch-size auto was decided
    model_mb: float | None = None  # GPU memory of the model alone
    gpu_total_mb: float | None = None
    first_batch_s: float | None = None  # into the loop: how long the pipeline took to fill
    stages: dict[str, float] = field(default_factory=dict)
    explained: dict[str, float] = field(default_factory=dict)
    gpu_util_mean: float | None = None
    gpu_busy_fraction: float | None = None
    peak_gpu_mem_mb: float | None = None
    peak_gpu_allocated_mb: float | None = None
    peak_rss_mb: float = 0.0
    slides: list[dict[str, Any]] = field(default_factory=list)
    failures: list[dict[str, str]] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)  # complete already
    finished: list[str] = field(default_factory=list)  # stores this run finished
    kept: dict[str, int] = field(default_factory=dict)  # interrupted: tiles done, unfinished
    interrupted: str | None = None  # the signal that stopped the run (SIGINT, SIGTERM)
    converted: list[dict[str, Any]] = field(default_factory=list)  # slides given, not stores
    # each slide file's preparation in the stager: {slide, store, seconds: {store, tissue}}
    prepared: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # e.g. what the compile cache did
    warnings: list[str] = field(default_factory=list)
    software: dict[str, str] = field(default_factory=dict)
    writer_error: BaseException | None = None
    # the file systems the run's writes found full or read-only: stores on them not attempted
    filesystems: FileSystems = field(default_factory=FileSystems, repr=False)
    # a job (its id: one store's slices may be two jobs of a run) -> its clock, its entry
    _started: dict[int, float] = field(default_factory=dict, repr=False)
    _entries: dict[int, dict] = field(default_factory=dict, repr=False)
    _written: dict[str, int] = field(default_factory=dict, repr=False)  # store -> tiles
    # inputs not planned yet -> their tiles to do as the preflight counted them (None: not
    # known before the run plans it), and the stores whose tiles `total` holds already
    _expected: dict[str, int | None] = field(default_factory=dict, repr=False)
    _planned: set[str] = field(default_factory=set, repr=False)
    # store -> its fixed costs, seconds: opening and planning, its group, its finish (beside
    # the model), and the GPU's wait for its first batch (the run's critical path)
    _fixed: dict[str, dict[str, float]] = field(default_factory=dict, repr=False)
    # the per-slide fixed cost over the run's slides (`fixed_costs`)
    per_slide: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def start(cls, model: dict[str, Any], settings: Settings) -> RunReport:
        """A report for a run of the model (`LoadedModel.describe()`) with these settings."""
        device = settings.device
        cuda = device.type == "cuda"
        name = torch.cuda.get_device_name(device) if cuda else _cpu_name()
        total = torch.cuda.get_device_properties(device).total_memory / 2**20 if cuda else None
        return cls(
            gpu_total_mb=round(total) if total else None,
            model=model,
            device=str(device),
            device_name=name,
            batch_size=settings.batch_size,
            precision=settings.precision,
            compile=settings.compile,
            decode=settings.decode,
            gpu_decoder=settings.gpu_decoder,
            decode_why=settings.decode_why,
            started=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            software=software_versions("torch", "timm", "torchvision"),
        )

    @property
    def tiles_per_s(self) -> float:
        return self.tiles / self.wall_s if self.wall_s else 0.0

    def expect(self, tiles: dict[str, int | None]) -> None:
        """The run's inputs and their tiles to do, counted up front from the stores' metadata
        (`Preflight.tiles`): `total` is the cohort's from the first batch on, not a sum
        that grows as stores are planned."""
        self._expected = dict(tiles)
        self.total += sum(t for t in tiles.values() if t is not None)

    def planned(self, given, store, tiles: int) -> None:
        """An input is planned (or dropped: 0 tiles): its tiles to do now known exactly."""
        was = self._expected.pop(str(given), None)
        self.total += tiles - (was or 0)
        self._planned.add(str(store))

    def progress_total(self) -> int:
        """The total a progress line shows: exact, or `AtLeast` while inputs whose tiles
        only the run can tell are not planned yet."""
        unknown = sum(1 for t in self._expected.values() if t is None)
        return AtLeast(self.total, unknown) if unknown else self.total

    def begin(self, job, decoding: dict[str, str]) -> None:
        """A job's tiles start streaming, decoded as `decoding` says (a `DecodePlan`'s record:
        where, the row source and why)."""
        if str(job.store) not in self._planned:  # a slice's, counted as it starts
            self.total += len(job.todo)
        entry = self._entries[id(job)] = {
            "store": str(job.store),
            "plan": job.plan.name,
            "tiles": len(job.todo),
            "skipped_done": int(len(job.plan) - len(job.todo) - job.left),  # before
            "left": int(job.left),  # after this run (max_tiles)
            **decoding,  # cpu, gpu or both, this slide's; its path; why
            **({"reading": job.reading} if job.reading else {}),
            "fixed_s": self._fixed.setdefault(str(job.store), {}),  # filled as they come
        }
        self.slides.append(entry)
        # the writer may have failed it already (its group could not be made): the
        # producer's begin comes after, and the entry must say so as `failed` marks others
        if any(f["store"] == str(job.store) for f in self.failures):
            entry["failed"] = True
        self._started[id(job)] = time.perf_counter()

    def written(self, store) -> int:
        """The tiles written into `store` in this run."""
        return self._written.get(str(Path(store)), 0)

    def count(self, job, tiles: int) -> None:
        """A batch of a job's tiles was written."""
        self.tiles += tiles
        self._written[str(job.store)] = self._written.get(str(job.store), 0) + tiles

    def end(self, job) -> dict[str, Any]:
        """A job's last batch was written: its time and rate go into its entry."""
        seconds = time.perf_counter() - self._started[id(job)]
        entry = self._entries[id(job)]  # a dict: a cohort of 10,000 is not 10,000²
        entry.update(
            seconds=round(seconds, 3),
            tiles_per_s=round(entry["tiles"] / seconds, 1) if seconds else None,
        )
        return entry

    def completed(self, job, seconds: float | None = None) -> None:
        """A job's store was finished (its last batch written, its group closed) in
        `seconds`."""
        self.finished.append(str(job.store))
        if seconds is not None:
            self._fixed.setdefault(str(job.store), {})["finish"] = round(seconds, 4)

    def opened(self, job, seconds: dict[str, float]) -> None:
        """A job was opened for the run: its steps' seconds (open and plan, its group)."""
        self._fixed.setdefault(str(job.store), {}).update(seconds)

    def switched(self, job, seconds: float) -> None:
        """The GPU (without one, the loop) waited `seconds` for the job's first batch after
        the batch before it (its share, where that batch held several slides' first rows):
        the slide's fixed cost on the run's critical path."""
        self._fixed.setdefault(str(job.store), {})["gpu_waited"] = round(seconds, 4)

    def stopped(self, signal: str) -> None:
        """The run was interrupted by `signal` (SIGINT, SIGTERM), once every store it had
        open kept what was done (`kept`: their tiles done, now or before)."""
        self.interrupted = signal

    @property
    def exit_code(self) -> int:
        """The exit status of this run (`tilestore.embed.outcome`)."""
        if self.interrupted:
            return interrupted_code(self.interrupted)
        done = [s for s in self.slides if not s.get("failed")]
        return exit_code(len(done) + len(self.skipped), len(self.failures))

    def quality(self, job, summary: dict[str, Any] | None) -> None:
        """A finished job's per-tile quality, spread and flagged tiles, into its entry."""
        if summary is None:
            return
        for entry in self.slides:
            if entry["store"] == str(job.store):
                entry["quality"] = summary

    def failed(self, store, message: str, fault: WriteFault | None = None) -> None:
        """A store could not be embedded (or not finished): why, the store named once; where
        a write failed, its cause (the errno's name: ENOSPC...) beside."""
        failure = {"store": str(store), "error": without_store(store, message)}
        if fault is not None:
            failure["cause"] = fault.code
        self.failures.append(failure)
        for entry in self.slides:
            if entry["store"] == str(store):
                entry["failed"] = True

    def skip(self, store, message: str) -> None:
        """A store was left alone (complete already): why, the store named once."""
        self.skipped.append({"store": str(store), "why": without_store(store, message)})

    def finish(self, wall: float, sampler: Sampler, stats: Stats) -> None:
        self.wall_s = wall
        self.per_slide = fixed_costs([s.get("fixed_s", {}) for s in self.slides])
        self.stages = {k: round(v, 3) for k, v in sorted(stats.seconds.items())}
        loop = stats.get("loop")
        compute = stats.get("compute")
        waiting = stats.get("waiting_for_tiles")
        warm = stats.get("warm_up")
        compile_wait = stats.get("compile_cache_wait")  # a wait of its own, not "other"
        if "gpu_idle" in stats.seconds:
            # The loop waits for tiles while the GPU still computes the batches launched
            # before: only the GPU's idle time (the fill, then the gaps between batches,
            # timed by CUDA events) is time lost to waiting, so the parts add up to the wall.
            fill = max((self.first_batch_s or 0.0) - warm - compile_wait, 0.0)
            waiting = min(waiting, fill + stats.get("gpu_idle"))
        warm += compile_wait  # below: the loop's time before its first batch, either way
        self.explained = {
            "setup (model load, batch size)": round(self.setup_s, 3),
            "model warm-up (CUDA set-up, compilation)": round(warm - compile_wait, 3),
            **({COMPILE_WAIT: round(compile_wait, 3)} if compile_wait else {}),
            "GPU computing" if self.device.startswith("cuda") else "model computing": round(
                compute, 3
            ),
            WAITING: round(waiting, 3),
            "other (launches, writer back-pressure)": round(
                max(loop - warm - compute - waiting, 0), 3
            ),
            "finishing (last writes, metadata)": round(max(wall - self.setup_s - loop, 0), 3),
        }
        self.peak_rss_mb = round(max(sampler.rss_mb, _hwm_mb()), 1)
        if self.device.startswith("cuda"):
            self.peak_gpu_allocated_mb = round(torch.cuda.max_memory_allocated() / 2**20, 1)
            self.peak_gpu_mem_mb = round(sampler.gpu_mem_mb, 1) or None
            if sampler.gpu_util:
                self.gpu_util_mean = round(sum(sampler.gpu_util) / len(sampler.gpu_util), 1)
            working = loop - warm  # the warm-up is reported on its own, not as idling
            self.gpu_busy_fraction = round(compute / working, 3) if working > 0 else None
            if sampler.nvml_error:
                self.warnings.append(f"no NVML GPU utilisation: {sampler.nvml_error}")
        self.warnings.extend(advice(self))

    def slide_summary(self, job) -> dict[str, Any]:
        """What a finished embeddings group records of the run that wrote it."""
        return {
            "tiles": self._written.get(str(job.store), 0),
            "device": self.device_name,
            "batch_size": self.batch_size,
            "precision": self.precision,
            "decode": self.decode,
        }

    def to_json(self) -> dict[str, Any]:
        data = {
            k: v
            for k, v in asdict(self).items()
            if k
            not in (
                "writer_error",
                "filesystems",
                "_started",
                "_entries",
                "_written",
                "_expected",
                "_planned",
                "_fixed",
            )
        }
        data["tiles_per_s"] = round(self.tiles_per_s, 1)
        return ended(data, self.exit_code)

    def save(self, path: str | os.PathLike) -> bool:
        """Write the JSON report (`tilestore.embed.reportfile.write_report`: its folder made,
        whole or not at all, a failure a warning); whether it was written."""
        return write_report(path, self.to_json())


def fixed_costs(slides: list[dict[str, float]]) -> dict[str, Any]:
    """The per-slide fixed cost over a run's slides (`RunReport._fixed` each), in ms:
    on the critical path (the GPU's wait for each slide's first batch, the run's first slide
    aside: its wait is the pipeline's fill), median and max; beside the model (opening and
    planning, its group, its finish: on threads while the GPU works), median and max of
    their sum, and each part's median. Empty for a run of no slide."""
    waited = [s["gpu_waited"] for s in slides if "gpu_waited" in s]
    parts = {part: [s[part] for s in slides if part in s] for part in FIXED_PARTS}
    beside = [sum(s.get(part, 0.0) for part in FIXED_PARTS) for s in slides if s]
    if not beside and not waited:
        return {}

    def ms(values: list[float], how) -> float | None:
        return round(1000 * how(values), 1) if values else None

    return {
        "slides": len(slides),
        "critical_path_ms": {"median": ms(waited, statistics.median), "max": ms(waited, max)},
        "beside_ms": {"median": ms(beside, statistics.median), "max": ms(beside, max)},
        "parts_median_ms": {part: ms(v, statistics.median) for part, v in parts.items() if v},
    }


# a slide's fixed steps done beside the model, as the report names them
FIXED_PARTS = {"open_plan": "open and plan", "group": "its group made", "finish": "finish"}


def fixed_line(per_slide: dict[str, Any]) -> str | None:
    """The report's line for the per-slide fixed cost (`fixed_costs`); None for one slide."""
    if not per_slide or per_slide["slides"] < 2:
        return None
    path, beside = per_slide["critical_path_ms"], per_slide["beside_ms"]
    parts = ", ".join(f"{FIXED_PARTS[k]} {v:.0f}" for k, v in per_slide["parts_median_ms"].items())
    critical = (
        f"{path['median']:.1f} ms median ({path['max']:.1f} max) on the critical path (the "
        "GPU waiting for the slide's first batch)"
        if path["median"] is not None
        else "none measured on the critical path"
    )
    return (
        f"per-slide fixed cost: {critical}; {beside['median']:.0f} ms median "
        f"({beside['max']:.0f} max) beside the model ({parts}, ms)"
    )


def advice(report: RunReport) -> list[str]:
    """Loud, actionable warnings: GPU present but unused, or the GPU mostly idle."""
    notes = []
    if not report.device.startswith("cuda") and torch.cuda.is_available():
        notes.append("CUDA is available but the model ran on the CPU: pass device='cuda'")
    busy = report.gpu_busy_fraction
    if busy is not None and busy < 0.5 and report.tiles:
        waiting = report.explained.get(WAITING, 0)
        if waiting > 0.25 * report.wall_s:
            fix = "the GPU waited for tiles: add readers or decoders (readers=, decoders=)" + (
                ""
                if report.decode in ("gpu", "both")
                else " or decode on the GPU's JPEG engines too (decode='both')"
            )
        else:
            fix = (
                f"the GPU had little work per launch: try a larger batch_size than "
                f"{report.batch_size}"
            )
        notes.append(f"the GPU was busy only {busy:.0%} of the loop: {fix}")
    return notes


def _hwm_mb() -> float:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _decode(report: RunReport) -> str:
    """How the run decoded (cpu, gpu or both, decode="auto" resolved) and why, through which
    GPU decoder, and how many slides the CPU decoded alone (a zstd level; nvJPEG
    disagreeing)."""
    used = [slide["decode"] for slide in report.slides if "decode" in slide]
    text = report.decode
    if ("gpu" in used or "both" in used) and report.gpu_decoder:
        text += f" via {report.gpu_decoder}"
    if report.decode != "cpu" and "cpu" in used:
        text += f"; {used.count('cpu')} of {len(used)} slides on the CPU alone"
    return text + (f" ({report.decode_why})" if report.decode_why else "")


def _cpu_name() -> str:
    """The CPU the run had: the cores it may run on (its affinity: a SLURM job's share, taskset)
    of the machine's, and torch's threads."""
    usable, machine = usable_cpus(), os.cpu_count()
    cores = f"{usable} cores" if usable == machine else f"{usable} of {machine} cores"
    return f"CPU ({cores}, {torch.get_num_threads()} torch threads)"


def format_report(report: RunReport) -> list[str]:
    """The report as lines for the terminal."""
    weights = weights_said(report.model)
    lines = [
        f"{report.tiles} tiles in {report.wall_s:.1f} s = {report.tiles_per_s:.1f} tiles/s "
        f"on {report.device_name} ({report.precision}, batch {report.batch_size}, "
        f"decode {_decode(report)}{', compiled' if report.compile else ''})"
        + (f"; {weights}" if weights else "")
    ]
    lines.append("wall time: " + ", ".join(f"{k} {v:.2f} s" for k, v in report.explained.items()))
    if report.first_batch_s is not None:
        lines.append(f"first batch ready {report.first_batch_s:.2f} s into the loop")
    fixed = fixed_line(report.per_slide)
    if fixed:
        lines.append(fixed)
    overlapped = {
        k: v
        for k, v in report.stages.items()
        if k
        in (
            "read",
            "decode",
            "read_decode",
            "cut",
            "decode_issue",
            "produce",
            "transfer_issue",
            "write",
        )
    }
    if overlapped:
        lines.append(
            "overlapped thread time: " + ", ".join(f"{k} {v:.2f} s" for k, v in overlapped.items())
        )
    if report.setup_parts:
        lines.append(
            "set-up: " + ", ".join(f"{k} {v:.2f} s" for k, v in report.setup_parts.items())
        )
    if report.batch_note:
        lines.append(f"batch size {report.batch_size}: {report.batch_note}")
    lines.extend(report.notes)
    memory = f"peak host RSS {report.peak_rss_mb:.0f} MB"
    if report.peak_gpu_allocated_mb is not None:
        of = f" of the GPU's {report.gpu_total_mb:,.0f} MB" if report.gpu_total_mb else ""
        model = f", the model alone {report.model_mb:.0f} MB" if report.model_mb else ""
        memory += (
            f", peak GPU memory {report.peak_gpu_allocated_mb:.0f} MB allocated{of}"
            + (
                f" ({report.peak_gpu_mem_mb:.0f} MB in use per NVML)"
                if report.peak_gpu_mem_mb
                else ""
            )
            + model
        )
    if report.gpu_util_mean is not None:
        memory += f", GPU utilisation {report.gpu_util_mean:.0f}% (NVML mean)"
    lines.append(memory)
    lines.extend(preparation_lines(report.converted, report.prepared))
    for slide in report.slides:
        lines.append(
            f"  {slide['store']}: {slide['tiles']} tiles"
            + (f" ({slide['skipped_done']} done before)" if slide["skipped_done"] else "")
            + (f", {slide['tiles_per_s']} tiles/s" if slide.get("tiles_per_s") else "")
            + (
                f"; {slide['left']:,} still to do: run again without max_tiles=<n> to finish"
                if slide.get("left")
                else ""
            )
        )
        if slide.get("reading"):
            lines.append(f"    {reading_line(slide['reading'])}")
        if slide.get("quality"):
            lines.append(f"    quality: {quality_line(slide['quality'])}")
    for skipped in report.skipped:
        lines.append(f"  skipped {skipped['store']}: {skipped['why']}")
    for failure in report.failures:
        lines.append(f"tilestore: error: {failure['store']}: {failure['error']}")
    lines.extend(f"WARNING: {w}" for w in report.warnings)
    return lines


def weights_said(model: dict[str, Any]) -> str | None:
    """What the run's line says of its model's weights where they are not a trained model's
    (random: asked for on purpose, seeded; the sha256 of what was drawn says which), None
    for a checkpoint's."""
    if model.get("weights") != "random":
        return None
    seed, sha = model.get("weights_seed"), model.get("weights_sha256")
    if seed is None:
        return f"{model.get('name')}: RANDOM weights drawn without a seed (weights unknown)"
    return (
        f"{model.get('name')}: RANDOM weights (seed {seed}, sha256 {str(sha)[:12]}), not a "
        "trained model's features"
    )


def preparation_lines(converted: list[dict], prepared: list[dict]) -> list[str]:
    """How the slide files given were made ready (a run's, a cohort's): each conversion
    (or store reused), then each one's steps, timed."""
    lines = []
    for done in converted:
        how = (
            "reused"
            if done.get("reused")
            else f"{done['seconds']:.1f} s, " + "/".join(done["levels"])
        )
        lines.append(f"  converted {done['slide']} -> {done['store']} ({how})")
    steps = {"store": "its store", "tissue": "its tissue mask"}
    for done in prepared:
        lines.append(
            f"  prepared {done['slide']} beside the run: "
            + ", ".join(f"{steps[k]} {v:.1f} s" for k, v in done["seconds"].items())
        )
    return lines


def reading_line(reading: dict[str, Any]) -> str:
    """How a slide's tiles were read, in one line: the plan, its um/px and tile, the level
    and window read (the resampling factor), the channels, and what is not the model's."""
    mpp = reading["mpp"]
    scale = f"{mpp:.4g} um/px" if mpp is not None else "level-0 pixels, magnification UNKNOWN"
    window = (
        "read as is"
        if reading["read_px"] == reading["tile"]
        else f"{reading['read_px']} px windows resized x{reading['resample']:.3g}"
    )
    channels = reading.get("channels")
    line = (
        f"plan {reading['plan']}: {reading['tile']} px tiles at {scale}, from level "
        f"{reading['level']} ({window}); "
        + (f"channels {','.join(channels)} as R,G,B" if channels else "RGB")
    )
    if reading.get("not_the_models_input"):
        line += f"; NOT the model's input (any_scale=True): {reading['not_the_models_input']}"
    if reading.get("mpp_override"):
        line += f"; level-0 pixel size {reading['mpp_override']}"
    return line


def quality_line(summary: dict[str, Any]) -> str:
    """A slide's per-tile quality in one line: blur's spread, and the tiles each limit
    flags (`tilestore.qc.tilewise.summarise`)."""
    if summary.get("note"):
        return summary["note"]
    blur = (summary.get("spread") or {}).get("blur")
    spread = f"blur p50 {blur['p50']:.2f}, p95 {blur['p95']:.2f}" if blur else "blur not judged"
    limits = summary.get("limits") or {}
    flagged = [
        f"{count} over max_{name} {limits.get(f'max_{name}')}"
        for name, count in (summary.get("flagged") or {}).items()
        if count
    ]
    return (
        f"{spread}; "
        + (", ".join(flagged) if flagged else "no tile flagged")
        + (f" of {summary['tiles']}")
    )
