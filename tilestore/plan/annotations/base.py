"""Annotations as shapely geometries in level-0 pixels (origin top left, y down), with classes.

A format reader turns a file into `Shape`s; `finish` is the one place where every format's
shapes are checked, repaired, rescaled and clipped, so all formats behave the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import shapely

from tilestore.errors import AnnotationError

AREA_TYPES = ("Polygon", "MultiPolygon")


def number(path: Path, value: str | None, what: str) -> float:
    """A coordinate or size written as text (XML attributes), or an AnnotationError saying
    what is wrong with it: missing, a decimal comma, not a number, not finite."""
    if value is None:
        raise AnnotationError(f"{path}: {what} is missing")
    try:
        result = float(value)
    except ValueError:
        hint = " (a decimal comma: write 12.5, not 12,5)" if "," in value else ""
        raise AnnotationError(f"{path}: {what} is {value!r}, not a number{hint}") from None
    if not np.isfinite(result):
        raise AnnotationError(f"{path}: {what} is {value!r}, not a finite number")
    return result


@dataclass(frozen=True)
class Shape:
    """One annotated shape as the file has it (any geometry type)."""

    geometry: shapely.Geometry
    class_name: str = ""
    name: str = ""


@dataclass(frozen=True)
class Annotations:
    """Area annotations of one file: polygons in level-0 pixels and their class names."""

    path: Path
    format: str
    geometries: np.ndarray  # shapely Polygon / MultiPolygon
    classes: np.ndarray  # str, "" for unclassified
    names: np.ndarray  # str
    file_mpp: float | None = None  # resolution the file declares, if any
    warnings: tuple[str, ...] = field(default=())

    def __len__(self) -> int:
        return len(self.geometries)

    @property
    def class_names(self) -> list[str]:
        """Distinct class names, sorted ("" = unclassified)."""
        return sorted(set(self.classes.tolist()))

    def select(self, class_name: str | None) -> Annotations:
        """Return only the shapes of one class (all shapes for None)."""
        if class_name is None:
            return self
        keep = self.classes == class_name
        if not keep.any():
            raise AnnotationError(
                f"{self.path}: no annotations of class {class_name!r}; classes are "
                f"{', '.join(repr(c) for c in self.class_names)}"
            )
        return Annotations(
            self.path,
            self.format,
            self.geometries[keep],
            self.classes[keep],
            self.names[keep],
            self.file_mpp,
            self.warnings,
        )

    def union(self) -> shapely.Geometry:
        """Return the union of all shapes (the region of interest)."""
        return shapely.union_all(self.geometries)

    def bounds(self) -> tuple[float, float, float, float]:
        """Return (xmin, ymin, xmax, ymax) over all shapes."""
        b = shapely.bounds(self.geometries)
        return (
            float(b[:, 0].min()),
            float(b[:, 1].min()),
            float(b[:, 2].max()),
            float(b[:, 3].max()),
        )


def finish(
    path: Path,
    fmt: str,
    shapes: Sequence[Shape],
    *,
    scale: float = 1.0,
    size: tuple[int, int] | None = None,
    file_mpp: float | None = None,
) -> Annotations:
    """Return area annotations: non-areas rejected, invalid repaired, rescaled, clipped.

    scale multiplies coordinates (annotations drawn at another resolution); size is the
    slide's level-0 (width, height) to clip to.
    """
    notes: list[str] = []
    geoms = np.array([s.geometry for s in shapes], dtype=object)
    if len(geoms) and not np.isfinite(shapely.get_coordinates(geoms)).all():
        raise AnnotationError(f"{path}: a coordinate is NaN or infinite")
    types = shapely.get_type_id(geoms) if len(geoms) else np.array([], int)
    areas = np.isin(types, [3, 6, 7])  # Polygon, MultiPolygon, GeometryCollection
    if not areas.any():
        kinds = sorted({shapely.get_type_id(g) for g in geoms})
        names = ", ".join(_TYPE_NAMES.get(k, str(k)) for k in kinds) or "nothing"
        raise AnnotationError(
            f"{path}: no areas to use as a region of interest (found {names}); "
            "draw polygons, rectangles, ellipses or brush areas"
        )
    if not areas.all():
        notes.append(f"skipped {int((~areas).sum())} point/line shapes (ROIs must be areas)")
    keep = [s for s, a in zip(shapes, areas, strict=True) if a]
    geoms = geoms[areas]

    invalid = ~shapely.is_valid(geoms)
    if invalid.any():
        geoms[invalid] = [_polygonal(g) for g in shapely.make_valid(geoms[invalid])]
        notes.append(f"repaired {int(invalid.sum())} invalid polygons with shapely.make_valid")
    geoms = np.array([_polygonal(g) for g in geoms], dtype=object)
    if scale != 1.0:
        geoms = shapely.transform(geoms, lambda xy: xy * scale)
    if size is not None:
        frame = shapely.box(0, 0, size[0], size[1])
        outside = ~shapely.within(geoms, frame)
        if outside.any():
            geoms[outside] = [_polygonal(g) for g in shapely.intersection(geoms[outside], frame)]
            notes.append(f"clipped {int(outside.sum())} shapes at the slide edge")
    empty = shapely.is_empty(geoms) | (shapely.area(geoms) == 0)
    if empty.any():
        notes.append(f"dropped {int(empty.sum())} shapes with no area inside the slide")
    if empty.all():
        raise AnnotationError(
            f"{path}: no annotated area lies inside the slide "
            f"({size[0]}x{size[1]} px); wrong slide or wrong roi_mpp?"
        )
    live = ~empty
    return Annotations(
        path=path,
        format=fmt,
        geometries=geoms[live],
        classes=np.array([s.class_name for s in keep], dtype=object)[live].astype(str),
        names=np.array([s.name for s in keep], dtype=object)[live].astype(str),
        file_mpp=file_mpp,
        warnings=tuple(notes),
    )


_TYPE_NAMES = {
    0: "points",
    1: "lines",
    2: "rings",
    3: "polygons",
    4: "multipoints",
    5: "multilines",
    6: "multipolygons",
    7: "collections",
}


def _polygonal(geom: shapely.Geometry) -> shapely.Geometry:
    """Return only the polygonal parts of a geometry (make_valid may add lines or points)."""
    if shapely.get_type_id(geom) in (3, 6):
        return geom
    parts = shapely.get_parts(geom)
    polys = [p for p in parts if shapely.get_type_id(p) in (3, 6)]
    if not polys:
        return shapely.Polygon()
    return shapely.union_all(polys) if len(polys) > 1 else polys[0]
