"""Plain RGB images (PNG, JPEG): small pictures of tissue, read whole (they are not tiled)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
from PIL import Image, UnidentifiedImageError

from tilestore.errors import SlideError
from tilestore.sources.base import (
    Fact,
    Reader,
    Source,
    SourceInfo,
    SourceLevel,
    check_whole,
    checked_mpp,
)

Image.MAX_IMAGE_PIXELS = None  # we apply our own plausibility limit (check_size)


@dataclass
class ArrayLevel(SourceLevel):
    """A level held as one decoded array."""

    pixels: np.ndarray = None

    def read(self, y0: int, y1: int, x0: int, x1: int) -> np.ndarray:
        return self.pixels[y0:y1, x0:x1]


class ImageSource(Source):
    """A PNG or JPEG file; its resolution chunk (pHYs/JFIF density) is rarely a scan mpp.

    Its header is checked before the image is decoded: a size beyond what memory or the
    file's bytes allow (`check_whole`) is refused."""

    MAGIC: ClassVar[dict[bytes, str]] = {b"\x89PNG\r\n\x1a\n": "png", b"\xff\xd8\xff": "jpeg"}

    @classmethod
    def sniff(cls, head: bytes) -> str | None:
        return next((fmt for magic, fmt in cls.MAGIC.items() if head.startswith(magic)), None)

    def __init__(self, path: Path, fmt: str) -> None:
        try:
            with Image.open(path) as img:
                check_whole(path, (img.height, img.width, 3))
                dpi = img.info.get("dpi")
                pixels = np.asarray(img.convert("RGB") if img.mode != "RGB" else img)
        except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
            raise SlideError(f"{path}: cannot decode {fmt.upper()} image: {exc}") from exc
        mpp, warning = None, None
        if dpi and dpi[0] and dpi[1]:
            mpp, warning = checked_mpp(25_400 / dpi[0], 25_400 / dpi[1], f"{fmt.upper()} dpi")
        level = ArrayLevel(
            shape=pixels.shape[:2],
            channels=3,
            dtype=pixels.dtype,
            compression=fmt,
            tile_shape=None,
            rgb=True,
            lossless=Fact(fmt == "png", f"{fmt.upper()} file"),
            pixels=pixels,
        )
        info = SourceInfo(format=fmt, mpp=mpp, warnings=(warning,) if warning else ())
        super().__init__(path, info, [level])


READER = Reader(
    "image",
    "PNG or JPEG",
    priority=40,
    guess_can_open=lambda path, head: ImageSource.sniff(head) is not None,
    open=lambda path, head, series: ImageSource(path, ImageSource.sniff(head)),
    magic=tuple(ImageSource.MAGIC),
)
