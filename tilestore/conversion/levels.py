"""Writing one store level: copy a slide's JPEG tiles as chunks (`TileSource` says what each
becomes), or stream bands through zarr.

Both writers keep memory bounded: the copy path holds one tile per thread, the
band path one band of chunk rows being encoded plus the next band being read.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import zarr

from tilestore.format.codecs import JpegCodec, has_checksums
from tilestore.format.integrity import seal
from tilestore.reading.source_chunks import TileSource
from tilestore.sources import JpegTiles, SourceLevel

Progress = Callable[[int], None]


def downsample2(image: np.ndarray) -> np.ndarray:
    """Return the 2x2 box average of an (h, w, c) image; odd edges repeat their last pixel."""
    h, w = image.shape[:2]
    if h % 2 or w % 2:
        image = np.pad(image, ((0, h % 2), (0, w % 2), (0, 0)), mode="edge")
    if image.dtype.kind == "f":
        return (image[0::2, 0::2] + image[1::2, 0::2] + image[0::2, 1::2] + image[1::2, 1::2]) / 4
    acc = image[0::2, 0::2].astype(np.uint32)
    acc += image[1::2, 0::2]
    acc += image[0::2, 1::2]
    acc += image[1::2, 1::2]
    return ((acc + 2) // 4).astype(image.dtype)


def write_bands(
    array: zarr.Array,
    read: Callable[[int, int], np.ndarray],
    progress: Progress,
) -> int:
    """Fill a (c, y, x) array band by band from read(y0, y1) -> (h, w, c); return chunks written.

    Each band is one row of chunks, so every chunk is written whole, once. The
    next band is read (decoded) while zarr encodes the current one on its threads.
    """
    _, height, width = array.shape
    band = array.chunks[1]
    per_band = -(-width // array.chunks[2])
    with ThreadPoolExecutor(1) as prefetch:
        pending = prefetch.submit(read, 0, min(band, height))
        for y0 in range(0, height, band):
            pixels = pending.result()
            y1 = min(y0 + band, height)
            if y1 < height:
                pending = prefetch.submit(read, y1, min(y1 + band, height))
            array[:, y0:y1, :] = np.moveaxis(pixels, -1, 0)
            progress(per_band)
    return per_band * -(-height // band)


def copy_tiles(
    array: zarr.Array,
    root: Path,
    tiles: JpegTiles,
    level: SourceLevel,
    codec: JpegCodec,
    background: int,
    workers: int,
    progress: Progress,
    where: str,
) -> tuple[int, int]:
    """Write each source JPEG tile as its chunk's bytes (`TileSource`); return (chunks
    copied, re-encoded). Every chunk is written, background ones too; with the array's
    checksums, each with its CRC-32C."""
    rows, cols = tiles.grid
    base = root / array.path
    finish = seal if has_checksums(array) else bytes
    chunk = TileSource(tiles, level, codec, background, where).chunk

    def copy_row(row: int) -> tuple[int, int]:
        copied = redone = 0
        row_dir = None
        for col in range(cols):
            data, verbatim = chunk(row, col)
            copied, redone = copied + verbatim, redone + (not verbatim)
            path = base / array.metadata.encode_chunk_key((0, row, col))
            if row_dir is None:
                row_dir = path.parent
                row_dir.mkdir(parents=True, exist_ok=True)
            path.write_bytes(finish(data))
        progress(cols)
        return copied, redone

    with ThreadPoolExecutor(workers) as pool:
        counts = list(pool.map(copy_row, range(rows)))
    return sum(c for c, _ in counts), sum(r for _, r in counts)
