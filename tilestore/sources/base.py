"""What a source slide reader provides: levels that read regions, facts with their origin.

A reader implements `Source` for one file format. Conversion only ever asks a
level for a band of rows (`read`) or, for the copy path, for its JPEG tiles; it
never needs a whole level in memory.
"""

from __future__ import annotations

import hashlib
import os
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tilestore.format.jpeg import TileFrame
from tilestore.format.record import MPP_RANGE

# No scanner makes a side this long; a header that says so is corrupt or hostile.
MAX_SIDE = 500_000
# Nor tiles this large (slides use 240-4,096 px): a tile is decoded whole, in memory.
MAX_TILE = 16_384
# An image read whole (PNG, JPEG) holds at most this many bytes decoded...
MAX_WHOLE_BYTES = 2**31
# ...and no more than this many times its file's size: deflate packs at most ~1,032:1, and
# a JPEG of a blank field about 700:1, so a header beyond this is corrupt or a bomb.
MAX_RATIO = 2_000
# Plausible microscope pixel sizes: `MPP_RANGE`, the one range a size given is held to too.


@dataclass(frozen=True)
class Fact:
    """A metadata value and where in the source it was read from."""

    value: object
    origin: str

    @staticmethod
    def to_json(fact: Fact | None) -> dict | None:
        """Return {value, origin} for storing in attributes, or None."""
        return None if fact is None else {"value": fact.value, "origin": fact.origin}


UNKNOWN = Fact(None, "the reader does not say")


@dataclass(frozen=True)
class Channel:
    """One channel as the file names it: its name and display colour (hex RRGGBB), if any."""

    name: str
    color: str | None = None


@dataclass(frozen=True)
class SourceInfo:
    """What the source file says about itself; None where it says nothing."""

    format: str
    vendor: str | None = None
    mpp: Fact | None = None  # value: (x, y) in µm per level-0 pixel
    objective_power: Fact | None = None
    modality: Fact | None = None  # value: "brightfield" | "fluorescence"
    channels: tuple[Channel, ...] | None = None  # as the file declares them
    series: str | None = None  # a DICOM slide's SeriesInstanceUID
    warnings: tuple[str, ...] = ()


@dataclass
class JpegTiles:
    """A level's JPEG tiles as complete streams, ready to become store chunks unchanged."""

    tile_shape: tuple[int, int]
    grid: tuple[int, int]  # tiles down, tiles across
    color_space: str  # "ycbcr" | "rgb" | "grayscale": what the samples in the stream are
    subsampling: tuple[tuple[int, int], ...]
    read: Callable[[int, int], bytes | None]  # (tile row, tile col) -> stream, None if absent
    # what every stream of the level starts with (SOI, the tables, an Adobe marker: spliced
    # in front of each tile) and what it says (`jpeg.marker_facts`): each tile is then checked
    # by its own few segments only
    prefix: bytes = b""
    shared: tuple[bool, int | None] = (False, None)
    # (row, first col, end col) -> each tile's own bytes after its SOI (None: absent, or
    # not a JPEG stream: `read` says why), contiguous tiles in one read; None: not offered
    read_own: Callable[[int, int, int], list[bytes | None]] | None = None
    # (row, col) -> (file, offset, length) of the tile's whole stream as the file stores it
    # (None: absent), for the decoder processes that read tiles by byte range; None: the
    # tiles are not byte ranges of a file (DICOM frames through wsidicom)
    locate: Callable[[int, int], tuple[str, int, int] | None] | None = None

    @property
    def own_start(self) -> int:
        """Where each stream's own segments begin (after the shared prefix)."""
        return len(self.prefix)

    @property
    def frame(self) -> TileFrame:
        """What each tile must be to be its chunk as it is (`tilestore.format.jpeg.TileFrame`)."""
        return TileFrame(
            self.prefix, self.tile_shape, self.subsampling, self.color_space, *self.shared
        )


@dataclass
class SourceLevel(ABC):
    """One resolution of a source slide."""

    shape: tuple[int, int]  # (height, width)
    channels: int
    dtype: np.dtype
    compression: str
    tile_shape: tuple[int, int] | None
    # the samples are the R, G and B of one colour picture (TIFF photometric RGB or YCbCr,
    # DICOM RGB or YBR, a PNG), not independent channels such as one page per marker
    rgb: bool = False
    # whether the file stores these pixels losslessly (True), quantised (False) or does not
    # say (None), and where that was read (`tilestore.sources.storage`)
    lossless: Fact = UNKNOWN

    @abstractmethod
    def read(self, y0: int, y1: int, x0: int, x1: int) -> np.ndarray:
        """Return pixels [y0:y1, x0:x1] as a (h, w, channels) array."""

    def jpeg_tiles(self) -> JpegTiles | None:
        """Return the level's JPEG tiles if they can be copied verbatim, else None."""
        return None

    def describe_copy(self) -> str:
        """Say why `jpeg_tiles` is None (for the conversion report)."""
        return f"{self.compression} source"

    def close(self) -> None:  # noqa: B027 - levels without resources need nothing
        """Release file handles."""


