"""TIFF slides read in place: a sidecar OME-Zarr whose source levels are the slide's own tiles.

`open_slide("slide.svs")` makes `slide.svs.tilestore.zarr` beside the slide the first time
(`convert(..., in_place=True)`; or at `store=`): the store's metadata and the coarse levels
conversion adds are written, but the source levels whose JPEG tiles can be chunks as they
are stay in the slide and are read from it, tile by tile, through `TiffTiles`. Everything
tissue, plan and embed write goes into the sidecar, so the slide itself is never written.

The sidecar records the slide's path, size and fingerprint (SHA-256 of its size and of every
in-place level's shape, tile size, tile offsets and byte counts: milliseconds to recompute),
checked at every open: a slide that changed, or another slide under the same name, is
refused, never paired with another slide's tissue, plans or features.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
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
    from tilestore.slide import Slide
    from tilestore.sources import Source

SUFFIX = ".tilestore.zarr"


def sidecar_for(slide: str | os.PathLike) -> Path:
    """Where a slide's sidecar goes by default: beside it, `<name>.tilestore.zarr`."""
    slide = Path(slide)
    return slide.with_name(slide.name + SUFFIX)


class TiffTiles(WrapperStore):
    """A sidecar's store: the chunks of in-place levels come from the slide's tiles (`sources`:
    level path -> `TileSource`); every other key is the sidecar's own."""

    def __init__(self, store: LocalStore, sources: dict[str, TileSource] | None = None) -> None:
        super().__init__(store)
        self.sources = sources if sources is not None else {}

    def _with_store(self, store: LocalStore) -> TiffTiles:
        return type(self)(store, self.sources)

    @property
    def root(self) -> Path:
        """The sidecar's folder (where lock files and derived data go)."""
        return self._store.root

    def _tile(self, key: str) -> tuple[TileSource, int, int] | None:
        parts = key.split("/")  # <level>/c/0/<row>/<col>
        if len(parts) != 5 or parts[1] != "c" or parts[0] not in self.sources:
            return None
        source = self.sources[parts[0]]
        row, col = int(parts[3]), int(parts[4])
        rows, cols = source.tiles.grid
        return (source, row, col) if 0 <= row < rows and 0 <= col < cols else None

    async def get(
        self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None
    ) -> Buffer | None:
        tile = self._tile(key)
        if tile is None:
            return await self._store.get(key, prototype, byte_range)
        if byte_range is not None:
            raise StoreError(f"{key}: a slide's tile is read whole, not by byte range")
        source, row, col = tile
        data, _ = await asyncio.to_thread(source.chunk, row, col)
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


def open_in_place(slide: str | os.PathLike, store: str | os.PathLike | None = None) -> Slide:
    """The slide as a `Slide`, its sidecar made the first time (at `store`, else beside it)."""
    from tilestore.conversion import convert, tile_source
    from tilestore.slide import open_slide
    from tilestore.sources import open_source
    from tilestore.store import is_store, open_store

    slide = Path(slide)
    target = Path(store) if store is not None else sidecar_for(slide)
    if not is_store(target):
        convert(slide, target, in_place=True)
    group, attrs = open_store(target)
    recorded = attrs.get("source", {})
    if "fingerprint" not in recorded:
        raise StoreError(f"{target}: a converted store, not a sidecar of {slide.name}")
    source = open_source(slide)
    try:
        levels = [int(i) for i in recorded.get("in_place", [])]
        if fingerprint(source, levels) != recorded["fingerprint"]:
            raise StoreError(
                f"{slide}: not the slide its sidecar {target} was made from "
                f"({recorded.get('path')}, {recorded.get('size')} bytes): it has changed "
                "since; remove the sidecar to make it again"
            )
        background = attrs.get("background", 255)
        sources = {str(i): tile_source(source, i, group[str(i)], background) for i in levels}
    except BaseException:
        source.close()
        raise
    opened = open_slide(TiffTiles(LocalStore(target, read_only=True), sources))
    opened.name, opened.source = slide.name, source  # the slide's files stay open with it
    return opened
