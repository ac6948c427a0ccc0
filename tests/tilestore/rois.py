"""ROIs made in memory for geometry tests: polygons with classes, as annotation readers give."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tilestore.plan.annotations import Annotations


def rois(geoms, classes) -> Annotations:
    """Annotations of these shapely polygons, one class name each."""
    return Annotations(
        Path("x"),
        "test",
        np.array(geoms, dtype=object),
        np.array(classes, dtype=str),
        np.array(classes, dtype=str),
    )
