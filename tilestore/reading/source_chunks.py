"""A slide level's pixels as the chunks of a store array, for the copy path and for levels
read in place: its JPEG tiles as they are where they can be (`TileSource`), else its pixels
decoded under each chunk (`DecodedChunks`); `chunk_source` picks one of the two.

A level read in place is checked by content (`TileSums`): its sidecar records the CRC-32C of
each of the slide's tiles (or strips) as the file stores them (`Segments.sums`, when the
sidecar is made), and every read compares the bytes it reads with it: a JPEG tile by the
bytes already in hand (a few microseconds a tile), a decoded level by the tiles under the
chunk, read once more (from the page cache, beside decoding them). A tile changed since is a
ChunkError naming the slide, the level and the tile, never its pixels."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import google_crc32c
import numpy as np
import zarr

from tilestore.errors import ChunkError, SlideError
from tilestore.format.codecs import encode_chunk
from tilestore.format.integrity import UNWRITTEN, Location
from tilestore.sources import JpegTiles, Source, SourceLevel


def chunk_source(
    source: Source,
    index: int,
    array: zarr.Array,
    background: int,
    decoded: frozenset[int],
    sums: TileSums | None = None,
) -> TileSource | DecodedChunks:
    """A source level's pixels as the chunks of `array`: its JPEG tiles (`TileSource`), or
    decoded from the slide at each read (`DecodedChunks`); `sums`: each tile's bytes checked
    against them as it is read (None: not checked by content, as sidecars made before)."""
    where = f"{source.path}: level {index}"
    level = source.levels[index]
    if index in decoded:
        return DecodedChunks(level, array, background, sums)
    return TileSource(level.jpeg_tiles(), level, array.serializer, background, where, sums)


class TileSource:
    """A level's source JPEG tiles as chunks of an array: the tile itself where its frame
    matches the level's (size, sampling, colour), else decoded and re-encoded with the
    array's codec, so every chunk stays valid for the codec the array declares; a tile absent
    from the source is a background chunk. A tile that is not a JPEG stream and cannot be
    decoded either is a SlideError naming it (`where` names the file and level). With `sums`
    (a level read in place) each tile's bytes are checked first (`TileSums`)."""

    def __init__(
        self,
        tiles: JpegTiles,
        level: SourceLevel,
        codec: Any,
        background: int,
        where: str,
        sums: TileSums | None = None,
    ) -> None:
        self.tiles, self.level, self.codec, self.where = tiles, level, codec, where
        self.background, self.sums = background, sums
        self.frame = tiles.frame  # what a tile must be to be its chunk as it is
        self._blank: bytes | None = None

    def _expected(self, data: bytes, own: bool = False) -> bool:
        return self.frame.fits(data, own=own)

    def locations(self, coords: Sequence[tuple[int, int]]) -> list[Location | None] | None:
        """Where each tile's whole stream is in the slide file (None: absent), for the decoder
        processes, which splice and check each as `chunk` does (`TileFrame.spliced`) and
        leave the others to it; None where the tiles are not byte ranges of a file. With
        `sums`, each carries the CRC-32C recorded for its bytes (`Location.whole`): a tile
        whose bytes differ is left to `chunk`, which names it."""
        locate = self.tiles.locate
        if locate is None:
            return None
        sums, out = self.sums, []
        for row, col in coords:
            at = locate(row, col)
            if at is None:
                out.append(None)
            elif sums is None:
                out.append(Location(*at))
            else:
                out.append(Location(*at, sums.expected(row, col), whole=True))
        return out

    def _reencode(self, row: int, col: int) -> bytes:
        (th, tw), (height, width) = self.tiles.tile_shape, self.level.shape
        y0, x0 = row * th, col * tw
        pixels = self.level.read(y0, min(y0 + th, height), x0, min(x0 + tw, width))
        full = np.full((th, tw, pixels.shape[2]), self.background, dtype=pixels.dtype)
        full[: pixels.shape[0], : pixels.shape[1]] = pixels
        return encode_chunk(self.codec, full)

    @property
    def grid(self) -> tuple[int, int]:
        return self.tiles.grid

    def tiles_under(self, row: int, col: int, plane: int = 0) -> list[tuple[int, int, int]]:
        """The slide's tiles (plane, row, col) under chunk (row, col): the tile itself."""
        return [(0, row, col)]

    def copied(self, row: int, first: int, end: int) -> list[bytes | None]:
        """Of tiles [first, end) of a row, each tile's own bytes after its SOI where it can be
        its chunk as it is (its chunk: the level's prefix, then these); None where not (to
        be had through `chunk`). The fast path of a copy: the source reads each run of
        tiles at once and the level's shared tables are never parsed again."""
        if self.tiles.read_own is None:
            return [None] * (end - first)
        out = []
        for own in self.tiles.read_own(row, first, end):
            try:
                out.append(own if own is not None and self._expected(own, own=True) else None)
            except ValueError:  # damaged markers: `chunk` re-encodes it or names it
                out.append(None)
        return out

    def chunk(self, row: int, col: int, plane: int = 0) -> tuple[bytes, bool]:
        """The chunk's JPEG stream and whether it is the source tile as it was; a tile whose
        bytes changed since its sidecar was made is a ChunkError (`TileSums.changed`)."""
        try:
            data = self.tiles.read(row, col)
            if self.sums is not None:  # the bytes in hand: the file's, but for the prefix
                self.sums.check_stream(row, col, data, self.tiles.own_start)
            if data is None:  # absent in the source
                if self._blank is None:
                    th, tw = self.tiles.tile_shape
                    blank = np.full((th, tw, self.level.channels), self.background, np.uint8)
                    self._blank = encode_chunk(self.codec, blank)
                return self._blank, False
            if self._expected(data):
                return data, True
        except (ValueError, OSError) as exc:  # not a JPEG stream: decode it another way
            if self.sums is not None:  # as the file stores it, unchanged since
                self.sums.check_read([(0, row, col)])
            try:
                return self._reencode(row, col), False
            except SlideError as again:
                raise SlideError(
                    f"{self.where} tile ({row}, {col}) is damaged: {exc}; decoding it: {again}"
                ) from exc
        return self._reencode(row, col), False


