"""QuPath GeoJSON: a FeatureCollection, one Feature, or (QuPath <= 0.2) a bare list of them."""

from __future__ import annotations

import json
import math
from pathlib import Path

import shapely.geometry

from tilestore.errors import AnnotationError
from tilestore.plan.annotations.base import Shape


class GeoJsonReader:
    format = "qupath-geojson"

    @staticmethod
    def sniff(data: object) -> bool:
        if isinstance(data, dict):
            return data.get("type") in ("Feature", "FeatureCollection")
        return (
            isinstance(data, list)
            and bool(data)
            and all(isinstance(f, dict) and "geometry" in f for f in data)
        )

    @staticmethod
    def read(path: Path, data: object) -> list[Shape]:
        features = data.get("features", [data]) if isinstance(data, dict) else data
        if not isinstance(features, list):
            raise AnnotationError(f"{path}: 'features' is not a list")
        shapes = []
        for index, feature in enumerate(features):
            if not isinstance(feature, dict):
                raise AnnotationError(f"{path}: feature {index} is not a JSON object")
            geometry = feature.get("geometry")
            if geometry is None:
                continue
            try:
                _check_geometry(geometry)
                geom = shapely.geometry.shape(geometry)
            except (ValueError, TypeError, AttributeError, shapely.errors.ShapelyError) as exc:
                raise AnnotationError(
                    f"{path}: feature {index} has a malformed geometry: {exc}"
                ) from exc
            props = feature.get("properties") or {}
            shapes.append(Shape(geom, _class_name(props), str(props.get("name") or "")))
        return shapes


# how deep each geometry's coordinate arrays nest (a position is one level: [x, y])
_DEPTH = {
    "Point": 1,
    "MultiPoint": 2,
    "LineString": 2,
    "MultiLineString": 3,
    "Polygon": 3,
    "MultiPolygon": 4,
}


def _check_geometry(geometry: object) -> None:
    """Raise ValueError unless a GeoJSON geometry has a known type and positions of two or
    three finite JSON numbers, nested as deep as its type says."""
    if not isinstance(geometry, dict):
        raise ValueError("not a JSON object")
    kind = geometry.get("type")
    if kind == "GeometryCollection":
        for part in geometry.get("geometries") or []:
            _check_geometry(part)
        return
    if not isinstance(kind, str) or kind not in _DEPTH:  # a list or a dict is no type name
        raise ValueError(f"unknown geometry type {kind!r}")
    _check_positions(geometry.get("coordinates"), _DEPTH[kind])


def _check_positions(value: object, depth: int) -> None:
    if not isinstance(value, list):
        raise ValueError(f"coordinates nest wrongly: {str(value)[:40]!r} where a list belongs")
    if depth > 1:
        for item in value:
            _check_positions(item, depth - 1)
        return
    if not 2 <= len(value) <= 3:
        raise ValueError(f"a position holds {len(value)} values, not 2 or 3: {value!r:.60}")
    for number in value:
        if isinstance(number, bool) or not isinstance(number, int | float):
            raise ValueError(f"a coordinate is {number!r:.40}, not a number")
        if not math.isfinite(number):
            raise ValueError(f"a coordinate is {number!r}, not a finite number")


def _class_name(props: dict) -> str:
    """QuPath spells classes as {"name": ...}, {"names": [...]} (derived) or, long ago, a string."""
    cls = props.get("classification")
    if isinstance(cls, str):
        return cls
    if isinstance(cls, dict):
        if cls.get("name"):
            return str(cls["name"])
        if cls.get("names"):
            return ": ".join(map(str, cls["names"]))
    return ""


def load_json(path: Path) -> object:
    try:
        return json.loads(path.read_text(encoding="utf-8-sig"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise AnnotationError(f"{path}: not valid JSON: {exc}") from exc
    except RecursionError:
        raise AnnotationError(f"{path}: JSON nested too deeply to be annotations") from None
