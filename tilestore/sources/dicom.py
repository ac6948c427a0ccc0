"""DICOM whole-slide images (VL Whole Slide Microscopy) through wsidicom.

A slide is one DICOM series: one instance (file) or more per pyramid level, TILED_FULL or
TILED_SPARSE, possibly concatenated, plus LABEL and OVERVIEW instances. A `.dcm` file, a
folder of one series' files, or one series of a folder that holds several can be opened
(`dicom_series` lists a folder's series). JPEG baseline frames are complete JPEG streams,
copied as chunks like SVS tiles; frames of other transfer syntaxes (JPEG 2000, JPEG-LS, RLE,
uncompressed) are decoded by wsidicom. Several optical paths of one sample each
(fluorescence) are the slide's channels; of several focal planes the one nearest 0 is read.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tilestore.errors import SlideError
from tilestore.format import jpeg
from tilestore.sources.base import (
    MAX_SIDE,
    Channel,
    Fact,
    JpegTiles,
    Reader,
    Source,
    SourceInfo,
    SourceLevel,
    check_size,
    checked_mpp,
)
from tilestore.sources.storage import dicom_lossless

JPEG_BASELINE = "1.2.840.10008.1.2.4.50"
# photometric interpretation -> what the samples in a JPEG frame are
_JPEG_COLOR = {
    "YBR_FULL_422": "ycbcr",
    "YBR_FULL": "ycbcr",
    "RGB": "rgb",
    "MONOCHROME2": "grayscale",
}
# transfer syntaxes of WSI frames, by the names this project uses for compressions
_COMPRESSION = {
    JPEG_BASELINE: "jpeg",
    "1.2.840.10008.1.2.4.90": "jpeg2000",  # lossless only
    "1.2.840.10008.1.2.4.91": "jpeg2000",
    "1.2.840.10008.1.2.4.201": "htj2k",
    "1.2.840.10008.1.2.4.202": "htj2k",
    "1.2.840.10008.1.2.4.203": "htj2k",
    "1.2.840.10008.1.2.4.80": "jpegls",
    "1.2.840.10008.1.2.4.81": "jpegls",
    "1.2.840.10008.1.2.4.57": "jpeg-lossless",
    "1.2.840.10008.1.2.4.70": "jpeg-lossless",
    "1.2.840.10008.1.2.5": "rle",
    "1.2.840.10008.1.2.1": "none",
    "1.2.840.10008.1.2": "none",
}
_RGB = {"RGB", "YBR_FULL_422", "YBR_FULL", "YBR_ICT", "YBR_RCT"}
DICM_OFFSET = 128  # a DICOM file's 128-byte preamble, then "DICM"
# a frame's and the whole image's (width, height) attributes
_SIZES = ("Columns", "Rows", "TotalPixelMatrixColumns", "TotalPixelMatrixRows")
WSI_SOP_CLASS = "1.2.840.10008.5.1.4.1.1.77.1.6"  # VL Whole Slide Microscopy Image Storage
# what every VL WSI file must say (type 1), and what it is, for the refusal
_REQUIRED = (
    ("ImageType", "VOLUME, LABEL, OVERVIEW or THUMBNAIL"),
    ("Columns", "a frame's width"),
    ("Rows", "a frame's height"),
    ("TotalPixelMatrixColumns", "the whole image's width"),
    ("TotalPixelMatrixRows", "the whole image's height"),
    ("DimensionOrganizationType", "how its frames tile the image"),  # or frames' positions
)
_READ = (
    *_SIZES,
    "SOPClassUID",
    "ImageType",
    "DimensionOrganizationType",
    "PerFrameFunctionalGroupsSequence",
)


def is_dicom_file(head: bytes) -> bool:
    """True where a file's first 132 bytes are a DICOM preamble and magic."""
    return head[DICM_OFFSET : DICM_OFFSET + 4] == b"DICM"


