"""Slides only OpenSlide reads (MIRAX, Hamamatsu VMS, Sakura SVSLIDE, Leica SCN, Ventana BIF,
Philips TIFF, Trestle), through openslide-python and the openslide-bin library.

OpenSlide gives decoded RGBA regions, so these slides take the decode + re-encode path.
Transparent pixels (never scanned: MIRAX gaps, sparse Philips tiles) are painted in the
slide's background colour, as OpenSlide's own viewers do. Levels whose downsample is not
a whole number are left out: OpenSlide would resample them by a fraction of a pixel, and
conversion builds exact 2x levels from the finer level instead.
"""

from __future__ import annotations

import configparser
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tifffile

from tilestore.cpus import usable_cpus
from tilestore.errors import SlideError
from tilestore.sources.base import (
    Fact,
    Reader,
    Source,
    SourceInfo,
    SourceLevel,
    check_size,
    checked_mpp,
)
from tilestore.sources.storage import openslide_lossless, tiff_page_lossless
from tilestore.sources.tiff import TIFF_ERRORS, TIFF_MAGIC, check_page_chain

# TIFF variants whose layout our TIFF reader does not know (Leica collections of images,
# Ventana's overlapping tiles, Philips' padded levels and sparse tiles, Trestle's sidecars):
# OpenSlide reads them instead.
TIFF_VENDORS = frozenset({"leica", "ventana", "philips", "trestle"})
_VMS_FILE_KEYS = ("ImageFile", "MapFile", "OptimisationFile", "MacroImage")
_PIECE = 2048  # columns read per OpenSlide call: its RGBA buffer stays ~32 MB for 4k rows


def detect(path: Path) -> str | None:
    """OpenSlide's vendor name for a file it can open, None where it cannot (or is absent)."""
    try:
        import openslide
    except (ImportError, OSError):  # openslide-bin missing: the C library cannot load
        return None
    try:
        return openslide.OpenSlide.detect_format(str(path))
    except openslide.OpenSlideError:
        return None


@dataclass
class OpenSlideLevel(SourceLevel):
    """One OpenSlide level whose downsample is a whole number, read in column pieces."""

    slide: object = None  # openslide.OpenSlide
    index: int = 0  # OpenSlide's level number
    downsample: int = 1
    background: tuple[int, int, int] = (255, 255, 255)
    where: str = ""
    workers: int = 1

    def read(self, y0: int, y1: int, x0: int, x1: int) -> np.ndarray:
        out = np.empty((y1 - y0, x1 - x0, 3), np.uint8)
        pieces = range(x0, x1, _PIECE)

        def read_piece(p0: int) -> None:
            p1 = min(p0 + _PIECE, x1)
            out[:, p0 - x0 : p1 - x0] = self._read(y0, y1, p0, p1)

        if len(pieces) == 1 or self.workers == 1:
            for p0 in pieces:
                read_piece(p0)
        else:  # OpenSlide decodes without the GIL and allows concurrent reads of one handle
            with ThreadPoolExecutor(min(self.workers, len(pieces))) as pool:
                list(pool.map(read_piece, pieces))
        return out

    def _read(self, y0: int, y1: int, x0: int, x1: int) -> np.ndarray:
        import openslide

        ds = self.downsample
        try:
            region = self.slide.read_region((x0 * ds, y0 * ds), self.index, (x1 - x0, y1 - y0))
        except openslide.OpenSlideError as exc:
            raise SlideError(f"{self.where}: cannot decode rows {y0}-{y1}: {exc}") from exc
        rgba = np.asarray(region)
        alpha = rgba[..., 3:].astype(np.uint16)
        if alpha.min() == 255:
            return rgba[..., :3]
        # OpenSlide returns straight (not premultiplied) alpha: blend onto the background
        background = np.asarray(self.background, np.uint16)
        blended = (rgba[..., :3] * alpha + background * (255 - alpha) + 127) // 255
        return blended.astype(np.uint8)

    def describe_copy(self) -> str:
        return "decoded by OpenSlide"


