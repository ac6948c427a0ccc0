"""What a store or a slide file holds: levels, chunking, codec, size, completeness."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import zarr

from tilestore.errors import StoreError
from tilestore.sources import Fact, open_source
from tilestore.store import ATTRS_KEY, is_store, tree_size


def describe(path: str | os.PathLike) -> dict[str, Any]:
    """Return a JSON-able description of a store (complete or not) or of a slide file."""
    path = Path(path)
    if is_store(path):
        return _describe_store(path)
    if path.is_dir():
        raise StoreError(f"{path}: a directory that is neither a store nor a slide")
    return _describe_slide(path)


def _describe_store(path: Path) -> dict[str, Any]:
    try:
        group = zarr.open_group(path, mode="r", zarr_format=3, use_consolidated=False)
    except (OSError, ValueError, zarr.errors.BaseZarrError) as exc:
        raise StoreError(f"{path}: cannot open store: {exc}") from exc
    attrs = group.attrs.get(ATTRS_KEY)
    if not isinstance(attrs, dict):
        raise StoreError(f"{path}: zarr group without tilestore metadata (not made by tilestore)")
    size = tree_size(path)
    source_size = attrs.get("source", {}).get("size")
    mpp = attrs.get("mpp")
    levels = []
    for level in attrs.get("levels", []):
        array = group[level["path"]]
        dy, dx = level["downsample"]
        codecs = [
            c.to_dict()["name"] for c in (*array.filters, array.serializer, *array.compressors)
        ]
        levels.append(
            {
                "path": level["path"],
                "shape": list(array.shape),
                "chunks": list(array.chunks),
                "downsample": [dy, dx],
                "mpp": [mpp["x"] * dx, mpp["y"] * dy] if mpp else None,
                "codecs": codecs,
                "write": level["write"],
                "reason": level["reason"],
            }
        )
    return {
        "path": str(path),
        "kind": "store",
        "complete": bool(attrs.get("complete")),
        "source": attrs.get("source"),
        "mpp": mpp,
        "objective_power": attrs.get("objective_power"),
        "modality": attrs.get("modality"),
        "codec": attrs.get("codec"),
        "levels": levels,
        "associated": attrs.get("associated", []),
        "tissue": _tissue(group),
        "plans": _plans(group),
        "size_bytes": size,
        "size_vs_source": round(size / source_size, 3) if source_size else None,
        "software": attrs.get("software"),
    }


def _describe_slide(path: Path) -> dict[str, Any]:
    with open_source(path) as source:
        info = source.info
        levels = []
        for level in source.levels:
            tiles = level.jpeg_tiles()
            levels.append(
                {
                    "shape": [level.channels, *level.shape],
                    "dtype": str(level.dtype),
                    "compression": level.compression,
                    "tile": list(level.tile_shape) if level.tile_shape else None,
                    "copyable": tiles is not None,
                    "why_not": None if tiles else level.describe_copy(),
                }
            )
        return {
            "path": str(path),
            "kind": "slide",
            "format": info.format,
            "vendor": info.vendor,
            "mpp": Fact.to_json(info.mpp),
            "objective_power": Fact.to_json(info.objective_power),
            "modality": Fact.to_json(info.modality),
            "levels": levels,
            "associated": sorted(source.associated),
            "size_bytes": path.stat().st_size,
            "warnings": list(info.warnings),
        }


def _tissue(group: zarr.Group) -> dict | None:
    try:
        meta = group["labels/tissue"].attrs["tilestore"]
    except KeyError:
        return None
    return {k: meta[k] for k in ("method", "polarity", "fraction", "mpp")}


def _plans(group: zarr.Group) -> dict[str, int]:
    try:
        plans = group["plans"]
    except KeyError:
        return {}
    return {
        name: g.attrs["tilestore"]["tiles"]
        for name, g in sorted(plans.groups())
        if g.attrs.get("tilestore", {}).get("complete")
    }
