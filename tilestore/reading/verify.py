"""Checking a whole store: every chunk of every array read and its CRC-32C compared.

`verify_store` walks every array of a store (image levels, labels, plans, embeddings) on a
thread pool and lists every bad chunk with its cause, rather than stopping at the first:
missing where the store promises every chunk, a link or anything but a regular file, too
short, or its checksum not matching its bytes; and, in image and label levels of a store
that records positions (`tilestore.format.positions`), a chunk that is not the one written
at its position (moved, swapped, a shard index rewritten), or stored where none was. A store
made before positions were recorded is checked as before, and its levels are listed as not
tied to their positions (`tilestore reshard` adds them). With ``decode=True`` each chunk is also
decoded, which finds data that was damaged before it was written (a source tile copied as
it was). A sidecar's levels read in place are checked in the slide: the sidecar opened
(the slide's fingerprint) and every tile read and decoded, as reading would (the slide's
tiles carry no checksum). The result is recorded in the store's attributes, where
`tilestore info` shows it.
"""

from __future__ import annotations

import datetime as dt
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import imagecodecs
import numpy as np
import zarr

from tilestore.cpus import usable_cpus
from tilestore.errors import ChunkError, SlideError, StoreError
from tilestore.format import positions
from tilestore.format.chunks import ChunkReader
from tilestore.format.codecs import has_checksums
from tilestore.format.integrity import UNWRITTEN, Location, read_chunks, unseal
from tilestore.format.shards import ShardIndex
from tilestore.format.store import (
    DAMAGED,
    members,
    open_for_writing,
    open_group,
    open_store,
    write_record,
)
from tilestore.options import Workers, checked
from tilestore.reading.inplace import open_sidecar


@dataclass
class Verification:
    """What `verify_store` found."""

    store: Path
    chunks: int = 0  # chunks read
    arrays: int = 0
    unchecked: list[str] = field(default_factory=list)  # arrays without checksums
    untied: list[str] = field(default_factory=list)  # levels whose positions are not recorded
    bad: list[str] = field(default_factory=list)  # one line per bad chunk
    decoded: bool = False
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.bad

    def record(self) -> dict:
        """What the store keeps of this check."""
        return {
            "at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "chunks": self.chunks,
            "bad": len(self.bad),
            "first_bad": self.bad[:5],
            "decoded": self.decoded,
            "unchecked_arrays": self.unchecked,
            "untied_levels": self.untied,
        }


@checked
def verify_store(
    path: str | os.PathLike,
    *,
    decode: bool = False,
    workers: Workers = None,
    record: bool = True,
) -> Verification:
    """Read every chunk of a complete store and check it; return what was found.

    decode: also decode every chunk (slower; finds data damaged before it was written).
    record: write the result into the store's attributes (`tilestore info` shows it).
    """
    started = time.perf_counter()
    path = Path(path)
    group, stored = open_store(path)
    every_chunk = stored.integrity.every_chunk
    tied = positions.declared(stored)
    images = {lv.path for lv in stored.levels}
    in_place = {str(i) for i in stored.source.in_place}
    slide = open_sidecar(None, store=path) if stored.source.sidecar else None
    result = Verification(path, decoded=decode)
    with ThreadPoolExecutor(workers or usable_cpus()) as pool:
        for name, array in _arrays(group, path):
            if positions.is_record(name):  # read (zarr checks its CRC-32C) with its level's
                continue
            result.arrays += 1
            coords = _coords(array)
            if slide is not None and name in in_place:  # its tiles are in the slide
                check = _slide_checker(path, slide, name)
            else:
                if not has_checksums(array):
                    result.unchecked.append(name)
                required = every_chunk and name in images
                label = f"level {name}" if name in images else name
                where = f"{path}: {label}"
                table = None
                if positions.is_level(name, stored) and has_checksums(array):
                    if not tied:
                        result.untied.append(name)
                    else:  # positions missing or damaged: one line; chunks checked without
                        try:
                            table = positions.Positions(array, where).table()
                        except ChunkError as exc:
                            result.bad.append(str(exc))
                shards = ShardIndex(array, path / name, where) if array.shards else None
                if shards is not None:  # a damaged shard is one line, not one per chunk
                    faults = _shard_faults(shards, array)
                    result.bad += faults.values()
                    coords = [c for c in coords if shards.shard_of(c) not in faults]
                check = _checker(path, name, label, array, required, decode, shards, table)
            for bad in pool.map(check, coords):
                result.chunks += 1
                if bad:
                    result.bad.append(bad)
    result.seconds = time.perf_counter() - started
    if record:
        _record(path, result)
    return result


