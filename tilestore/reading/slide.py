"""`Slide`: lazy, chunk-exact reading of a tilestore store.

Coordinates: `read_region` takes level-0 pixel coordinates of the region's
top-left corner (origin at the slide's top-left, y down) and a size in pixels
of the level (or target mpp) read, as OpenSlide does. Arrays are (c, y, x);
regions come back as (h, w, c) images. xarray coordinates are OME-Zarr physical
coordinates of pixel centres, in micrometres (level-0 pixel (0, 0) at 0, 0).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated

import numpy as np
import zarr
from PIL import Image
from zarr.abc.store import Store

from tilestore.format import positions
from tilestore.format.chunks import ChannelPick, ChunkReader
from tilestore.format.record import StoreRecord

if TYPE_CHECKING:
    import dask.array as da
    import xarray as xr
from tilestore.errors import OptionError, StoreError
from tilestore.format.store import DAMAGED, open_for_writing, open_group, remote_store
from tilestore.options import Opt, checked
from tilestore.reading.resolution import MAX_MPP, MPP_TOLERANCE
from tilestore.urls import only_read

# What `Slide.read_region` is asked (a library call: no command takes these as flags).
MAX_REGION = 2**19  # px a side: past any slide's (500,000 px), and past what RAM holds
Corner = Annotated[
    float,
    Opt("A level-0 coordinate of the region's top-left corner.", unit="px", low=-MAX_REGION,
        high=2 * MAX_REGION, cli=False),
]  # fmt: skip
Side = Annotated[
    int, Opt("The region's width or height, in pixels of the level or um/px read.", unit="px",
             low=1, high=MAX_REGION, cli=False),
]  # fmt: skip
LevelIndex = Annotated[
    int | None, Opt("The level read (0: full resolution).", low=0, high=63, cli=False)
]
RegionMpp = Annotated[
    float | None,
    Opt("The um/px the region is read at.", unit="um/px", low=0, above=True, high=MAX_MPP,
        cli=False),
]  # fmt: skip
Tolerance = Annotated[
    float,
    Opt("How far off mpp (a fraction) a level may be and be read as is.", low=0, high=0.5,
        cli=False),
]  # fmt: skip


@dataclass(frozen=True)
class _Unopened:
    """A level's array as a pickled slide carries it: where it is and its metadata, made
    into a zarr array (nothing read) where it is first asked for (`Slide.array`)."""

    store_path: object  # zarr's StorePath
    metadata: dict

    @classmethod
    def of(cls, array: zarr.Array) -> _Unopened:
        return cls(array.store_path, array.metadata.to_dict())

    def open(self) -> zarr.Array:
        from zarr.core.array import AsyncArray

        return zarr.Array(AsyncArray(self.metadata, self.store_path))


@dataclass(frozen=True)
class Level:
    """One pyramid level of a store."""

    index: int
    path: str
    shape: tuple[int, int, int]  # (c, y, x)
    downsample: tuple[float, float]  # (dy, dx) relative to level 0
    chunks: tuple[int, int, int]

    @property
    def height(self) -> int:
        return self.shape[1]

    @property
    def width(self) -> int:
        return self.shape[2]


class Slide:
    """An open store: its levels, pixel size and lazy readers."""

    def __init__(self, group: zarr.Group, record: StoreRecord, name: str) -> None:
        self.group = group
        self.record = record  # what the store says about itself (`tilestore.format.record`)
        self.name = name
        try:
            self._arrays = [group[lv.path] for lv in record.levels]
            self.levels = tuple(
                Level(i, lv.path, tuple(a.shape), lv.downsample, tuple(a.chunks))
                for i, (lv, a) in enumerate(zip(record.levels, self._arrays, strict=True))
            )
        except DAMAGED as exc:  # a level's zarr.json that is not JSON, a level missing
            raise StoreError(
                f"{name}: store metadata is damaged ({type(exc).__name__}: {exc}); convert "
                "the slide again"
            ) from exc
        mpp = record.mpp
        self.mpp: tuple[float, float] | None = (mpp.x, mpp.y) if mpp else None
        self.background: int = record.background
        # each level's reader made where it is first asked for (`chunks`)
        self._readers: list[ChunkReader | ChannelPick | None] = [None] * len(self._arrays)

    def __copy__(self) -> Slide:
        """A view (`as_rgb`) shares the levels made (a copy through `__getstate__` would
        make each again from its metadata)."""
        view = object.__new__(type(self))
        view.__dict__.update(self.__dict__)
        return view

    def __getstate__(self) -> dict:
        """Pickled (a store process sends the slide it opened to the run), a level no
        reader was made for travels as its metadata, made into an array only where it is
        asked for: zarr's codecs made again cost the run a small slide's GIL three times
        over, for the one level it reads (bench/RESULTS.md, issue 68)."""
        state = self.__dict__.copy()
        state["_arrays"] = [
            a if reader is not None or isinstance(a, _Unopened) else _Unopened.of(a)
            for a, reader in zip(self._arrays, self._readers, strict=True)
        ]
        return state

    def __repr__(self) -> str:
        mpp = f"{self.mpp[0]:.4g} µm/px" if self.mpp else "mpp unknown"
        size = f"{self.shape[2]}x{self.shape[1]} px"
        return f"<Slide {self.name} {size}, {len(self.levels)} levels, {mpp}>"

    @property
    def shape(self) -> tuple[int, int, int]:
        """Level-0 shape (c, y, x)."""
        return self.levels[0].shape

    @property
    def rgb(self) -> bool:
        """The pixels are one 8-bit RGB colour picture (what RGB models take), not other
        channels: recorded at conversion; stores from before, by their shape and dtype."""
        if self.picked:  # an `as_rgb` view
            return True
        three = self.shape[0] == 3 and self.array(0).dtype == np.uint8
        return three and self.record.rgb

    @property
    def fluorescence(self) -> bool:
        """The store records a fluorescence scan (dark background, markers as channels)."""
        return self.record.fluorescence

    def channel_index(self, channel: str | int) -> int:
        """A channel's index from its name or number; TilestoreError naming the channels."""
        names = list(self.record.channels)
        text = str(channel)
        if text in names:
            return names.index(text)
        if text.isdigit() and int(text) < self.shape[0]:
            return int(text)
        raise OptionError(
            f"{self.name}: no channel {text!r} (channels: {', '.join(names) or 'unnamed'})"
        )

    def as_rgb(self, channels: Sequence[str | int]) -> Slide:
        """This store seen as the 8-bit RGB picture an RGB model takes: three of its channels
        (by name or index) as R, G and B, each scaled linearly from its display window
        (OME-Zarr `omero` window start-end, as napari shows it) to 0-255. Only chunk reads
        change (`chunks`); a brightfield store that is already RGB is refused (nothing to
        choose); a fluorescence scan stored as RGB is not (its channels are markers)."""
        if self.rgb and not self.fluorescence:
            raise OptionError(f"{self.name}: is already an RGB picture; no channels to choose")
        if len(channels) != 3:
            raise OptionError(
                f"{self.name}: an RGB model takes 3 channels, {len(channels)} given "
                f"({', '.join(map(str, channels))})"
            )
        indices = [self.channel_index(c) for c in channels]
        omero = (self.group.attrs.get("ome") or {}).get("omero") or {}
        shown = omero.get("channels") or []
        top = float(np.iinfo(self.array(0).dtype).max) if self.array(0).dtype.kind in "ui" else 1.0
        windows = []
        for i in indices:
            window = shown[i].get("window", {}) if i < len(shown) else {}
            windows.append((float(window.get("start", 0)), float(window.get("end", top))))
        view = copy.copy(self)
        view._readers = [None] * len(self._arrays)
        view._pick = (indices, windows)
        view.picked = tuple(
            (self.record.channels or tuple(str(i) for i in range(self.shape[0])))[i]
            for i in indices
        )
        return view

    picked: tuple[str, ...] | None = None  # the channels an `as_rgb` view shows, in order
    _pick: tuple | None = None  # an `as_rgb` view: the (indices, windows) its readers pick
    source: object = None  # a slide read in place: its open file (`tilestore.conversion.sidecar`)

    def describe_channels(self) -> str:
        """'3 channels (DAPI, CD8, PanCK) of uint8', for messages."""
        names = ", ".join(self.record.channels)
        return f"{self.shape[0]} channel(s) ({names}) of {self.array(0).dtype}"

    def array(self, level: int = 0) -> zarr.Array:
        """Return the zarr array of a level."""
        array = self._arrays[level]
        if isinstance(array, _Unopened):  # a level of a slide that travelled pickled
            array = self._arrays[level] = array.open()
        return array

    def writable_group(self) -> zarr.Group:
        """Return the store's root group opened for writing (for derived data: labels, plans,
        embeddings); the pixels are never rewritten. A store read through a URL (a bucket's,
        a web server's) is refused: it is only read where it is, written only whole
        (`convert -o s3://...`), never a label, plan or group at a time."""
        if remote_store(self.group.store):
            raise only_read(str(self.group.store), "a label, plan or embeddings group")
        try:
            return open_for_writing(self.group.store.with_read_only(False))
        except (OSError, ValueError, zarr.errors.BaseZarrError) as exc:
            raise StoreError(f"{self.name}: cannot open the store for writing: {exc}") from exc

    def chunks(self, level: int = 0) -> ChunkReader:
        """Return the whole-chunk reader of a level (encoded bytes, decode, windows)."""
        reader = self._readers[level]
        if reader is None:  # made once (two threads at once: two alike, one kept)
            every_chunk, tied = self.record.integrity.every_chunk, positions.declared(self.record)
            reader = ChunkReader(self.array(level), self.background, self.name, every_chunk, tied)
            if self._pick is not None:
                reader = ChannelPick(reader, *self._pick)
            self._readers[level] = reader
        return reader

    def level_mpp(self, level: int) -> tuple[float, float]:
        """Return (x, y) µm per pixel of a level."""
        if self.mpp is None:
            raise StoreError(
                f"{self.name}: pixel size unknown (convert again with mpp=<um/px>, or embed "
                "the slide file with scan_mpp=<um/px>)"
            )
        dy, dx = self.levels[level].downsample
        return self.mpp[0] * dx, self.mpp[1] * dy

    def level_for_mpp(self, mpp: float, tolerance: float = MPP_TOLERANCE) -> int:
        """Return the coarsest level whose pixels are at least as fine as `mpp` (within tolerance).

        A level slightly coarser than asked (0.5015 for 0.5) counts as fine
        enough when within `tolerance`, so tiny calibration differences do not
        force reading a level four times larger.
        """
        fine_enough = [
            lv.index for lv in self.levels if self.level_mpp(lv.index)[0] <= mpp * (1 + tolerance)
        ]
        return max(fine_enough) if fine_enough else 0

    @checked
    def read_region(
        self,
        x: Corner,
        y: Corner,
        w: Side,
        h: Side,
        *,
        level: LevelIndex = None,
        mpp: RegionMpp = None,
        tolerance: Tolerance = MPP_TOLERANCE,
    ) -> np.ndarray:
        """Return the (h, w, c) region whose top-left corner is level-0 pixel (x, y).

        At a coarser level the corner is the level pixel nearest to (x, y).

        With `level`, w and h are pixels of that level (0 to the slide's last; no index
        from the end). With `mpp`, they are pixels at that resolution (above 0): the
        region is read from `level_for_mpp` and resampled (antialiased bilinear) unless
        that level is within tolerance. Parts outside the slide are the background value
        (white for brightfield). OptionError names an argument out of its range (a NaN
        corner, mpp=0, a level the slide lacks), before anything is read.
        """
        if (level is None) == (mpp is None):
            raise TypeError("read_region needs exactly one of level= or mpp=")
        if level is not None and level >= len(self.levels):
            raise OptionError(f"level={level}: {self.name} has levels 0 to {len(self.levels) - 1}")
        if mpp is None:
            return self._read_level(level, x, y, w, h)
        index, sw, sh = self.level_window(w, h, mpp, tolerance)
        pixels = self._read_level(index, x, y, sw, sh)
        return pixels if (sw, sh) == (w, h) else resize(pixels, w, h)

    def level_window(
        self, w: int, h: int, mpp: float, tolerance: float = MPP_TOLERANCE
    ) -> tuple[int, int, int]:
        """(level, w', h'): where `read_region(..., w, h, mpp=mpp)` reads from, and how many
        of that level's pixels (resized to w x h where they differ)."""
        index = self.level_for_mpp(mpp, tolerance)
        lx, ly = self.level_mpp(index)
        if abs(mpp / lx - 1) <= tolerance and abs(mpp / ly - 1) <= tolerance:
            return index, w, h
        return index, max(1, round(w * mpp / lx)), max(1, round(h * mpp / ly))

    def level_corner(self, level: int, x, y):
        """The level pixel nearest to level-0 pixel (x, y), halves up (arrays too): where
        a region read at that level starts (round trips plan tiles)."""
        dy, dx = self.levels[level].downsample
        return np.floor(np.asarray(x) / dx + 0.5).astype(int), np.floor(
            np.asarray(y) / dy + 0.5
        ).astype(int)

    def _read_level(self, level: int, x: int, y: int, w: int, h: int) -> np.ndarray:
        lv = self.levels[level]
        x0, y0 = (int(v) for v in self.level_corner(level, x, y))
        out = np.full((h, w, lv.shape[0]), self.background, dtype=self.array(level).dtype)
        # Clip to the level: exactly the chunks the window overlaps are fetched.
        cx0, cy0 = max(x0, 0), max(y0, 0)
        cx1, cy1 = min(x0 + w, lv.width), min(y0 + h, lv.height)
        if cx1 > cx0 and cy1 > cy0:
            block = self.chunks(level).read(cy0, cy1, cx0, cx1)
            out[cy0 - y0 : cy1 - y0, cx0 - x0 : cx1 - x0] = block
        return out

    def to_dask(self, level: int = 0) -> da.Array:
        """Return a level as a lazy (c, y, x) dask array, one dask chunk per store chunk.

        Each block is read as `read_region` reads it (`chunks(level)`): a chunk missing where
        the store was written whole, or damaged (its checksum, its codec, not a regular
        file), is a ChunkError naming store, level and chunk, never background or a codec's
        raw error; only a store that says chunks may be absent reads them as background."""
        import dask.array as da  # here, not at import: 1 s of every command's start
        from dask.base import tokenize

        reader = self.chunks(level)
        view = _Level(reader, self.levels[level], self.array(level))
        token = tokenize(str(self.group.store), self.array(level).path, self.picked)
        return da.from_array(
            view,
            chunks=(view.shape[0], *self.array(level).chunks[1:]),
            name=f"tilestore-{self.name}-level{level}-{token}",
            lock=False,
            asarray=True,
            fancy=False,
            meta=np.empty((0, 0, 0), view.dtype),
        )

    def to_xarray(self, level: int = 0) -> xr.DataArray:
        """Return a level as a lazy DataArray with pixel-centre coordinates in µm (or pixels)."""
        lv = self.levels[level]
        (dy, dx), (py, px) = lv.downsample, (self.mpp[1], self.mpp[0]) if self.mpp else (1, 1)
        unit = "micrometer" if self.mpp else "level-0 pixel"
        coords = {
            "c": list(self.record.channels),
            "y": ("y", (np.arange(lv.height) * dy + (dy - 1) / 2) * py, {"units": unit}),
            "x": ("x", (np.arange(lv.width) * dx + (dx - 1) / 2) * px, {"units": unit}),
        }
        import xarray as xr

        return xr.DataArray(
            self.to_dask(level),
            dims=("c", "y", "x"),
            coords=coords,
            name=self.name,
            attrs={
                "level": level,
                "downsample": list(lv.downsample),
                "mpp": list(self.level_mpp(level)) if self.mpp else None,
            },
        )


