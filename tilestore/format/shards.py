"""Shards: many chunks in one file, zarr v3's `sharding_indexed` layout, read and written here.

A store of one file per chunk makes ~185,000 files of a 40x slide; cluster filesystems hold
users to a few million. A shard holds `SHARD_CHUNKS` x `SHARD_CHUNKS` inner chunks (the
chunks a store had before: a copied level's are still the slide's JPEG tiles, byte for byte),
so a slide is a few hundred files (ARCHITECTURE.md, "Shards", says why this size).

The layout is the spec's, so any zarr v3 reader reads our shards: the inner chunks' bytes one
after another, then the index, (offset, length) as little-endian uint64 per inner chunk in
C order of the shard's chunk grid ((2^64-1, 2^64-1) for a chunk absent), then the index's
CRC-32C. tilestore writes the copy path's shards itself (`pack`), whole, and renames each into
place (`write_atomic`): a kill leaves no torn shard. Reading a chunk is a read of the index
(cached per shard) and one read of the chunk's bytes (`ShardIndex`, `locate`).
"""

from __future__ import annotations

import math
import os
import uuid
from collections.abc import Sequence
from pathlib import Path

import google_crc32c
import numpy as np
from zarr.codecs import BytesCodec, Crc32cCodec, ShardingCodec

from tilestore.errors import ChunkError
from tilestore.format.integrity import TRAILER, Location, read_range

# Inner chunks per shard side: 32 x 32 chunks of 240-256 px are 7,680-8,192 px, so a
# 100,000 px slide's level 0 is 169-196 shards where it was 153,000-174,000 chunk files.
SHARD_CHUNKS = 32
# Tiles per shard of `features` and `done` (rounded to whole batches). A slide of 100,000
# tiles, batch 256, ViT-L features: 53 files where a file per batch made 785; the writer
# writes a shard once its batches are in, a shard with done batches by one read-modify-write
# (bench/RESULTS.md, "Shards": per-batch write cost by shard size).
SHARD_TILES = 4096
SHARD_BYTES = 2**28  # decoded, at most: one shard (all its channels) is held to be written
ABSENT = np.uint64(2**64 - 1)
ABSENT_INT = 2**64 - 1
# `ShardIndex.locate` looks this many chunks or more up with array operations
LOCATE_AS_ARRAYS = 24
ENTRY = 16  # bytes per chunk in the index: offset and length, uint64 each


