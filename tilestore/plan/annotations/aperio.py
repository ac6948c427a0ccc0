"""Aperio ImageScope XML: annotation layers of regions; NegativeROA regions are holes.

Vertex coordinates are level-0 pixels of the scan the annotation was drawn on;
MicronsPerPixel records that scan's resolution (kept as `file_mpp`).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import shapely

from tilestore.errors import AnnotationError
from tilestore.plan.annotations.base import Shape, number

# ImageScope region types: 0 free-hand, 1 rectangle, 2 ellipse, 3 arrow, 4 ruler, 5 pin.
_LINES = {"3", "4"}
_POINTS = {"5"}


class AperioXmlReader:
    format = "aperio-xml"
    root_tag = "Annotations"  # the XML root element that marks its files

    @staticmethod
    def read(path: Path, root: ET.Element) -> tuple[list[Shape], float | None]:
        mpp = root.get("MicronsPerPixel")
        shapes: list[Shape] = []
        for layer in root.iter("Annotation"):
            name = layer.get("Name") or ""
            positive, holes = [], []
            for region in layer.iter("Region"):
                where = f"region {region.get('Id')} vertex"
                xy = np.array(
                    [
                        [number(path, v.get(k), f"{where} {i} {k}") for k in ("X", "Y")]
                        for i, v in enumerate(region.iter("Vertex"))
                    ],
                    dtype=float,
                ).reshape(-1, 2)
                geom = _region_geometry(path, region, xy)
                if geom is None:
                    continue
                (holes if region.get("NegativeROA") == "1" else positive).append(geom)
            if holes:
                cut = shapely.union_all(holes)
                positive = [
                    shapely.difference(g, cut) if shapely.intersects(g, cut) else g
                    for g in positive
                ]
            shapes.extend(Shape(g, name, name) for g in positive)
        return shapes, number(path, mpp, "MicronsPerPixel") if mpp else None


def _region_geometry(path: Path, region: ET.Element, xy: np.ndarray) -> shapely.Geometry | None:
    kind = region.get("Type", "0")
    if len(xy) == 0:
        return None
    if kind in _POINTS or len(xy) == 1:
        return shapely.points(xy[0])
    if kind in _LINES or (len(xy) == 2 and kind != "2"):
        return shapely.linestrings(xy)
    if kind == "2":  # ellipse given by two opposite corners of its bounding box
        (x0, y0), (x1, y1) = xy.min(axis=0), xy.max(axis=0)
        circle = shapely.buffer(shapely.points(0, 0), 1.0, quad_segs=32)
        return shapely.affinity.affine_transform(
            circle, [(x1 - x0) / 2, 0, 0, (y1 - y0) / 2, (x0 + x1) / 2, (y0 + y1) / 2]
        )
    if len(xy) < 3:
        raise AnnotationError(f"{path}: region {region.get('Id')} has {len(xy)} vertices")
    return shapely.polygons(xy)
