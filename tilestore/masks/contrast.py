"""The contrast rule of the tutorials this project grew from: a tile is tissue if its
pixels span dark and saturated-bright values (min < 135, max >= 255, 5th percentile < 162,
median < 225, over all channel values of the tile).

One rule, two users (the tile filter is `tilestore.plan.filters`): `tilestore.masks.tissue`'s
``contrast`` method (blocks of a coarse read) and a plan's ``filter="contrast"`` (each plan tile's
own pixels at the plan's resolution, so a plan keeps exactly the tiles the tutorial's per-tile loop
keeps).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import numpy as np

from tilestore.options import Declared, Opt


def _level(help: str, flag: str) -> Opt:
    return Opt(help, low=0, high=256, flag=flag)


@dataclass(frozen=True)
class ContrastRule(Declared):
    """Keep a tile if min < max_min, max >= min_max, p5 < max_p5 and median < max_median
    (8-bit values; 256 never excludes)."""

    max_min: Annotated[int, _level("--filter contrast: min below this.", "contrast_min")] = 135
    min_max: Annotated[int, _level("--filter contrast: max at least this.", "contrast_max")] = 255
    max_p5: Annotated[int, _level("--filter contrast: p5 below this.", "contrast_p5")] = 162
    max_median: Annotated[
        int, _level("--filter contrast: median below this.", "contrast_median")
    ] = 225


def passes(values: np.ndarray, rule: ContrastRule) -> np.ndarray:
    """bool (n,): which rows of (n, k) pixel values pass the rule (percentiles as numpy's
    default, linear, so a per-tile np.percentile loop decides the same)."""
    p5, median = np.percentile(values, [5, 50], axis=1)
    return (
        (values.min(axis=1) < rule.max_min)
        & (values.max(axis=1) >= rule.min_max)
        & (p5 < rule.max_p5)
        & (median < rule.max_median)
    )
