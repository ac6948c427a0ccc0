"""A slide level's pixels as the chunks of a store array, for the copy path and for levels
read in place: its JPEG tiles as they are where they can be (`TileSource`), else its pixels
decoded under each chunk (`DecodedChunks`); `chunk_source` picks one of the two."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import zarr

from tilestore.errors import SlideError
from tilestore.format.codecs import encode_chunk
from tilestore.format.integrity import Location
from tilestore.sources import JpegTiles, Source, SourceLevel


def chunk_source(
    source: Source, index: int, array: zarr.Array, background: int, decoded: frozenset[int]
) -> TileSource | DecodedChunks:
    """A source level's pixels as the chunks of `array`: its JPEG tiles (`TileSource`), or
    decoded from the slide at each read (`DecodedChunks`)."""
    where = f"{source.path}: level {index}"
    level = source.levels[index]
    if index in decoded:
        return DecodedChunks(level, array, background)
    return TileSource(level.jpeg_tiles(), level, array.serializer, background, where)


class TileSource:
    """A level's source JPEG tiles as chunks of an array: the tile itself where its frame
    matches the level's (size, sampling, colour), else decoded and re-encoded with the
    array's codec, so every chunk stays valid for the codec the array declares; a tile absent
    from the source is a background chunk. A tile that is not a JPEG stream and cannot be
    decoded either is a SlideError naming it (`where` names the file and level)."""

    def __init__(
        self, tiles: JpegTiles, level: SourceLevel, codec: Any, background: int, where: str
    ) -> None:
        self.tiles, self.level, self.codec, self.where = tiles, level, codec, where
        self.background = background
        self.frame = tiles.frame  # what a tile must be to be its chunk as it is
        self._blank: bytes | None = None

    def _expected(self, data: bytes, own: bool = False) -> bool:
        return self.frame.fits(data, own=own)

    def locations(self, coords: Sequence[tuple[int, int]]) -> list[Location | None] | None:
        """Where each tile's whole stream is in the slide file (None: absent), for the decoder
        processes, which splice and check each as `chunk` does (`TileFrame.spliced`) and
        leave the others to it; None where the tiles are not byte ranges of a file."""
        locate = self.tiles.locate
        if locate is None:
            return None
        out = []
        for row, col in coords:
            at = locate(row, col)
            out.append(None if at is None else Location(*at))
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
        """The chunk's JPEG stream and whether it is the source tile as it was."""
        try:
            data = self.tiles.read(row, col)
            if data is None:  # absent in the source
                if self._blank is None:
                    th, tw = self.tiles.tile_shape
                    blank = np.full((th, tw, self.level.channels), self.background, np.uint8)
                    self._blank = encode_chunk(self.codec, blank)
                return self._blank, False
            if self._expected(data):
                return data, True
        except (ValueError, OSError) as exc:  # not a JPEG stream: decode it another way
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
