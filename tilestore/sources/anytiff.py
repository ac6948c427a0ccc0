"""A TIFF of any kind, opened by the TIFF reader that knows its layout (SVS, NDPI, QPTIFF,
OME-TIFF, else the plain one): its pages checked before tifffile divides by their sizes, what
tifffile logs of a broken chain of pages turned into a refusal."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path

import tifffile

from tilestore.errors import SlideError
from tilestore.sources.base import Reader, Source
from tilestore.sources.ndpi import NdpiSource
from tilestore.sources.ometiff import OmeTiffSource
from tilestore.sources.qptiff import QptiffSource
from tilestore.sources.svs import SvsSource
from tilestore.sources.tiff import (
    TIFF_ERRORS,
    TIFF_MAGIC,
    TiffSource,
    check_page_chain,
    check_pages,
)

# the first whose `matches` says yes opens the file: the most specific first
TIFF_READERS: tuple[type[TiffSource], ...] = (
    SvsSource,
    NdpiSource,
    QptiffSource,
    OmeTiffSource,
    TiffSource,
)


def open_tiff(path: Path) -> Source:
    """The TIFF at `path` opened by the first of `TIFF_READERS` that matches it, or
    SlideError saying why it cannot be read."""
    with _TiffLog() as log:
        try:
            tif = tifffile.TiffFile(path)
        except TIFF_ERRORS as exc:
            raise SlideError(f"{path}: not a readable TIFF (truncated or corrupt): {exc}") from exc
        with _closed_on_error(path, tif):
            check_page_chain(path, tif)
            check_pages(path, tif.pages)  # tifffile's series detection divides by their sizes
            series = tif.series
    broken = [m for m in log.messages if "offset" in m]
    with _closed_on_error(path, tif):
        if broken:
            raise SlideError(f"{path}: truncated or corrupt: {broken[0]}")
        if not series:
            raise SlideError(f"{path}: TIFF holds no image")
        reader = next(r for r in TIFF_READERS if r.matches(tif))
        return reader(path, tif)


@contextlib.contextmanager
def _closed_on_error(path: Path, tif: tifffile.TiffFile) -> Iterator[None]:
    """The TIFF closed where what is done inside fails: a SlideError as it is, tifffile's
    errors as one SlideError naming the file."""
    try:
        yield
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


READER = Reader(
    "tiff",
    "TIFF/SVS/NDPI/OME-TIFF/QPTIFF",
    priority=30,
    guess_can_open=lambda path, head: head.startswith(TIFF_MAGIC),
    open=lambda path, head, series: open_tiff(path),
    magic=TIFF_MAGIC,
)
