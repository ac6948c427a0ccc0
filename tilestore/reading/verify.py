"""Checking a whole store: every chunk of every array read and its CRC-32C compared.

`verify_store` walks every array of a store (image levels, labels, plans, embeddings) on a
thread pool and lists every bad chunk with its cause, rather than stopping at the first:
missing where the store promises every chunk, a link or anything but a regular file, too
short, or its checksum not matching its bytes; and, in image and label levels of a store
that records positions (`tilestore.format.positions`), a chunk that is not the one written
at its position (moved, swapped, a shard index rewritten), or stored where none was; the
same of every array a finished embeddings group ties (`_group_positions`: features, tokens,
quality, done, coordinates), and each such array's dtype as written. A store made before
positions were recorded is checked as before, and its levels are listed as not tied to their
positions (`tilestore reshard` adds them); embeddings groups made before them, or still
being written, are listed as not compared. With ``decode=True`` each chunk is also
decoded, which finds data that was damaged before it was written (a source tile copied as
it was). A sidecar's levels read in place are checked in the slide: the sidecar opened
(the slide's fingerprint), then every tile's bytes compared with the CRC-32C the sidecar
recorded for it (`tilestore.reading.source_chunks.TileSums`), each changed tile named; with
``decode=True`` each chunk is also read and decoded, as reading would. A sidecar made before
tile checksums has none to compare: its levels are listed as not checked by content, and
every tile is read and decoded, as before.

A store named by URL (s3://, gs://, https://) is verified where it is, through zarr's
FsspecStore: each object (a shard, or an unsharded chunk) fetched whole in one request, or a
large shard's index and then its chunks by byte ranges (a few MB a request, never the whole
shard in memory), its index and chunks checked in hand as a local store's are (`_Fetched`);
the same verdict, line for line, as its local copy's, its URL for its path.

Verifying writes nothing, in the store or anywhere: the verdict is the `Verification`
returned (`tilestore verify` prints it), so a read-only store (an archive) is checked as any
other.
"""

from __future__ import annotations

import math
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import imagecodecs
import numpy as np
import zarr
from zarr.abc.store import RangeByteRequest
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync

from tilestore.cpus import usable_cpus
from tilestore.errors import ChunkError, SlideError, StoreError
from tilestore.format import positions
from tilestore.format.chunks import ChunkReader
from tilestore.format.codecs import has_checksums
from tilestore.format.integrity import UNWRITTEN, Location, read_chunks, tied, unseal
from tilestore.format.records import GroupRecord, find_record
from tilestore.format.shards import (
    ABSENT_INT,
    ShardIndex,
    check_ranges,
    chunks_per_shard,
    index_bytes,
    index_checked,
    parse_index,
    split,
)
from tilestore.format.store import (
    DAMAGED,
    members,
    open_group,
    open_store,
)
from tilestore.options import Workers, checked
from tilestore.reading.inplace import open_sidecar
from tilestore.sources.remote import url_store
from tilestore.urls import is_url, shown


@dataclass
class Verification:
    """What `verify_store` found."""

    store: Path | str  # a store's path, or its URL as shown
    chunks: int = 0  # chunks read
    arrays: int = 0
    unchecked: list[str] = field(default_factory=list)  # arrays without checksums
    untied: list[str] = field(default_factory=list)  # levels whose positions are not recorded
    # a sidecar's in-place levels whose tiles' checksums it does not record (made before)
    unsummed: list[str] = field(default_factory=list)
    # groups of arrays (embeddings) whose chunks were not compared with positions, and why
    untied_groups: list[str] = field(default_factory=list)
    bad: list[str] = field(default_factory=list)  # one line per bad chunk
    decoded: bool = False
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.bad


