"""Open any supported slide file as a `Source`; readers are tried most specific first.

One small file per vendor reader. May import `tilestore.format` (JPEG headers) and nothing
above it: readers never know about stores."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import tifffile

from tilestore.errors import SlideError
from tilestore.sources.base import (
    MAX_TILE,
    Channel,
    Fact,
    JpegTiles,
    Source,
    SourceInfo,
    SourceLevel,
)
from tilestore.sources.dicom import DICM_OFFSET, dicom_series, is_dicom_file, open_dicom
from tilestore.sources.image import ImageSource
from tilestore.sources.ndpi import NdpiSource
from tilestore.sources.ometiff import OmeTiffSource
from tilestore.sources.openslide_reader import TIFF_VENDORS, OpenSlideSource, detect
from tilestore.sources.qptiff import QptiffSource
from tilestore.sources.svs import SvsSource
from tilestore.sources.tiff import TIFF_ERRORS, TiffSource, check_page_chain, check_pages

TIFF_READERS: tuple[type[TiffSource], ...] = (
    SvsSource,
    NdpiSource,
    QptiffSource,
    OmeTiffSource,
    TiffSource,
)
_TIFF_MAGIC = (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+")

__all__ = [
    "Channel",
    "Fact",
    "JpegTiles",
    "OpenSlideSource",
    "Source",
    "SourceInfo",
    "SourceLevel",
    "checked_levels",
    "dicom_series",
    "open_source",
]


def open_source(path: str | os.PathLike, series: str | None = None) -> Source:
    """Return the open `Source` for a slide file (or a folder of DICOM files; `series` picks
    one SeriesInstanceUID where it holds several), or raise SlideError saying why not."""
    return checked_levels(_open(Path(path), series))


def checked_levels(source: Source) -> Source:
    """The source, if every level's tile size is one a slide can have (whatever reader
    found it: ours, wsidicom's or OpenSlide's properties); else it is closed and refused,
    since a 0 px tile would divide by zero further on."""
    for index, level in enumerate(source.levels):
        tile = level.tile_shape
        if tile is not None and not all(1 <= side <= MAX_TILE for side in tile):
            source.close()
            raise SlideError(
                f"{source.path}: level {index} declares {tile[1]}x{tile[0]} px tiles "
                f"(plausible: 1-{MAX_TILE} px a side); the header is corrupt"
            )
    return source


def _open(path: Path, series: str | None) -> Source:
    if path.is_dir():
        if not dicom_series(path):
            raise SlideError(f"{path}: is a directory, not a slide file (and holds no DICOM)")
        return open_dicom(path, series)
    try:
        info = path.stat()
        if not stat.S_ISREG(info.st_mode):  # a FIFO or a device would block the read forever
            raise SlideError(f"{path}: not a regular file (a pipe, socket or device)")
        size = info.st_size
        with open(path, "rb") as fh:
            head = fh.read(DICM_OFFSET + 4)
    except OSError as exc:
        raise SlideError(f"{path}: cannot read: {exc.strerror}") from exc
    if size == 0:
        raise SlideError(f"{path}: file is empty (0 bytes)")
    if is_dicom_file(head):
        return open_dicom(path, series)
    if head.startswith(_TIFF_MAGIC):
        vendor = detect(path)
        if vendor in TIFF_VENDORS:
            return OpenSlideSource(path, vendor)
        return _open_tiff(path)
    vendor = detect(path)  # MIRAX, VMS/VMU, SVSLIDE (before the image sniff: a .mrxs may
    if vendor:  # hold a JPEG preview)
        return OpenSlideSource(path, vendor)
    fmt = ImageSource.sniff(head)
    if fmt:
        return ImageSource(path, fmt)
    raise SlideError(
        f"{path}: not a supported slide (expected TIFF/SVS/NDPI/OME-TIFF/QPTIFF, DICOM, "
        "MIRAX/VMS/SVSLIDE/SCN/BIF/Philips TIFF (through OpenSlide), PNG or JPEG; "
        f"file starts with {head[:8]!r})"
    )


def _open_tiff(path: Path) -> Source:
    with _TiffLog() as log:
        try:
            tif = tifffile.TiffFile(path)
        except TIFF_ERRORS as exc:
            raise SlideError(f"{path}: not a readable TIFF (truncated or corrupt): {exc}") from exc
        try:
            check_page_chain(path, tif)
            check_pages(path, tif.pages)  # tifffile's series detection divides by their sizes
            series = tif.series
        except SlideError:
            tif.close()
            raise
        except TIFF_ERRORS as exc:
            tif.close()
            raise SlideError(f"{path}: corrupt TIFF structure: {exc}") from exc
    broken = [m for m in log.messages if "offset" in m]
    try:
        if broken:
            raise SlideError(f"{path}: truncated or corrupt: {broken[0]}")
        if not series:
            raise SlideError(f"{path}: TIFF holds no image")
        reader = next(r for r in TIFF_READERS if r.matches(tif))
        return reader(path, tif)
    except SlideError:
        tif.close()
        raise
    except TIFF_ERRORS as exc:
        tif.close()
        raise SlideError(f"{path}: corrupt TIFF structure: {exc}") from exc


class _TiffLog(logging.Handler):
    """Collect what tifffile logs while parsing: it reports broken IFD chains only there."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []
        self._logger = logging.getLogger("tifffile")

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage().split("> ", 1)[-1])

    def __enter__(self) -> _TiffLog:
        self._logger.addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        self._logger.removeHandler(self)
