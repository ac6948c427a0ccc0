"""A store opened for a run, the one place it is done (the engine, its store processes, the
Dask cohort, the dry run and the compile ahead): opened, seen as the model reads it, its plan
loaded or made (`plan_for`), refused before any GPU time where the model cannot read it.
Without torch: the store processes (`tilestore.embed.storeside`) import it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tilestore.embed.models import ModelSpec
from tilestore.embed.preflight import (
    refuse_other_scale,
    resolve_for_model,
    rgb_input,
    scale_mismatch,
)
from tilestore.embed.readout import ReadOut
from tilestore.embeddings import EmbeddingWriter, RunIdentity, plan_slide
from tilestore.embeddings.recipe import scale_of
from tilestore.errors import PlanError, StoreError
from tilestore.format.record import Mpp
from tilestore.plan import (
    PlanOptions,
    ResolvedPlan,
    TilePlan,
    list_plans,
    load_plan,
    plan_difference,
    plan_uid,
    refuse_made_otherwise,
    save_plan,
    stored_record,
    uses_stored_plan,
)
from tilestore.plan.plans import REPLACE
from tilestore.reading import Slide, described, open_slide
from tilestore.workers import WorkerGone

PlanChoice = str | PlanOptions | ResolvedPlan | None


@dataclass(frozen=True)
class Prepared:
    """A store made ready to embed: opened, seen as the model reads it, its plan chosen."""

    store: Path
    slide: Slide  # the store itself: plans, tissue and the writer keep it
    pixels: Slide  # as the model reads it (`rgb_input`)
    plan: TilePlan
    uid: str | None  # None only for a plan not stored (save=False)
    reading: dict  # how the model reads its tiles (`reading`)


def prepare(
    store: str | os.PathLike,
    spec: ModelSpec,
    plan: PlanChoice,
    identity: RunIdentity,
    *,
    save: bool = True,
    any_scale: bool = False,
) -> Prepared:
    """Open a store and choose its plan as a run does (the one place the engine, the Dask
    cohort and the dry run do it): refused before any GPU time where the model cannot read
    its pixels, or where the plan's tiles are not the model's input (another um/px or
    tile, or an unknown pixel size) unless any_scale. save=False (a dry run) writes
    nothing."""
    slide = open_slide(store)
    pixels = rgb_input(slide, identity.channels)
    tile_plan, uid = plan_for(slide, spec, plan, save=save)
    scale = scale_of(tile_plan.spec)
    if not any_scale:
        refuse_other_scale(slide, tile_plan.name, scale.mpp, scale.tile, spec)
    mismatch = scale_mismatch(scale.mpp, scale.tile, spec)
    return Prepared(
        Path(store),
        slide,
        pixels,
        tile_plan,
        uid,
        reading(tile_plan, pixels.picked, mismatch, slide.record.mpp),
    )


def reading(
    plan: TilePlan,
    channels: tuple[str, ...] | None,
    mismatch: str | None,
    slide_mpp: Mpp | None = None,
) -> dict:
    """How a run reads a plan's tiles, for its per-slide line and report: the plan, the um/px
    and tile size, the level read and its window (the resampling factor), the channels read
    as R, G, B, whether the magnification is known, how the tiles differ from the model's
    input (where any_scale let them), and the slide's level-0 pixel size where it is the
    user's override of the file's (`slide_mpp`, the store's record)."""
    grid, scale = plan.spec, scale_of(plan.spec)
    return {
        "plan": plan.name,
        "mpp": scale.mpp,
        "tile": scale.tile,
        "level": grid.level,
        "read_px": grid.read,
        "resample": round(scale.tile / grid.read, 4),
        "channels": list(channels) if channels else None,
        "magnification_known": scale.mpp is not None,
        **({"not_the_models_input": mismatch} if mismatch else {}),
        **({"mpp_override": described(slide_mpp)} if slide_mpp and slide_mpp.overridden else {}),
    }


def tiles_of(blocks: np.ndarray, batch: int, n: int) -> np.ndarray:
    """Plan indices of the tiles in these batches."""
    tiles = (np.asarray(blocks, np.int64)[:, None] * batch + np.arange(batch)).ravel()
    return tiles[tiles < n]


def plan_for(
    slide: Slide, spec: ModelSpec, plan: PlanChoice, *, save: bool = True
) -> tuple[TilePlan, str | None]:
    """The plan a run uses and its uid.

    plan: a stored plan's name; None for the store's only plan, or, where it has none or
    several, one made at the model's native mpp and tile size; or `PlanOptions`, whose
    unset mpp and tile are the model's (`resolve_for_model`: the same rules as `tilestore
    plan`, a slide without a pixel size refused unless mpp=0 asks for level-0 pixels); or
    those options resolved already (`ResolvedPlan`: the checks before the run did). A plan made
    is saved (reused if made before with the same options). save=False (a dry run) writes
    nothing, not even a tissue mask; the uid is then None for a plan not stored before.
    """
    if isinstance(plan, ResolvedPlan):
        resolved = plan
    elif uses_stored_plan(slide, plan):
        return load_plan(slide, plan)
    else:
        resolved = resolve_for_model(slide, plan, spec)
    refuse_made_otherwise(slide, resolved)  # before its tiles are made
    made = plan_slide(slide, resolved, store_tissue=save)
    if save:  # the same plan stored before is kept; one of its name made otherwise refused
        return made, save_plan(slide, made)
    if made.name in list_plans(slide):  # a dry run: what the run's save would say
        stored, uid = load_plan(slide, made.name)
        if uid != plan_uid(made):
            raise PlanError(
                f"{slide.name}: plan {made.name!r} is stored already, made otherwise "
                f"({plan_difference(stored_record(slide, made.name), made)}); {REPLACE}"
            )
        return stored, uid
    return made, None


@dataclass
class Opening:
    """A store being opened for a run's writing (`open_for_run`), step by step: what is
    done of it so far, so whatever stops it (an error, the run's stop) releases the lock
    it took (`abandon`)."""

    store: Path
    ready: Prepared | None = None
    writer: EmbeddingWriter | None = None
    todo: np.ndarray | None = None  # global plan indices this run embeds, whole batches
    left: int = 0  # tiles still to do after this run (a trial, max_tiles, leaves some)
    seconds: dict[str, float] = field(default_factory=dict)  # its steps, for the report
    read_out: ReadOut | None = None  # its steps (and chunks) made where it was opened

    def abandon(self) -> str:
        """Release what was taken (the lock; a group made and never written is removed)."""
        return self.writer.abandon() if self.writer is not None else ""


def open_for_run(
    store: str | os.PathLike,
    spec: ModelSpec,
    plan: PlanChoice,
    identity: RunIdentity,
    *,
    overwrite: bool,
    max_tiles: int | None = None,
    any_scale: bool = False,
    break_lock: bool = False,
    go_on: Callable[[], None] = lambda: None,
    maker: Callable[..., Any] | None = None,
    lock_for: int | None = None,
) -> Opening:
    """Open a store to write the run's embeddings into: prepared (`prepare`), its writer
    made (the group's lock taken: `EmbeddingWriter`), its group made or resumed, and the
    tiles to do listed. AlreadyComplete where it is; the store's TilestoreError where it
    cannot be embedded (WriteFailed: its plan, lock or group could not be written).
    `go_on` is called between steps and raises to stop there. maker: where the group is
    made (`EmbeddingWriter.create`'s: worker processes, `tilestore.workers.Calls`); a maker's
    worker that dies (killed: out of memory) fails this store alone. lock_for: the run's
    pid, where a store process opens it for a run (`EmbeddingWriter`). Whatever ends it
    early releases the lock it took."""
    opening = Opening(Path(store))
    clock = time.perf_counter()
    try:
        go_on()
        opening.ready = ready = prepare(store, spec, plan, identity, any_scale=any_scale)
        go_on()
        opening.seconds["open_plan"] = _lap(clock)
        clock = time.perf_counter()
        opening.writer = writer = EmbeddingWriter(
            ready.slide,
            ready.plan,
            ready.uid,
            identity,
            overwrite=overwrite,
            create=False,
            break_lock=break_lock,
            lock_for=lock_for,
        )
        go_on()
        try:
            writer.create(maker=maker)
        except WorkerGone as exc:  # its store fails; a new worker makes the next group
            raise StoreError(f"{store}: making {writer.path}: {exc}") from exc
        opening.seconds["group"] = _lap(clock)
    except BaseException:
        opening.abandon()
        raise
    batch = identity.batch_size
    blocks = writer.todo()
    owed = len(tiles_of(blocks, batch, len(ready.plan)))
    if max_tiles is not None:  # a trial: the plan's first batches only
        blocks = blocks[blocks < -(-max_tiles // batch)]
    opening.todo = tiles_of(blocks, batch, len(ready.plan))
    opening.left = owed - len(opening.todo)
    return opening


def _lap(since: float) -> float:
    return round(time.perf_counter() - since, 4)