@checked
def verify_store(
    path: str | os.PathLike,
    *,
    decode: bool = False,
    workers: Workers = None,
) -> Verification:
    """Read every chunk of a complete store and check it; return what was found. Writes
    nothing.

    decode: also decode every chunk (slower; finds data damaged before it was written).
    """
    started = time.perf_counter()
    remote = is_url(path)
    if remote:  # read where it is, an object at a time, through zarr's FsspecStore
        group, stored = open_group(url_store(str(path)))  # the URL as given; shown as `shown`
        path = shown(str(path))
        if stored.source.sidecar:
            raise StoreError(
                f"{path}: a slide's sidecar, read through its slide: verify it where the "
                "slide is (a local or mounted file system)"
            )
    else:
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
                tiles = slide.group.store.level_tiles(name)
                changed: set[tuple[int, int, int]] = set()
                if tiles.sums is None:  # made before: every tile read and decoded, as before
                    result.unsummed.append(name)
                else:  # every tile's bytes, each changed one named; decoded too if asked
                    changed = set(tiles.sums.changed_tiles())
                    result.bad += [str(tiles.sums.changed(*at)) for at in sorted(changed)]
                    if not decode:  # the tiles read: the level's chunks are counted so
                        result.chunks += len(coords)
                        continue
                check = _slide_checker(path, slide, name, tiles, changed)
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
                if table is None:  # an array its group ties (embeddings), else None
                    table = _group_positions(group, name, array, where, result)
                if remote:  # an object at a time (a shard whole), its chunks checked in hand
                    fetched = _Fetched(array, f"{path}: {label}", required, decode, table)
                    for chunks, bad in pool.map(fetched.check, fetched.objects()):
                        result.chunks += chunks
                        result.bad += bad
                    continue
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
    return result


def _group_positions(
    root: zarr.Group, name: str, array: zarr.Array, where: str, result: Verification
) -> np.ndarray | None:
    """The CRC-32C recorded for each chunk of an array its group ties to their positions
    (`positions.group_tied`: an embeddings group's features, tokens, quality, done and
    coordinate columns), to compare each chunk read with; None for any other array. A group
    still being written is not compared (only its done batches are the ones recorded: the
    writer's resume and `status` compare those), nor one made before positions: each is
    listed once in `result.untied_groups`, why said. A record missing or damaged, or an
    array whose dtype is not the one written, is a line in `result.bad`."""
    parent, _, leaf = name.rpartition("/")
    if not parent:
        return None
    try:
        record = find_record(root[parent], GroupRecord)  # of any kind: what it ties, if any
    except (KeyError, ValueError, TypeError, zarr.errors.BaseZarrError):
        return None  # its own arrays' reads say what is wrong
    attrs = None if record is None else record.to_attrs()
    declared = positions.group_tied(attrs)
    if declared is None or leaf not in declared:
        batched = attrs is not None and "batch_size" in attrs  # an embeddings group
        if declared is None and leaf == "features" and batched:
            result.untied_groups.append(f"{parent} (made before positions were recorded)")
        return None
    if not attrs.get("complete"):
        if leaf == "features":
            result.untied_groups.append(f"{parent} (unfinished)")
        return None
    if str(array.dtype) != declared[leaf]:
        result.bad.append(
            f"{where}: is {array.dtype} where it was written as {declared[leaf]} (its zarr.json "
            "was changed)"
        )
    try:
        return positions.group_positions(attrs, leaf, array, where, _again(parent)).table()
    except ChunkError as exc:
        result.bad.append(str(exc))
        return None


def _again(group: str) -> str:
    return f"embed the store again with overwrite=True (or remove {group})"


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


def _slide_checker(store: Path, slide, name: str, tiles, changed: set[tuple[int, int, int]]):
    """A level read in place: each chunk read from the slide and decoded, as reading does
    (`Slide.chunks`); damage is the slide's, named with the slide's tile. A chunk over a
    tile in `changed` is left out: that tile is named already."""
    reader = slide.chunks(int(name))

    def check(coord: tuple[int, ...]) -> str | None:
        plane, row, col = coord
        if changed and changed.intersection(tiles.tiles_under(row, col, plane)):
            return None
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
        except ChunkError as exc:
            return str(exc)
        return _verdict(array, coord, data, where, required, expect, checksum, decode, jpeg)

    return check


