"""Sidecars opened: a TIFF slide read in place through the store beside it (or in a folder the
user names), whose in-place levels' chunks are read from the slide file itself.

`open_sidecar` opens a sidecar that exists (`tilestore.conversion.open_in_place` makes it, the
one place one is made) and checks at every open that the slide is still the one it was made
from (`fingerprint`: SHA-256 of the slide's size and of every in-place level's shape, tile
size, tile offsets and byte counts; milliseconds to recompute), so a slide that changed, or
another slide under the same name, is never paired with another slide's tissue, plans or
features. Opening one writes nothing.

The fingerprint says the tiles are where they were, not that their bytes are: a tile
rewritten in place (same size) keeps it. So a sidecar also records the CRC-32C of each of its
in-place levels' tiles as the slide file stores them (`TILE_SUMS`: ``tile_crc32c/<level>``, one
small uint64 array shaped as the level's tile grid, `source_chunks.Segments`; computed by
`tile_sums` when the sidecar is made, beside its SHA-256), and its record says so
(``source.tile_crc32c``); every read checks each tile's bytes against it
(`source_chunks.TileSums`), and `tilestore verify` checks every tile. A sidecar made before
has none: it reads as it did, by its fingerprint alone, and `info` and `verify` say its
tiles are not checked by content.

`TiffTiles` wraps the sidecar's own store: keys of in-place levels' chunks are answered from
the slide (`tilestore.reading.source_chunks.TileSource` for JPEG tiles that are chunks as they are,
`DecodedChunks` for levels decoded at each read); every other key is the sidecar's.
`fingerprint` says whether a slide is still the one a sidecar was made from.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import zarr
from zarr.abc.store import ByteRequest
from zarr.core.buffer import Buffer, BufferPrototype
from zarr.storage import LocalStore, WrapperStore

from tilestore.errors import ChunkError, StoreError
from tilestore.format.codecs import zstd_codecs
from tilestore.format.integrity import UNWRITTEN
from tilestore.format.records import TileSumsRecord, attrs_of, find_record
from tilestore.format.store import DAMAGED, is_store, open_store
from tilestore.reading.slide import Slide, slide_of
from tilestore.reading.source_chunks import Segments, TileSums, chunk_source
from tilestore.sources import open_source

if TYPE_CHECKING:
    import os

    from tilestore.reading.source_chunks import DecodedChunks, TileSource
    from tilestore.sources import Source

SUFFIX = ".tilestore.zarr"
TILE_SUMS = "tile_crc32c"  # tile_crc32c/<level>: an in-place level's tiles' CRC-32C, by tile
# what a sidecar's record says (``source.tile_crc32c``) where it keeps them
TILE_SUMS_SAID = (
    f"{TILE_SUMS}/<level> of each in-place level: the CRC-32C of each of the slide's tiles "
    "(or strips) as its file stores them, by tile"
)


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


def fingerprint(source: Source, levels: Iterable[int]) -> str:
    """SHA-256 of the slide's size and each given level's shape, tile size and tile index."""
    digest = hashlib.sha256(str(source.size()).encode())
    for index in sorted(levels):
        level = source.levels[index]
        digest.update(f"{index}:{level.shape}:{level.tile_shape}".encode())
        page = getattr(level, "page", None)  # a TIFF level: its tiles' offsets and sizes
        if page is not None:
            digest.update(np.asarray(page.dataoffsets, np.uint64).tobytes())
            digest.update(np.asarray(page.databytecounts, np.uint64).tobytes())
    return digest.hexdigest()


class LevelSums(NamedTuple):
    """What a sidecar records of an in-place level's bytes: each tile's CRC-32C, shaped as
    its tile grid (`Segments.sums`), and its tables' (`Segments.tables_crc`)."""

    tiles: np.ndarray
    tables: int


def tile_sums(source: Source, levels: Iterable[int]) -> dict[int, LevelSums]:
    """What a sidecar records of each given level of a TIFF slide (`LevelSums`), as its
    file stores them now."""
    out = {}
    for index in sorted(levels):
        segments = Segments.of(source.levels[index])
        out[index] = LevelSums(segments.sums(), segments.tables_crc)
    return out


def record_tile_sums(group: zarr.Group, sums: dict[int, LevelSums]) -> None:
    """Write each level's sums (`tile_sums`) into a sidecar being made, as
    ``tile_crc32c/<level>`` (its tables' CRC-32C an attribute); the caller records
    `TILE_SUMS_SAID` in its source facts."""
    for index, (table, tables) in sums.items():
        zarr.create_array(
            group.store_path.store,
            name=f"{TILE_SUMS}/{index}",
            data=np.asarray(table, np.uint64),
            chunks=table.shape,  # one file: a level's tile grid is small
            fill_value=UNWRITTEN,
            attributes=attrs_of(
                TileSumsRecord.make(
                    f"{TILE_SUMS}/{index}",
                    tile_crc32c_of=str(index),
                    unwritten=UNWRITTEN,
                    tables_crc32c=int(tables),
                )
            ),
            **zstd_codecs(),
        )


