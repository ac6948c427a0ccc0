"""The plan flags, declared once: `tilestore plan` and `tilestore embed` take the same ones.

Each flag maps onto one `PlanOptions` field and states its default from there (the one
table of plan defaults); a flag left out is left out of the options too, so the library
decides every default (`tilestore.plan.resolve_plan`: the model's native mpp and tile in
`embed`). A command decorated with `with_plan_flags` has the flags added to its own and is
called with them as one `plan_options` argument: a `PlanOptions`, or None where no plan
flag was given.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from tilestore.masks import ContrastRule
from tilestore.plan import DEFAULT_MPP, DEFAULT_TILE, FILTERS, MIN_TISSUE, PlanOptions

_RULE = ContrastRule()


def _flag(name: str, kind: type, help: str, *decls: str) -> inspect.Parameter:
    return inspect.Parameter(
        name,
        inspect.Parameter.KEYWORD_ONLY,
        default=typer.Option(None, *decls, help=help),
        annotation=kind | None,
    )


PLAN_FLAGS = (
    _flag(
        "mpp",
        float,
        f"Tile resolution, um/px (default {DEFAULT_MPP:g}; in embed the model's own); 0 plans "
        "in level-0 pixels, for a slide without a recorded pixel size.",
    ),
    _flag("tile", int, f"Tile side in px at --mpp (default {DEFAULT_TILE}; in embed the model's)."),
    _flag("stride", int, "Pixels between tile starts (default: --tile)."),
    _flag(
        "min_tissue",
        float,
        f"Keep tiles with at least this tissue fraction (default {MIN_TISSUE}; 0 with --filter).",
    ),
    _flag(
        "tissue_method",
        str,
        f"How a missing tissue mask is made (default {PlanOptions.tissue_method}).",
    ),
    _flag("roi", Path, "ROI annotations: QuPath GeoJSON, Aperio or ASAP XML."),
    _flag("roi_class", str, "Use only ROIs of this class."),
    _flag(
        "min_roi",
        float,
        f"Keep tiles with at least this ROI overlap (default {PlanOptions.min_roi}).",
    ),
    _flag("roi_mpp", float, "um/px the ROI coordinates were drawn at (default: level-0 px)."),
    _flag(
        "tolerance",
        float,
        f"Use a level as is if its mpp is this close (default {PlanOptions.tolerance:g}).",
    ),
    _flag("name", str, "Plan name (default: from the options, e.g. 0.5mpp-224px)."),
    _flag(
        "max_artefact",
        float,
        "Drop tiles more than this share artefact (needs `tilestore qc` first).",
    ),
    _flag("exclude", str, "The artefacts --max-artefact counts, comma-separated (default: all)."),
    _flag(
        "filter",
        str,
        f"{'/'.join(FILTERS)}: keep tiles whose own pixels pass the tutorial rule.",
    ),
    _flag("contrast_min", int, f"--filter contrast: min below this (default {_RULE.max_min})."),
    _flag("contrast_max", int, f"--filter contrast: max at least this (default {_RULE.min_max})."),
    _flag("contrast_p5", int, f"--filter contrast: p5 below this (default {_RULE.max_p5})."),
    _flag(
        "contrast_median",
        int,
        f"--filter contrast: median below this (default {_RULE.max_median}).",
    ),
    _flag(
        "max_blur",
        float,
        "Drop tiles whose blur, measured in an earlier embedding pass, is above this "
        "(ds.blur: sharp tissue 0.4-0.7, the limit the measures count against 0.74).",
    ),
    _flag("quality_from", str, "--max-blur: the model whose measures count (default: the only)."),
    _flag(
        "upsample",
        bool,
        "Plan at an mpp finer than the slide's finest level, enlarging its pixels (refused "
        "without it).",
    ),
)
_CONTRAST = {
    "contrast_min": "max_min",
    "contrast_max": "min_max",
    "contrast_p5": "max_p5",
    "contrast_median": "max_median",
}


def plan_options(**flags: Any) -> PlanOptions | None:
    """The `PlanOptions` of the plan flags given (None where none was)."""
    given = {k: v for k, v in flags.items() if v is not None}
    if not given:
        return None
    rule = {_CONTRAST[k]: given.pop(k) for k in list(given) if k in _CONTRAST}
    if rule:
        given["contrast"] = ContrastRule(**{**vars(_RULE), **rule})
    if "exclude" in given:
        given["exclude"] = tuple(e.strip() for e in given["exclude"].split(","))
    return PlanOptions(**given)


def with_plan_flags(command: Callable[..., Any]) -> Callable[..., Any]:
    """The command with `PLAN_FLAGS` among its options, called with `plan_options`."""
    own = inspect.signature(command, eval_str=True)
    params = [p for p in own.parameters.values() if p.name != "plan_options"]

    @functools.wraps(command)
    def wrapper(**kwargs: Any) -> Any:
        flags = {p.name: kwargs.pop(p.name) for p in PLAN_FLAGS}
        return command(**kwargs, plan_options=plan_options(**flags))

    wrapper.__signature__ = own.replace(
        parameters=[*params, *PLAN_FLAGS], return_annotation=own.return_annotation
    )
    wrapper.__annotations__ = {
        p.name: p.annotation for p in wrapper.__signature__.parameters.values()
    }
    return wrapper
