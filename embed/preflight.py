"""What a run can refuse before it loads a model: each store given, from its metadata.

A store whose pixels the model cannot read (not RGB, no channels chosen), whose plan cannot
be made (no pixel size, coarser than asked), whose tiles are not the model's input (another
um/px or tile size, unless any_scale), or whose embeddings of this model come from another
plan is refused here, in one line, before torch is imported and the model loaded (20-95 s
on a busy machine); a store already complete is skipped here too, so a run with nothing to
do loads nothing. The run makes the same checks again as it opens each store
(`tilestore.embed.opening.prepare`), with the same functions: this is a first look, not a
second rule. Light: no torch, no pixels read.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from tilestore.embed.models import REGISTRY, model_record
from tilestore.embed.models.spec import ModelSpec
from tilestore.embed.settings import Options
from tilestore.embeddings import resume_state
from tilestore.embeddings.recipe import scale_of
from tilestore.errors import PlanError, StoreError, TilestoreError
from tilestore.format import is_store
from tilestore.plan import (
    PlanOptions,
    ResolvedPlan,
    list_plans,
    load_plan,
    plan_grid,
    refuse_made_otherwise,
    resolve_plan,
    uses_stored_plan,
)
from tilestore.reading import MPP_TOLERANCE, Slide, open_slide
from tilestore.sources import given as as_given

PlanChoice = str | PlanOptions | None


@dataclass
class Preflight:
    """The inputs a run keeps, and those refused or skipped with why (in the order given)."""

    kept: list[Path] = field(default_factory=list)
    refused: list[tuple[str, str]] = field(default_factory=list)  # (store, why)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # complete already
    # each kept input's tiles still to embed, from its stored plan and its group's done
    # batches; None where only the run can tell (a plan it makes, a slide file)
    tiles: dict[str, int | None] = field(default_factory=dict)
    # each kept store's plan options resolved (`resolve_plan`), where the run makes its
    # plan: the run takes this record (`tilestore.embed.opening.plan_for`), never resolves again
    plans: dict[str, ResolvedPlan] = field(default_factory=dict)


def check_stores(
    inputs: list[str | os.PathLike], model: str | ModelSpec, plan: PlanChoice, options: Options
) -> Preflight:
    """Check each store among `inputs` as the run would, from metadata only (slide files
    are checked once they are stores). model: the run's record (`ModelSpec`, resolved once
    by the caller), or a name (a registered model's native input is known without loading
    it; a timm:, local: or random:<timm architecture> model's only once loaded). A store
    is skipped as complete only for a stored plan (named, or its only one): a plan to be
    made may be other tiles under the same name, which only the run can tell."""
    spec = _facts(model)
    name = model.name if isinstance(model, ModelSpec) else model
    found = Preflight()
    for given in map(as_given, inputs):
        if not is_store(given):
            found.kept.append(given)
            found.tiles[str(given)] = None
            continue
        try:
            slide = open_slide(given)
            rgb_input(slide, options.channels)
            plan_name, uid, mpp, tile, tiles, resolved = _plan(slide, plan, spec)
            if spec is not None and not options.any_scale:
                refuse_other_scale(slide, plan_name, mpp, tile, spec)
            asked = {"channels": list(options.channels) if options.channels else None}
            held = resume_state(slide, name, plan_name, uid, tiles, asked)
        except TilestoreError as exc:
            found.refused.append((str(given), without_store(given, str(exc))))
            continue
        if held.state in ("other plan", "damaged", "other settings") and not options.overwrite:
            found.refused.append((str(given), without_store(given, held.why)))
        elif held.state == "complete" and uid is not None and not options.overwrite:
            # complete for this very plan (its uid: a stored plan); a plan still to be made
            # may come out other tiles under the same name, which only the run can tell
            found.skipped.append((str(given), without_store(given, held.why)))
        else:
            found.kept.append(given)
            if resolved is not None:
                found.plans[str(given)] = resolved
            # a plan to be made under a name stored with these settings: the stored one's
            # tiles (the run says the exact count as it plans it)
            tiles = tiles if tiles is not None else _stored_tiles(slide, plan_name)
            found.tiles[str(given)] = _to_do(held, tiles, options.overwrite)
    return found


def _stored_tiles(slide: Slide, name: str) -> int | None:
    """The tiles of the stored plan of this name, None where there is none."""
    if name not in list_plans(slide):
        return None
    return len(load_plan(slide, name)[0])


def _to_do(held, tiles: int | None, overwrite: bool) -> int | None:
    """The plan's tiles a run will embed: all of them, or those of the batches not done in
    the group it resumes; None where the plan is the run's to make."""
    if tiles is None or overwrite or held.state not in ("resumes", "complete"):
        return tiles
    if held.state == "complete":  # skipped as the run finds it so
        return 0
    size = held.batch_size
    done = sum(min(size, held.tiles - int(b) * size) for b in held.done)
    return max(tiles - done, 0)


def without_store(store, message: str) -> str:
    """The message without the store's own name in front, where a line names the store."""
    for name in (str(store), Path(store).name):
        if message.startswith(f"{name}: "):
            return message[len(name) + 2 :]
    return message


def _facts(model: str | ModelSpec) -> ModelSpec | None:
    """A registered model's facts (its native input), None for one known only once loaded.
    A name is resolved only where it is registered (no timm import before the checks)."""
    name = model.name if isinstance(model, ModelSpec) else model
    if name.startswith(("timm:", "local:")):
        return None
    if name.startswith("random:") and name.split(":", 1)[1] not in REGISTRY:
        return None  # a timm architecture's random weights: known once loaded, as timm:'s
    return model_record(model)


def _plan(slide: Slide, plan: PlanChoice, spec: ModelSpec | None):
    """The name, uid (None: made by the run), um/px, tile and tiles (None: made by the run)
    of the plan a run would use, and its options resolved (None: a stored plan)."""
    if uses_stored_plan(slide, plan):
        stored, uid = load_plan(slide, plan)
        scale = scale_of(stored.spec)
        return stored.name, uid, scale.mpp, scale.tile, len(stored), None
    resolved = resolve_for_model(slide, plan, spec)
    refuse_made_otherwise(slide, resolved)  # a plan of its name stored with other settings
    scale = scale_of(plan_grid(slide, resolved))  # the pixels' own um/px, as the run reads
    return resolved.name, None, scale.mpp, scale.tile, None, resolved


def resolve_for_model(slide: Slide, plan: PlanOptions | None, spec: ModelSpec | None):
    """The plan options resolved for a model's run (`resolve_plan`): an unset mpp and tile
    are the model's native ones (`spec`; None: a model known only once loaded). The one
    place a run resolves its plan options: the checks before it, and the run for a store
    they did not see (a slide file converted on the way)."""
    native = (spec.native_mpp, spec.tile) if spec is not None else (None, None)
    return resolve_plan(plan or PlanOptions(), slide, native_mpp=native[0], native_tile=native[1])


def rgb_input(slide: Slide, channels: tuple[str, ...] | None) -> Slide:
    """The slide as an RGB model reads it (plans, tissue and the writer keep the store itself):
    the three `channels` the run chose (recorded with the embeddings; an error for a store
    that is one RGB picture already), else the slide itself where it is one 8-bit colour
    picture of a brightfield slide; an error before any GPU time for other pixels
    (fluorescence markers, 16 bits, or a fluorescence scan stored as RGB) with no channels
    chosen: a model trained on stained tissue would read them as something they are not."""
    if channels:
        return slide.as_rgb(channels)
    if not slide.rgb:
        raise StoreError(
            f"{slide.name}: holds {slide.describe_channels()}, not an 8-bit RGB picture; "
            "an RGB model cannot embed it: choose three channels as its R, G, B "
            "(channels=A,B,C)"
        )
    if slide.fluorescence:
        names = ",".join(slide.record.channels or ("0", "1", "2"))
        raise StoreError(
            f"{slide.name}: a fluorescence scan stored as RGB, not a brightfield stain; a "
            "model trained on stained tissue would read its markers as colours they are not: "
            f"name the channels it reads as R, G, B to embed it anyway (channels={names})"
        )
    return slide


def scale_mismatch(mpp: float | None, tile: int, spec: ModelSpec) -> str | None:
    """How a plan's tiles differ from what the model was trained on (its native um/px,
    within `MPP_TOLERANCE`, and tile), None where they do not or the model names neither."""
    parts = []
    native = spec.native_mpp
    if native is not None and mpp is None:
        parts.append(f"their pixel size is unknown (the model reads {native:g} um/px)")
    elif native is not None and abs(mpp / native - 1) > MPP_TOLERANCE:
        parts.append(
            f"{mpp:.3g} um/px where the model reads {native:g} um/px (the tissue "
            f"{native / mpp:.3g}x {'larger' if mpp < native else 'smaller'})"
        )
    if spec.tile is not None and tile != spec.tile:
        parts.append(f"{tile} px tiles where the model reads {spec.tile} px")
    return "; ".join(parts) or None


def refuse_other_scale(slide: Slide, plan: str, mpp: float | None, tile: int, spec) -> None:
    """PlanError where the plan's tiles are not the model's input (see `scale_mismatch`)."""
    mismatch = scale_mismatch(mpp, tile, spec)
    if mismatch:
        at = f"mpp={spec.native_mpp:g}, " if spec.native_mpp else ""
        raise PlanError(
            f"{slide.name}: plan {plan!r} does not show the tissue as {spec.name} was trained "
            f"to see it: {mismatch}; plan at {at}tile={spec.tile}, or pass any_scale=True to "
            "embed these tiles anyway"
        )
