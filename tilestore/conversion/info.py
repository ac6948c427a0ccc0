"""What a store or a slide file holds: levels, chunking, codec, size, completeness."""

from __future__ import annotations

import os
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit

import zarr

from tilestore.conversion.bucket import BucketStore
from tilestore.conversion.converter import choose_codec
from tilestore.errors import SlideError, StoreError, TilestoreError
from tilestore.format.record import StoreRecord
from tilestore.format.records import LabelRecord, PlanRecord, read_record
from tilestore.format.store import damage_as_store_error, is_store, open_group, tree_size
from tilestore.options import Opt
from tilestore.reading import open_slide
from tilestore.reading.inplace import TILE_SUMS
from tilestore.sources import Fact, dicom_series, open_source
from tilestore.sources.remote import check_urls, slide_file, url_store
from tilestore.urls import is_url, shown

SAMPLE_TILES = 8  # per level, decoded by describe(verify=True)


def describe(
    path: str | os.PathLike,
    *,
    verify: Annotated[
        bool, Opt("Slide files: also decode a sample of each level's tiles.")
    ] = False,
) -> dict[str, Any]:
    """Return a JSON-able description of a store (complete or not) or of a slide file.

    A slide file's description reads its metadata only; with verify=True a sample of each
    level's tiles (`SAMPLE_TILES`, spread over the level) is decoded too. A slide named by a
    URL (`s3://`, `https://`, a DICOMweb series) is staged to the slide cache as `convert`
    stages it, and described as its URL. A store's says what its chunks are checked with (a
    sidecar's also whether the slide's tiles are checked by content: `in_place_tiles`);
    `tilestore verify` writes nothing into it.
    """
    if is_url(str(path)):
        return _describe_url(str(path), verify)
    path = Path(path)
    if is_store(path):
        return _describe_store(path)
    if path.is_dir() and not dicom_series(path):
        raise StoreError(f"{path}: a directory that is neither a store nor a slide")
    return _describe_slide(path, verify)


def _describe_url(url: str, verify: bool) -> dict[str, Any]:
    """A slide at a URL, staged (`slide_file`) and described as its URL says it (without its
    secrets); a store in a bucket is refused in one line (read it with `open_slide`)."""
    if Path(urlsplit(url).path).suffix == ".zarr" or url.rstrip("/").endswith(".ome.zarr"):
        return _describe_store(url)  # read where it is, through zarr's FsspecStore
    check_urls([url])  # one request: a missing object or a refused credential in one line
    with slide_file(url) as local:
        found = _describe_slide(local, verify)
    return {**found, "path": shown(url), "staged": str(local)}


def _describe_store(path: Path | str) -> dict[str, Any]:
    """A store's description; `path` a local store's, or a store's URL in a bucket."""
    if isinstance(path, str):
        group, record = open_group(url_store(path), complete=False)  # complete or not
        size, path = BucketStore(path).stored_bytes(), shown(path)
    else:
        group, record = open_group(path, complete=False)
        size = tree_size(path)
    # {x, y, origin}, and where the user's size overrides the file's, the file's ("file")
    mpp = None if record.mpp is None else {"origin": None, **record.mpp.to_attrs()}
    with damage_as_store_error(path, "store metadata", "convert the slide again"):
        levels = _levels(group, record, mpp)
        ratio = round(size / record.source.size, 3) if record.source.size and size else None
    _gpu_jpeg(path, levels)
    integrity = record.integrity
    return {
        "path": str(path),
        "kind": "store",
        "complete": record.complete,
        "source": dict(record.source.facts),
        "mpp": mpp,
        "objective_power": record.get("objective_power"),
        "modality": record.modality,
        "channels": _channels(group),
        "codec": record.get("codec"),
        # None: written before chunks had checksums
        "integrity": {k: v for k, v in asdict(integrity).items() if v is not None}
        if integrity.every_chunk
        else None,
        "in_place_tiles": _in_place_tiles(record),
        "levels": levels,
        "associated": record.get("associated", []),
        "tissue": _tissue(group),
        "plans": _plans(group),
        "size_bytes": size,
        "size_vs_source": ratio,
        "software": record.get("software"),
    }


def _in_place_tiles(record: StoreRecord) -> str | None:
    """How a sidecar's in-place levels' tiles are checked (None: not a sidecar)."""
    if not record.source.sidecar:
        return None
    if record.source.tile_sums:
        return f"checked by content at every read (each tile's CRC-32C: {TILE_SUMS}/<level>)"
    return (
        "not checked by content (a sidecar made before tile checksums: only the slide's "
        "fingerprint is checked); remove the sidecar to make it again with them"
    )


def _channels(group: zarr.Group) -> list[dict]:
    """Each channel's label, colour and display window, as viewers read them (omero)."""
    omero = group.attrs.get("ome", {}).get("omero", {})
    return [
        {"name": c.get("label"), "color": c.get("color"), "window": c.get("window")}
        for c in omero.get("channels", [])
    ]