class _Level:
    """A level as an array-like for dask: every block read through the level's checked
    reader (`ChunkReader` or an `as_rgb` view's `ChannelPick`)."""

    ndim = 3

    def __init__(self, reader, level: Level, array: zarr.Array) -> None:
        self.reader = reader
        self.shape = (reader.channels, level.height, level.width)
        self.dtype = np.dtype(np.uint8) if isinstance(reader, ChannelPick) else array.dtype

    def __getitem__(self, index: tuple[slice, slice, slice]) -> np.ndarray:
        c, y, x = (s.indices(n) for s, n in zip(index, self.shape, strict=True))
        if y[0] >= y[1] or x[0] >= x[1]:
            return np.empty((c[1] - c[0], max(0, y[1] - y[0]), max(0, x[1] - x[0])), self.dtype)
        pixels = self.reader.read(y[0], y[1], x[0], x[1])
        return np.moveaxis(pixels, -1, 0)[c[0] : c[1]]


def slide_of(store: Store, name: str | None = None) -> Slide:
    """The `Slide` of a complete store given as a zarr v3 store object."""
    group, record = open_group(store)
    return Slide(group, record, name or str(store))


THREADED_PX = 1 << 22  # from 4 Mpx (a 100k slide's tissue level: 39 Mpx) in bands on threads
BAND_PX = 256  # rows (across) or columns (down) a thread resamples at a time


