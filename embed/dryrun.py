"""`embed --dry-run`: what a run would do and roughly how long it would take, writing nothing.

The model is loaded and its batch size chosen as the run would; each store is planned as
the run would plan it (tissue computed if missing, but neither stored); tiles already
embedded by an earlier run are counted as done. A short calibration (the model alone at the
run's batch size on random tiles, `tilestore.embed.sizing.profile_batches`) gives tiles/s and peak
GPU memory; a slide's time is its tiles to do at that rate, a lower bound: the engine reaches
0.77-0.99 of the model alone (bench/RESULTS.md).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from tilestore.embed.decodeplan import slide_decoding
from tilestore.embed.engine import Embedder
from tilestore.embed.models import LoadedModel, ModelSpec
from tilestore.embed.opening import PlanChoice, prepare
from tilestore.embed.settings import Options
from tilestore.embed.sizing import profile_batches
from tilestore.embeddings import resume_state
from tilestore.errors import EmbeddingError, TilestoreError
from tilestore.format import is_store, store_name
from tilestore.reading import sidecar_for
from tilestore.sources import given, is_url, shown


@dataclass(frozen=True)
class DryRow:
    """One input: its plan's tiles, those done, those to do and their estimated seconds."""

    given: str
    tiles: int | None = None
    done: int | None = None
    todo: int | None = None
    seconds: float | None = None
    note: str = ""
    error: str | None = None


@dataclass(frozen=True)
class DryRun:
    """The whole run's estimate and the calibration it rests on."""

    model: str
    device_name: str
    batch_size: int
    tiles_per_s: float  # the model alone at the run's batch size
    peak_gpu_mb: float | None
    model_mb: float | None
    setup_s: float
    rows: tuple[DryRow, ...]
    decode: str = "cpu"  # how the run would decode (`Settings.decode`)
    decode_why: str = ""

    @property
    def todo(self) -> int:
        return sum(r.todo or 0 for r in self.rows)

    @property
    def seconds(self) -> float:
        return sum(r.seconds or 0.0 for r in self.rows)


def dry_run(
    inputs: list[str | os.PathLike],
    model: str | ModelSpec | LoadedModel,
    *,
    plan: PlanChoice = None,
    options: Options = Options(),
    convert_into: str | os.PathLike | None = None,
    in_place: bool = False,
    sidecars: str | os.PathLike | None = None,
) -> DryRun:
    """Estimate a run of `embed(inputs, model, plan=plan, options=options)`; write nothing."""
    started = time.perf_counter()
    with Embedder(model, options) as embedder:
        setup = time.perf_counter() - started
        s = embedder.settings
        calibration = profile_batches(
            embedder.loaded, s.device, s.precision, (s.batch_size,), repeats=3
        ).runs[0]
        rate = calibration.tiles_per_s or 0.0
        identity = embedder.writer_identity()
        rows = tuple(
            _row(given(p), embedder, identity, plan, rate, convert_into, in_place, sidecars)
            for p in inputs
        )
        return DryRun(
            embedder.loaded.spec.name,
            _device_name(s.device),
            s.batch_size,
            rate,
            calibration.peak_mb,
            embedder.model_mb,
            setup,
            rows,
            s.decode,
            s.decode_why,
        )


def _row(path, embedder, identity, plan, rate, into, in_place, sidecars) -> DryRow:
    store = path  # a slide with nowhere to go is refused by open_slide, as `embed` does
    if is_url(path):  # not fetched by a dry run
        where = "read in place (refused)" if in_place else f"converted into {into} first"
        return DryRow(shown(path), note=f"a slide's URL: would be staged and {where}")
    if path.exists() and not is_store(path) and (in_place or into is not None):
        if not in_place:
            target = Path(into) / store_name(path)
            return DryRow(str(path), note=f"a slide: would be converted into {target} first")
        store = sidecar_for(path, sidecars)
        if not is_store(store):
            return DryRow(str(path), note=f"a slide: would be read in place ({store} made first)")
    try:
        ready = prepare(
            store,
            embedder.loaded.spec,
            plan,
            identity,
            save=False,
            any_scale=embedder.settings.any_scale,
        )
        slide, tile_plan = ready.slide, ready.plan
    except TilestoreError as exc:
        return DryRow(str(path), error=str(exc))
    total = len(tile_plan)
    try:
        done, note = _done(
            slide, embedder.loaded.spec.name, tile_plan, ready.uid, embedder.settings.overwrite
        )
    except TilestoreError as exc:
        return DryRow(str(path), error=str(exc))
    most = embedder.settings.max_tiles
    todo = total - done if most is None else min(total - done, most)
    seconds = todo / rate if rate else None
    notes = [note] if note else list(tile_plan.notes)
    decided = slide_decoding(
        embedder.settings,
        ready.pixels.chunks(tile_plan.spec.level),
        embedder.processes is not None,
        embedder.gpu_jpeg,
        tile_plan,
    )  # as the run decides it, and says it (`tilestore.embed.produce`)
    notes.extend([decided.said] if decided.said else [])
    return DryRow(str(path), total, done, todo, seconds, "; ".join(notes))


def _done(slide, model: str, plan, uid: str | None, overwrite: bool) -> tuple[int, str]:
    """Tiles an earlier run of this model already embedded from this plan (its done
    batches), as the run's writer counts them (`resume_state`); a group from another plan, or
    damaged, is the run's error."""
    if overwrite:
        return 0, "recomputed (overwrite)"
    # a plan the dry run made afresh (uid None: not stored) is other tiles than any group's
    found = resume_state(slide, model, plan.name, uid or "(made afresh)", len(plan))
    if found.state in ("other plan", "damaged"):
        raise EmbeddingError(found.why)
    if found.state == "complete":
        return len(plan), "already complete (skipped unless --overwrite)"
    done = int(sum(min(found.batch_size, len(plan) - b * found.batch_size) for b in found.done))
    return done, found.why


def _device_name(device) -> str:
    import torch

    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
