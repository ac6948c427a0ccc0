"""How to plan a slide's tiles (`PlanOptions`, the one table of plan defaults) and its
resolution (`resolve_plan`): every default decided once, in one function that `plan`,
`embed`, `qc --plan` and the dry run all call, into a `ResolvedPlan` with no value left
open. Light: no zarr, no pixels (the CLI reads its flag defaults here).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tilestore.errors import PlanError
from tilestore.masks.contrast import ContrastRule
from tilestore.reading.resolution import MPP_TOLERANCE

if TYPE_CHECKING:
    from tilestore.reading.slide import Slide

DEFAULT_MPP = 0.5  # um/px of a plan's tiles when none is asked for (the common 20x of the models)
DEFAULT_TILE = 224  # px
MIN_TISSUE = 0.5  # tissue fraction a tile needs when no filter is asked for
FILTERS = ("contrast",)


@dataclass(frozen=True)
class PlanOptions:
    """How to plan a slide's tiles: `tilestore plan` and `embed`'s plan options map onto these.

    mpp: um/px of the tiles; None takes the default (`DEFAULT_MPP`, or in `embed` the
        model's native mpp), 0 plans in level-0 pixels (slides without a pixel size).
    tile: tile side in px at mpp; None takes `DEFAULT_TILE` (in `embed`, the model's).
    stride: px between tile starts (None: tile). min_tissue: keep tiles with at least this
    tissue fraction (0: no tissue mask needed). tissue_method: how a missing tissue mask is
    made (`tilestore.masks.tissue`). roi: an annotation file (QuPath GeoJSON, Aperio or ASAP XML)
    in level-0 pixels, or drawn at roi_mpp um/px; roi_class: only ROIs of this class;
    min_roi: keep tiles with at least this ROI overlap. tolerance: a level within this
    fraction of mpp is read as is. name: the stored plan's name (None: from the options).
    max_artefact: drop tiles whose QC artefacts (labels/qc, made by `tilestore qc`) cover
    more than this share of them; exclude: the artefacts that count (None: all).
    filter: "contrast" keeps only tiles whose own pixels pass `contrast` (the tutorials'
    rule, `tilestore.masks.contrast`); with a filter, min_tissue defaults to 0 (the filter is
    the tissue test), else to MIN_TISSUE.
    upsample: plan at an mpp finer than the slide's finest level (its tiles read as smaller
    windows and enlarged); without it such a plan is refused, since a model would be fed
    pixels that were never scanned.
    max_blur: drop tiles whose per-tile blur (measured in an earlier embedding pass and
    stored with its embeddings: `tilestore.qc.tilewise`) is above this; quality_from: the
    model whose measures count (None: the store's only embeddings that have them).
    """

    mpp: float | None = None
    tile: int | None = None
    stride: int | None = None
    min_tissue: float | None = None
    tissue_method: str = "auto"
    roi: str | os.PathLike | None = None
    roi_class: str | None = None
    min_roi: float = 0.5
    roi_mpp: float | None = None
    tolerance: float = MPP_TOLERANCE
    name: str | None = None
    max_artefact: float | None = None
    exclude: tuple[str, ...] | None = None
    filter: str | None = None
    contrast: ContrastRule = ContrastRule()  # noqa: RUF009 (frozen: safe to share)
    upsample: bool = False
    max_blur: float | None = None
    quality_from: str | None = None

    @property
    def effective_min_tissue(self) -> float:
        """min_tissue, or its default: 0 with a filter (the filter is the tissue test)."""
        if self.min_tissue is not None:
            return self.min_tissue
        return 0.0 if self.filter else MIN_TISSUE


@dataclass(frozen=True)
class ResolvedPlan:
    """A plan's options with every default decided (`resolve_plan`): what a plan is made with
    and what its record says. mpp None means level-0 pixels, asked for explicitly (mpp=0)."""

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
    `DEFAULT_TILE`; mpp=0 plans in level-0 pixels. A slide whose pixel size is unknown is
    refused for any mpp (the same rule for every command): the tiles' magnification would
    be unknown, and a model is magnification-specific."""
    if isinstance(options, ResolvedPlan):
        return options
    mpp = (native_mpp or DEFAULT_MPP) if options.mpp is None else options.mpp or None
    tile = options.tile or native_tile or DEFAULT_TILE
    if mpp is not None and slide.mpp is None:
        raise PlanError(
            f"{slide.name}: pixel size unknown, so its tiles cannot be read at {mpp:g} um/px; "
            "give the slide's pixel size (convert again with mpp=<um/px>), or plan in "
            "level-0 pixels explicitly (mpp=0)"
        )
    finest = slide.mpp[0] if slide.mpp is not None else None
    if mpp is not None and finest > mpp * (1 + options.tolerance) and not options.upsample:
        raise PlanError(
            f"{slide.name}: its finest level is {finest:.4g} um/px, coarser than the {mpp:g} "
            f"um/px asked: each tile would be {finest / mpp:.3g}x enlarged from pixels never "
            f"scanned; plan at mpp={finest:.4g} or coarser, or pass upsample=True to enlarge "
            "them anyway"
        )
    if options.filter is not None and options.filter not in FILTERS:
        raise PlanError(f"unknown filter {options.filter!r}; choose {', '.join(FILTERS)}")
    if tile < 1 or (options.stride is not None and options.stride < 1):
        raise PlanError(f"tile={tile}, stride={options.stride}: must be at least 1 px")
    stride = options.stride or tile
    return ResolvedPlan(
        mpp=mpp,
        tile=tile,
        stride=stride,
        min_tissue=options.effective_min_tissue,
        tissue_method=options.tissue_method,
        roi=options.roi,
        roi_class=options.roi_class,
        min_roi=options.min_roi,
        roi_mpp=options.roi_mpp,
        tolerance=options.tolerance,
        name=options.name or default_name(mpp, tile, stride, options),
        max_artefact=options.max_artefact,
        exclude=options.exclude,
        filter=options.filter,
        contrast=options.contrast,
        upsample=options.upsample,
        max_blur=options.max_blur,
        quality_from=options.quality_from,
    )


def default_name(mpp: float | None, tile: int, stride: int, options: PlanOptions) -> str:
    """A readable plan name: 0.5mpp-224px[-s112][-roi][-class][-contrast][-qc0.1]."""
    parts = [f"{mpp:g}mpp" if mpp is not None else "level0", f"{tile}px"]
    if stride != tile:
        parts.append(f"s{stride}")
    if options.roi:
        parts.append(os.path.splitext(os.path.basename(options.roi))[0])
    if options.roi_class:
        parts.append(options.roi_class)
    if options.filter:
        parts.append(options.filter)
    if options.max_artefact is not None:
        counted = "+".join(options.exclude) if options.exclude else ""
        parts.append(f"qc{options.max_artefact:g}{'-' + counted if counted else ''}")
    if options.max_blur is not None:
        parts.append(f"blur{options.max_blur:g}")
    return "-".join(p.replace("/", "_").replace(" ", "_") for p in parts)
