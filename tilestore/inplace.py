"""The chunks of a sidecar store's in-place levels, read from the slide file itself.

`TiffTiles` wraps the sidecar's own store: keys of in-place levels' chunks are answered from
the slide (`tilestore.levels.TileSource` for JPEG tiles that are chunks as they are,
`DecodedChunks` for levels decoded at each read); every other key is the sidecar's.
`fingerprint` says whether a slide is still the one a sidecar was made from.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from zarr.abc.store import ByteRequest
from zarr.core.buffer import Buffer, BufferPrototype
from zarr.storage import LocalStore, WrapperStore

from tilestore.errors import StoreError

if TYPE_CHECKING:
    from tilestore.levels import TileSource
    from tilestore.sources import Source, SourceLevel


class TiffTiles(WrapperStore):
    """A sidecar's store: the chunks of in-place levels come from the slide's tiles (`sources`:
    level path -> `TileSource`); every other key is the sidecar's own."""

    def __init__(self, store: LocalStore, sources: dict[str, TileSource] | None = None) -> None:
        super().__init__(store)
        self.sources = sources if sources is not None else {}

    def _with_store(self, store: LocalStore) -> TiffTiles:
        return type(self)(store, self.sources)

    def level_tiles(self, path: str) -> TileSource | DecodedChunks | None:
        """The chunks of level `path` where it is read from the slide, else None."""
        return self.sources.get(path)

    @property
    def root(self) -> Path:
        """The sidecar's folder (where lock files and derived data go)."""
        return self._store.root

    def _tile(self, key: str) -> tuple[TileSource | DecodedChunks, int, int, int] | None:
        parts = key.split("/")  # <level>/c/<plane>/<row>/<col>
        if len(parts) != 5 or parts[1] != "c" or parts[0] not in self.sources:
            return None
        source = self.sources[parts[0]]
        plane, row, col = int(parts[2]), int(parts[3]), int(parts[4])
        rows, cols = source.grid
        return (source, plane, row, col) if 0 <= row < rows and 0 <= col < cols else None

    async def get(
        self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None
    ) -> Buffer | None:
        tile = self._tile(key)
        if tile is None:
            return await self._store.get(key, prototype, byte_range)
        if byte_range is not None:
            raise StoreError(f"{key}: a slide's tile is read whole, not by byte range")
        source, plane, row, col = tile
        data, _ = await asyncio.to_thread(source.chunk, row, col, plane)
        return prototype.buffer.from_bytes(data)

    async def get_partial_values(
        self, prototype: BufferPrototype, key_ranges: Iterable[tuple[str, ByteRequest | None]]
    ) -> list[Buffer | None]:
        return [await self.get(key, prototype, byte_range) for key, byte_range in key_ranges]

    async def exists(self, key: str) -> bool:
        return self._tile(key) is not None or await self._store.exists(key)

    async def set(self, key: str, value: Buffer) -> None:
        if self._tile(key) is not None:
            raise StoreError(f"{key}: a slide read in place is never written")
        await self._store.set(key, value)


class DecodedChunks:
    """A source level that is not JPEG tiles (NDPI strips, LZW, 16-bit channels) as the raw
    chunks of an uncompressed (c, y, x) array: each read decodes the slide's pixels under
    the chunk through its reader, exactly, and pads the edge with the background."""

    def __init__(self, level: SourceLevel, array, background: int) -> None:
        self.level, self.background = level, background
        self.chunk_shape = tuple(array.chunks)
        self.dtype = np.dtype(array.dtype).newbyteorder("<")
        _, h, w = array.shape
        self.grid = (-(-h // self.chunk_shape[1]), -(-w // self.chunk_shape[2]))

    def chunk(self, row: int, col: int, plane: int = 0) -> tuple[bytes, bool]:
        depth, th, tw = self.chunk_shape
        (h, w), y0, x0 = self.level.shape, row * th, col * tw
        pixels = self.level.read(y0, min(y0 + th, h), x0, min(x0 + tw, w))
        block = np.full((depth, th, tw), self.background, self.dtype)
        planes = pixels[..., plane * depth : (plane + 1) * depth]
        block[:, : pixels.shape[0], : pixels.shape[1]] = np.moveaxis(planes, -1, 0)
        return block.tobytes(), False


def fingerprint(source: Source, levels: Iterable[int]) -> str:
    """SHA-256 of the slide's size and each given level's shape, tile size and tile index."""
    digest = hashlib.sha256(str(sum(f.stat().st_size for f in source.files)).encode())
    for index in sorted(levels):
        level = source.levels[index]
        digest.update(f"{index}:{level.shape}:{level.tile_shape}".encode())
        page = getattr(level, "page", None)  # a TIFF level: its tiles' offsets and sizes
        if page is not None:
            digest.update(np.asarray(page.dataoffsets, np.uint64).tobytes())
            digest.update(np.asarray(page.databytecounts, np.uint64).tobytes())
    return digest.hexdigest()
