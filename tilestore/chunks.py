"""Whole-chunk access to a store level: encoded bytes out of the store, decoded to (h, w, c).

A chunk of a JPEG level is one complete JPEG stream, already interleaved (y, x, c), so it
decodes straight into the image layout readers want, without zarr's per-call machinery.
Encoded bytes are what a GPU decoder (nvJPEG) takes; the embedder streams them from here.
Local stores are read as files; any other zarr store through its own API, one batched call
per request (that is also how tests count exactly which chunks a read touched).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from concurrent.futures import Executor
from pathlib import Path

import imagecodecs
import numpy as np
import zarr
from zarr.codecs import TransposeCodec
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync
from zarr.storage import LocalStore

from tilestore.codecs import JpegCodec


class ChunkReader:
    """Fetch and decode the chunks (row, col) of one (c, y, x) level, all channels together."""

    def __init__(self, array: zarr.Array, background: int) -> None:
        self.array = array
        self.background = background
        self.channels = array.shape[0]
        self.chunk_h, self.chunk_w = array.chunks[1:]
        self.grid = (-(-array.shape[1] // self.chunk_h), -(-array.shape[2] // self.chunk_w))
        self.is_jpeg = (
            isinstance(array.serializer, JpegCodec)
            and list(array.filters) == [TransposeCodec(order=(1, 2, 0))]
            and not array.compressors
            and array.chunks[0] == array.shape[0]
        )
        self.color_space = array.serializer.encoded_color_space if self.is_jpeg else None
        store = array.store_path.store
        self._root = Path(store.root) if type(store) is LocalStore else None
        self._store = store
        encoding = array.metadata.chunk_key_encoding
        plain = getattr(encoding, "separator", None) == "/" and type(encoding).__name__ == (
            "DefaultChunkKeyEncoding"
        )
        # Local files under the default key encoding: c/0/<row>/<col>, read without zarr.
        self._files = f"{self._root / array.path}/c/0" if self._root and plain else None

    def key(self, row: int, col: int) -> str:
        """Return the store key of chunk (row, col)."""
        return f"{self.array.path}/{self.array.metadata.encode_chunk_key((0, row, col))}"

    def paths(self, coords: Sequence[tuple[int, int]]) -> list[str] | None:
        """File paths of chunks in a local store (None for other stores)."""
        if self._files is None:
            return None
        return [f"{self._files}/{r}/{c}" for r, c in coords]

    def fetch_one(self, coord: tuple[int, int]) -> bytes | None:
        """The encoded bytes of one chunk (None if never written)."""
        if self._files is not None:
            return _read_file(f"{self._files}/{coord[0]}/{coord[1]}")
        return self.fetch([coord])[0]

    def fetch(self, coords: Sequence[tuple[int, int]]) -> list[bytes | None]:
        """Return the encoded bytes of each chunk, None where the chunk was never written."""
        if self._files is not None:
            return [_read_file(f"{self._files}/{r}/{c}") for r, c in coords]
        keys = [self.key(r, c) for r, c in coords]
        if self._root is not None:
            return [_read_file(self._root / k) for k in keys]
        proto = default_buffer_prototype()

        async def get_all():
            return await asyncio.gather(*(self._store.get(k, proto) for k in keys))

        return [None if b is None else b.to_bytes() for b in sync(get_all())]

    def decode(self, data: bytes | None) -> np.ndarray:
        """Return a JPEG chunk's pixels as (chunk_h, chunk_w, c); background if absent."""
        if data is None:
            return np.full((self.chunk_h, self.chunk_w, self.channels), self.background, np.uint8)
        image = imagecodecs.jpeg8_decode(data)
        return image.reshape(self.chunk_h, self.chunk_w, self.channels)

    def load(
        self, coords: Sequence[tuple[int, int]], pool: Executor | None = None
    ) -> list[np.ndarray]:
        """Return each chunk's pixels as (chunk_h, chunk_w, c), background beyond the level.

        JPEG chunks are fetched in one batch and decoded (on `pool` if given); other
        codecs go through zarr, which decodes with the array's own codec chain.
        """
        if self.is_jpeg:
            data = self.fetch(coords)
            return list(pool.map(self.decode, data)) if pool else [self.decode(d) for d in data]
        mapper = pool.map if pool else map
        return list(mapper(self._zarr_chunk, coords))

    def _zarr_chunk(self, coord: tuple[int, int]) -> np.ndarray:
        r, c = coord
        ch, cw = self.chunk_h, self.chunk_w
        block = self.array[:, r * ch : (r + 1) * ch, c * cw : (c + 1) * cw]
        out = np.full((ch, cw, block.shape[0]), self.background, block.dtype)
        out[: block.shape[1], : block.shape[2]] = np.moveaxis(block, 0, -1)
        return out

    def decode_into(self, data: bytes | None, out: np.ndarray) -> None:
        """Decode a JPEG chunk into `out` (a contiguous (chunk_h, chunk_w, c) array)."""
        if data is None:
            out[...] = self.background
        else:
            imagecodecs.jpeg8_decode(data, out=out.reshape(self.chunk_h, self.chunk_w, -1))

    def read(self, y0: int, y1: int, x0: int, x1: int) -> np.ndarray:
        """Return pixels [y0:y1, x0:x1] (inside the level) as (h, w, c)."""
        if not self.is_jpeg:
            return np.moveaxis(self.array[:, y0:y1, x0:x1], 0, -1)
        ch, cw = self.chunk_h, self.chunk_w
        coords = [
            (r, c)
            for r in range(y0 // ch, (y1 - 1) // ch + 1)
            for c in range(x0 // cw, (x1 - 1) // cw + 1)
        ]
        out = np.empty((y1 - y0, x1 - x0, self.channels), np.uint8)
        for (r, c), data in zip(coords, self.fetch(coords), strict=True):
            chunk = self.decode(data)
            ty0, tx0 = max(y0, r * ch), max(x0, c * cw)
            ty1, tx1 = min(y1, (r + 1) * ch), min(x1, (c + 1) * cw)
            out[ty0 - y0 : ty1 - y0, tx0 - x0 : tx1 - x0] = chunk[
                ty0 - r * ch : ty1 - r * ch, tx0 - c * cw : tx1 - c * cw
            ]
        return out


def _read_file(path: str | Path) -> bytes | None:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except FileNotFoundError:
        return None
