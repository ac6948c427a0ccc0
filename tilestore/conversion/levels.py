"""Writing one store level: copy a slide's JPEG tiles as chunks (`TileSource` says what each
becomes), or stream blocks through zarr.

Both writers keep memory bounded: the copy path holds one shard's tiles per thread, the
block path one shard (or row of chunks) being encoded plus the next being read.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import google_crc32c
import numpy as np
import zarr

from tilestore.conversion.loss import Loss
from tilestore.format import positions
from tilestore.format.codecs import has_checksums
from tilestore.format.integrity import UNWRITTEN, seal
from tilestore.format.shards import chunks_per_shard, index_checked, pack_parts, write_atomic
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


def write_blocks(
    array: zarr.Array,
    read: Callable[[int, int, int, int], np.ndarray],
    progress: Progress,
    loss: Loss | None = None,
) -> int:
    """Fill a (c, y, x) array block by block from read(y0, y1, x0, x1) -> (h, w, c); return
    the chunks written. With `loss`, its sampled chunks are read back as each block is
    written and compared with the block's pixels (a lossy codec's PSNR).
    With the array's checksums, its positions are recorded from what zarr wrote
    (`tilestore.format.positions.read_back`: shard indexes and 4 bytes a chunk).

    A block is one shard (so zarr writes each shard whole, once, and renames it into place),
    or in an array of one file per chunk one row of chunks. The next block is read (decoded)
    while zarr encodes the current one on its threads.
    """
    _, height, width = array.shape
    chunk_h, chunk_w = array.chunks[1:]
    block_h, block_w = array.shards[1:] if array.shards else (chunk_h, width)
    blocks = [
        (y0, min(y0 + block_h, height), x0, min(x0 + block_w, width))
        for y0 in range(0, height, block_h)
        for x0 in range(0, width, block_w)
    ]
    with ThreadPoolExecutor(1) as prefetch:
        pending = prefetch.submit(read, *blocks[0])
        for i, (y0, y1, x0, x1) in enumerate(blocks):
            pixels = pending.result()
            if i + 1 < len(blocks):
                pending = prefetch.submit(read, *blocks[i + 1])
            array[:, y0:y1, x0:x1] = np.moveaxis(pixels, -1, 0)
            if loss is not None:
                loss.measure(array, y0, x0, pixels)
            progress(-(-(y1 - y0) // chunk_h) * -(-(x1 - x0) // chunk_w))
    if has_checksums(array):
        positions.record(array, positions.read_back(array, str(array.store_path)))
    return -(-height // chunk_h) * -(-width // chunk_w)


def copy_tiles(
    array: zarr.Array,
    root: Path,
    tiles: JpegTiles,
    level: SourceLevel,
    codec: Any,
    background: int,
    workers: int,
    progress: Progress,
    where: str,
) -> tuple[int, int]:
    """Write each source JPEG tile as its chunk's bytes (`TileSource`); return (chunks
    copied, re-encoded). Every chunk is written, background ones too; with the array's
    checksums, each with its CRC-32C, and the level's positions recorded from them
    (`tilestore.format.positions`). In a sharded array each shard is packed and written
    whole (`tilestore.format.shards`), else each chunk is a file."""
    rows, cols = tiles.grid
    base = root / array.path
    checksums = has_checksums(array)
    finish = seal if checksums else bytes
    source = TileSource(tiles, level, codec, background, where)
    chunk = source.chunk
    key = array.metadata.encode_chunk_key
    per = None if array.shards is None else chunks_per_shard(array)[1:]
    crcs = np.full((rows, cols), UNWRITTEN, np.uint64)  # each chunk's, by position

    def one(row: int, col: int, counts: list[int]) -> bytes | None:
        """The chunk's bytes as stored; counts[0] or [1] +1 as it was copied or re-encoded."""
        if row >= rows or col >= cols:
            return None  # beyond the level, in its last shards: absent
        data, verbatim = chunk(row, col)
        counts[0 if verbatim else 1] += 1
        return finish(data)

    def copy_row(row: int) -> list[int]:
        counts = [0, 0]
        for col in range(cols):
            path = base / key((0, row, col))
            if col == 0:
                path.parent.mkdir(parents=True, exist_ok=True)
            data = one(row, col, counts)
            path.write_bytes(data)
            crcs[row, col] = positions.crcs_of([data])[0]
        progress(cols)
        return counts

    prefix = source.tiles.prefix  # what each copied tile's chunk starts with
    prefix_crc = google_crc32c.value(prefix)

    def copied(own: bytes) -> tuple[bytes, ...]:
        """A tile's chunk as its parts: the level's prefix, its own bytes (and its CRC-32C,
        carried on from the prefix's: the chunk is never put together to be checksummed)."""
        if not checksums:
            return prefix, own
        return prefix, own, struct.pack("<I", google_crc32c.extend(prefix_crc, own))

    def copy_shard(shard: tuple[int, int]) -> list[int]:
        (per_r, per_c), counts, inner = per, [0, 0], []
        first, end = shard[1] * per_c, (shard[1] + 1) * per_c
        for row in range(shard[0] * per_r, (shard[0] + 1) * per_r):
            if row >= rows:
                inner += [None] * per_c  # beyond the level, in its last shards: absent
                continue
            owns = source.copied(row, first, min(end, cols)) + [None] * max(0, end - cols)
            for col, own in zip(range(first, end), owns, strict=True):
                if own is None:
                    inner.append(one(row, col, counts))
                else:
                    counts[0] += 1
                    inner.append(copied(own))
        write_atomic(base / key((0, *shard)), pack_parts(inner, index_checked(array)))
        block = crcs[shard[0] * per_r : (shard[0] + 1) * per_r, first:end]
        packed = positions.crcs_of(inner).reshape(per_r, per_c)
        block[...] = packed[: block.shape[0], : block.shape[1]]  # the level's, not beyond
        progress(sum(counts))
        return counts

    with ThreadPoolExecutor(workers) as pool:
        if per is None:
            counts = list(pool.map(copy_row, range(rows)))
        else:
            grid = [(r, c) for r in range(-(-rows // per[0])) for c in range(-(-cols // per[1]))]
            counts = list(pool.map(copy_shard, grid))
    if checksums:
        positions.record(array, crcs[None])
    return sum(c for c, _ in counts), sum(r for _, r in counts)
