"""Whole-chunk access to a store level: encoded bytes out of the store, decoded to (h, w, c).

A chunk of a JPEG level is one complete JPEG stream, already interleaved (y, x, c), so it
decodes straight into the image layout readers want, without zarr's per-call machinery.
Encoded bytes are what a GPU decoder (nvJPEG) takes; the embedder streams them from here.
Local stores are read as files; any other zarr store through its own API, one batched call
per request (that is also how tests count exactly which chunks a read touched).

Every chunk read is checked (`tilestore.format.integrity`): its CRC-32C where the array records
one, its presence where the store promises every chunk was written, and its place where the
store records positions (`tilestore.format.positions`: the CRC-32C it ends with is the one
recorded for its position). A chunk that is missing, damaged, out of place or does not
decode is a ChunkError naming the store, level and chunk, never the fill value.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from pathlib import Path

import imagecodecs
import numpy as np
import zarr
from zarr.abc.store import RangeByteRequest, SuffixByteRequest
from zarr.codecs import Crc32cCodec, TransposeCodec
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync
from zarr.storage import LocalStore

from tilestore.cpus import usable_cpus
from tilestore.errors import ChunkError
from tilestore.format.codecs import (
    COLOR_SPACE_NAMES,
    coded_color_space,
    has_checksums,
    is_jpeg,
    whole_streams,
)
from tilestore.format.integrity import (
    UNWRITTEN,
    Location,
    read_chunks,
    read_ends,
    tied,
    unseal,
)
from tilestore.format.jpeg import TileFrame, as_declared, gpu_refusal
from tilestore.format.positions import Positions
from tilestore.format.shards import (
    ABSENT,
    ShardIndex,
    check_ranges,
    chunks_per_shard,
    index_bytes,
    index_checked,
    parse_index,
    split,
)

# `ChunkReader.read` decodes on threads, one per this many chunks (up to the CPUs): a
# region of a few chunks (the viewer's tiles) stays on the caller's thread
PARALLEL_CHUNKS = 8


class ChunkReader:
    """Fetch and decode the chunks (row, col) of one (c, y, x) level, all channels together.

    name: the store's name, for messages. every_chunk: the store was written with every
    chunk present (a chunk missing is damage); stores from before that promise read a
    missing chunk as the background. positions: the store records each chunk's CRC-32C by
    position (`tilestore.format.positions`): each chunk read is tied to its place.
    """

    def __init__(
        self,
        array: zarr.Array,
        background: int,
        name: str = "",
        every_chunk: bool = False,
        positions: bool = False,
    ) -> None:
        self.array = array
        self.background = background
        self.channels = array.shape[0]
        self.chunk_h, self.chunk_w = array.chunks[1:]
        self.grid = (-(-array.shape[1] // self.chunk_h), -(-array.shape[2] // self.chunk_w))
        self.checksum = has_checksums(array)
        self.every_chunk = every_chunk
        self.where = f"{name}: level {array.path}"
        self.is_jpeg = (
            is_jpeg(array.serializer)
            and whole_streams(array.serializer)
            and list(array.filters) == [TransposeCodec(order=(1, 2, 0))]
            and list(array.compressors) in ([], [Crc32cCodec()])
            and array.chunks[0] == array.shape[0]
        )
        self.color_space = coded_color_space(array.serializer) if self.is_jpeg else None
        # decoded as declared, as zarr's codec decodes it, not as the stream's markers say
        self.jpeg_colorspace = COLOR_SPACE_NAMES.get(self.color_space)
        store = array.store_path.store
        self._root = Path(store.root) if type(store) is LocalStore else None
        self._store = store
        # a level read in place from its slide (`tilestore.reading.inplace`): its tiles, fetched
        # directly rather than through the store's event loop (twice the regions/s)
        self._slide_tiles = getattr(store, "level_tiles", lambda path: None)(array.path)
        encoding = array.metadata.chunk_key_encoding
        plain = getattr(encoding, "separator", None) == "/" and type(encoding).__name__ == (
            "DefaultChunkKeyEncoding"
        )
        # Local files under the default key encoding: c/<plane>/<row>/<col>, read without
        # zarr; in a sharded level, byte ranges of c/<plane>/<shard row>/<shard col>
        self._files = f"{self._root / array.path}/c" if self._root and plain else None
        self.per_shard = chunks_per_shard(array)  # (c, y, x) inner chunks per shard
        self._remote_indexes: dict[str, np.ndarray | None] = {}  # other stores' shards
        self._shards = (
            ShardIndex(array, self._root / array.path, self.where)
            if self.per_shard is not None and self._root is not None
            else None
        )
        # the CRC-32C recorded for each chunk's position (none for a slide's own tiles)
        self._positions = (
            Positions(array, self.where)
            if positions and self.checksum and self._slide_tiles is None
            else None
        )

    def _key(self, coord: tuple[int, int, int]) -> str:
        """The store key of chunk (plane, row, col): of its shard, in a sharded level."""
        if self.per_shard is not None:
            coord = tuple(i // p for i, p in zip(coord, self.per_shard, strict=True))
        return f"{self.array.path}/{self.array.metadata.encode_chunk_key(coord)}"

    @property
    def frame(self) -> TileFrame | None:
        """For a level read in place from its slide's JPEG tiles: what a tile located by
        `locations` must be, spliced, to be its chunk (`TileFrame`); None for a store's own
        chunks, which are their streams as they are."""
        return getattr(self._slide_tiles, "frame", None)

    def chunk_name(self, coord: tuple[int, int]) -> str:
        """The chunk as messages name it: store, level and (row, col)."""
        return f"{self.where} chunk ({coord[0]}, {coord[1]})"

    def _name(self, coord: tuple[int, int, int]) -> str:
        """`chunk_name` of chunk (plane, row, col): (row, col) for plane 0, as always."""
        return self.chunk_name(coord[1:]) if coord[0] == 0 else f"{self.where} chunk {coord}"

    def locations(self, coords: Sequence[tuple[int, int]]) -> list[Location | None] | None:
        """Where each chunk's bytes are in a local store: its file, or its byte range of a
        shard (None for a chunk absent from its shard), with the CRC-32C recorded for its
        position where the store records them; for a level read in place, each tile's whole
        stream in the slide file (spliced into its chunk as `frame` says); None for other
        stores."""
        if self._slide_tiles is not None:  # a slide's own tiles: ranges of the slide file
            locate = getattr(self._slide_tiles, "locations", None)
            return None if locate is None else locate(coords)
        if self._root is None or (self._shards is None and self._files is None):
            return None
        coords3 = [(0, r, c) for r, c in coords]
        return self._locate(coords3, self._expected(coords3))

    def _locate(
        self, coords: Sequence[tuple[int, int, int]], expect: Sequence[int | None]
    ) -> list[Location | None]:
        if self._shards is not None:
            return self._shards.locate(coords, expect)
        if self._files is not None:
            files = self._files
            return [
                Location(f"{files}/{p}/{r}/{c}", 0, None, e)
                for (p, r, c), e in zip(coords, expect, strict=True)
            ]
        root = self._root
        return [
            Location(str(root / self._key(coord)), 0, None, e)
            for coord, e in zip(coords, expect, strict=True)
        ]

    def _expected(self, coords: Sequence[tuple[int, int, int]]) -> list[int | None]:
        """The CRC-32C recorded for each chunk's position (None each: the store has none)."""
        if self._positions is None:
            return [None] * len(coords)
        return self._positions.expected(coords)

    def gpu_refusal(self, sample: int = 3) -> str | None:
        """Why a GPU's JPEG decoder cannot take this level's chunks (not JPEG, not colour,
        or a frame it does not decode, judged on the headers of `sample` stored chunks read
        outward from the level's centre, a few at a time), or None where it can."""
        if not self.is_jpeg:
            return "its chunks are not JPEG"
        if self.channels != 3:
            return f"{self.channels} channels (the GPU decodes colour JPEG)"
        rows, cols = self.grid
        by_row = sorted(range(rows), key=lambda r: abs(r - rows // 2))[:5]
        by_col = sorted(range(cols), key=lambda c: abs(c - cols // 2))
        coords = [(r, c) for r in by_row for c in by_col]
        for start in range(0, len(coords), 8):  # tissue is often near the centre
            for data in self.fetch(coords[start : start + 8]):
                if data is None:
                    continue
                refusal = gpu_refusal(data)
                if refusal is not None:
                    return refusal
                sample -= 1
                if not sample:
                    return None
        return None

    def fetch_one(self, coord: tuple[int, int]) -> bytes | None:
        """The checked bytes of one chunk (None if never written and that is allowed)."""
        return self.fetch([coord])[0]

    def fetch(self, coords: Sequence[tuple[int, int]]) -> list[bytes | None]:
        """Return each chunk's encoded bytes, checked (CRC-32C stripped, tied to its position
        where the store records positions), None where a chunk was never written in a store
        that allows that; ChunkError where one is damaged or out of place."""
        if self._slide_tiles is not None:  # the slide's own tiles: no checksums to check
            return [
                self._checked(self._slide_tiles.chunk(r, c)[0], (0, r, c), None) for r, c in coords
            ]
        return self._stored([(0, r, c) for r, c in coords])

    def _stored(self, coords: Sequence[tuple[int, int, int]]) -> list[bytes | None]:
        """`fetch` of chunks (plane, row, col) stored in the store."""
        expect = self._expected(coords)
        names = [self._name(coord) for coord in coords]
        if self._root is not None:  # each tied to its position as it is read
            found = read_chunks(self._locate(coords, expect), names, required=self.every_chunk)
        else:
            found = self._fetch_inner(coords) if self.per_shard else self._fetch_whole(coords)
            for data, crc, name in zip(found, expect, names, strict=True):
                if data is not None and crc is not None:
                    tied(data, crc, name)
        return [
            self._checked(data, coord, crc)
            for data, coord, crc in zip(found, coords, expect, strict=True)
        ]

    def _fetch_whole(self, coords: Sequence[tuple[int, int, int]]) -> list[bytes | None]:
        """Chunks of a level of one object per chunk in a store other than local files."""
        keys = [self._key(coord) for coord in coords]
        proto = default_buffer_prototype()

        async def get_all():
            return await asyncio.gather(*(self._store.get(k, proto) for k in keys))

        return [None if b is None else b.to_bytes() for b in sync(get_all())]

    def _fetch_inner(self, coords: Sequence[tuple[int, int, int]]) -> list[bytes | None]:
        """Inner chunks of a sharded level in a store other than local files, through the
        store's byte ranges: each shard's index (read once), then each chunk."""
        proto = default_buffer_prototype()
        ranges = self._remote_ranges(coords)

        async def one(at: tuple[str, int, int] | None) -> bytes | None:
            if at is None:
                return None
            key, offset, length = at
            got = await self._store.get(key, proto, RangeByteRequest(offset, offset + length))
            return None if got is None else got.to_bytes()

        async def get_all():
            return await asyncio.gather(*(one(at) for at in ranges))

        return sync(get_all())

    def _remote_ranges(self, coords: Sequence[tuple[int, int, int]]) -> list:
        """(shard key, offset, length) of each chunk in a store other than local files (None:
        absent), the shards' indexes read once and kept."""
        proto = default_buffer_prototype()
        chunks, crc = math.prod(self.per_shard), index_checked(self.array)
        indexes = self._remote_indexes
        keys = [self._key(coord) for coord in coords]
        missing = sorted(set(keys) - indexes.keys())

        async def tails():
            size = SuffixByteRequest(index_bytes(chunks, crc))
            return await asyncio.gather(*(self._store.get(k, proto, size) for k in missing))

        for key, tail in zip(missing, sync(tails()) if missing else [], strict=True):
            where = f"{self.where} shard {key}"
            indexes[key] = (
                None
                if tail is None
                else check_ranges(parse_index(tail.to_bytes(), chunks, where, crc), where)
            )
        if not coords:
            return []
        _, inner = split(np.array(coords), self.per_shard)
        out = []
        for key, entry in zip(keys, inner.tolist(), strict=True):
            index = indexes[key]
            if index is None or index[entry, 0] == ABSENT:
                out.append(None)
            else:
                out.append((key, int(index[entry, 0]), int(index[entry, 1])))
        return out

    def _checked(
        self, data: bytes | None, coord: tuple[int, int, int], expect: int | None
    ) -> bytes | None:
        """A chunk's data, its CRC-32C checked; None where it was never written, which is
        damage where the store promises every chunk or records one at its position."""
        if data is None:
            if self.every_chunk or (expect is not None and expect != UNWRITTEN):
                raise ChunkError(f"{self._name(coord)}: chunk is missing")
            return None
        return unseal(data, self._name(coord)) if self.checksum else data

    def decode(self, data: bytes | None, coord: tuple[int, int] | None = None) -> np.ndarray:
        """Return a JPEG chunk's pixels as (chunk_h, chunk_w, c); background if absent."""
        out = np.empty((self.chunk_h, self.chunk_w, self.channels), np.uint8)
        self.decode_into(data, out, coord)
        return out

    def decode_into(
        self, data: bytes | None, out: np.ndarray, coord: tuple[int, int] | None = None
    ) -> None:
        """Decode a JPEG chunk into `out` (a contiguous (chunk_h, chunk_w, c) array)."""
        if data is None:
            out[...] = self.background
            return
        try:
            imagecodecs.jpeg8_decode(
                data,
                **as_declared(self.jpeg_colorspace),
                out=out.reshape(self.chunk_h, self.chunk_w, -1),
            )
        except (imagecodecs.Jpeg8Error, ValueError) as exc:
            where = self.chunk_name(coord) if coord is not None else f"{self.where} chunk"
            raise ChunkError(f"{where}: cannot decode: {exc}") from exc

    def load(
        self, coords: Sequence[tuple[int, int]], pool: Executor | None = None
    ) -> list[np.ndarray]:
        """Return each chunk's pixels as (chunk_h, chunk_w, c), background beyond the level.

        JPEG chunks are fetched in one batch and decoded (on `pool` if given); other
        codecs go through zarr, which decodes with the array's own codec chain.
        """
        mapper = pool.map if pool else map
        if self.is_jpeg:
            data = self.fetch(coords)
            return list(mapper(self.decode, data, coords))
        return list(mapper(self._zarr_chunk, coords))

    def _zarr_chunk(self, coord: tuple[int, int]) -> np.ndarray:
        r, c = coord
        ch, cw = self.chunk_h, self.chunk_w
        block = self._zarr_read(r * ch, (r + 1) * ch, c * cw, (c + 1) * cw)
        out = np.full((ch, cw, block.shape[0]), self.background, block.dtype)
        out[: block.shape[1], : block.shape[2]] = np.moveaxis(block, 0, -1)
        return out

    def _zarr_read(self, y0: int, y1: int, x0: int, x1: int) -> np.ndarray:
        """Pixels (c, y, x) through zarr, which checks each chunk's CRC-32C; a chunk missing
        where every chunk was written is a ChunkError (zarr would give the fill value). Where
        the store records positions, each chunk of every plane is first tied to its place
        (`_tie`: zarr cannot say which chunk it read from where)."""
        ch, cw = self.chunk_h, self.chunk_w
        coords = [
            (r, c)
            for r in range(y0 // ch, (min(y1, self.array.shape[1]) - 1) // ch + 1)
            for c in range(x0 // cw, (min(x1, self.array.shape[2]) - 1) // cw + 1)
        ]
        if self._positions is not None:
            planes = range(-(-self.array.shape[0] // self.array.chunks[0]))
            self._tie([(p, r, c) for p in planes for r, c in coords])
        elif self.every_chunk:
            for coord in coords:
                if not self._exists(coord):
                    raise ChunkError(f"{self.chunk_name(coord)}: chunk is missing")
        try:
            return self.array[:, y0:y1, x0:x1]
        except (ValueError, RuntimeError, OSError) as exc:  # a codec or checksum failing
            where = (
                self.chunk_name(coords[0])
                if len(coords) == 1
                else f"{self.where} chunks {coords[0]}-{coords[-1]}"
            )
            raise ChunkError(f"{where}: cannot decode: {exc}") from exc

    def _tie(self, coords: Sequence[tuple[int, int, int]]) -> None:
        """Each chunk's place checked by its last 4 bytes alone (`read_ends`: zarr reads it
        whole, its CRC-32C checked, to decode it); a chunk whose 4 bytes are not the ones
        recorded is read whole, to name its damage or its misplacement. In stores other than
        local files each chunk is read whole."""
        if self._root is None:
            self._stored(coords)
            return
        expect = self._expected(coords)
        names = [self._name(coord) for coord in coords]
        located = self._locate(coords, expect)
        ends = read_ends(located, names, required=self.every_chunk)
        for coord, end, crc in zip(coords, ends, expect, strict=True):
            if end is None:
                self._checked(None, coord, crc)  # absent: where one was written, missing
            elif int.from_bytes(end, "little") != crc:
                self._stored([coord])

    def _exists(self, coord: tuple[int, int]) -> bool:
        at = (0, *coord)
        if self._shards is not None:
            return self._shards.locate([at])[0] is not None
        if self.per_shard is not None:
            return self._remote_ranges([at])[0] is not None
        if self._root is not None:
            return (self._root / self._key(at)).exists()
        return sync(self._store.exists(self._key(at)))

    def read(self, y0: int, y1: int, x0: int, x1: int) -> np.ndarray:
        """Return pixels [y0:y1, x0:x1] (inside the level) as (h, w, c)."""
        if not self.is_jpeg:
            return np.moveaxis(self._zarr_read(y0, y1, x0, x1), 0, -1)
        ch, cw = self.chunk_h, self.chunk_w
        coords = [
            (r, c)
            for r in range(y0 // ch, (y1 - 1) // ch + 1)
            for c in range(x0 // cw, (x1 - 1) // cw + 1)
        ]
        out = np.empty((y1 - y0, x1 - x0, self.channels), np.uint8)

        def place(coord: tuple[int, int], data: bytes | None) -> None:
            r, c = coord
            chunk = self.decode(data, coord)
            ty0, tx0 = max(y0, r * ch), max(x0, c * cw)
            ty1, tx1 = min(y1, (r + 1) * ch), min(x1, (c + 1) * cw)
            out[ty0 - y0 : ty1 - y0, tx0 - x0 : tx1 - x0] = chunk[
                ty0 - r * ch : ty1 - r * ch, tx0 - c * cw : tx1 - c * cw
            ]

        found = self.fetch(coords)
        workers = min(usable_cpus(), len(coords) // PARALLEL_CHUNKS)
        if workers <= 1:
            for coord, data in zip(coords, found, strict=True):
                place(coord, data)
            return out
        # a whole level (a tissue mask's, a preview's): decoded on threads, which libjpeg
        # runs without the GIL, each chunk into its own part of `out`
        with ThreadPoolExecutor(workers, thread_name_prefix="tilestore-read") as pool:
            for _ in pool.map(place, coords, found):  # raises a chunk's error
                pass
        return out


class ChannelPick:
    """A level's reader that gives three of its channels as 8-bit RGB: each channel picked
    (`indices`) is scaled linearly from its (start, end) window to 0-255 and clipped. It
    reads like a ChunkReader of a non-JPEG level (`load`, `read`), so the CPU assembly path
    takes it; see `Slide.as_rgb`."""

    is_jpeg = False
    jpeg_colorspace = None
    color_space = None
    channels = 3

    def __init__(
        self, reader: ChunkReader, indices: Sequence[int], windows: Sequence[tuple[float, float]]
    ) -> None:
        self.reader = reader
        self.indices = list(indices)
        starts, ends = np.array(windows, np.float32).T
        self._start = starts
        self._scale = 255.0 / np.maximum(ends - starts, np.finfo(np.float32).tiny)
        self.chunk_h, self.chunk_w, self.grid = reader.chunk_h, reader.chunk_w, reader.grid
        self.where, self.checksum = reader.where, reader.checksum
        self.every_chunk = reader.every_chunk
        self.background = int(
            self._map(np.full((1, 1, reader.channels), reader.background))[0, 0, 0]
        )

    def locations(self, coords: Sequence[tuple[int, int]]) -> None:
        """None: the chunks must be decoded through the reader, not as JPEG files."""
        return None

    def chunk_name(self, coord: tuple[int, int]) -> str:
        return self.reader.chunk_name(coord)

    def _map(self, pixels: np.ndarray) -> np.ndarray:
        picked = pixels[..., self.indices].astype(np.float32)
        scaled = (picked - self._start) * self._scale
        return np.clip(np.rint(scaled), 0, 255).astype(np.uint8)

    def load(
        self, coords: Sequence[tuple[int, int]], pool: Executor | None = None
    ) -> list[np.ndarray]:
        """Each chunk's three picked channels as (chunk_h, chunk_w, 3) uint8."""
        return [self._map(chunk) for chunk in self.reader.load(coords, pool)]

    def read(self, y0: int, y1: int, x0: int, x1: int) -> np.ndarray:
        """Pixels [y0:y1, x0:x1] of the three picked channels as (h, w, 3) uint8."""
        return self._map(self.reader.read(y0, y1, x0, x1))
