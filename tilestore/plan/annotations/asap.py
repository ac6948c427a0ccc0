"""ASAP XML (CAMELYON): annotations with ordered coordinates; the group is the class."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import shapely

from tilestore.plan.annotations.base import Shape, number

_AREAS = {"polygon", "rectangle", "spline"}
_POINTS = {"dot", "pointset"}


class AsapXmlReader:
    format = "asap-xml"
    root_tag = "ASAP_Annotations"  # the XML root element that marks its files

    @staticmethod
    def read(path: Path, root: ET.Element) -> tuple[list[Shape], float | None]:
        shapes = []
        for annotation in root.iter("Annotation"):
            where = f"annotation {annotation.get('Name')!r} coordinate"
            coords = sorted(
                annotation.iter("Coordinate"),
                key=lambda c: number(path, c.get("Order", "0"), f"{where} Order"),
            )
            xy = np.array(
                [[number(path, c.get(k), f"{where} {k}") for k in ("X", "Y")] for c in coords],
                dtype=float,
            ).reshape(-1, 2)
            kind = (annotation.get("Type") or "polygon").lower()
            group = annotation.get("PartOfGroup") or ""
            name = annotation.get("Name") or ""
            if len(xy) == 0:
                continue
            if kind in _POINTS or (len(xy) < 3 and kind not in _AREAS):
                geom = shapely.multipoints(xy)
            elif kind in _AREAS and len(xy) >= 3:
                geom = shapely.polygons(xy)  # splines: the polygon through their control points
            else:
                geom = shapely.linestrings(xy)
            shapes.append(Shape(geom, "" if group == "None" else group, name))
        return shapes, None