def _verdict(
    array: zarr.Array,
    coord: tuple[int, ...],
    data: bytes | None,
    where: str,
    required: bool,
    expect: int | None,
    checksum: bool,
    decode: bool,
    jpeg: bool,
) -> str | None:
    """What is wrong with one chunk as read (`data`, tied to its position already; None:
    absent), or None: missing where required or where one was written, its CRC-32C, and
    with `decode` whether it decodes."""
    try:
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


def _ranges(
    where: dict[tuple[int, ...], tuple[int, int]], most: int
) -> list[list[tuple[int, ...]]]:
    """The chunks of `where` (each its [start, stop) in the object) in groups read in one
    request each: by offset, a group spanning at most `most` bytes (a chunk larger than that
    alone), gaps between its chunks included."""
    groups: list[list[tuple[int, ...]]] = []
    for coord in sorted(where, key=lambda c: where[c]):
        if groups and where[coord][1] - where[groups[-1][0]][0] <= most:
            groups[-1].append(coord)
        else:
            groups.append([coord])
    return groups


# a store read where it is: an object up to this many bytes is fetched whole (one request);
# a larger shard's index by its byte range, then its chunks in requests of about
# `RANGE_BYTES`, so a pool thread holds no more than that of a shard of any size
WHOLE_BYTES = 64 << 20
RANGE_BYTES = 16 << 20