def dicom_series(
    path: str | os.PathLike, other: Callable[[Path, bytes], bool] | None = None
) -> dict[str, list[Path]]:
    """The DICOM files of a file or folder by SeriesInstanceUID, in a stable order. Files of
    a folder that are not DICOM are left out, unless they are slides of another format
    beside DICOM files: a folder is taken for a DICOM slide, so they would be left out
    without a word; that folder is refused, naming them. other(path, head): whether a file
    is marked as another reader's (`tilestore.sources.registry.marked_by_another`)."""
    import pydicom

    path = Path(path)
    candidates = [path] if path.is_file() else sorted(p for p in path.iterdir() if p.is_file())
    series: dict[str, list[Path]] = {}
    others: list[Path] = []
    for candidate in candidates:
        try:
            with open(candidate, "rb") as fh:
                head = fh.read(DICM_OFFSET + 4)
            if not is_dicom_file(head):
                if other is not None and other(candidate, head):
                    others.append(candidate)
                continue
            ds = pydicom.dcmread(
                candidate, stop_before_pixels=True, specific_tags=["SeriesInstanceUID", *_READ]
            )
        except (OSError, EOFError, ValueError, pydicom.errors.InvalidDicomError) as exc:
            raise SlideError(f"{candidate}: not a readable DICOM file: {exc}") from exc
        _check_required(candidate, ds)
        _check_sizes(candidate, ds)
        uid = str(ds.get("SeriesInstanceUID", "")) or "unknown"
        series.setdefault(uid, []).append(candidate)
    if series and others:
        files = sum(len(f) for f in series.values())
        names = ", ".join(p.name for p in others[:4]) + (", ..." if len(others) > 4 else "")
        raise SlideError(
            f"{path}: the folder holds {files} DICOM file(s) and {len(others)} slide(s) of "
            f"other formats ({names}), which a folder taken as a DICOM slide would leave out: "
            f"give the slide files themselves ({path}/*), or a folder holding only DICOM files"
        )
    return dict(sorted(series.items()))


def _check_required(path: Path, ds: object) -> None:
    """Refuse a VL Whole Slide Microscopy file without an attribute the standard requires of
    it and wsidicom needs, naming it: wsidicom left such a file out of the series, then
    said "Level files not found in provided files" (or "Undetermined tile type"), naming
    neither. Files of other kinds are left for wsidicom to judge."""
    if str(ds.get("SOPClassUID", "")) != WSI_SOP_CLASS:
        return
    missing = [name for name, _ in _REQUIRED[:-1] if ds.get(name) in (None, "")]
    volume = len(ds.get("ImageType") or ()) > 2 and ds.ImageType[2] == "VOLUME"
    tiling = ("DimensionOrganizationType", "PerFrameFunctionalGroupsSequence")
    if volume and not any(name in ds for name in tiling):  # neither TILED_FULL nor positions
        missing.append("DimensionOrganizationType")
    if missing:
        what = dict(_REQUIRED)[missing[0]]
        raise SlideError(
            f"{path}: a DICOM whole-slide image file without {missing[0]} ({what}), which the "
            "standard requires: not a conformant DICOM WSI; export it again with a conformant "
            "tool (e.g. wsidicomizer)"
        )


def _check_sizes(path: Path, ds: object) -> None:
    """Refuse a file whose frames or whole image declare a side no image has: wsidicom
    divides by the frame's and allocates by both, trusting whatever the header says."""
    for what, (columns, rows) in (("frames", _SIZES[:2]), ("an image", _SIZES[2:])):
        width, height = ds.get(columns), ds.get(rows)
        if width is None or height is None:
            continue  # absent (not a tiled image): wsidicom says what it misses
        if not (1 <= int(width) <= MAX_SIDE and 1 <= int(height) <= MAX_SIDE):
            raise SlideError(
                f"{path}: declares {what} of {width}x{height} px ({columns} x {rows}; "
                f"plausible: 1-{MAX_SIDE} px a side); the header is corrupt"
            )


