"""The contrast rule of the tutorials this project grew from: a tile is tissue if its
pixels span dark and saturated-bright values (min < 135, max >= 255, 5th percentile < 162,
median < 225, over all channel values of the tile).

One rule, two users: `tilestore.tissue`'s ``contrast`` method (blocks of a coarse read)
and a plan's ``filter="contrast"`` (each plan tile's own pixels at the plan's resolution,
so a plan keeps exactly the tiles the tutorial's per-tile loop keeps).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tilestore.grid import TilePlan
from tilestore.slide import Slide, resize


@dataclass(frozen=True)
class ContrastRule:
    """Keep a tile if min < max_min, max >= min_max, p5 < max_p5 and median < max_median."""

    max_min: int = 135
    min_max: int = 255
    max_p5: int = 162
    max_median: int = 225


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


def contrast_keep(slide: Slide, plan: TilePlan, rule: ContrastRule) -> np.ndarray:
    """bool (len(plan),): the plan tiles whose own pixels (read at the plan's level,
    resampled to the tile size as the engine reads them) pass the rule. Read one grid row
    at a time: a band of the level, never the whole slide."""
    keep = np.zeros(len(plan), bool)
    spec, read = plan.spec, plan.spec.read
    for row in np.unique(plan.row):
        members = np.flatnonzero(plan.row == row)
        lx = plan.level_x[members]
        x0, x1 = int(lx.min()), int(lx.max()) + read
        band = slide.read_region(
            round(x0 * spec.downsample[1]),
            round(int(plan.level_y[members[0]]) * spec.downsample[0]),
            x1 - x0,
            read,
            level=spec.level,
        )
        tiles = [band[:, x - x0 : x - x0 + read] for x in lx]
        if read != spec.tile:
            tiles = [resize(t, spec.tile, spec.tile) for t in tiles]
        keep[members] = passes(np.stack([t.reshape(-1) for t in tiles]), rule)
    return keep