def resize(image: np.ndarray, w: int, h: int) -> np.ndarray:
    """Resample an (h, w, c) image to (h, w) with antialiased bilinear filtering (PIL's).
    A large 8-bit image is resampled in bands on threads (`_resize_in_bands`) where PIL
    resamples across first, else a channel a thread (PIL lets go of the GIL while it
    resamples, and a channel alone comes out as the same bytes as in the RGB image)."""
    large = image.dtype == np.uint8 and image[..., 0].size >= THREADED_PX
    if large and image.shape[2] in (1, 3) and _across_first(image.shape, w, h):
        return _resize_in_bands(image, w, h)
    if large and image.shape[2] == 3:
        planes = [np.ascontiguousarray(image[..., c]) for c in range(3)]
        with ThreadPoolExecutor(3, thread_name_prefix="tilestore-resize") as pool:
            resized = list(pool.map(lambda plane: resize(plane[..., None], w, h), planes))
        return np.concatenate(resized, axis=-1)
    if image.dtype == np.uint8 and image.shape[2] in (1, 3):
        pil = Image.fromarray(image[..., 0] if image.shape[2] == 1 else image)
        out = np.asarray(pil.resize((w, h), Image.Resampling.BILINEAR))
        return out.reshape(h, w, image.shape[2])
    channels = [
        np.asarray(
            Image.fromarray(image[..., c].astype(np.float32)).resize(
                (w, h), Image.Resampling.BILINEAR
            )
        )
        for c in range(image.shape[2])
    ]
    out = np.stack(channels, axis=-1)
    if image.dtype.kind in "ui":
        info = np.iinfo(image.dtype)
        out = np.clip(np.rint(out), info.min, info.max)
    return out.astype(image.dtype)