@dataclass
class DicomLevel(SourceLevel):
    """One pyramid level of a DICOM series, read through wsidicom."""

    wsi: object = None  # wsidicom.WsiDicom
    handle: object = None  # its wsidicom Level
    level: int = 0  # wsidicom's level number (log2 of its scale)
    paths: tuple[str, ...] = ()  # optical paths read as channels (one: the colour image)
    z: float = 0.0
    photometric: str = ""
    transfer_syntax: str = ""
    where: str = ""

    def read(self, y0: int, y1: int, x0: int, x1: int) -> np.ndarray:
        size = (x1 - x0, y1 - y0)
        try:
            planes = [
                np.asarray(self.wsi.read_region((x0, y0), self.level, size, z=self.z, path=p))
                for p in self.paths
            ]
        except Exception as exc:  # wsidicom and its decoders raise many kinds
            raise SlideError(
                f"{self.where}: cannot decode rows {y0}-{y1} ({type(exc).__name__}: {exc})"
            ) from exc
        if len(planes) == 1:
            return planes[0] if planes[0].ndim == 3 else planes[0][..., None]
        return np.stack([p if p.ndim == 2 else p[..., 0] for p in planes], axis=-1)

    def _copy_blocker(self) -> str | None:
        if self.transfer_syntax != JPEG_BASELINE:
            return f"DICOM transfer syntax {self.transfer_syntax}, not JPEG baseline"
        if len(self.paths) != 1:
            return "one optical path per channel"
        if self.photometric not in _JPEG_COLOR:
            return f"photometric {self.photometric}"
        return None

    def describe_copy(self) -> str:
        return self._copy_blocker() or "frames not copyable"

    def jpeg_tiles(self) -> JpegTiles | None:
        if self._copy_blocker() is not None:
            return None
        image_data = self.handle.default_instance.image_data
        (path,) = self.paths
        frame = self._frames(image_data, path)
        first = _first(frame, image_data.tiled_size)
        if first is None:
            return None
        try:
            header = jpeg.read_header(first)
        except ValueError:
            return None
        color_space = _JPEG_COLOR[self.photometric]
        mark_rgb = jpeg.copy_marking(header, color_space)  # RGB-coded frames carry no JFIF
        if mark_rgb is None:
            return None

        def read_tile(row: int, col: int) -> bytes | None:
            data = frame(row, col)  # None: TILED_SPARSE, never scanned: the background
            return None if data is None else jpeg.complete_stream(data, None, mark_rgb=mark_rgb)

        size, tiled = image_data.tile_size, image_data.tiled_size
        return JpegTiles(
            (size.height, size.width),
            (tiled.height, tiled.width),
            color_space,
            header.sampling,
            read_tile,
        )

    def first_frame(self) -> bytes | None:
        """The level's first encoded frame (of its first optical path), None where it has
        none; the files it was read through are closed again."""
        image_data = self.handle.default_instance.image_data
        try:
            return _first(self._frames(image_data, self.paths[0]), image_data.tiled_size)
        finally:
            self.close()

    def _frames(self, image_data: object, path: str) -> Callable[[int, int], bytes | None]:
        """(row, col) -> the tile's encoded frame, None where the level has none. Frames are
        read with `os.pread` at the offsets of wsidicom's frame index, from any thread at
        once (wsidicom's own read takes a lock and a seek per frame: 3x slower copying)."""
        from wsidicom.geometry import Point

        index = image_data.tiles
        readers = getattr(image_data, "_readers", None)  # one per file of the level
        if readers is None or not all(hasattr(type(r), "frame_index") for r in readers):
            readers = []  # another wsidicom: read through its API
        spans = []
        for reader in readers:
            try:
                positions = reader.frame_index  # parsed from the file on first use
            except Exception as exc:  # a truncated file: EOFError
                raise SlideError(
                    f"{self.where}: cannot read its frame index ({type(exc).__name__}: {exc}); "
                    "the file is truncated or damaged"
                ) from exc
            fd = os.open(reader.filepath, os.O_RDONLY)
            self._fds = [*getattr(self, "_fds", []), fd]
            spans.append((reader.frame_offset, reader.frame_count, fd, positions))

        number_of = _full_frame_numbers(index, self.z, path)

        def frame(row: int, col: int) -> bytes | None:
            try:
                number = (
                    number_of(row, col)
                    if number_of
                    else index.get_frame_index(Point(col, row), self.z, path)
                )
            except (KeyError, IndexError, LookupError):
                return None
            if number < 0:
                return None
            try:
                for first, count, fd, positions in spans:
                    if first <= number < first + count:
                        position, length = positions[number - first]
                        data = os.pread(fd, length, position)
                        if len(data) != length:
                            raise EOFError(f"read {len(data)} of {length} bytes")
                        return data
                return self.wsi.read_encoded_tile(
                    self.level, (col, row), z=self.z, path=path, crop_to_image_boundary=False
                )
            except Exception as exc:  # a truncated file: EOFError; a bad index: others
                raise SlideError(
                    f"{self.where} frame ({row}, {col}): cannot read ({type(exc).__name__}: "
                    f"{exc}); the file is truncated or damaged"
                ) from exc

        return frame

    def close(self) -> None:
        for fd in getattr(self, "_fds", []):
            os.close(fd)
        self._fds = []


def _first(frame: Callable[[int, int], bytes | None], tiled: object) -> bytes | None:
    """The first frame there is, in row-major order (a TILED_SPARSE level may lack the
    top-left one)."""
    rows, cols = tiled.height, tiled.width
    return next((f for t in range(rows * cols) if (f := frame(*divmod(t, cols)))), None)


def _full_frame_numbers(index: object, z: float, path: str) -> Callable[[int, int], int] | None:
    """(row, col) -> frame number by arithmetic for a TILED_FULL level, whose frames are in
    row-major order within each focal plane and optical path (wsidicom's FullTileIndex
    computes the same per call, at a third of a copied frame's time); None for other
    indexes (TILED_SPARSE: looked up per tile)."""
    from wsidicom.geometry import Point

    try:
        from wsidicom.instance.tile_index.full_tile_index import FullTileIndex
    except ImportError:  # another wsidicom
        return None
    if not isinstance(index, FullTileIndex):
        return None
    base, width = index.get_frame_index(Point(0, 0), z, path), index.tiled_size.width
    return lambda row, col: base + row * width + col


