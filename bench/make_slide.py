"""Build a large Aperio-style SVS from real tissue: CMU-1-Small-Region's JPEG tiles, tiled out.

Level 0 reuses the source tiles' JPEG bytes and JPEGTables unchanged (RGB, Q=30, as Aperio
writes them), so the copy path meets exactly what it meets in real SVS files. Levels 1 and 2
(4x, 16x, as Aperio pyramids) are box-downsampled from the same mosaic and JPEG-encoded.

    python bench/make_slide.py bench/data/large.svs --size 40000
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import imagecodecs
import numpy as np
import tifffile

DATA = Path(os.environ.get("TILESTORE_DATA", Path(__file__).resolve().parents[2] / "shared/data"))
CMU = DATA / "slides" / "CMU-1-Small-Region.svs"
TILE = 240
MPP = 0.499


def _source_tiles() -> tuple[list[list[bytes]], bytes, np.ndarray]:
    """Return CMU-1's full interior tiles (12 rows x 9 cols) as raw bytes, its tables, pixels."""
    with tifffile.TiffFile(CMU) as tif:
        page = tif.pages[0]
        per_row = -(-page.imagewidth // TILE)
        rows, cols = page.imagelength // TILE, page.imagewidth // TILE
        fh = tif.filehandle
        tiles = []
        for r in range(rows):
            row = []
            for c in range(cols):
                i = r * per_row + c
                fh.seek(page.dataoffsets[i])
                row.append(fh.read(page.databytecounts[i]))
            tiles.append(row)
        pixels = page.asarray()[: rows * TILE, : cols * TILE]
        return tiles, page.jpegtables, pixels


def _box(image: np.ndarray, factor: int) -> np.ndarray:
    h, w = image.shape[0] // factor * factor, image.shape[1] // factor * factor
    blocks = image[:h, :w].reshape(h // factor, factor, w // factor, factor, 3)
    return blocks.mean(axis=(1, 3)).round().astype(np.uint8)


def _encoded_level(period: np.ndarray, size: int):
    """Yield JPEG tiles of a size x size image that repeats `period`."""
    ph, pw = period.shape[:2]
    reps = (-(-size // ph) + 1, -(-size // pw) + 1, 1)
    big = np.tile(period, reps)[:size, :size]
    for y in range(0, size, TILE):
        for x in range(0, size, TILE):
            tile = np.zeros((TILE, TILE, 3), np.uint8)
            part = big[y : y + TILE, x : x + TILE]
            tile[: part.shape[0], : part.shape[1]] = part
            yield imagecodecs.jpeg8_encode(tile, level=80, colorspace="RGB", outcolorspace="RGB")


def make_large_svs(path: Path, size: int = 40_000, mpp: float = MPP) -> Path:
    """Write the slide (if absent) and return its path. mpp: the pixel size declared (the
    tissue is CMU-1's 20x pixels whatever it says; 0.25 makes a 40x-sized slide for
    benchmarks of what a pixel size decides, such as which levels QC reads)."""
    path = Path(path)
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tiles, tables, pixels = _source_tiles()
    rows, cols = len(tiles), len(tiles[0])
    n = -(-size // TILE)
    level0 = (tiles[r % rows][c % cols] for r in range(n) for c in range(n))
    description = (
        f"Aperio Image Library v12.0.15 \r\n{size}x{size} ({TILE}x{TILE}) JPEG/RGB Q=30"
        f"|AppMag = {round(20 * MPP / mpp)}|MPP = {mpp}|Filename = tilestore-bench"
    )
    tmp = path.with_suffix(".partial")
    thumb_period = _box(pixels, 64)
    thumbnail = np.tile(
        thumb_period,
        (
            -(-size // 64 // thumb_period.shape[0]) + 1,
            -(-size // 64 // thumb_period.shape[1]) + 1,
            1,
        ),
    )
    with tifffile.TiffWriter(tmp, bigtiff=True) as tif:
        tif.write(
            level0,
            shape=(size, size, 3),
            dtype=np.uint8,
            tile=(TILE, TILE),
            compression="jpeg",
            photometric="rgb",
            jpegtables=tables,
            description=description,
            metadata=None,
        )
        # Aperio order: baseline, thumbnail (stripped), then the reduced levels.
        tif.write(
            thumbnail[: size // 64, : size // 64],
            compression="jpeg",
            photometric="rgb",
            description="Aperio Image Library v12.0.15 \r\nthumbnail",
            metadata=None,
        )
        for factor in (4, 16):
            level_size = size // factor
            tif.write(
                _encoded_level(_box(pixels, factor), level_size),
                shape=(level_size, level_size, 3),
                dtype=np.uint8,
                tile=(TILE, TILE),
                compression="jpeg",
                photometric="rgb",
                metadata=None,
                description=f"Aperio Image Library v12.0.15 \r\n{size}x{size} -> "
                f"{level_size}x{level_size}",
            )
    _photometric_rgb(tmp)
    tmp.rename(path)
    return path


def _photometric_rgb(path: Path) -> None:
    """Say RGB in the tiled pages' Photometric tag, as Aperio does (tifffile writes YCbCr)."""
    with tifffile.TiffFile(path) as tif:
        offsets = [p.tags["PhotometricInterpretation"].valueoffset for p in tif.pages if p.is_tiled]
    with open(path, "r+b") as fh:
        for offset in offsets:
            fh.seek(offset)
            fh.write((2).to_bytes(2, "little"))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("path", type=Path)
    parser.add_argument("--size", type=int, default=40_000)
    parser.add_argument("--mpp", type=float, default=MPP)
    args = parser.parse_args()
    print(make_large_svs(args.path, args.size, args.mpp))
