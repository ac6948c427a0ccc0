"""The Dask worker's side of a cohort (`tilestore.embed.cohort`): the plugin that loads the
model once per worker, and the tasks it runs: slices, and slide files made ready.

Light to import: a worker unpickles the plugin, and so imports this module, on its event
loop, which must keep answering the scheduler; torch and the engine are imported when the
plugin sets up, beside the loop (a ViT's imports and load took 7-21 s there before).
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from distributed import Reschedule, WorkerPlugin, get_worker, secede

from tilestore.embed.settings import Options
from tilestore.progress import to_stderr

if TYPE_CHECKING:
    from tilestore.embed.jobs import Slice
    from tilestore.embed.models import ModelSpec
    from tilestore.embeddings import RunIdentity

PLUGIN = "tilestore-embedder"
PREPARER = "tilestore-slides"


class EmbedderPlugin(WorkerPlugin):
    """A Dask worker plugin: loads the model once per worker and keeps it for every task.

    model: the coordinator's record of it (`ModelSpec`, resolved once there): the worker
    loads what it says, never resolves a name again. cpus: the CPUs each worker may use
    (None: its own affinity)."""

    name = PLUGIN

    def __init__(self, model: ModelSpec, options: Options, cpus: int | None = None) -> None:
        self.model, self.options, self.cpus = model, options, cpus
        self.embedder = None

    async def setup(self, worker) -> None:
        # one slice at a time per model, even on a worker with several threads
        self.lock = threading.Lock()
        # imported and loaded beside the worker's event loop, not on it: else the worker
        # stops answering the scheduler while it loads ("Event loop was unresponsive")
        self.embedder = await asyncio.to_thread(self._load)

    def _load(self):
        from tilestore.embed.engine import Embedder

        return Embedder(self.model, self.options, cpus=self.cpus)

    def teardown(self, worker) -> None:
        if self.embedder is not None:
            self.embedder.close()


class SlidesPlugin(WorkerPlugin):
    """A Dask worker plugin: the worker's slide process (`tilestore.embed.inputs.SlideWorker`,
    started with its first slide), which makes slide files ready one at a time. Apart from
    the model's plugin, and light: registered first, so the first slides are converted
    while the workers load their models."""

    name = PREPARER

    def __init__(self) -> None:
        self.slides = None
        self.closing = False

    async def setup(self, worker) -> None:
        self.preparing = threading.Lock()
        self.slides, self.closing = None, False

    def prepare(self, request: dict[str, Any]) -> dict[str, Any]:
        """One slide made ready in this worker's slide process: its reply, or {"died": its
        exit code} where the process died on it (a new one takes the next slide). A slide
        stopped by the plugin's teardown is sent to the scheduler again (Reschedule)."""
        from tilestore.embed.inputs import SlideWorker

        with self.preparing:
            if self.closing:
                raise Reschedule()
            if self.slides is None:
                self.slides = SlideWorker()
            self.slides.send(request)
            reply = self.slides.receive()
            if reply is None:
                code = self.slides.close()
                self.slides = None
                if self.closing:  # stopped by teardown, not by the slide: made elsewhere
                    raise Reschedule()
                reply = {"died": code}
            return reply

    def teardown(self, worker) -> None:
        # not under the lock (on the worker's event loop: never wait for a conversion); a
        # slide in hand is stopped, and its task rescheduled
        self.closing = True
        slides = self.slides  # read once: the thread in prepare may drop it meanwhile
        if slides is not None:
            slides.kill()


def _embedder():
    return get_worker().plugins[PLUGIN].embedder


def worker_identity() -> RunIdentity:
    """What the coordinator needs to create groups the workers can write into."""
    return _embedder().writer_identity()


def make_ready(request: dict[str, Any]) -> dict[str, Any]:
    """A Dask task: one slide file made ready (converted into the cohort's folder, the tissue
    mask its plan reads made) in this worker's slide process, a process of its own as in one
    process's run (`tilestore.embed.inputs`). The task leaves the worker's thread pool
    first (Dask's secede): the slices handed to this worker run meanwhile, so its next
    slide is made while its GPU embeds the one before. The process's reply, as
    `tilestore.embed.inputs.staged_from` reads it ({"died": exit code} where it died)."""
    secede()
    return get_worker().plugins[PREPARER].prepare(request)


def run_slices(pieces: list[Slice]) -> dict[str, Any]:
    """A Dask task: embed slices on this worker's model, in one run (many small slides'
    slices go to one task: a run's set-up paid once for them, `tilestore.embed.cohort`);
    return what happened to each (its tiles, or its slide's failure: the coordinator drops
    that slide's other slices, the others go on) and to the task."""
    from tilestore.embed.report import WAITING  # here: this module imports no torch

    plugin = get_worker().plugins[PLUGIN]
    with plugin.lock:
        began, started = time.time(), time.perf_counter()  # the wall clock: the timeline's
        # the worker's log (a SLURM job's output) says when it compiles or waits for a compile
        report = plugin.embedder.embed_slices(pieces, say=to_stderr)
    failed = {failure["store"]: failure for failure in report.failures}
    outcomes = []
    for piece in pieces:  # each a store of its own (a task holds one slice of a store)
        failure = failed.get(str(Path(piece.store)))
        if failure is not None:  # its slide's data, or a write its file system refused
            outcome = {"error": f"{piece.store}: {failure['error']}"}
            if "cause" in failure:
                outcome["cause"] = failure["cause"]
            outcomes.append(outcome)
            continue
        tiles = report.written(piece.store)
        outcomes.append({
            "store": piece.store, "start": piece.start, "tiles": tiles,
            # the slice's tiles found done: written by a worker lost while running it (the
            # slice's batches were all to do when it was cut), kept, not computed again
            "kept": piece.tiles - tiles,
        })  # fmt: skip
    return {
        "pieces": outcomes,
        "tiles": report.tiles,
        "seconds": round(time.perf_counter() - started, 3),
        "began": began,
        "first_batch_s": report.first_batch_s,
        "waiting_s": report.explained.get(WAITING),
        "worker": get_worker().address,
        "device": report.device_name,
        "gpu_util_mean": report.gpu_util_mean,
        "gpu_busy_fraction": report.gpu_busy_fraction,
        "peak_gpu_allocated_mb": report.peak_gpu_allocated_mb,
        "decoders": plugin.embedder.settings.decoders,
    }