class DicomSource(Source):
    """A DICOM WSI series: its pyramid levels, mpp, optical paths, label and overview."""

    format = "dicom"

    def __init__(self, path: Path, files: list[Path]) -> None:
        from wsidicom import WsiDicom

        try:
            wsi = WsiDicom.open(files)
        except Exception as exc:  # wsidicom raises its own and pydicom's errors
            raise SlideError(f"{path}: not a readable DICOM WSI series: {exc}") from exc
        self._wsi, self._files = wsi, list(files)
        try:
            levels, info = self._read(path, wsi)
        except BaseException:
            wsi.close()
            raise
        associated = {}
        if wsi.labels:
            associated["label"] = lambda: np.asarray(wsi.read_label())
        if wsi.overviews:
            associated["macro"] = lambda: np.asarray(wsi.read_overview())
        super().__init__(path, info, levels, associated)

    @staticmethod
    def _read(path: Path, wsi: object) -> tuple[list[DicomLevel], SourceInfo]:
        if not wsi.levels:
            raise SlideError(f"{path}: DICOM series holds no VOLUME (pyramid) instances")
        warnings = []
        base = wsi.levels.base_level
        planes = sorted(base.focal_planes, key=abs)
        if len(planes) > 1:
            warnings.append(f"{len(planes)} focal planes; the one at z={planes[0]} is read")
        paths = tuple(str(p) for p in base.optical_paths)
        data = base.default_instance.image_data
        photometric = str(data.photometric_interpretation)
        samples = int(data.samples_per_pixel)
        if len(paths) > 1 and samples != 1:
            warnings.append(f"{len(paths)} optical paths of colour images; the first is read")
            paths = paths[:1]
        channels = samples if len(paths) == 1 else len(paths)
        levels = []
        for level in wsi.levels:
            image_data = level.default_instance.image_data
            height, width = level.size.height, level.size.width
            check_size(path, (height, width))
            bits = int(image_data.bits)
            syntax = str(image_data.transfer_syntax)
            made = DicomLevel(
                shape=(height, width),
                channels=channels,
                dtype=np.dtype(np.uint8 if bits <= 8 else np.uint16),
                compression=_COMPRESSION.get(syntax, "dicom"),
                tile_shape=(level.tile_size.height, level.tile_size.width),
                rgb=photometric in _RGB and samples == 3 and len(paths) == 1,
                wsi=wsi,
                handle=level,
                level=level.level,
                paths=paths,
                z=planes[0],
                photometric=photometric,
                transfer_syntax=syntax,
                where=f"{path}: level {len(levels)}",
            )
            made.lossless = dicom_lossless(syntax, made.first_frame)
            levels.append(made)
        mpp = base.mpp  # µm/px, from PixelSpacing in the shared functional groups
        mpp_fact, warning = (
            checked_mpp(mpp.width, mpp.height, "DICOM PixelSpacing") if mpp else (None, None)
        )
        warnings += [warning] if warning else []
        dataset = base.datasets[0]
        power = next(
            (
                float(op.ObjectiveLensPower)
                for op in dataset.get("OpticalPathSequence", [])
                if op.get("ObjectiveLensPower")
            ),
            None,
        )
        fluorescence = len(paths) > 1 or (samples == 1 and photometric == "MONOCHROME2")
        info = SourceInfo(
            format="dicom",
            vendor=str(dataset.get("Manufacturer", "")) or None,
            mpp=mpp_fact,
            objective_power=Fact(power, "DICOM ObjectiveLensPower") if power else None,
            modality=(
                Fact("fluorescence", f"DICOM: {len(paths)} optical path(s) of one sample")
                if fluorescence
                else None
            ),
            channels=tuple(Channel(p) for p in paths) if len(paths) > 1 else None,
            series=str(dataset.get("SeriesInstanceUID", "")) or None,
            warnings=tuple(warnings),
        )
        return levels, info

    @property
    def files(self) -> list[Path]:
        return self._files

    def close(self) -> None:
        for level in self.levels:
            level.close()
        self._wsi.close()


def open_dicom(path: Path, series: str | None = None) -> DicomSource:
    """The DICOM series at `path` (a file, or a folder of one series, or `series` of a folder
    that holds several)."""
    found = dicom_series(path)
    if not found:
        raise SlideError(f"{path}: folder holds no DICOM files")
    if series is None:
        if len(found) > 1:
            raise SlideError(
                f"{path}: holds {len(found)} DICOM series ({', '.join(found)}): `tilestore "
                "convert` makes a store of each; in Python pass series=<SeriesInstanceUID>"
            )
        (files,) = found.values()
    elif series in found:
        files = found[series]
    else:
        raise SlideError(f"{path}: no DICOM series {series} (found: {', '.join(found)})")
    return DicomSource(path, files)


READER = Reader(
    "dicom",
    "DICOM",
    priority=10,
    guess_can_open=lambda path, head: is_dicom_file(head),
    open=lambda path, head, series: open_dicom(path, series),
)