def _read_tile_sums(
    group: zarr.Group, index: int, segments: Segments, sidecar: Path, slide: Path
) -> np.ndarray:
    """Level `index`'s recorded tile sums, its tables checked against the slide's now; a
    ChunkError naming them where they are missing, damaged or not shaped as the slide's
    tile grid, or naming the level where its tables changed."""
    path, where = f"{TILE_SUMS}/{index}", f"{sidecar}: level {index}"
    fix = "remove the sidecar to make it again"
    try:
        array = zarr.open_array(group.store_path.store, path=path, mode="r", zarr_format=3)
        table = array[...]
        record = find_record(array, TileSumsRecord)  # damaged or absent: None, said below
        tables = int(record.tables_crc32c)  # type: ignore[union-attr,arg-type]
    except (FileNotFoundError, zarr.errors.NodeNotFoundError):
        raise ChunkError(
            f"{where}: its tiles' checksums ({path}) are missing, though the sidecar says it "
            f"records them; {fix}"
        ) from None
    except (*DAMAGED, OSError) as exc:
        raise ChunkError(
            f"{where}: its tiles' checksums ({path}) are damaged ({type(exc).__name__}: "
            f"{' '.join(str(exc).split())}); {fix}"
        ) from exc
    if table.dtype != np.uint64 or table.shape != segments.grid:
        raise ChunkError(
            f"{where}: its tiles' checksums ({path}) are {table.dtype} {table.shape}, not "
            f"uint64 {segments.grid} as the slide's tiles; {fix}"
        )
    if tables != segments.tables_crc:
        raise ChunkError(
            f"{slide}: level {index}: its JPEG tables (what every tile is decoded with) have "
            f"changed since its sidecar {sidecar} was made; {fix} from the "
            "slide as it is now (open_in_place)"
        )
    return table


def sidecar_for(slide: str | os.PathLike, sidecars: str | os.PathLike | None = None) -> Path:
    """Where a slide's sidecar is: `<name>.tilestore.zarr` in `sidecars`, else beside the slide
    (slide archives on clusters are often read-only: name a folder of your own)."""
    slide = Path(slide)
    return (Path(sidecars) if sidecars is not None else slide.parent) / (slide.name + SUFFIX)


def open_sidecar(
    slide: str | os.PathLike | None,
    sidecars: str | os.PathLike | None = None,
    *,
    store: str | os.PathLike | None = None,
) -> Slide:
    """A slide read in place, as a `Slide`: its existing sidecar (at `store`, else
    `sidecar_for(slide, sidecars)`) with the in-place levels read from the slide (None: the
    slide the sidecar records). Writes nothing; a missing sidecar is a StoreError saying how
    to make one. The slide's file stays open with the `Slide` (`Slide.source`)."""
    target = Path(store) if store is not None else sidecar_for(slide, sidecars)
    if not is_store(target):
        raise StoreError(
            f"{slide}: no sidecar at {target}; read it in place with "
            "tilestore.open_in_place (which makes one) or convert it"
        )
    group, record = open_store(target)
    recorded = record.source
    if not recorded.sidecar:
        raise StoreError(f"{target}: a converted store, not a slide's sidecar")
    slide = Path(slide) if slide is not None else Path(recorded.path or "")
    if not slide.is_file():
        raise StoreError(
            f"{target}: reads its levels from {slide}, which is not there (moved?); give the "
            "slide's path (tilestore.open_in_place)"
        )
    source = open_source(slide)
    try:
        levels = list(recorded.in_place)
        if fingerprint(source, levels) != recorded.fingerprint:
            raise StoreError(
                f"{slide}: not the slide its sidecar {target} was made from "
                f"({recorded.path}, {recorded.size} bytes): it has changed "
                "since; remove the sidecar to make it again"
            )
        background, decoded = record.background, frozenset(recorded.decoded)
        sources = {}
        for i in levels:
            sums = None
            if recorded.tile_sums:  # else made before: its tiles are trusted by the fingerprint
                where = f"{slide}: level {i}"
                segments = Segments.of(source.levels[i])
                table = _read_tile_sums(group, i, segments, target, slide)
                sums = TileSums(segments, table, where, str(target))
            sources[str(i)] = chunk_source(source, i, group[str(i)], background, decoded, sums)
        opened = slide_of(TiffTiles(LocalStore(target, read_only=True), sources))
    except BaseException:
        source.close()
        raise
    opened.name, opened.source = slide.name, source  # its file stays open with it
    return opened