@dataclass
class Source(ABC):
    """An open source slide: its levels (finest first), facts and associated images."""

    path: Path
    info: SourceInfo
    levels: list[SourceLevel]
    associated: dict[str, Callable[[], np.ndarray]] = field(default_factory=dict)

    def close(self) -> None:  # noqa: B027 - readers without resources need nothing
        """Release file handles."""

    @property
    def files(self) -> list[Path]:
        """The files the slide is read from (a DICOM series has several)."""
        return [self.path]

    def size(self) -> int:
        """Its files' bytes, together."""
        return sum(f.stat().st_size for f in self.files)

    def mtime_ns(self) -> int:
        """Its files' latest modification time (ns): with the size, what says it is the same
        file as one recorded, without reading it."""
        return max(f.stat().st_mtime_ns for f in self.files)

    def sha256(self) -> str:
        """The SHA-256 of its files' bytes, in order: what a store made from it records."""
        digest = hashlib.sha256()
        for path in self.files:
            with open(path, "rb") as fh:
                while block := fh.read(8 << 20):
                    digest.update(block)
        return digest.hexdigest()

    def __enter__(self) -> Source:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def brightfield_rgb(self) -> bool:
        """True for one 8-bit RGB colour picture not declared as fluorescence: the only kind of
        slide that may get lossy (JPEG) chunks unasked, and only where it is stored lossy."""
        level = self.levels[0]
        fluorescence = self.info.modality is not None and self.info.modality.value == "fluorescence"
        return level.rgb and level.channels == 3 and level.dtype == np.uint8 and not fluorescence

    def describe_pixels(self) -> str:
        """What the pixels are, for messages: '3 channels (DAPI, CD8, PanCK) of uint8'."""
        level = self.levels[0]
        names = [c.name for c in self.info.channels or ()]
        named = f" ({', '.join(names)})" if names else ""
        kind = "RGB" if level.rgb else f"{level.channels} channel(s)"
        return f"{kind}{named} of {level.dtype}"


@dataclass(frozen=True)
class Reader:
    """What one reader opens (xarray's `BackendEntrypoint` as the model): its name, the
    formats it opens as the refusal of any other file lists them (`opens`), its `priority`
    (lower asked first, among the readers whose `guess_can_open` says yes), the first bytes
    (`magic`) and names (`suffixes`, lower case) that mark its files, and the two functions:
    `guess_can_open(path, head)` (head: the file's first 132 bytes) and
    `open(path, head, series)`. Declared beside its reader as ``READER``; listed in
    `tilestore.sources.registry.READERS`."""

    name: str
    opens: str
    priority: int
    guess_can_open: Callable[[Path, bytes], bool]
    open: Callable[[Path, bytes, str | None], Source]
    magic: tuple[bytes, ...] = ()
    suffixes: tuple[str, ...] = ()

    def marks(self, path: Path, head: bytes) -> bool:
        """Whether the file's first bytes or its name are this reader's marks."""
        return head.startswith(self.magic) or path.suffix.lower() in self.suffixes


def checked_mpp(x: float | None, y: float | None, origin: str) -> tuple[Fact | None, str | None]:
    """Return the mpp fact, or None and a warning if the values are missing or implausible."""
    if not x or not y:
        return None, None
    if not (MPP_RANGE[0] <= x <= MPP_RANGE[1] and MPP_RANGE[0] <= y <= MPP_RANGE[1]):
        return None, (
            f"ignored resolution from {origin} ({x:.4g} x {y:.4g} µm/px is not a microscope "
            "scan resolution)"
        )
    return Fact((float(x), float(y)), origin), None


def check_whole(path: str | os.PathLike, shape: tuple[int, ...]) -> None:
    """Reject an image read whole whose declared size exceeds what memory or its file allows."""
    from tilestore.errors import SlideError

    check_size(path, shape)
    decoded = int(np.prod(shape, dtype=np.int64))
    size = os.path.getsize(path)
    if decoded > MAX_WHOLE_BYTES or decoded > MAX_RATIO * size:
        raise SlideError(
            f"{path}: declares {'x'.join(map(str, shape))} ({decoded / 2**30:.1f} GiB decoded) "
            f"in a {size / 2**10:.0f} KiB file: corrupt header, or too large to read whole "
            "(save it as a tiled TIFF)"
        )


def check_size(path: str | os.PathLike, shape: tuple[int, ...]) -> None:
    """Reject declared image sizes no scanner produces (corrupt or hostile headers)."""
    from tilestore.errors import SlideError

    if any(s <= 0 for s in shape) or max(shape) > MAX_SIDE:
        raise SlideError(
            f"{path}: declared image size {'x'.join(map(str, shape))} is not plausible "
            f"(sides must be 1-{MAX_SIDE} px); the header is corrupt"
        )
