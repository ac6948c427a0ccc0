"""How to plan a slide's tiles (`PlanOptions`, the one table of plan defaults) and its
resolution (`resolve_plan`): every default decided once, in one function that `plan`,
`embed`, `qc --plan` and the dry run all call, into a `ResolvedPlan` with no value left
open. Light: no zarr, no pixels (the CLI reads its flag defaults here).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Annotated, Literal

from tilestore.errors import OptionError, PlanError
from tilestore.masks.contrast import ContrastRule
from tilestore.masks.options import TissueMethod
from tilestore.options import Declared, Opt
from tilestore.qc.classes import ARTEFACTS
from tilestore.reading.resolution import MAX_MPP, MPP_TOLERANCE

if TYPE_CHECKING:
    from tilestore.reading.slide import Slide

DEFAULT_MPP = 0.5  # um/px of a plan's tiles when none is asked for (the common 20x of the models)
DEFAULT_TILE = 224  # px
MIN_TISSUE = 0.5  # tissue fraction a tile needs when no filter is asked for
FILTERS = ("contrast",)
MIN_TILE, MAX_TILE = 8, 16384  # px: a tile smaller holds no tissue pattern, larger no model's


# Names a plan may not take: the subgroups an embeddings group holds beside its arrays (slide
# vectors, zero-shot scores, learned scores, its chunks' positions; a store made before keeps
# them beside its plans' groups).
RESERVED_NAMES = ("slides", "zeroshot", "learned", "crc32c")

LEVEL0 = "level0"  # mpp's named value: plan in level-0 pixels (a slide without a pixel size)
Filter = Literal["contrast"]  # FILTERS


def _fraction(help: str, none: str = "") -> Opt:
    return Opt(help, low=0, high=1, none=none)


@dataclass(frozen=True)
class PlanOptions(Declared):
    """How to plan a slide's tiles: `tilestore plan` and `embed`'s plan options map onto these,
    each declared once here (type, unit, range, default, help; `tilestore.options`): a value
    out of range is refused when the options are made.

    The quality filter (max_blur) reads an earlier embedding pass's measures: a plan with it
    is made by `tilestore.plan_slide`, which applies it (`tilestore.plan.plan_over_tissue`
    refuses it).
    """

    mpp: Annotated[
        float | Literal["level0"] | None,
        Opt(
            "Tile resolution; 'level0' plans in level-0 pixels, for a slide without a "
            "recorded pixel size.",
            unit="um/px",
            low=0,
            above=True,
            high=MAX_MPP,
            none=f"{DEFAULT_MPP:g}; in embed the model's own",
            metavar="UM/PX|level0",
        ),
    ] = None
    tile: Annotated[
        int | None,
        Opt(
            "Tile side at the plan's resolution.",
            unit="px",
            low=MIN_TILE,
            high=MAX_TILE,
            none=f"{DEFAULT_TILE}; in embed the model's",
            metavar="PX",
        ),
    ] = None
    stride: Annotated[
        int | None,
        Opt("Pixels between tile starts.", unit="px", low=1, high=MAX_TILE, none="the tile"),
    ] = None
    min_tissue: Annotated[
        float | None,
        _fraction(
            "Keep tiles with at least this tissue fraction.", f"{MIN_TISSUE:g}; 0 with --filter"
        ),
    ] = None
    tissue_method: TissueMethod = "auto"  # how a missing tissue mask is made
    roi: Annotated[
        str | os.PathLike | None,
        Opt("ROI annotations: QuPath GeoJSON, Aperio or ASAP XML.", metavar="FILE"),
    ] = None
    roi_class: Annotated[str | None, Opt("Use only ROIs of this class.")] = None
    min_roi: Annotated[float, _fraction("Keep tiles with at least this ROI overlap.")] = 0.5
    roi_mpp: Annotated[
        float | None,
        Opt(
            "um/px the ROI coordinates were drawn at.",
            unit="um/px",
            low=0,
            above=True,
            high=MAX_MPP,
            none="level-0 px",
        ),
    ] = None
    tolerance: Annotated[
        float,
        Opt("Use a level as is if its um/px is this close (a fraction).", low=0, high=0.5),
    ] = MPP_TOLERANCE
    name: Annotated[str | None, Opt("Plan name.", none="from the options, e.g. 0.5mpp-224px")] = (
        None
    )
    max_artefact: Annotated[
        float | None,
        _fraction("Drop tiles more than this share artefact (needs `tilestore qc` first)."),
    ] = None
    exclude: Annotated[
        tuple[str, ...] | None,
        Opt("The artefacts --max-artefact counts, comma-separated.", none="all"),
    ] = None
    filter: Annotated[
        Filter | None, Opt("contrast: keep tiles whose own pixels pass the tutorial rule.")
    ] = None
    contrast: Annotated[ContrastRule, Opt("The rule of filter='contrast'.")] = ContrastRule()  # noqa: RUF009 (frozen: safe to share)
    upsample: Annotated[
        bool,
        Opt(
            "Plan at an mpp finer than the slide's finest level, enlarging its pixels "
            "(refused without it)."
        ),
    ] = False
    max_blur: Annotated[
        float | None,
        Opt(
            "Drop tiles whose blur, measured in an earlier embedding pass (embed --quality), "
            "is above this (ds.blur: sharp tissue 0.4-0.7, the limit the measures count "
            "against 0.74).",
            low=0,
            high=1,
        ),
    ] = None
    quality_from: Annotated[
        str | None, Opt("max_blur: the model whose measures count.", none="the store's only")
    ] = None

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_names(self)

    @property
    def effective_min_tissue(self) -> float:
        """min_tissue, or its default: 0 with a filter (the filter is the tissue test)."""
        if self.min_tissue is not None:
            return self.min_tissue
        return 0.0 if self.filter else MIN_TISSUE


@dataclass(frozen=True)
class ResolvedPlan:
    """A plan's options with every default decided (`resolve_plan`): what a plan is made with
    and what its record says. mpp None means level-0 pixels, asked for explicitly (mpp='level0').
    The same fields as `PlanOptions` (a test holds them equal): those `resolve_plan` decides
    (mpp, tile, stride, min_tissue, name), the others carried as given."""

    mpp: float | None
    tile: int
    stride: int
    min_tissue: float
    tissue_method: str
    roi: str | os.PathLike | None
    roi_class: str | None
    min_roi: float
    roi_mpp: float | None
    tolerance: float
    name: str
    max_artefact: float | None
    exclude: tuple[str, ...] | None
    filter: str | None
    contrast: ContrastRule
    upsample: bool
    max_blur: float | None = None
    quality_from: str | None = None


def resolve_plan(
    options: PlanOptions | ResolvedPlan,
    slide: Slide,
    *,
    native_mpp: float | None = None,
    native_tile: int | None = None,
) -> ResolvedPlan:
    """Decide every default of `options` for `slide`: the mpp and tile unset take the model's
    native ones where a model is known (`native_mpp`, `native_tile`), else `DEFAULT_MPP` and
    `DEFAULT_TILE`; mpp='level0' plans in level-0 pixels. A slide whose pixel size is unknown is
    refused for any mpp (the same rule for every command): the tiles' magnification would
    be unknown, and a model is magnification-specific.

    Parameters
    ----------
    options : PlanOptions or ResolvedPlan
        The plan asked for; a `ResolvedPlan` is returned as it is.
    slide : Slide
        The slide planned: its pixel size and levels decide what is allowed.
    native_mpp, native_tile : float, int, optional
        The model's um/px and tile size, the defaults of an mpp and tile not given.

    Returns
    -------
    ResolvedPlan
        Every value decided (no None left open), as `plan_over_tissue` and the plan's
        record take it.
    """
    if isinstance(options, ResolvedPlan):
        return options
    if options.mpp == LEVEL0:
        mpp = None
    else:
        mpp = options.mpp if options.mpp is not None else native_mpp or DEFAULT_MPP
    tile = options.tile if options.tile is not None else native_tile or DEFAULT_TILE
    if mpp is not None and slide.mpp is None:
        raise PlanError(
            f"{slide.name}: pixel size unknown, so its tiles cannot be read at {mpp:g} um/px; "
            "give the slide's pixel size (convert again with mpp=<um/px>, or embed the slide "
            "file with scan_mpp=<um/px>), or plan in level-0 pixels explicitly (mpp='level0')"
        )
    if mpp is not None and abs(slide.mpp[1] / slide.mpp[0] - 1) > options.tolerance:
        raise PlanError(
            f"{slide.name}: its pixels are not square ({slide.mpp[0]:.4g} x {slide.mpp[1]:.4g} "
            f"um/px, x by y): a {tile} px tile at {mpp:g} um/px would cover "
            f"{tile * mpp:.4g} x {tile * mpp * slide.mpp[1] / slide.mpp[0]:.4g} um; plans of "
            "slides with other pixel sizes across and down are not made (give the slide's "
            "true pixel size, or plan in level-0 pixels: mpp='level0')"
        )
    finest = slide.mpp[0] if slide.mpp is not None else None
    if mpp is not None and finest > mpp * (1 + options.tolerance) and not options.upsample:
        raise PlanError(
            f"{slide.name}: its finest level is {finest:.4g} um/px, coarser than the {mpp:g} "
            f"um/px asked: each tile would be {finest / mpp:.3g}x enlarged from pixels never "
            f"scanned; plan at mpp={finest:.4g} or coarser, or pass upsample=True to enlarge "
            "them anyway"
        )
    stride = options.stride or tile
    decided = {
        "mpp": mpp,
        "tile": tile,
        "stride": stride,
        "min_tissue": options.effective_min_tissue,
        "name": options.name or default_name(mpp, tile, stride, options),
    }
    # every other option as given: one field list (a new option is carried, not forgotten)
    names = [f.name for f in fields(ResolvedPlan) if f.name not in decided]
    given = {name: getattr(options, name) for name in names}
    return ResolvedPlan(**given, **decided)


def _check_names(options: PlanOptions) -> None:
    """Names a plan is stored or filtered by: a plan's name is a group in the store (no
    folders, nothing hidden), the artefacts excluded are QC's."""
    name = options.name
    if name is not None and (
        not name.strip() or "/" in name or name.startswith((".", "__")) or name in RESERVED_NAMES
    ):
        raise OptionError(
            f"name={name!r}: a plan's name is a group of the store: not empty, no '/', not "
            f"starting with '.' or '__', not {' or '.join(RESERVED_NAMES)}"
        )
    unknown = [e for e in options.exclude or () if e not in ARTEFACTS]
    if unknown:
        raise OptionError(f"exclude={unknown[0]!r}: not an artefact; choose {', '.join(ARTEFACTS)}")