def _arrays(group: zarr.Group, store: Path, prefix: str = ""):
    """(path, array) for every array below a group (of `store`), depth first, sorted."""
    try:
        found = members(group)
    except DAMAGED as exc:
        raise StoreError(f"{store}: cannot list the store: {prefix}{exc}") from exc
    for name, member in found:
        full = f"{prefix}{name}"
        if isinstance(member, zarr.Array):
            yield full, member
        else:
            yield from _arrays(member, store, f"{full}/")


def _coords(array: zarr.Array) -> list[tuple[int, ...]]:
    grid = [-(-s // c) for s, c in zip(array.shape, array.chunks, strict=True)]
    out = [()]
    for size in grid:
        out = [(*c, i) for c in out for i in range(size)]
    return out


def _slide_checker(store: Path, slide, name: str):
    """A level read in place: each chunk read from the slide and decoded, as reading does
    (`Slide.chunks`); damage is the slide's, named with the slide's tile."""
    reader = slide.chunks(int(name))

    def check(coord: tuple[int, ...]) -> str | None:
        _, row, col = coord
        try:
            reader.load([(row, col)])
        except (ChunkError, SlideError) as exc:
            return f"{store}: level {name} (in the slide) chunk {(row, col)}: {exc}"
        return None

    return check


def _shard_faults(shards: ShardIndex, array: zarr.Array) -> dict[tuple[int, ...], str]:
    """Each shard whose file or index is damaged, and why."""
    counts = [-(-s // c) for s, c in zip(array.shape, array.shards, strict=True)]
    faults = {}
    for shard in np.ndindex(*counts):
        try:
            shards.index(tuple(int(i) for i in shard))
        except ChunkError as exc:
            faults[tuple(int(i) for i in shard)] = str(exc)
    return faults


def _checker(
    store: Path,
    name: str,
    label: str,
    array: zarr.Array,
    required: bool,
    decode: bool,
    shards: ShardIndex | None,
    table: np.ndarray | None,
):
    """The check of one chunk of an array: a line saying what is wrong with it, or None.
    `table`: the CRC-32C recorded for each chunk's position (None: not recorded)."""
    checksum = has_checksums(array)
    jpeg = array.ndim == 3 and ChunkReader(array, 0).is_jpeg  # an image level

    def check(coord: tuple[int, ...]) -> str | None:
        where = f"{store}: {label} chunk {coord}"
        expect = None if table is None else table.item(coord)
        try:
            if shards is None:
                key = array.metadata.encode_chunk_key(coord)
                at = Location(str(store / name / key), 0, None, expect)
            else:  # its shard's index read (and its CRC-32C checked), then its range
                at = shards.locate([coord], [expect])[0]
            (data,) = read_chunks([at], [where], required=required)  # tied to its position
            if data is None:
                if required:
                    raise ChunkError(f"{where}: chunk is missing (absent from its shard)")
                if expect is not None and expect != UNWRITTEN:
                    raise ChunkError(f"{where}: chunk is missing (one was written here)")
                return None
            body = unseal(data, where) if checksum else data
            if decode:
                if jpeg:
                    imagecodecs.jpeg8_decode(body)
                else:
                    window = zip(coord, array.chunks, strict=True)
                    array[tuple(slice(i * c, (i + 1) * c) for i, c in window)]
        except ChunkError as exc:
            return str(exc)
        except (imagecodecs.Jpeg8Error, ValueError, RuntimeError) as exc:
            return f"{where}: cannot decode: {exc}"
        return None

    return check


def _record(path: Path, result: Verification) -> None:
    root = open_for_writing(path)
    _, stored = open_group(root.store)
    write_record(root, stored.replace(verified=result.record()))