def _across_first(shape: tuple[int, ...], w: int, h: int) -> bool:
    """Whether every Pillow resamples across before down for these sizes: Pillow 13 goes
    down first where the height shrinks by more than twice what the width does (its
    `ImagingResampleInner`); 12.2 and 12.3 where an image over 100 times taller than wide
    shrinks in height (`Image.resize`); earlier ones never. Where all agree, so does
    `_resize_in_bands` (a test checks on the Pillow installed)."""
    height, width = shape[:2]
    pillow_13 = height - h > 0 and height - h > (width - w) * 2
    pillow_12_2 = height > 100 * width and h < height
    return not (pillow_13 or pillow_12_2)


def _resize_in_bands(image: np.ndarray, w: int, h: int) -> np.ndarray:
    """PIL's 8-bit resize is two passes, here across (each row alone, rounded to 8 bits),
    then down (each column alone), each pass's weights set by the image's and the output's
    sizes alone. So the rows are resampled across in bands, then the columns down in
    strips, on threads (PIL lets go of the GIL while it resamples): the same bytes as one
    call (a test checks), on all the CPUs where one call keeps one busy (a 100k slide's
    6,250 px tissue level: 1.1 s in one call per channel, on a 16-CPU machine)."""
    from tilestore.cpus import usable_cpus

    height, channels = image.shape[0], image.shape[2]

    def pil(pixels: np.ndarray, size: tuple[int, int]) -> np.ndarray:
        flat = pixels[..., 0] if channels == 1 else pixels
        out = Image.fromarray(np.ascontiguousarray(flat)).resize(size, Image.Resampling.BILINEAR)
        return np.asarray(out).reshape(size[1], size[0], channels)

    across = np.empty((height, w, channels), np.uint8)
    out = np.empty((h, w, channels), np.uint8)

    def rows(y: int) -> None:
        band = image[y : y + BAND_PX]
        across[y : y + BAND_PX] = pil(band, (w, len(band)))

    def columns(x: int) -> None:
        strip = across[:, x : x + BAND_PX]
        out[:, x : x + BAND_PX] = pil(strip, (strip.shape[1], h))

    with ThreadPoolExecutor(usable_cpus(), thread_name_prefix="tilestore-resize") as pool:
        list(pool.map(rows, range(0, height, BAND_PX)))  # raises a band's error
        list(pool.map(columns, range(0, w, BAND_PX)))
    return out
