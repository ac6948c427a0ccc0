"""Plans for a slide: made from its tissue mask and ROIs, saved in the store as plans/<name>.

A stored plan is a group of 1-D arrays on a ``tile`` dimension (x, y, row, col, tissue,
roi, roi_class, chunk ranges), so ``xarray.open_zarr(store, group="plans/<name>",
consolidated=False)`` shows it as a table; its attributes hold the grid, the parameters
and a uid that embeddings record, so a replaced plan is never mistaken for the one they
were made from.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import json
import os
import warnings
from collections.abc import Callable
from dataclasses import asdict, replace

import numpy as np
import zarr
from zarr.core.sync import sync

from tilestore import locks
from tilestore.errors import PlanError
from tilestore.format.codecs import zstd_codecs
from tilestore.format.records import PlanRecord, find_record, read_record, write_record
from tilestore.format.shards import column
from tilestore.format.store import damage_as_store_error, written_whole
from tilestore.masks.tissue import TissueMask, compute_tissue, read_tissue, write_tissue
from tilestore.plan.annotations import Annotations, load_annotations
from tilestore.plan.filters import contrast_keep
from tilestore.plan.grid import GridSpec, TilePlan, grid_spec, make_plan, tissue_fractions
from tilestore.plan.options import PlanOptions, ResolvedPlan, resolve_plan
from tilestore.qc.store import StoredQC, read_qc
from tilestore.reading.labels import children
from tilestore.reading.slide import Slide

PLANS = "plans"
# what to do about a plan of a name stored already, made otherwise (in embed too: its
# --overwrite is the embeddings', never the plan's)
REPLACE = (
    "choose another name, or replace the stored plan (tilestore plan --overwrite, "
    "save_plan(overwrite=True); embeddings of the stored one then no longer stand for it)"
)


def plan_tissue(
    slide: Slide, options: PlanOptions | ResolvedPlan, *, store: bool = True
) -> tuple[TissueMask | None, str | None]:
    """The tissue mask a plan of these options reads, and a note where it was computed: none
    where the plan needs none (min_tissue 0); the store's labels/tissue; else computed with
    `options.tissue_method` and stored (unless store=False)."""
    min_tissue = (
        options.min_tissue if isinstance(options, ResolvedPlan) else options.effective_min_tissue
    )
    if min_tissue <= 0:
        return None, None
    tissue = read_tissue(slide)
    if tissue is not None:
        return tissue, None
    tissue = compute_tissue(slide, options.tissue_method)
    if store:
        write_tissue(slide, tissue)
    stored = "and stored" if store else "(not stored)"
    return tissue, f"tissue mask computed ({tissue.method}, {tissue.polarity}) {stored}"


def uses_stored_plan(slide: Slide, plan: str | PlanOptions | None) -> bool:
    """Whether `plan` means a plan already in the store: a name, or None where the store
    holds exactly one (else None means one is to be made)."""
    return isinstance(plan, str) or (plan is None and len(list_plans(slide)) == 1)


def plan_grid(slide: Slide, options: ResolvedPlan, notes: list[str] | None = None) -> GridSpec:
    """Where a plan of these options reads its tiles on this slide: the level, the window
    and stride in its pixels, and the um/px the pixels read are at (`effective_mpp`). From
    the store's metadata alone: what a run checks before it loads a model, and what the plan
    is made on."""
    level = slide.level_for_mpp(options.mpp, options.tolerance) if options.mpp else 0
    lv = slide.levels[level]
    return grid_spec(
        level,
        lv.downsample,
        (lv.height, lv.width),
        slide.level_mpp(level)[0] if slide.mpp else None,
        options.mpp,
        options.tile,
        options.stride,
        tolerance=options.tolerance,
        notes=notes,
    )


def plan_slide(slide: Slide, options: PlanOptions | ResolvedPlan = PlanOptions(), **given):
    """Deprecated: `plan_over_tissue` (this name is `tilestore.plan_slide`'s, the plan a user
    asks for, max_blur's filter too); kept because the tutorials named it."""
    warnings.warn(
        "tilestore.plan.plan_slide is tilestore.plan.plan_over_tissue now; "
        "tilestore.plan_slide makes the plan with every filter",
        DeprecationWarning,
        stacklevel=2,
    )
    return plan_over_tissue(slide, options, **given)


def plan_over_tissue(
    slide: Slide,
    options: PlanOptions | ResolvedPlan = PlanOptions(),
    *,
    store_tissue: bool = True,
    measured: Callable[[TilePlan], TilePlan] | None = None,
) -> TilePlan:
    """Return the plan of `tile`-px tiles at `mpp` over the slide's tissue (and ROI), as the
    options say once resolved (`resolve_plan`; pass a `ResolvedPlan` for a model's defaults).

    The tissue mask is the store's labels/tissue; if there is none it is computed with
    `options.tissue_method` and stored (unless store_tissue=False: a dry run writes
    nothing). measured: the filter that leaves out tiles an earlier embedding pass measured
    blurrier than max_blur; the store's embeddings hold those measures, so it is passed in
    from above (by `tilestore.plan_slide`, the plan a user asks for, which calls this): a
    plan asked for max_blur without it is refused, never made unfiltered under a filter's
    name.
    """
    if not isinstance(options, ResolvedPlan):  # a record resolved once is taken as it is
        options = resolve_plan(options, slide)
    if options.max_blur is not None and measured is None:
        raise PlanError(
            f"max_blur={options.max_blur:g}: the blur filter reads the store's embeddings' "
            "measures: plan with tilestore.plan_slide, not tilestore.plan.plan_over_tissue"
        )
    notes: list[str] = []
    spec = plan_grid(slide, options, notes)
    lv = slide.levels[spec.level]
    tissue, note = plan_tissue(slide, options, store=store_tissue)
    notes.extend([note] if note else [])
    rois = plan_rois(slide, options, notes) if options.roi else None
    qc = _stored_qc(slide, options)
    roi = options.roi
    plan = make_plan(
        spec,
        name=options.name,
        chunk_shape=lv.chunks[1:],
        tissue=tissue.mask if tissue is not None else None,
        tissue_downsample=tissue.downsample if tissue is not None else (1, 1),
        min_tissue=options.min_tissue,
        rois=rois,
        min_roi=options.min_roi,
        params={
            **option_params(options),
            "tissue_method": tissue.method if tissue else None,
            **({"upsample": True} if options.upsample else {}),
        },
        notes=notes,
    )
    if qc is not None:
        plan = _with_qc(plan, qc, options, notes)
    if options.filter == "contrast" and len(plan):
        keep = contrast_keep(slide, plan, options.contrast)
        notes.append(f"contrast filter kept {int(keep.sum())} of {len(plan)} tiles")
        plan = plan.subset(keep)
    if measured is not None and options.max_blur is not None and len(plan):
        plan = measured(plan)
    if not len(plan):
        why = []
        if tissue is not None:
            why.append(
                f"tissue covers {tissue.fraction:.1%} of the slide"
                + (" (no tissue found)" if not tissue.mask.any() else "")
            )
        if rois is not None:
            why.append(f"ROI area {float(rois.union().area):.0f} px^2")
        rows, cols = spec.grid
        raise PlanError(
            f"{slide.name}: no tile of the {rows}x{cols} grid kept with "
            f"min_tissue={options.min_tissue}"
            + (f", min_roi={options.min_roi}" if roi else "")
            + (f" ({'; '.join(why)})" if why else "")
        )
    return plan


def _stored_qc(slide: Slide, options: ResolvedPlan) -> StoredQC | None:
    """The store's labels/qc; an error where the options need it and there is none."""
    qc = read_qc(slide)
    if qc is None and (options.max_artefact is not None or options.exclude):
        raise PlanError(
            f"{slide.name}: max_artefact and exclude need the store's QC maps; run "
            "`tilestore qc` on it first"
        )
    if qc is not None and options.exclude:
        unknown = [n for n in options.exclude if n not in qc.classes]
        if unknown:
            raise PlanError(
                f"{slide.name}: exclude names {', '.join(unknown)}, which QC did not look "
                f"for; its artefacts: {', '.join(qc.classes)}"
            )
    return qc


def _with_qc(plan: TilePlan, qc: StoredQC, options: ResolvedPlan, notes: list[str]) -> TilePlan:
    """The plan with each artefact's share of every tile as a column, and without the tiles
    over `options.max_artefact` (counting the artefacts in `options.exclude`, or all)."""
    fh, fw = plan.footprint0()
    y0, x0 = plan.y.astype(np.float64), plan.x.astype(np.float64)
    shares = {}
    for name in qc.classes:
        mask = qc.mask(name)
        shares[name] = (
            tissue_fractions(mask, qc.downsample, y0, x0, fh, fw)
            if mask.any()
            else np.zeros(len(plan), np.float32)
        )
    plan = replace(plan, qc=shares)
    if options.max_artefact is None:
        return plan
    counted = options.exclude or tuple(qc.classes)
    share = np.sum([shares[n] for n in counted], axis=0)
    keep = share <= options.max_artefact
    notes.append(
        f"QC: {int((~keep).sum())} of {len(plan)} tiles over {options.max_artefact:g} "
        f"{'+'.join(counted)} dropped"
    )
    return plan.subset(keep)


def plan_rois(slide: Slide, options: ResolvedPlan, notes: list[str] | None = None) -> Annotations:
    """The ROIs a plan of these options keeps tiles in, in level-0 pixels, exactly as the
    plan uses them (scaled from roi_mpp, of roi_class only): what its preview draws."""
    notes = [] if notes is None else notes
    roi, roi_class, roi_mpp = options.roi, options.roi_class, options.roi_mpp
    _, h0, w0 = slide.shape
    scale = 1.0
    if roi_mpp is not None:
        if slide.mpp is None:
            raise PlanError(f"{slide.name}: roi_mpp needs the slide's pixel size (unknown)")
        scale = roi_mpp / slide.mpp[0]
        notes.append(f"ROI coordinates scaled by {scale:.4g} ({roi_mpp} -> {slide.mpp[0]} um/px)")
    rois = load_annotations(roi, size=(w0, h0), scale=scale).select(roi_class)
    notes.extend(f"{os.path.basename(roi)}: {w}" for w in rois.warnings)
    drawn = rois.file_mpp
    if drawn and slide.mpp and roi_mpp is None and abs(drawn / slide.mpp[0] - 1) > 0.05:
        notes.append(
            f"{os.path.basename(roi)} was drawn on a {rois.file_mpp:g} um/px scan; "
            f"this slide is {slide.mpp[0]:g} um/px (set roi_mpp if they differ)"
        )
    return rois


def save_plan(slide: Slide, plan: TilePlan, *, overwrite: bool = False) -> str:
    """Store the plan as plans/<name>; return its uid.

    A plan of that name stored already is never replaced implicitly: the very same plan
    (its recipe and its tiles) is kept as it is (its uid returned, nothing written); one made
    otherwise is refused in one line naming how the two differ (`plan_difference`), unless
    overwrite=True.

    Parameters
    ----------
    slide : Slide
        The store written into (a converted store or a sidecar).
    plan : TilePlan
        The plan made (`tilestore.plan_slide`).
    overwrite : bool
        Replace a plan of that name made otherwise.

    Returns
    -------
    str
        The plan's uid: a hash of its recipe and tiles, what an embeddings group records
        of the plan it was made from.
    """
    root = slide.writable_group()
    plans = root.require_group(PLANS)
    if plan.name in plans and not _complete(plans[plan.name]):
        del plans[plan.name]  # a save that failed or was killed part way: never a plan
    columns = _columns(plan)
    uid = plan_uid(plan)
    if plan.name in plans:
        if not overwrite:
            meta = stored_record(slide, plan.name)
            if meta.uid == uid and not recipe_difference(recipe_of(meta), plan_recipe(plan)):
                return uid  # the very same plan: kept as it is
            raise PlanError(
                f"{slide.name}: plan {plan.name!r} is stored already, made otherwise ("
                f"{plan_difference(meta, plan)}); {REPLACE}"
            )
        # a run embedding this store reads its plans: none is replaced under it
        locks.refuse_while_written(
            getattr(slide.group.store, "root", None), f"replacing its plan {plan.name!r}"
        )
        del plans[plan.name]
    with written_whole(plans, plan.name, slide.name, f"plan {plan.name!r}"):
        group = plans.create_group(plan.name)
        for key, values in columns.items():
            group.create_array(
                key,
                data=np.ascontiguousarray(values),
                dimension_names=("tile",),
                **column(zstd_codecs(), len(plan)),
            )
        record = PlanRecord.make(
            f"{slide.name}: {PLANS}/{plan.name}",
            uid=uid,
            spec=asdict(plan.spec),
            classes=plan.classes,
            qc_classes=list(plan.qc),
            chunk_shape=list(plan.chunk_shape),
            params=plan.params,
            recipe=plan_recipe(plan),
            notes=plan.notes,
            tiles=len(plan),
            created=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            complete=True,
        )
        write_record(group, record)
    return uid


def _columns(plan: TilePlan) -> dict[str, np.ndarray]:
    """The per-tile arrays a stored plan holds."""
    return {
        "x": plan.x,
        "y": plan.y,
        "row": plan.row,
        "col": plan.col,
        "tissue": plan.tissue,
        "roi": plan.roi,
        "roi_class": plan.roi_class,
        "chunk_row0": plan.chunk_rows[:, 0],
        "chunk_row1": plan.chunk_rows[:, 1],
        "chunk_col0": plan.chunk_cols[:, 0],
        "chunk_col1": plan.chunk_cols[:, 1],
        **{f"qc_{name}": share for name, share in plan.qc.items()},
    }


def plan_uid(plan: TilePlan) -> str:
    """What a plan is, by content: a digest of its tiles (every column) and its grid; the uid
    embeddings record, so a plan stored again otherwise is never taken for the one they
    were made from."""
    return hashlib.sha256(
        b"".join(np.ascontiguousarray(v).tobytes() for v in _columns(plan).values())
        + repr(asdict(plan.spec)).encode()
    ).hexdigest()[:16]


def plan_recipe(plan: TilePlan) -> dict:
    """Every setting a plan was made with (its grid's um/px, tile and stride, and its
    params: tissue, ROI file and its SHA-256, filters, QC, tolerance), as stored (JSON)."""
    spec = plan.spec
    made = {"mpp": spec.mpp, "tile": spec.tile, "stride": spec.stride, **plan.params}
    return json.loads(json.dumps(made))


def recipe_of(meta: PlanRecord) -> dict:
    """A stored plan's recipe: recorded, or for a plan stored before recipes were, its
    grid's and params' (without the ROI file's hash, which was not recorded)."""
    if meta.recipe is not None:
        return dict(meta.recipe)
    spec = meta.spec or {}
    made = {k: spec.get(k) for k in ("mpp", "tile", "stride")}
    return json.loads(json.dumps({**made, **(meta.params or {})}))


def recipe_difference(old: dict, new: dict) -> list[str]:
    """The settings two recipes both record and give other values (name=old -> new)."""
    return [
        f"{key}={old[key]!r} -> {new[key]!r}"
        for key in sorted(old.keys() & new.keys())
        if old[key] != new[key]
    ]


def plan_difference(meta: PlanRecord, plan: TilePlan) -> str:
    """How a plan made now differs from the one stored under its name (`meta`, its record):
    the settings, else its tiles (the same settings over another tissue mask, QC maps or
    annotations)."""
    settings = recipe_difference(recipe_of(meta), plan_recipe(plan))
    if settings:
        return "stored -> now: " + ", ".join(settings)
    return (
        f"the same settings, other tiles: {meta.tiles} stored, {len(plan)} now (its "
        "tissue mask, QC maps or annotations changed since)"
    )


def option_params(options: ResolvedPlan) -> dict:
    """The settings a plan records in its params that its options alone decide: the one
    list `plan_over_tissue` stores and `options_recipe` compares before a plan is made."""
    roi = options.roi
    return {
        "min_tissue": options.min_tissue,
        "roi": os.path.basename(roi) if roi else None,
        "roi_sha256": _sha256(roi) if roi else None,
        "roi_class": options.roi_class,
        "min_roi": options.min_roi if roi else None,
        "roi_mpp": options.roi_mpp,
        "tolerance": options.tolerance,
        "filter": options.filter,
        "contrast": asdict(options.contrast) if options.filter == "contrast" else None,
        "max_artefact": options.max_artefact,
        "exclude": list(options.exclude) if options.exclude else None,
        "max_blur": options.max_blur,
        "quality_from": options.quality_from,
    }


def options_recipe(options: ResolvedPlan) -> dict:
    """What a plan made with these options will record of its settings (`plan_recipe`'s
    keys that the options decide alone: not the tissue mask's method, which the store's
    mask may decide), before it is made: what a run compares with a stored plan of the
    same name before any model loads."""
    made = {"mpp": options.mpp, "tile": options.tile, "stride": options.stride}
    made.update(option_params(options))
    return json.loads(json.dumps(made))


def refuse_made_otherwise(slide: Slide, options: ResolvedPlan) -> None:
    """PlanError, one line, where a plan of these options' name is stored already with other
    settings (the options alone tell: before the plan, or a model, is made). Other tiles of
    the same settings (another tissue mask) are said when the plan is saved (`save_plan`)."""
    if options.name not in list_plans(slide):
        return
    meta = stored_record(slide, options.name)
    differ = recipe_difference(recipe_of(meta), options_recipe(options))
    if differ:
        raise PlanError(
            f"{slide.name}: plan {options.name!r} is stored already, made otherwise (stored -> "
            f"now: {', '.join(differ)}); {REPLACE}"
        )


def _sha256(path: str | os.PathLike) -> str:
    """The SHA-256 of a file's bytes (a ROI file: what a plan's name cannot say)."""
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(2**20), b""):
            digest.update(block)
    return digest.hexdigest()


