"""Plan filters that judge each tile by its own pixels: `contrast_keep` applies the tutorials'
contrast rule (`tilestore.masks.contrast`) to every plan tile at the plan's resolution."""

from __future__ import annotations

import numpy as np

from tilestore.masks.contrast import ContrastRule, passes
from tilestore.plan.grid import TilePlan
from tilestore.reading.slide import Slide, resize


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