class OpenSlideSource(Source):
    """A slide opened through OpenSlide; `vendor` is OpenSlide's name for its format."""

    def __init__(self, path: Path, vendor: str) -> None:
        import openslide

        try:
            slide = openslide.OpenSlide(str(path))
        except openslide.OpenSlideError as exc:  # unsupported or damaged
            raise SlideError(f"{path}: OpenSlide cannot open this {vendor} slide: {exc}") from exc
        self._slide = slide
        props = slide.properties
        where = f"{path} ({vendor}, through OpenSlide)"
        background = _hex_rgb(props.get(openslide.PROPERTY_NAME_BACKGROUND_COLOR))
        w0, h0 = slide.dimensions
        check_size(path, (h0, w0))
        levels, skipped = [], []
        workers = usable_cpus()
        lossless = _lossless(path, vendor, props)
        for index, ((w, h), ds) in enumerate(
            zip(slide.level_dimensions, slide.level_downsamples, strict=True)
        ):
            whole = round(ds)
            # an exact level: whole-number downsample and the size that implies
            exact = abs(ds - whole) < 1e-9 and (h, w) == (-(-h0 // whole), -(-w0 // whole))
            if not exact and index:
                skipped.append(f"level {index} (downsample {ds:.4g}, {w}x{h})")
                continue
            levels.append(
                OpenSlideLevel(
                    shape=(h, w),
                    channels=3,
                    dtype=np.dtype(np.uint8),
                    compression="openslide",
                    tile_shape=_tile_shape(props, index),
                    rgb=True,
                    lossless=lossless,
                    slide=slide,
                    index=index,
                    downsample=whole,
                    background=background,
                    where=f"{where}: level {index}",
                    workers=workers,
                )
            )
        mpp, warning = checked_mpp(
            _float(props.get(openslide.PROPERTY_NAME_MPP_X)),
            _float(props.get(openslide.PROPERTY_NAME_MPP_Y)),
            "OpenSlide openslide.mpp-x/mpp-y",
        )
        power = _float(props.get(openslide.PROPERTY_NAME_OBJECTIVE_POWER))
        warnings = [w for w in (warning,) if w]
        if skipped:
            warnings.append(
                "OpenSlide levels not whole-number downsamples, built from the finer level "
                f"instead: {', '.join(skipped)}"
            )
        info = SourceInfo(
            format=vendor,
            vendor=vendor,
            mpp=mpp,
            objective_power=Fact(power, "OpenSlide openslide.objective-power") if power else None,
            warnings=tuple(warnings),
        )
        associated = {
            name: (lambda name=name: np.asarray(slide.associated_images[name].convert("RGB")))
            for name in slide.associated_images
        }
        super().__init__(path, info, levels, associated)
        self._files = _companions(path, vendor)

    @property
    def files(self) -> list[Path]:
        return self._files

    def close(self) -> None:
        self._slide.close()


def _lossless(path: Path, vendor: str, props: object) -> Fact:
    """How the slide's pixels are stored: for the TIFFs, their largest page's Compression tag
    (OpenSlide's level 0); for the others, what OpenSlide's properties say."""
    if vendor not in TIFF_VENDORS:
        return openslide_lossless(props, vendor)
    try:
        with tifffile.TiffFile(path) as tif:
            check_page_chain(path, tif)  # iterating pages of a looped chain never ends
            page = max(tif.pages, key=lambda p: p.imagewidth * p.imagelength)
            fact = tiff_page_lossless(path, page)
    except TIFF_ERRORS as exc:
        return Fact(None, f"its TIFF tags cannot be read ({exc})")
    return Fact(fact.value, f"{fact.origin}, of its largest page")


def _companions(path: Path, vendor: str) -> list[Path]:
    """The files a slide is read from: a MIRAX .mrxs and its folder's files, a VMS/VMU and the
    JPEG/NGR, map and optimisation files it names."""
    files = [path]
    if vendor == "mirax" and path.with_suffix("").is_dir():
        files += sorted(p for p in path.with_suffix("").iterdir() if p.is_file())
    elif vendor == "hamamatsu":
        parser = configparser.ConfigParser(interpolation=None, strict=False)
        parser.optionxform = str
        try:
            parser.read(path, encoding="latin-1")
        except configparser.Error:
            return files
        for section in parser.sections():
            for key, value in parser.items(section):
                if key.startswith(_VMS_FILE_KEYS) and (path.parent / value).is_file():
                    files.append(path.parent / value)
    return files


def _tile_shape(props: object, index: int) -> tuple[int, int] | None:
    h = props.get(f"openslide.level[{index}].tile-height")
    w = props.get(f"openslide.level[{index}].tile-width")
    return (int(h), int(w)) if h and w else None  # 0 is refused by checked_levels


def _float(text: str | None) -> float | None:
    try:
        return float(text) if text else None
    except ValueError:
        return None


def _hex_rgb(text: str | None) -> tuple[int, int, int]:
    try:
        value = int(text, 16) if text else 0xFFFFFF
    except ValueError:
        value = 0xFFFFFF
    return (value >> 16) & 255, (value >> 8) & 255, value & 255


def _can_open(path: Path, head: bytes) -> bool:
    """OpenSlide opens a TIFF only of the vendors our TIFF reader does not know (a plain or
    OME-TIFF it would open too), and any other file it detects (MIRAX, VMS/VMU, SVSLIDE:
    asked before the image sniff, as a .mrxs may hold a JPEG preview)."""
    vendor = detect(path)
    return vendor in TIFF_VENDORS if head.startswith(TIFF_MAGIC) else bool(vendor)


READER = Reader(
    "openslide",
    "MIRAX/VMS/SVSLIDE/SCN/BIF/Philips TIFF (through OpenSlide)",
    priority=20,
    guess_can_open=_can_open,
    open=lambda path, head, series: OpenSlideSource(path, detect(path)),
    suffixes=(".mrxs", ".vms", ".vmu", ".svslide", ".scn", ".bif"),
)
