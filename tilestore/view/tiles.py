"""A store's chunks as images a browser shows: a JPEG chunk as it is stored, anything else
encoded on the fly, one chunk at a time (nothing decodes a level).

A copied level's chunks are the slide's own JPEG tiles made whole (tables spliced, Aperio's
RGB-coded ones marked so), so they are served byte for byte. A stream whose markers would
make a browser decode it in another colour space than its level declares (a chunk coded RGB
without the Adobe marker) gets the marker added; one that cannot be marked is decoded as
declared and encoded again. Other levels (zstd, multiplex, 16-bit) are decoded through the
store's checked reader, made 8-bit RGB (`Slide.as_rgb` for channels) and encoded as JPEG.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np
from PIL import Image

from tilestore.errors import ViewError
from tilestore.format.jpeg import complete_stream, marker_facts
from tilestore.reading.slide import Slide

QUALITY = 90  # JPEG quality of tiles encoded here (display only)


@dataclass(frozen=True)
class Tile:
    data: bytes
    media_type: str
    copied: bool  # the stored bytes as they are


def display(slide: Slide) -> Slide:
    """The slide as 8-bit RGB: itself, or its first three channels (one, thrice) windowed."""
    if slide.rgb:
        return slide
    channels = list(range(min(3, slide.shape[0])))
    return slide.as_rgb((channels * 3)[:3] if len(channels) < 3 else channels)


def tile(slide: Slide, level: int, row: int, col: int) -> Tile:
    """Chunk (row, col) of a level as an image; ViewError outside the level."""
    if not 0 <= level < len(slide.levels):
        raise ViewError(f"{slide.name}: no level {level} (levels 0-{len(slide.levels) - 1})")
    reader = slide.chunks(level)
    rows, cols = reader.grid
    if not (0 <= row < rows and 0 <= col < cols):
        raise ViewError(f"{slide.name}: level {level} has no chunk ({row}, {col})")
    if getattr(reader, "is_jpeg", False) and reader.channels == 3:
        data = reader.fetch_one((row, col))
        if data is not None:
            marked = as_browser_reads(data, reader.color_space)
            if marked is not None:
                return Tile(marked, "image/jpeg", marked is data)
    pixels = display(slide).chunks(level).load([(row, col)])[0]
    return Tile(encode(pixels), "image/jpeg", False)


def as_browser_reads(data: bytes, declared: str | None) -> bytes | None:
    """The stream as a browser decodes it in its declared colour space: itself, itself with
    the Adobe RGB marker, or None where it must be decoded and encoded again."""
    try:
        _, adobe = marker_facts(data)
    except ValueError:
        return None
    if declared == "rgb":
        if adobe == 0:
            return data
        return complete_stream(data, None, mark_rgb=True) if adobe is None else None
    if declared == "ycbcr" and adobe == 0:  # marked RGB, declared YCbCr
        return None
    return data


def encode(pixels: np.ndarray, quality: int = QUALITY) -> bytes:
    """An (h, w, 3 or 1) uint8 image as JPEG."""
    image = Image.fromarray(pixels[..., 0] if pixels.shape[2] == 1 else pixels)
    out = io.BytesIO()
    image.save(out, "JPEG", quality=quality)
    return out.getvalue()
