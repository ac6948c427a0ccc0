"""QuPath GeoJSON: a FeatureCollection, one Feature, or (QuPath <= 0.2) a bare list of them."""

from __future__ import annotations

import json
from pathlib import Path

import shapely.geometry

from tilestore.annotations.base import Shape
from tilestore.errors import AnnotationError


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
        shapes = []
        for index, feature in enumerate(features):
            geometry = feature.get("geometry")
            if geometry is None:
                continue
            try:
                geom = shapely.geometry.shape(geometry)
            except (ValueError, TypeError, AttributeError, shapely.errors.GEOSException) as exc:
                raise AnnotationError(
                    f"{path}: feature {index} has a malformed geometry: {exc}"
                ) from exc
            props = feature.get("properties") or {}
            shapes.append(Shape(geom, _class_name(props), str(props.get("name") or "")))
        return shapes


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