class DecodedChunks:
    """A source level that is not JPEG tiles (NDPI strips, LZW, 16-bit channels) as the raw
    chunks of an uncompressed (c, y, x) array: each read decodes the slide's pixels under
    the chunk through its reader, exactly, and pads the edge with the background. With
    `sums`, the tiles (or strips) under the chunk are checked first (`TileSums`)."""

    def __init__(
        self, level: SourceLevel, array, background: int, sums: TileSums | None = None
    ) -> None:
        self.level, self.background, self.sums = level, background, sums
        self.chunk_shape = tuple(array.chunks)
        self.dtype = np.dtype(array.dtype).newbyteorder("<")
        _, h, w = array.shape
        self.grid = (-(-h // self.chunk_shape[1]), -(-w // self.chunk_shape[2]))

    def chunk(self, row: int, col: int, plane: int = 0) -> tuple[bytes, bool]:
        depth, th, tw = self.chunk_shape
        (h, w), y0, x0 = self.level.shape, row * th, col * tw
        if self.sums is not None:
            self.sums.check_read(self.tiles_under(row, col, plane))
        pixels = self.level.read(y0, min(y0 + th, h), x0, min(x0 + tw, w))
        block = np.full((depth, th, tw), self.background, self.dtype)
        planes = pixels[..., plane * depth : (plane + 1) * depth]
        block[:, : pixels.shape[0], : pixels.shape[1]] = np.moveaxis(planes, -1, 0)
        return block.tobytes(), False

    def tiles_under(self, row: int, col: int, plane: int = 0) -> list[tuple[int, int, int]]:
        """The slide's tiles (plane, row, col) under chunk (row, col) of `plane` (`sums`)."""
        _, th, tw = self.chunk_shape
        (h, w), y0, x0 = self.level.shape, row * th, col * tw
        where = (self._planes(plane), y0, min(y0 + th, h), x0, min(x0 + tw, w))
        return self.sums.segments.under(*where)

    def _planes(self, plane: int) -> range:
        """The slide's planes under chunk plane `plane`: its channels where the slide stores
        one plane per channel (a page per marker), else every plane (samples interleaved)."""
        planes = self.sums.table.shape[0]
        if planes == self.level.channels and planes > 1:
            depth = self.chunk_shape[0]
            return range(plane * depth, (plane + 1) * depth)
        return range(planes)


@dataclass(frozen=True)
class Segments:
    """Where an in-place TIFF level's compressed tiles (or strips) are, as its file(s) store
    them now: per plane (a page, or a sample plane of one), the file, and each tile's offset
    and byte count on the level's tile grid; `shape`: the pixels of each (h, w); `tables`:
    what every tile is decoded with, outside the tiles (the JPEG tables, NDPI's header)."""

    files: tuple[str, ...]  # per plane
    offsets: np.ndarray  # uint64 (planes, rows, cols)
    counts: np.ndarray  # uint64 (planes, rows, cols); 0: absent
    shape: tuple[int, int]
    kind: str  # "tile" or "strip", for messages
    tables: bytes = b""

    @property
    def tables_crc(self) -> int:
        """The CRC-32C of `tables`."""
        return google_crc32c.value(self.tables)

    @classmethod
    def of(cls, level: SourceLevel) -> Segments:
        """The segments of a TIFF level (tifffile's offsets and byte counts of each of its
        pages); a layout that is not a grid of tiles or strips over the image (tiled depth)
        is checked whole: each of its segments a plane of one, all read at every read."""
        pages = level.series.levels[level.level].pages
        key = level.series.levels[level.level].keyframe
        height, width = key.imagelength, key.imagewidth
        if key.is_tiled:
            shape, kind = (key.tilelength, key.tilewidth), "tile"
        else:
            shape, kind = (min(key.rowsperstrip or height, height), width), "strip"
        grid = (-(-height // shape[0]), -(-width // shape[1]))
        offsets = [np.asarray(page.dataoffsets, np.uint64) for page in pages]
        counts = [np.asarray(page.databytecounts, np.uint64) for page in pages]
        files = [page.parent.filehandle.path for page in pages]
        if any(len(found) % (grid[0] * grid[1]) for found in offsets):
            shape, grid = (height, width), (1, 1)
        tables = b"".join(
            (getattr(page, "jpegtables", None) or b"") + (getattr(page, "jpegheader", None) or b"")
            for page in pages
        )
        planes = [len(o) // (grid[0] * grid[1]) for o in offsets]
        return cls(
            tuple(f for f, n in zip(files, planes, strict=True) for _ in range(n)),
            np.concatenate(offsets).reshape(-1, *grid),
            np.concatenate(counts).reshape(-1, *grid),
            shape,
            kind,
            tables,
        )

    @property
    def grid(self) -> tuple[int, int, int]:
        return self.offsets.shape

    def sums(self) -> np.ndarray:
        """The CRC-32C of every segment's bytes as the file stores them, as uint64 shaped as
        `grid`; `UNWRITTEN` where the file stores none."""
        out = np.full(self.grid, UNWRITTEN, np.uint64)
        value = google_crc32c.value
        for plane, path in enumerate(self.files):
            at, n = self.offsets[plane].ravel().tolist(), self.counts[plane].ravel().tolist()
            present = [i for i, count in enumerate(n) if count]
            read = _read_spans(path, [(at[i], n[i]) for i in present])
            out[plane].reshape(-1)[present] = [value(data) for data in read]
        return out

    def read_many(
        self, coords: Sequence[tuple[int, int, int]]
    ) -> Iterator[tuple[tuple[int, int, int], bytes]]:
        """(coord, bytes) of each present segment of `coords` (plane, row, col)."""
        by_file: dict[str, list[tuple[int, int, int]]] = {}
        for at in coords:
            if self.counts[at]:
                by_file.setdefault(self.files[at[0]], []).append(at)
        for path, found in by_file.items():
            spans = [(int(self.offsets[at]), int(self.counts[at])) for at in found]
            yield from zip(found, _read_spans(path, spans), strict=True)

    def under(
        self, planes: range, y0: int, y1: int, x0: int, x1: int
    ) -> list[tuple[int, int, int]]:
        """The segments (plane, row, col) holding pixels [y0:y1, x0:x1] of `planes`."""
        h, w = self.shape
        rows = range(y0 // h, min(self.grid[1], -(-y1 // h)))
        cols = range(x0 // w, min(self.grid[2], -(-x1 // w)))
        return [(p, r, c) for p in planes for r in rows for c in cols]


def _read_spans(path: str, spans: Sequence[tuple[int, int]]) -> Iterator[bytes]:
    """The bytes of each (offset, length) of one file, one read each, each dropped once
    used: on a 366 MB SVS, 27,889 tiles read and summed one by one took 0.19-0.24 s; read
    in runs of 16 MB and sliced, 1.5 s; all kept until summed, 1.5 s (fresh pages for
    each). A file shorter than a span gives the bytes there are (its checksum differs)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        for offset, length in spans:
            yield os.pread(fd, length, offset)
    finally:
        os.close(fd)


class TileSums:
    """An in-place level's tiles checked by content: the CRC-32C of each of the slide's tiles
    (or strips) as its file stores them, recorded in the sidecar when it was made
    (`table`, shaped as the level's tile grid, `Segments.grid`), compared with the bytes
    read. A tile whose bytes differ is a ChunkError naming the slide, the level and the
    tile, and how to make the sidecar again (`changed`): its pixels are never given."""

    def __init__(self, segments: Segments, table: np.ndarray, where: str, sidecar: str) -> None:
        self.segments, self.table, self.where, self.sidecar = segments, table, where, sidecar

    def name(self, plane: int, row: int, col: int) -> str:
        """The tile as messages name it: (row, col), and its plane where the level has more."""
        kind = self.segments.kind
        return f"{kind} ({row}, {col})" + (f" of plane {plane}" if self.table.shape[0] > 1 else "")

    def changed(self, plane: int, row: int, col: int) -> ChunkError:
        """What a changed tile is: a ChunkError naming it and how to make the sidecar again."""
        return ChunkError(
            f"{self.where} {self.name(plane, row, col)} has changed since its sidecar "
            f"{self.sidecar} was made (its bytes' CRC-32C is not the one recorded); remove "
            "the sidecar to make it again from the slide as it is now (open_in_place)"
        )

    def check(self, plane: int, row: int, col: int, crc: int | None) -> None:
        """Nothing where `crc` (of the tile's bytes; None: the file stores none) is the one
        recorded for the tile; else `changed`."""
        expect = int(self.table[plane, row, col])
        if (UNWRITTEN if crc is None else crc) != expect:
            raise self.changed(plane, row, col)

    def check_stream(self, row: int, col: int, stream: bytes | None, own: int) -> None:
        """`check` of a JPEG tile as its level's reader gives it: its stream with the
        level's shared prefix (`own` bytes: SOI, tables) spliced in place of the file's SOI
        (`JpegTiles.read`), so the file's bytes are SOI and the stream from `own` on."""
        crc = None if stream is None else google_crc32c.extend(_SOI_CRC, stream[own:])
        self.check(0, row, col, crc)

    def check_read(self, coords: Sequence[tuple[int, int, int]]) -> None:
        """`check` of each tile (plane, row, col) of `coords`, read from the file now."""
        found = dict(self.segments.read_many(coords))
        for at in coords:
            data = found.get(at)
            self.check(*at, None if data is None else google_crc32c.value(data))

    def expected(self, row: int, col: int) -> int:
        """The CRC-32C recorded for JPEG tile (row, col) (`UNWRITTEN`: none stored)."""
        return int(self.table[0, row, col])

    def changed_tiles(self) -> list[tuple[int, int, int]]:
        """Every tile (plane, row, col) of the level whose bytes are not the ones recorded
        (every tile read)."""
        now = self.segments.sums()
        return [tuple(map(int, at)) for at in np.argwhere(now != self.table)]


_SOI_CRC = google_crc32c.value(b"\xff\xd8")  # what each tile's bytes in the file start with