def _complete(group) -> bool:
    try:
        record = find_record(group, PlanRecord)  # a damaged record is no plan either
    except Exception:  # nor is a group whose attributes cannot be read
        return False
    return record is not None and record.complete


def list_plans(slide: Slide) -> list[str]:
    """Names of the complete plans in the store."""
    names = []
    for path in sorted(children(slide, PLANS)):
        name = path.split("/", 1)[1]
        with damage_as_store_error(slide.name, f"plan {name!r}", _remake(name)):
            record = read_record(slide.group[path], PlanRecord, _where(slide, name), _remake(name))
        if record is not None and record.complete:
            names.append(name)
    return names


def stored_record(slide: Slide, name: str) -> PlanRecord:
    """A stored plan's record (uid, grid, params, recipe...); StoreError where it has none
    or a damaged one."""
    with damage_as_store_error(slide.name, f"plan {name!r}", _remake(name)):
        record = read_record(slide.group[f"{PLANS}/{name}"], PlanRecord, _where(slide, name),
                             _remake(name))  # fmt: skip
        if record is None:
            raise KeyError("the plan's record")
    return record


def _where(slide: Slide, name: str) -> str:
    return f"{slide.name}: plan {name!r}"


def _remake(name: str) -> str:
    return f"make it again with overwrite=True (or remove {PLANS}/{name})"