def batches_per_shard(batch_size: int, shard_tiles: int = SHARD_TILES) -> int:
    """Whole batches in a shard of about `shard_tiles` tiles (at least one)."""
    return max(1, shard_tiles // batch_size)


def shard_shape(
    chunks: Sequence[int], shape: Sequence[int], per_side: int, chunk_bytes: int = 0
) -> tuple[int, ...]:
    """The shard shape of a (c, y, x) array of `chunks`: `per_side` inner chunks along y and
    x, never more than the array needs, and fewer where a shard of chunks of `chunk_bytes`
    decoded would pass `SHARD_BYTES` (a shard is written whole from memory: many-channel
    levels, large chunks)."""
    if chunk_bytes:
        per_side = max(1, min(per_side, math.isqrt(SHARD_BYTES // chunk_bytes)))
    shard = list(chunks)
    for axis in (-2, -1):
        shard[axis] = chunks[axis] * min(per_side, -(-shape[axis] // chunks[axis]))
    return tuple(shard)


def sharded(codecs: dict, chunks: Sequence[int], shard: Sequence[int], checksums: bool) -> dict:
    """``create_array`` arguments for an array of `chunks` stored in shards of `shard`, each
    inner chunk through `codecs` (filters, serializer, compressors, as `jpeg_codecs` and
    `zstd_codecs` give them); the index with its CRC-32C where `checksums`."""
    inner = [
        *(codecs.get("filters") or ()),
        codecs.get("serializer") or BytesCodec(),
        *(codecs.get("compressors") or ()),
    ]
    index = [BytesCodec(), *([Crc32cCodec()] if checksums else [])]
    sharding = ShardingCodec(chunk_shape=tuple(chunks), codecs=inner, index_codecs=index)
    return {"chunks": tuple(shard), "serializer": sharding, "filters": (), "compressors": ()}


def column(codecs: dict, length: int, chunk: int = 2**16, checksums: bool = True) -> dict:
    """``create_array`` arguments for a 1-D column of `length` values (a plan's or an
    embeddings group's coordinates): one file, inner chunks of `chunk` values through
    `codecs`. zarr's own choice is a file per 25,000-62,500 values: 4-16 per column of a
    large slide's plan, a dozen columns each."""
    inner = max(1, min(chunk, length))
    return sharded(codecs, (inner,), (max(1, -(-length // inner)) * inner,), checksums)


def index_checked(array) -> bool:
    """Whether a sharded array's shard indexes end in their CRC-32C."""
    return any(isinstance(c, Crc32cCodec) for c in array.metadata.codecs[0].index_codecs)


def index_bytes(chunks: int, crc: bool = True) -> int:
    """Bytes of a shard's index (with its CRC-32C where `crc`) for `chunks` inner chunks."""
    return chunks * ENTRY + (TRAILER if crc else 0)


def pack(chunks: Sequence[bytes | tuple[bytes, ...] | None], crc: bool = True) -> bytes:
    """One shard's file: `chunks` (C order of the shard's chunk grid, None where absent;
    a chunk may be given as its parts) one after another, then the index (and its CRC-32C
    where `crc`)."""
    return b"".join(pack_parts(chunks, crc))


def pack_parts(chunks: Sequence[bytes | tuple[bytes, ...] | None], crc: bool = True) -> list[bytes]:
    """`pack`'s file as the buffers to write one after another (`write_atomic` writes them
    with writev: a shard is never put together in memory, whose megabytes a fresh process
    would take from the system page by page)."""
    parts = [() if d is None else (d,) if isinstance(d, bytes) else d for d in chunks]
    lengths = np.fromiter(
        (-1 if d is None else sum(map(len, p)) for d, p in zip(chunks, parts, strict=True)),
        np.int64,
        len(chunks),
    )
    present = lengths >= 0
    sizes = np.where(present, lengths, 0).astype("<u8")
    index = np.full((len(chunks), 2), ABSENT, "<u8")
    index[present, 0] = (np.cumsum(sizes) - sizes)[present]
    index[present, 1] = sizes[present]
    table = index.tobytes()
    trailer = google_crc32c.value(table).to_bytes(TRAILER, "little") if crc else b""
    return [part for chunk in parts for part in chunk] + [table, trailer]


def write_atomic(path: Path, data: bytes | Sequence[bytes]) -> None:
    """Write `data` (or its buffers, one after another) to `path` whole: into a temporary
    name beside it, then renamed into place (the name zarr's own local store uses, so
    either's leftovers look alike)."""
    partial = path.with_suffix(f".{uuid.uuid4().hex}.partial")
    buffers = [data] if isinstance(data, bytes | bytearray) else [b for b in data if b]
    try:
        try:
            fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileNotFoundError:  # its folder first (asked only where it is missing)
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            for start in range(0, len(buffers), IOV):
                batch = buffers[start : start + IOV]
                left = sum(map(len, batch))
                while left:  # writev may write less than asked: go on from there
                    done = os.writev(fd, batch)
                    left -= done
                    if left:
                        batch = _after(batch, done)
        finally:
            os.close(fd)
        os.replace(partial, path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


IOV = 1024  # buffers per writev (the system's IOV_MAX on Linux)


def _after(buffers: list, written: int) -> list:
    """What of `buffers` is left once `written` bytes of them are written."""
    for i, buffer in enumerate(buffers):
        if written < len(buffer):
            return [memoryview(buffer)[written:], *buffers[i + 1 :]]
        written -= len(buffer)
    return []


def parse_index(tail: bytes, chunks: int, where: str, crc: bool = True) -> np.ndarray:
    """The (chunks, 2) offsets and lengths of a shard whose file ends in `tail`; ChunkError
    naming `where` if the index is short or its CRC-32C fails."""
    size = index_bytes(chunks, crc)
    if len(tail) < size:
        raise ChunkError(f"{where}: shard is {len(tail)} bytes long, shorter than its index")
    table = tail[-size : len(tail) - (TRAILER if crc else 0)]
    if crc and google_crc32c.value(table) != int.from_bytes(tail[-TRAILER:], "little"):
        raise ChunkError(f"{where}: shard index is corrupt (its CRC-32C does not match)")
    return np.frombuffer(table, "<u8").reshape(chunks, 2)


def check_ranges(index: np.ndarray, where: str, data_end: int | None = None) -> np.ndarray:
    """`index` if its chunks' ranges lie apart inside the shard's data (before its index, at
    `data_end`, where known); ChunkError naming `where` if not. The index's CRC-32C finds
    damage, not an index rewritten to point one chunk at another's bytes: valid pixels in
    the wrong place, as a link to another chunk file would read."""
    present = index[index[:, 0] != ABSENT]
    present = present[np.argsort(present[:, 0], kind="stable")]
    ends = present[:, 0] + present[:, 1]
    if data_end is not None and ends.size and int(ends.max()) > data_end:
        raise ChunkError(f"{where}: shard index points past its data (truncated?)")
    if np.any(present[1:, 0] < ends[:-1]):
        raise ChunkError(f"{where}: shard index has chunks sharing bytes (rewritten?)")
    return index


def chunks_per_shard(array) -> tuple[int, ...] | None:
    """Inner chunks per shard along each axis of a sharded zarr array (None: not sharded)."""
    if array.shards is None:
        return None
    return tuple(s // c for s, c in zip(array.shards, array.chunks, strict=True))


def split(coords: np.ndarray, per: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """(n, d) chunk coordinates as (their shards' coordinates, their entries in the index)."""
    per_ = np.asarray(per)
    return coords // per_, np.ravel_multi_index(tuple((coords % per_).T), tuple(per))


class ShardIndex:
    """The chunk locations of one sharded array on local disk, each shard's index read once
    (the shards of a 100,000 px slide's level 0 hold ~3 MB of index)."""

    def __init__(self, array, folder: Path, where: str) -> None:
        self.folder = folder  # the array's folder
        self.key = array.metadata.encode_chunk_key  # shard coordinates -> its key
        self.per = chunks_per_shard(array)
        self.crc = index_checked(array)
        self.where = where
        self._indexes: dict[tuple[int, ...], np.ndarray | None] = {}
        self._paths: dict[tuple[int, ...], str] = {}
        # C order of the shard's chunk grid: an inner chunk's row in the index
        self._strides = tuple(math.prod(self.per[i + 1 :]) for i in range(len(self.per)))

    def shard_of(self, coord: tuple[int, ...]) -> tuple[int, ...]:
        """The shard holding chunk `coord`."""
        return tuple(c // p for c, p in zip(coord, self.per, strict=True))

    def index(self, shard: tuple[int, ...]) -> np.ndarray | None:
        """The shard's index (None: no shard file); ChunkError if it is damaged."""
        if shard not in self._indexes:
            path = self.folder / self.key(shard)
            chunks = math.prod(self.per)
            where = f"{self.where} shard {shard}"
            try:
                size = os.stat(path, follow_symlinks=False).st_size
            except FileNotFoundError:
                self._indexes[shard] = None
                return None
            except OSError as exc:
                raise ChunkError(f"{where}: cannot read shard: {exc.strerror}") from None
            length = min(size, index_bytes(chunks, self.crc))
            tail = read_range(
                path, max(0, size - length), length, where, required=True, what="shard"
            )
            index = parse_index(tail, chunks, where, self.crc)
            self._indexes[shard] = check_ranges(index, where, size - length)
        return self._indexes[shard]

    def locate(
        self, coords: Sequence[tuple[int, ...]], expect: Sequence[int | None] | None = None
    ) -> list[Location | None]:
        """Each chunk's byte range (None: absent from its shard, or no shard), carrying the
        CRC-32C recorded for its position where `expect` gives them: each shard's index read
        once, then plain lookups for a few chunks (a region read's, a grid row's), array
        operations for many (a small slide's rows asked at once: 4x faster at 66)."""
        if len(coords) >= LOCATE_AS_ARRAYS:
            return self._locate_many(coords, expect)
        per, strides = self.per, self._strides
        out: list[Location | None] = []
        last, index, path = None, None, ""
        for i, coord in enumerate(coords):
            shard = tuple(int(c) // p for c, p in zip(coord, per, strict=True))
            if shard != last:
                last, index = shard, self.index(shard)
                path = self._path(shard) if index is not None else ""
            if index is None:
                out.append(None)
                continue
            at = sum((int(c) % p) * s for c, p, s in zip(coord, per, strides, strict=True))
            offset = index.item(at, 0)
            if offset == ABSENT_INT:
                out.append(None)
            else:
                crc = None if expect is None else expect[i]
                out.append(Location(path, offset, index.item(at, 1), crc))
        return out

    def _locate_many(
        self, coords: Sequence[tuple[int, ...]], expect: Sequence[int | None] | None
    ) -> list[Location | None]:
        at = np.asarray(coords, dtype=np.int64).reshape(len(coords), len(self.per))
        per = np.asarray(self.per, dtype=np.int64)
        inner = (at % per) @ np.asarray(self._strides, dtype=np.int64)
        shard_of = at // per
        if (shard_of == shard_of[0]).all():  # most often: a small slide in one shard
            shards, which = shard_of[:1], np.zeros(len(coords), dtype=np.int64)
        else:
            shards, which = np.unique(shard_of, axis=0, return_inverse=True)
            which = which.ravel()
        expect = [None] * len(coords) if expect is None else expect
        out: list[Location | None] = [None] * len(coords)
        for k, shard in enumerate(map(tuple, shards.tolist())):
            index = self.index(shard)
            if index is None:
                continue
            path, rows = self._path(shard), np.flatnonzero(which == k).tolist()
            found = index[inner[rows]].tolist()
            for i, (offset, length) in zip(rows, found, strict=True):
                if offset != ABSENT_INT:
                    out[i] = Location(path, offset, length, expect[i])
        return out

    def _path(self, shard: tuple[int, ...]) -> str:
        if (path := self._paths.get(shard)) is None:
            path = self._paths[shard] = str(self.folder / self.key(shard))
        return path