def _levels(group: zarr.Group, record: StoreRecord, mpp: dict | None) -> list[dict]:
    levels = []
    for stored_level in record.levels:
        level = stored_level.facts
        array = group[stored_level.path]
        dy, dx = stored_level.downsample
        codecs = [
            c.to_dict()["name"] for c in (*array.filters, array.serializer, *array.compressors)
        ]
        levels.append(
            {
                "path": level["path"],
                "shape": list(array.shape),
                "chunks": list(array.chunks),
                "shards": None if array.shards is None else list(array.shards),
                "downsample": [dy, dx],
                "mpp": [mpp["x"] * dx, mpp["y"] * dy] if mpp else None,
                "codecs": codecs,
                "write": level["write"],
                "reason": level["reason"],
                # JPEG encoded at conversion: PSNR on a sample of its chunks (stores made
                # before this was measured say None)
                "lossy": level.get("lossy"),
                "psnr": level.get("psnr"),
            }
        )
    return levels


def _gpu_jpeg(path: Path, levels: list[dict]) -> None:
    """Each level's `gpu_jpeg`: None where a GPU's JPEG decoder (the engines of an A100 or
    H100, `tilestore embed --decode gpu|both`) can take its chunks, else why not (judged on
    a few chunks' headers); left out of an incomplete store's levels."""
    try:
        slide = open_slide(path)
    except TilestoreError:  # incomplete, or unreadable: the description says so elsewhere
        return
    for index, level in enumerate(levels):
        try:
            level["gpu_jpeg"] = slide.chunks(index).gpu_refusal()
        except (TilestoreError, ValueError) as exc:  # a damaged chunk: it cannot decode
            level["gpu_jpeg"] = f"a chunk could not be read ({exc})"


def _describe_slide(path: Path, verify: bool) -> dict[str, Any]:
    with open_source(path) as source:
        info = source.info
        codec, why = choose_codec(source)
        levels = []
        for index, level in enumerate(source.levels):
            tiles = level.jpeg_tiles()
            levels.append(
                {
                    "shape": [level.channels, *level.shape],
                    "dtype": str(level.dtype),
                    "compression": level.compression,
                    "lossless": Fact.to_json(level.lossless),  # as the file stores it
                    "tile": list(level.tile_shape) if level.tile_shape else None,
                    "copyable": tiles is not None,
                    "why_not": None if tiles else level.describe_copy(),
                    # what `convert` with its defaults would do with this level
                    "write": "lossless" if codec == "zstd" else "copy" if tiles else "re-encode",
                    "checked": _sample(path, index, level) if verify else None,
                }
            )
        return {
            "path": str(path),
            "kind": "slide",
            "format": info.format,
            "reader": type(source).__name__,
            "vendor": info.vendor,
            "pixels": source.describe_pixels(),
            "channels": [asdict(c) for c in info.channels or ()],
            "codec": {"name": codec, "reason": why},
            "mpp": Fact.to_json(info.mpp),
            "objective_power": Fact.to_json(info.objective_power),
            "modality": Fact.to_json(info.modality),
            "levels": levels,
            "associated": sorted(source.associated),
            "size_bytes": source.size(),
            "files": len(source.files),
            "series": info.series,
            "warnings": list(info.warnings),
            "verified": verify,  # False: the metadata only was read
        }


def _sample(path: Path, index: int, level) -> dict[str, Any]:
    """Decode up to SAMPLE_TILES tile-sized windows spread over a level; say which fail."""
    th, tw = level.tile_shape or (min(512, level.shape[0]), min(512, level.shape[1]))
    rows, cols = -(-level.shape[0] // th), -(-level.shape[1] // tw)
    cells = sorted(
        {round(i * (rows * cols - 1) / max(1, SAMPLE_TILES - 1)) for i in range(SAMPLE_TILES)}
    )
    bad = []
    for cell in cells:
        r, c = divmod(cell, cols)
        y0, x0 = r * th, c * tw
        try:
            level.read(y0, min(y0 + th, level.shape[0]), x0, min(x0 + tw, level.shape[1]))
        except SlideError as exc:
            bad.append(f"level {index} tile ({r}, {c}): {str(exc).removeprefix(f'{path}: ')}")
    return {"tiles": len(cells), "bad": bad}


def _tissue(group: zarr.Group) -> dict | None:
    with damage_as_store_error(
        group.store_path, "labels/tissue", "compute it again (tilestore tissue)"
    ):
        try:
            label = group["labels/tissue"]
        except KeyError:
            return None
        meta = read_record(label, LabelRecord, f"{group.store_path}: labels/tissue")
        if meta is None:
            return None
        return {k: meta.facts[k] for k in ("method", "polarity", "fraction", "mpp")}


def _plans(group: zarr.Group) -> dict[str, int]:
    with damage_as_store_error(group.store_path, "plans", "make them again with overwrite=True"):
        try:
            plans = group["plans"]
        except KeyError:
            return {}
        found = {}
        for name, g in sorted(plans.groups()):
            record = read_record(g, PlanRecord, f"{group.store_path}: plans/{name}")
            if record is not None and record.complete:
                found[name] = record.tiles
        return found


def pixel_count(path: str | os.PathLike) -> int:
    """Level-0 pixels of a store or a slide file (a cheap proxy for the work it is), read
    without writing anything (sizing a cohort for `--shard` must not make sidecars beside
    a read-only archive); 0 where it cannot be opened."""
    path = Path(path)
    try:
        if is_store(path):
            _, h, w = open_slide(path).shape
            return h * w
        with open_source(path) as source:
            h, w = source.levels[0].shape
            return h * w
    except (TilestoreError, OSError):
        return 0