def load_plan(slide: Slide, name: str | None = None) -> tuple[TilePlan, str]:
    """Return a stored plan and its uid; without a name, the store's only plan.

    Returns
    -------
    tuple of (TilePlan, str)
        The plan as stored and its uid (`save_plan`'s). PlanError where the store holds
        no plan of that name, or (no name given) none or several.
    """
    names = list_plans(slide)
    if name is None:
        if len(names) != 1:
            raise PlanError(
                f"{slide.name}: {'no plans' if not names else 'several plans'} in the "
                f"store{': ' + ', '.join(names) if names else ''}; "
                + ("make one with `tilestore plan`" if not names else "name one with plan=<name>")
            )
        name = names[0]
    if name not in names:
        raise PlanError(f"{slide.name}: no plan {name!r}; plans: {', '.join(names) or 'none'}")
    with damage_as_store_error(slide.name, f"plan {name!r}", _remake(name)):
        group = slide.group[f"{PLANS}/{name}"]
        meta = stored_record(slide, name)
        spec = meta.spec
        spec = GridSpec(
            **{
                **spec,
                "downsample": tuple(spec["downsample"]),
                "level_shape": tuple(spec["level_shape"]),
            }
        )
        qc = [f"qc_{name}" for name in meta.qc_classes]
        columns = _read_whole(group, ["row", "col", "tissue", "roi", "roi_class", *qc])
        plan = TilePlan(
            name,
            spec,
            columns["row"],
            columns["col"],
            columns["tissue"],
            columns["roi"],
            columns["roi_class"],
            list(meta.classes),
            meta.chunk_shape,
            dict(meta.params),
            list(meta.notes),
            {name: columns[f"qc_{name}"] for name in meta.qc_classes},
        )
        return plan, meta.uid


def _read_whole(group: zarr.Group, names: list[str]) -> dict[str, np.ndarray]:
    """The group's arrays `names`, each read whole, in one call of zarr's event loop (a
    call each cost a CPU 1-2 ms more an array: a cohort of small slides loads a plan a
    slide). KeyError naming one that is absent."""

    async def read(name: str) -> np.ndarray:
        array = await group._async_group.getitem(name)
        if not isinstance(array, zarr.AsyncArray):
            raise KeyError(name)
        return np.asarray(await array.getitem(...))

    async def every() -> list[np.ndarray]:
        return await asyncio.gather(*(read(name) for name in names))

    return dict(zip(names, sync(every()), strict=True))
