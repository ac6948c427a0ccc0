"""Open any supported slide file as a `Source`: the readers' registry
(`tilestore.sources.registry.READERS`) is asked which reader opens it, the one of lowest
priority whose `guess_can_open` says yes.

One small file per vendor reader, each declaring what it opens (`READER`). May import
`tilestore.format` (JPEG headers) and nothing above it: readers never know about stores."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from tilestore.errors import SlideError
from tilestore.sources import dicom
from tilestore.sources.base import (
    MAX_TILE,
    Channel,
    Fact,
    JpegTiles,
    Reader,
    Source,
    SourceInfo,
    SourceLevel,
)
from tilestore.sources.dicom import DICM_OFFSET, open_dicom
from tilestore.sources.openslide_reader import OpenSlideSource
from tilestore.sources.registry import READERS, marked_by_another, reader_for, supported
from tilestore.sources.remote import (
    CACHE_LIMIT,
    check_urls,
    given,
    is_url,
    shown,
    slide_file,
    stage_slide,
)

__all__ = [
    "CACHE_LIMIT",
    "READERS",
    "Channel",
    "Fact",
    "JpegTiles",
    "OpenSlideSource",
    "Reader",
    "Source",
    "SourceInfo",
    "SourceLevel",
    "check_urls",
    "checked_levels",
    "dicom_series",
    "given",
    "is_url",
    "open_source",
    "shown",
    "slide_file",
    "stage_slide",
]


def open_source(path: str | os.PathLike, series: str | None = None) -> Source:
    """Return the open `Source` for a slide file (or a folder of DICOM files; `series` picks
    one SeriesInstanceUID where it holds several), or raise SlideError saying why not."""
    return checked_levels(_open(Path(path), series))


def dicom_series(path: str | os.PathLike) -> dict[str, list[Path]]:
    """The DICOM files of a file or folder by SeriesInstanceUID (`dicom.dicom_series`); a
    folder holding slides of other formats beside its DICOM files refused, naming them."""
    return dicom.dicom_series(path, other=marked_by_another)


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
    reader = reader_for(path, head)
    if reader is None:
        raise SlideError(
            f"{path}: not a supported slide (expected {supported()}; file starts with {head[:8]!r})"
        )
    return reader.open(path, head, series)