class _Fetched:
    """The checks of an array of a store read where it is (a bucket, a web server): each of
    its objects (a shard, or an unsharded chunk) read through the array's own store, its
    index checked (`parse_index`, `check_ranges`), then each chunk in hand as a local chunk
    is (`_verdict`, tied to its position first). An object up to `WHOLE_BYTES` is fetched
    whole in one request; a larger shard's index is its last bytes, then its chunks come in
    requests of about `RANGE_BYTES` (`_ranges`): a pool thread holds that much, whatever a
    shard's size (a level-0 shard of a large slide is gigabytes). The objects are checked on
    the pool; the verdict is the local copy's, line for line."""

    def __init__(self, array: zarr.Array, label: str, required: bool, decode: bool, table) -> None:
        self.array, self.label, self.required, self.decode = array, label, required, decode
        self.table = table
        self.per = chunks_per_shard(array)
        self.checksum = has_checksums(array)
        self.jpeg = array.ndim == 3 and ChunkReader(array, 0).is_jpeg
        self.store = array.store_path.store
        self.sizes = self._listed() if self.per is not None else {}

    def objects(self) -> list[tuple[int, ...]]:
        """The array's objects by their grid coordinates (shards, or chunks unsharded)."""
        grid = positions.grid_of(self.array)
        per = self.per or (1,) * len(grid)
        counts = (-(-g // p) for g, p in zip(grid, per, strict=True))
        return [tuple(map(int, c)) for c in np.ndindex(*counts)]

    def check(self, at: tuple[int, ...]) -> tuple[int, list[str]]:
        """(chunks checked, a line for each bad one) of the object at `at`."""
        key = f"{self.array.path}/{self.array.metadata.encode_chunk_key(at)}"
        name = f"{self.label} {'shard' if self.per else 'chunk'} {at}"
        if self.per is None:  # a chunk of its own, missing as a local chunk file is said
            data = self._get(key)
            if data is None and self.required:
                return 1, [f"{name}: chunk is missing (deleted or never written)"]
            return 1, [bad for bad in [self._chunk(at, data)] if bad]
        chunks = [tuple(a * p + i for a, p, i in zip(at, self.per, inner, strict=True))
                  for inner in np.ndindex(*self.per)]  # fmt: skip
        grid = positions.grid_of(self.array)
        chunks = [c for c in chunks if all(i < g for i, g in zip(c, grid, strict=True))]
        crc, count = index_checked(self.array), math.prod(self.per)
        size = self._size(key)
        index, whole = None, None
        try:
            if size is not None and size <= max(WHOLE_BYTES, index_bytes(count, crc)):
                whole = self._get(key)  # None: removed since it was sized (said missing)
                if whole is not None:
                    end = len(whole) - index_bytes(count, crc)
                    index = check_ranges(parse_index(whole, count, name, crc), name, end)
            elif size is not None:  # its index, its last bytes
                end = size - index_bytes(count, crc)
                tail = self._get(key, (end, size), name)
                if tail is not None:  # None: removed since it was sized (said missing)
                    index = check_ranges(parse_index(tail, count, name, crc), name, end)
        except ChunkError as exc:  # one line for the shard, its chunks not counted
            return 0, [str(exc)]
        where: dict[tuple[int, ...], tuple[int, int]] = {}  # each chunk present: its range
        if index is not None:
            _, rows = split(np.asarray(chunks), self.per)
            for coord, (offset, length) in zip(chunks, index[rows].tolist(), strict=True):
                if offset != ABSENT_INT:
                    where[coord] = (offset, offset + length)
        verdicts: dict[tuple[int, ...], str | None] = {}
        for group in _ranges(where, RANGE_BYTES):  # chunks whose bytes come in one request
            lo, hi = where[group[0]][0], where[group[-1]][1]
            try:
                data = whole[lo:hi] if whole is not None else self._get(key, (lo, hi), name)
            except ChunkError as exc:  # changed as it was read: one line for the shard
                return 0, [str(exc)]
            for coord in group:
                start, stop = where[coord]
                verdicts[coord] = self._chunk(
                    coord, None if data is None else data[start - lo : stop - lo]
                )
        bad = []
        for coord in chunks:  # in the shard's order, as the local copy's lines are
            line = verdicts[coord] if coord in verdicts else self._chunk(coord, None)
            if line is not None:
                bad.append(line)
        return len(chunks), bad

    def _listed(self) -> dict[str, int]:
        """The sizes of the array's objects, from one listing of its prefix (a bucket's
        listing gives them: no request a shard for its size); {} where the server lists
        nothing with sizes (a web server, a bucket that refuses listing but serves its
        objects): each object is then sized alone (`_size`)."""
        fs, root = getattr(self.store, "fs", None), str(getattr(self.store, "path", ""))
        if fs is None or not hasattr(fs, "_find"):
            return {}
        prefix = f"{root.rstrip('/')}/"
        try:
            found = sync(fs._find(f"{prefix}{self.array.path}", detail=True))
        except Exception:  # listing refused or not offered: sized an object at a time
            return {}
        return {
            path[len(prefix) :]: int(info["size"])
            for path, info in found.items()
            if path.startswith(prefix) and isinstance(info.get("size"), int)
        }

    def _size(self, key: str) -> int | None:
        """The object's bytes (None: no such object), as listed or asked; a request that
        fails is the store's one line (`UrlStore`), not a chunk's verdict."""
        if key in self.sizes:
            return self.sizes[key]
        try:
            return int(sync(self.store.getsize(key)))
        except FileNotFoundError:
            return None

    def _get(self, key: str, span: tuple[int, int] | None = None, name: str = "") -> bytes | None:
        """The object, or bytes [start, stop) of it (None: no such object). A range
        answered short is ChunkError naming `name`: the object changed since it was sized."""
        ranged = None if span is None else RangeByteRequest(*span)
        found = sync(self.store.get(key, default_buffer_prototype(), byte_range=ranged))
        data = None if found is None else found.to_bytes()
        if data is not None and span is not None and len(data) != span[1] - span[0]:
            raise ChunkError(
                f"{name}: {len(data)} bytes read where {span[1] - span[0]} were asked at "
                f"{span[0]}: the object changed while it was verified; verify again"
            )
        return data

    def _chunk(self, coord: tuple[int, ...], data: bytes | None) -> str | None:
        where = f"{self.label} chunk {coord}"
        expect = None if self.table is None else self.table.item(coord)
        if data is not None and expect is not None:
            try:
                tied(data, expect, where)
            except ChunkError as exc:
                return str(exc)
        args = (where, self.required, expect, self.checksum, self.decode, self.jpeg)
        return _verdict(self.array, coord, data, *args)