def default_name(mpp: float | None, tile: int, stride: int, options: PlanOptions) -> str:
    """A readable plan name that says every setting which decides its tiles and is not the
    default: 0.5mpp-224px[-s112][-t0.9][-<method>][-<roi>[-r0.7][-roi0.25mpp]][-class]
    [-contrast[-<rule>]][-qc0.1[-ink+fold]][-blur0.4[-from-<model>]][-tol0.1][-up]. Two plans
    of other settings never share a default name (`tests/tilestore/test_plans.py`, a property
    test); what a name cannot say (the ROI file's content, the tissue mask read) is compared
    where a plan of that name is stored already (`tilestore.plan.plans.save_plan`)."""
    parts = [f"{mpp:g}mpp" if mpp is not None else "level0", f"{tile}px"]
    if stride != tile:
        parts.append(f"s{stride}")
    if options.min_tissue is not None and options.min_tissue != (
        0.0 if options.filter else MIN_TISSUE
    ):
        parts.append(f"t{options.min_tissue:g}")
    if options.tissue_method != "auto" and options.effective_min_tissue > 0:
        parts.append(str(options.tissue_method))
    if options.roi:
        parts.append(os.path.splitext(os.path.basename(options.roi))[0])
        if options.min_roi != PlanOptions.min_roi:
            parts.append(f"r{options.min_roi:g}")
        if options.roi_mpp is not None:
            parts.append(f"roi{options.roi_mpp:g}mpp")
    if options.roi_class:
        parts.append(options.roi_class)
    if options.filter:
        parts.append(options.filter)
        if options.contrast != ContrastRule():
            parts.append(_digest(asdict(options.contrast)))
    if options.max_artefact is not None:
        counted = "+".join(options.exclude) if options.exclude else ""
        parts.append(f"qc{options.max_artefact:g}{'-' + counted if counted else ''}")
    if options.max_blur is not None:
        parts.append(f"blur{options.max_blur:g}")
        if options.quality_from:
            parts.append(f"from-{options.quality_from}")
    if mpp is not None and options.tolerance != MPP_TOLERANCE:
        parts.append(f"tol{options.tolerance:g}")
    if options.upsample:
        parts.append("up")
    return "-".join(p.replace("/", "_").replace(" ", "_").replace(":", "-") for p in parts)


def _digest(value) -> str:
    """Six hex digits standing for a setting too long to spell in a name."""
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:6]
