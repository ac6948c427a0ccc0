"""Plans that leave out tiles an earlier embedding pass measured as blurred.

The measures are the store's (`embeddings/<model>/<plan>/quality`, written beside the features by
`tilestore.embed`); a plan's tiles are matched to the measured ones by their level-0 corner,
so a plan on the same grid finds each of its tiles. A tile the earlier pass did not measure
(another grid, or not embedded) is kept and counted in the plan's notes, never dropped
silently.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from tilestore.embeddings.groups import check_shapes, embed_again, list_groups
from tilestore.embeddings.layout import model_folder
from tilestore.errors import PlanError
from tilestore.format.records import EmbeddingsRecord, read_record
from tilestore.format.store import damage_as_store_error
from tilestore.plan import plans
from tilestore.plan.grid import TilePlan
from tilestore.plan.options import PlanOptions, ResolvedPlan, resolve_plan
from tilestore.reading.slide import Slide


def plan_slide(
    slide: Slide, options: PlanOptions | ResolvedPlan = PlanOptions(), **resolve
) -> TilePlan:
    """A slide's plan with every option applied (`tilestore.plan.plan_over_tissue`), max_blur's
    filter too: where the options give it, without the tiles an earlier embedding pass
    measured blurrier (`without_blurred`). This is `tilestore.plan_slide`.

    Parameters
    ----------
    slide : Slide
        The store's slide (`tilestore.open_slide`).
    options : PlanOptions or ResolvedPlan
        The plan asked for; a `ResolvedPlan` where a model's defaults were applied already.
    **resolve
        `resolve_plan`'s model defaults (native_mpp, native_tile...); ``store_tissue``
        (default True) goes to `plan_over_tissue`: False writes no tissue mask (a dry run).

    Returns
    -------
    TilePlan
        The tiles' positions, fractions and the plan's recipe; not stored (`save_plan`).
    """
    store_tissue = resolve.pop("store_tissue", True)
    resolved = (
        options if isinstance(options, ResolvedPlan) else resolve_plan(options, slide, **resolve)
    )  # a record resolved once (a run's) is taken as it is
    return plans.plan_over_tissue(
        slide,
        resolved,
        store_tissue=store_tissue,
        measured=lambda plan: without_blurred(
            slide, plan, resolved.max_blur, resolved.quality_from
        ),
    )


def without_blurred(
    slide: Slide, plan: TilePlan, max_blur: float, model: str | None = None
) -> TilePlan:
    """The plan without the tiles whose stored blur is above `max_blur` (DamagedEmbeddings
    where the group's shapes disagree: `check_shapes`)."""
    where = _measured(slide, model)
    group = where.split("/", 1)[1]
    with damage_as_store_error(slide.name, where, embed_again(where)):
        found = slide.group[where]
        record = read_record(found, EmbeddingsRecord, f"{slide.name}: {where}")
        meta = (record or EmbeddingsRecord()).to_attrs()
        check_shapes(slide.name, where, meta, dict(found.arrays()))
        measures = list(found["quality"].attrs["measures"])
        blur = found["quality"][:, measures.index("blur")]
        xs, ys = found["x"][:], found["y"][:]
    at = {(int(x), int(y)): i for i, (x, y) in enumerate(zip(xs, ys, strict=True))}
    index = np.array([at.get((int(x), int(y)), -1) for x, y in zip(plan.x, plan.y, strict=True)])
    matched = index >= 0
    values = np.where(matched, blur[np.maximum(index, 0)], np.nan)
    drop = np.nan_to_num(values, nan=-np.inf) > max_blur
    notes = [f"blur over {max_blur:g} ({group}'s measures): {int(drop.sum())} of {len(plan)} "
             "tiles dropped"]  # fmt: skip
    if (~matched).any():
        notes.append(f"{int((~matched).sum())} tiles were not measured by {group} (kept)")
    kept = plan.subset(~drop)
    kept = replace(kept, notes=[*kept.notes, *notes])
    if not len(kept):
        raise PlanError(f"{slide.name}: every tile of the plan is blurrier than {max_blur:g}")
    return kept


def _measured(slide: Slide, model: str | None) -> str:
    """The embeddings group whose measures count: the model's, or the store's only one
    with measures (of one plan: several plans' measures are refused, naming them)."""
    having = []
    for name, _, path in list_groups(slide.group.store):
        with damage_as_store_error(slide.name, path, embed_again(path)):
            if "quality" in slide.group[path]:
                having.append((name, path))
    if model is not None:
        having = [(n, p) for n, p in having if n == model_folder(model).split("/")[-1]]
        if not having:
            raise PlanError(
                f"{slide.name}: no per-tile measures of {model!r} (max_blur needs a store "
                "embedded with quality measures: tilestore embed, then plan)"
            )
    if len(having) != 1:
        raise PlanError(
            f"{slide.name}: max_blur needs per-tile measures from an embedding pass; "
            + ("none in this store (embed it first)" if not having else
               f"several groups have them ({', '.join(p for _, p in having)}): name one "
               "model with quality_from (of one plan)")
        )  # fmt: skip
    return having[0][1]
