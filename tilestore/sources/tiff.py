"""Tiled and striped TIFF slides through tifffile: the reader the vendor formats build on.

Regions are read through tifffile's zarr store, so only the tiles or strips a
band touches are decoded. Vendor subclasses (SVS, NDPI, OME-TIFF) only say how
their metadata is spelled; pixel access is shared.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
import tifffile
import zarr

from tilestore.errors import SlideError
from tilestore.format import jpeg
from tilestore.sources.base import (
    MAX_SIDE,
    MAX_TILE,
    Fact,
    JpegTiles,
    Source,
    SourceInfo,
    SourceLevel,
    check_size,
    checked_mpp,
)
from tilestore.sources.storage import tiff_page_lossless

TIFF_MAGIC = (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+")  # classic and BigTIFF, both orders
_UNIT_UM = {2: 25_400.0, 3: 10_000.0}  # TIFF ResolutionUnit: inch, centimeter -> µm
# What tifffile raises on malformed headers and IFDs.
TIFF_ERRORS = (
    tifffile.TiffFileError,
    ValueError,
    OSError,
    KeyError,
    IndexError,
    EOFError,
    struct.error,
)


@dataclass
class TiffLevel(SourceLevel):
    """One pyramid level of a TIFF series, read band by band."""

    series: tifffile.TiffPageSeries = None
    level: int = 0
    path: Path = None

    def __post_init__(self) -> None:
        self._array: zarr.Array | None = None

    @property
    def page(self) -> tifffile.TiffPage:
        return self.series.levels[self.level].keyframe

    def read(self, y0: int, y1: int, x0: int, x1: int) -> np.ndarray:
        if self._array is None:
            self._array = zarr.open_array(self.series.aszarr(level=self.level), mode="r")
        axes = self.series.levels[self.level].axes
        try:
            if axes == "YX":
                return self._array[y0:y1, x0:x1][..., None]
            if axes == "YXS":
                return self._array[y0:y1, x0:x1, :]
            return np.moveaxis(self._array[:, y0:y1, x0:x1], 0, -1)  # CYX
        except (ValueError, RuntimeError, OSError) as exc:
            raise SlideError(
                f"{self.path}: cannot decode level {self.level} rows {y0}-{y1}: {exc}"
            ) from exc

    def _copy_blocker(self) -> str | None:
        page = self.page
        if page.compression != tifffile.COMPRESSION.JPEG:
            kind = "tiles" if page.is_tiled else "strips"
            name = "uncompressed" if page.compression == 1 else page.compression.name
            return f"{name} {kind}"
        if not page.is_tiled or page.is_ndpi:
            return "JPEG strips, not tiles"
        if len(self.series.levels[self.level].pages) != 1 or page.planarconfig != 1:
            return "separate planes"
        if page.bitspersample != 8 or page.samplesperpixel not in (1, 3):
            return f"{page.samplesperpixel}x{page.bitspersample}-bit samples"
        return None

    def describe_copy(self) -> str:
        return self._copy_blocker() or "tiles not copyable"

    def jpeg_tiles(self) -> JpegTiles | None:
        if self._copy_blocker() is not None:
            return None
        page = self.page
        tables = page.jpegtables
        offsets, counts = page.dataoffsets, page.databytecounts
        first = next((i for i, c in enumerate(counts) if c > 0), None)
        if first is None:
            return None
        with open(self.path, "rb") as fh:
            fh.seek(offsets[first])
            try:
                header = jpeg.read_header(*([tables] if tables else []), fh.read(counts[first]))
            except ValueError:
                return None
        # tifffile decodes RGB-photometric JPEG without JFIF as untransformed RGB
        # (Aperio); a standard decoder would assume YCbCr unless we mark it.
        if page.samplesperpixel == 1:
            color_space = "grayscale"
        elif page.photometric == tifffile.PHOTOMETRIC.RGB and not header.jfif:
            color_space = "rgb"
        else:
            color_space = header.color_space
        mark_rgb = jpeg.copy_marking(header, color_space)
        if mark_rgb is None:
            return None
        sampling = header.sampling
        th, tw = page.tilelength, page.tilewidth
        nx = -(-page.imagewidth // tw)
        fd = os.open(self.path, os.O_RDONLY)
        self._fds = [*getattr(self, "_fds", []), fd]

        def read_tile(row: int, col: int) -> bytes | None:
            index = row * nx + col
            if counts[index] == 0:
                return None
            data = os.pread(fd, counts[index], offsets[index])
            return jpeg.complete_stream(data, tables, mark_rgb=mark_rgb)

        starts, sizes = list(offsets), list(counts)

        def read_own(row: int, first: int, end: int) -> list[bytes | None]:
            """Tiles [first, end) of a row, each run of tiles stored one after another in
            the file read at once (a shard's row of Aperio's tiles is one read)."""
            out: list[bytes | None] = []
            index, stop = row * nx + first, row * nx + end
            while index < stop:
                if sizes[index] == 0:
                    out.append(None)
                    index += 1
                    continue
                last = index
                while (
                    last + 1 < stop
                    and sizes[last + 1]
                    and (starts[last + 1] == starts[last] + sizes[last])
                ):
                    last += 1
                base = starts[index]
                data = os.pread(fd, starts[last] + sizes[last] - base, base)
                for i in range(index, last + 1):  # each tile copied once: after its SOI
                    at = starts[i] - base
                    soi = sizes[i] >= 2 and data[at : at + 2] == jpeg.SOI
                    out.append(data[at + 2 : at + sizes[i]] if soi else None)
                index = last + 1
            return out

        path = os.path.realpath(self.path)  # the file itself: its readers refuse links

        def locate(row: int, col: int) -> tuple[str, int, int] | None:
            index = row * nx + col
            return (path, starts[index], sizes[index]) if sizes[index] else None

        grid = (-(-page.imagelength // th), nx)
        prefix = jpeg.complete_stream(jpeg.SOI, tables, mark_rgb=mark_rgb)  # what each gets
        facts = jpeg.marker_facts(prefix + jpeg.EOI)
        return JpegTiles(
            (th, tw), grid, color_space, sampling, read_tile, prefix, facts, read_own, locate
        )

    def close(self) -> None:
        for fd in getattr(self, "_fds", []):
            os.close(fd)
        self._fds = []


class TiffSource(Source):
    """A generic tiled or striped TIFF; subclasses read vendor metadata."""

    format = "tiff"
    # the tifffile flag that marks this vendor's files (`TiffFile.is_svs`...); None: any TIFF
    marked_by: ClassVar[str | None] = None

    @classmethod
    def matches(cls, tif: tifffile.TiffFile) -> bool:
        return cls.marked_by is None or bool(getattr(tif, cls.marked_by))

    def __init__(self, path: Path, tif: tifffile.TiffFile) -> None:
        self._tif = tif
        series = self.image_series(tif)
        levels = []
        for index, level in enumerate(series.levels):
            check_size(path, level.shape)
            levels.append(self._make_level(path, series, index))
        _check_not_truncated(path, [p for lvl in series.levels for p in lvl.pages])
        super().__init__(path, self.read_info(tif), levels, self.read_associated(tif))

    @staticmethod
    def _make_level(path: Path, series: tifffile.TiffPageSeries, index: int) -> TiffLevel:
        level = series.levels[index]
        axes, shape = level.axes, level.shape
        if axes not in ("YX", "YXS", "CYX"):
            raise SlideError(
                f"{path}: image axes {axes} {shape} are not a 2D slide (expected YX, YXS or CYX)"
            )
        page = level.keyframe
        codec = page.compression
        try:
            tifffile.TIFF.DECOMPRESSORS[int(codec)]
        except (KeyError, NotImplementedError):
            raise SlideError(
                f"{path}: compression {getattr(codec, 'name', codec)} (TIFF code {int(codec)}) "
                "is not supported: no decoder available"
            ) from None
        height, width = shape[axes.index("Y")], shape[axes.index("X")]
        channels = 1 if axes == "YX" else shape[axes.index("S" if "S" in axes else "C")]
        _check_layout(path, index, level.pages)
        tile = (page.tilelength, page.tilewidth) if page.is_tiled else None
        return TiffLevel(
            shape=(height, width),
            channels=channels,
            dtype=np.dtype(level.dtype),
            compression=getattr(codec, "name", str(codec)).lower(),
            tile_shape=tile,
            rgb=_is_rgb(level),
            lossless=tiff_page_lossless(path, page),
            series=series,
            level=index,
            path=path,
        )

    def image_series(self, tif: tifffile.TiffFile) -> tifffile.TiffPageSeries:
        """Return the series holding the slide image (levels finest first)."""
        return tif.series[0]

    def read_info(self, tif: tifffile.TiffFile) -> SourceInfo:
        mpp, warning = resolution_mpp(tif.pages.first)
        return SourceInfo(format=self.format, mpp=mpp, warnings=(warning,) if warning else ())

    def read_associated(self, tif: tifffile.TiffFile) -> dict:
        return {}

    def close(self) -> None:
        for level in self.levels:
            level.close()
        self._tif.close()


def _is_rgb(level: tifffile.TiffPageSeries) -> bool:
    """One page holds the three samples of a colour picture (photometric RGB or YCbCr). Pages
    of one sample each (a QPTIFF's or OME-TIFF's markers) are independent channels."""
    page = level.keyframe
    colour = page.photometric in (tifffile.PHOTOMETRIC.RGB, tifffile.PHOTOMETRIC.YCBCR)
    return len(level.pages) == 1 and page.samplesperpixel == 3 and colour


def resolution_mpp(page: tifffile.TiffPage) -> tuple[Fact | None, str | None]:
    """Return mpp from the XResolution/YResolution tags when their unit is physical."""
    unit = page.tags.valueof("ResolutionUnit")
    xres, yres = page.tags.valueof("XResolution"), page.tags.valueof("YResolution")
    if unit not in _UNIT_UM or not xres or not yres:
        return None, None
    to_px = [r[0] / r[1] if isinstance(r, tuple) else float(r) for r in (xres, yres)]
    if not all(to_px):
        return None, None
    name = "centimeter" if unit == 3 else "inch"
    scale = _UNIT_UM[unit]
    return checked_mpp(scale / to_px[0], scale / to_px[1], f"TIFF XResolution/YResolution ({name})")


def page_fault(page: tifffile.TiffPage) -> str | None:
    """What a TIFF page declares that no image has, None where its geometry is plausible:
    tifffile divides by these sizes (its series detection by the image's, its decoder by the
    tile's or strip's) and allocates by them, trusting whatever the header says."""
    height, width = page.imagelength, page.imagewidth
    if not (1 <= height <= MAX_SIDE and 1 <= width <= MAX_SIDE):
        return f"declares an image of {width}x{height} px (plausible: 1-{MAX_SIDE} px a side)"
    if "TileWidth" in page.tags or "TileLength" in page.tags:
        th, tw = page.tilelength, page.tilewidth
        if not (1 <= th <= MAX_TILE and 1 <= tw <= MAX_TILE):
            return f"declares {tw}x{th} px tiles (plausible: 1-{MAX_TILE} px a side)"
    elif page.rowsperstrip < 1:  # an absent RowsPerStrip is the image's height, as it says
        return f"declares strips of {page.rowsperstrip} rows (plausible: 1 or more)"
    return None


def check_page_chain(path: Path, tif: tifffile.TiffFile) -> None:
    """Refuse a file whose chain of top-level image headers (IFDs) comes back to one it has
    passed (a header whose next-IFD offset is its own, or an earlier one's): tifffile walks the
    chain a page at a time and only looks for loops once it holds 100 pages, so iterating its
    pages never ended. Reads the chain's offsets only (a few bytes per page)."""
    fh, tiff = tif.filehandle, tif.tiff
    seen: dict[int, int] = {}
    offset = tif.pages.first.offset if tif.pages else 0
    while 0 < offset < fh.size:
        if offset in seen:
            raise SlideError(
                f"{path}: a loop in the file's page chain: page {len(seen) - 1}'s next-page "
                f"offset points back to page {seen[offset]} (byte {offset}); the header is corrupt"
            )
        seen[offset] = len(seen)
        try:
            fh.seek(offset)
            (tags,) = struct.unpack(tiff.tagnoformat, fh.read(tiff.tagnosize))
            fh.seek(offset + tiff.tagnosize + tags * tiff.tagsize)
            (offset,) = struct.unpack(tiff.offsetformat, fh.read(tiff.offsetsize))
        except (struct.error, OSError):
            return  # a chain cut short: tifffile stops there and says so (its log)


def check_pages(path: Path, pages: Iterable[tifffile.TiffPage]) -> None:
    """Refuse a file one of whose top-level `pages` (levels, label, macro, thumbnail alike)
    declares what no image has (`page_fault`), naming it: before tifffile is asked anything
    about them. The chain that lists them is checked first (`check_page_chain`)."""
    for index, page in enumerate(pages):
        fault = page_fault(page)
        if fault:
            raise SlideError(f"{path}: page {index} {fault}; the header is corrupt")


def _check_layout(path: Path, index: int, pages: list) -> None:
    """Refuse a level whose tile or strip sizes no slide has, or whose data index does not
    cover its declared image: decoding either would read garbage, divide by zero or allocate
    without bound. Its pages are the top-level pages `check_pages` saw at the door, or the
    SubIFDs of a pyramid, seen first here."""
    for frame in pages:
        page = frame.keyframe  # geometry lives in the keyframe; the data index in each frame
        fault = page_fault(page)
        if fault:
            raise SlideError(f"{path}: level {index} {fault}; the header is corrupt")
        if page.is_tiled:
            th, tw = page.tilelength, page.tilewidth
            blocks = -(-page.imagelength // th) * -(-page.imagewidth // tw)
        else:
            blocks = -(-page.imagelength // min(page.rowsperstrip, page.imagelength))
        planes = page.samplesperpixel if page.planarconfig == 2 else 1
        if len(frame.dataoffsets) != blocks * planes:
            raise SlideError(
                f"{path}: level {index} holds {len(frame.dataoffsets)} tiles or strips where "
                f"its declared {page.imagewidth}x{page.imagelength} px need {blocks * planes}; "
                "the header is corrupt"
            )


def _check_not_truncated(path: Path, pages: list) -> None:
    size = os.path.getsize(path)
    for page in pages:
        ends = [o + c for o, c in zip(page.dataoffsets, page.databytecounts, strict=True) if c]
        if ends and max(ends) > size:
            raise SlideError(
                f"{path}: truncated: image data runs to byte {max(ends)} but the file has "
                f"{size} bytes (incomplete copy or download?)"
            )


def associated_series(tif: tifffile.TiffFile, names: dict[str, str]) -> dict:
    """Map our associated-image names to loaders for the tifffile series that hold them."""
    found = {}
    for series in tif.series[1:]:
        key = names.get(series.name.lower())
        if key:
            found[key] = series.asarray
    return found
