"""OME-Zarr label images in a store (labels/<name>): one writer for tissue, QC and others.

A label image has one level per image level (viewers such as napari expect them to line
up), coarser levels by nearest sampling; its classes and colours are in the label
metadata, so a viewer shows names, and tilestore's own facts sit beside them. In a store
that records positions, each label level's are recorded as it is written, and level 0 is
read tied to them (`tilestore.format.positions`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np

from tilestore.format import omezarr, positions
from tilestore.format.chunks import ChunkReader
from tilestore.format.codecs import zstd_codecs
from tilestore.format.records import LabelRecord, read_record, write_record
from tilestore.format.shards import SHARD_CHUNKS, shard_shape, sharded
from tilestore.format.store import damage_as_store_error, written_whole
from tilestore.reading.slide import Slide

T = TypeVar("T")
CHUNKS = (1, 1024, 1024)  # a label level's chunks (uint8), in shards of up to 16 x 16


def write_label(
    slide: Slide,
    name: str,
    label: np.ndarray,
    downsample: tuple[float, float],
    classes: Sequence[tuple[str, tuple[int, int, int, int]]],
    facts: dict[str, Any],
    method: str,
) -> None:
    """Store `label` (uint8 (h, w), one level-0 px = downsample) as labels/<name>, replacing
    an older one. classes: (name, rgba) for values 0, 1, ...; facts: tilestore's record."""
    root = slide.writable_group()
    labels = root.require_group("labels")
    names = [n for n in labels.attrs.get("ome", {}).get("labels", []) if n != name]
    if name in labels:  # the old one goes first, and its name from the list
        del labels[name]
        labels.attrs["ome"] = {"version": omezarr.OME_VERSION, "labels": names}
    with written_whole(labels, name, slide.name, f"labels/{name}"):
        group = labels.create_group(name)
        paths, downsamples = [], []
        tied = positions.declared(slide.record)
        for index in range(len(slide.levels)):
            factor = 2**index
            data = label[::factor, ::factor][None]
            array = group.create_array(
                str(index),
                data=data,
                dimension_names=("c", "y", "x"),
                **sharded(
                    zstd_codecs(),
                    CHUNKS,
                    shard_shape(CHUNKS, data.shape, SHARD_CHUNKS, 2**20),
                    True,
                ),
            )
            if tied:  # from what zarr wrote: its shards' indexes, 4 bytes a chunk
                positions.record(array, positions.read_back(array, f"{slide.name}: {array.path}"))
            paths.append(str(index))
            downsamples.append((downsample[0] * factor, downsample[1] * factor))
        group.attrs["ome"] = {
            "version": omezarr.OME_VERSION,
            "image-label": {
                "colors": [{"label-value": v, "rgba": list(c)} for v, (_, c) in enumerate(classes)],
                "properties": [{"label-value": v, "name": n} for v, (n, _) in enumerate(classes)],
                "source": {"image": "../../"},
            },
            "multiscales": omezarr.multiscales(name, paths, downsamples, slide.mpp, method=method),
        }
        write_record(group, LabelRecord.make(f"{slide.name}: labels/{name}", **facts))
    # listed once whole: a label a failure removed is never listed
    labels.attrs["ome"] = {"version": omezarr.OME_VERSION, "labels": [*names, name]}


def read_label(
    slide: Slide, name: str, parse: Callable[[np.ndarray, dict[str, Any]], T]
) -> T | None:
    """`parse`(level 0 of labels/<name>, its tilestore facts), or None if the store has none
    whole: absent, or not listed (a label is listed once written whole: one not listed is
    what a process killed while writing it left, which `write_label` replaces); a listed
    label damaged in any way (its metadata, its facts, its pixels) is a StoreError naming
    it."""
    if f"labels/{name}" not in children(slide, "labels") or name not in _listed(slide):
        return None
    fix = f"compute it again (it is replaced when written), or remove labels/{name}"
    with damage_as_store_error(slide.name, f"labels/{name}", fix):
        group = slide.group[f"labels/{name}"]
        level = group["0"]
        # read as image levels are: each chunk checked, tied to its position where recorded
        reader = ChunkReader(level, 0, slide.name, positions=positions.declared(slide.record))
        pixels = reader.read(0, level.shape[1], 0, level.shape[2])[..., 0]
        record = read_record(group, LabelRecord, f"{slide.name}: labels/{name}", fix)
        if record is None:
            raise KeyError(f"labels/{name}'s record")
        return parse(pixels, record.to_attrs())


def _listed(slide: Slide) -> list[str]:
    """The labels the store lists (its labels group's OME ``labels``): those written whole."""
    with damage_as_store_error(slide.name, "labels", "remove labels and make what it held again"):
        return list(slide.group["labels"].attrs.get("ome", {}).get("labels", []))


def children(slide: Slide, path: str) -> set[str]:
    """The paths of the groups and arrays under `path` (none where it is absent); a damaged
    listing is a StoreError naming it."""
    with damage_as_store_error(slide.name, path, f"remove {path} and make what it held again"):
        try:
            group = slide.group[path]
        except KeyError:
            return set()
        return {f"{path}/{name}" for name, _ in group.members()}
