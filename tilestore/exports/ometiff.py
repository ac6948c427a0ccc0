"""A store out as a tiled, pyramidal OME-TIFF, for QuPath, OMERO and other Bio-Formats tools.

Level 0 is the first image; the coarser levels are its SubIFDs, as Bio-Formats reads
pyramids. A JPEG store's chunks are complete JPEG streams of the chunk's size, so each
becomes one TIFF tile byte for byte (checksum stripped), never decoded: a copied level
keeps its colour coding (YCbCr, or Aperio's RGB-coded JPEG as photometric RGB) and its
chroma subsampling. A lossless store is written tile by tile with a lossless TIFF codec
(deflate by default: every TIFF reader has it; zstd or LZW on request), its channels as
OME channels with their names. Labels (the tissue mask) can follow as further OME images.
Written under a temporary name beside the target and renamed when complete.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
import tifffile

from tilestore.errors import StoreError
from tilestore.exports.files import Exported
from tilestore.format.codecs import chroma_sampling, coded_color_space, encode_chunk
from tilestore.format.records import LabelRecord, read_record
from tilestore.options import Opt, checked
from tilestore.reading.opening import open_slide
from tilestore.reading.slide import Slide

LOSSLESS = {"deflate": "adobe_deflate", "zstd": "zstd", "lzw": "lzw"}
Compression = Annotated[
    Literal["deflate", "zstd", "lzw"],
    Opt("Lossless stores: deflate, zstd or lzw (JPEG chunks are copied)."),
]
UM = "\u00b5m"


@dataclass
class TiffExport:
    """What `to_ome_tiff` wrote."""

    path: Path
    levels: list[dict] = field(default_factory=list)  # shape, tiles, how (copy / encode)
    labels: list[str] = field(default_factory=list)
    seconds: float = 0.0
    bytes: int = 0


@checked
def to_ome_tiff(
    store: str | os.PathLike,
    path: str | os.PathLike,
    *,
    compression: Compression = "deflate",
    labels: bool = False,
    overwrite: bool = False,
) -> TiffExport:
    """Write the store's pyramid as an OME-TIFF at `path`; return what was written.

    Parameters
    ----------
    store : str or path
        A store made by `tilestore.convert`.
    path : str or path
        The .ome.tiff written (under a temporary name, renamed when whole).
    compression : {"deflate", "zstd", "lzw"}
        The lossless codec for stores that are not JPEG; JPEG chunks are copied.
    labels : bool
        Also write each label image (tissue) as a further OME image at its own resolution.
    overwrite : bool
        Replace an existing file (else StoreError).

    Returns
    -------
    TiffExport
        The path, each level's shape, tiles and how they were written (copied or
        encoded), the labels written, seconds and bytes.
    """
    started = time.perf_counter()
    path = Path(path)
    if path.exists() and not overwrite:
        raise StoreError(f"{path}: already exists; pass overwrite=True to replace it")
    slide = open_slide(store)
    result = TiffExport(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:
        with tifffile.TiffWriter(tmp, bigtiff=True, ome=True) as tif:
            _write_pyramid(tif, slide, LOSSLESS[compression], result)
            if labels:
                result.labels = _write_labels(tif, slide)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    result.seconds = time.perf_counter() - started
    result.bytes = path.stat().st_size
    return result


@checked
def export_ome_tiff(
    store: Annotated[Path, Opt("A store made by `tilestore convert`.")],
    *,
    output: Annotated[Path, Opt("The .ome.tiff to write.", short="o", writes="file")],
    compression: Compression = "deflate",
    labels: Annotated[bool, Opt("Also write the label images (tissue).")] = False,
    overwrite: Annotated[bool, Opt("Replace an existing file.")] = False,
) -> Exported:
    """`tilestore export ome-tiff`: `to_ome_tiff`, and a line per level written."""
    result = to_ome_tiff(store, output, compression=compression, labels=labels, overwrite=overwrite)
    lines = [
        f"level {index}: {level['shape'][2]}x{level['shape'][1]}, {level['tiles']} tiles, "
        f"{level['how']}"
        for index, level in enumerate(result.levels)
    ]
    if result.labels:
        lines.append(f"labels: {', '.join(result.labels)}")
    lines.append(f"{result.path}: {result.bytes / 2**20:.1f} MB in {result.seconds:.1f} s")
    return Exported(tuple(lines))


def _write_pyramid(tif, slide: Slide, codec: str, result) -> None:
    rgb = slide.rgb
    names = list(slide.record.channels)
    for index, level in enumerate(slide.levels):
        reader = slide.chunks(index)
        c, h, w = level.shape
        tile = (reader.chunk_h, reader.chunk_w)
        options: dict = {"tile": tile, "dtype": slide.array(index).dtype}
        if index == 0:
            options["subifds"] = len(slide.levels) - 1
            options["metadata"] = _ome_metadata(slide, rgb, names)
        else:
            options["subfiletype"] = 1  # a reduced-resolution image
            options["metadata"] = None
        if reader.is_jpeg:
            codec = slide.array(index).serializer  # what its chunks hold, as declared
            coded = "grayscale" if c == 1 else coded_color_space(codec) or "ycbcr"
            sampling = chroma_sampling(codec)
            data = _jpeg_tiles(reader, _background_tile(reader, codec, c))
            how = f"{coded} JPEG tiles copied"
            photometric = {"ycbcr": "ycbcr", "rgb": "rgb", "grayscale": "minisblack"}[coded]
            if photometric in ("ycbcr", "rgb"):  # the tags say what the streams hold
                options["subsampling"] = _declared_sampling(photometric, sampling)
                # tifffile writes photometric YCbCr for JPEG unless told otherwise
                options["compressionargs"] = {"outcolorspace": photometric.upper()}
            tif.write(
                data,
                shape=(h, w, c) if c > 1 else (h, w),
                compression="jpeg",
                photometric=photometric,
                **options,
            )
        else:
            planar = not rgb or c not in (1, 3)
            shape = (c, h, w) if planar else (h, w, c)
            tif.write(
                _decoded_tiles(slide, index, tile, planar),
                shape=shape,
                compression=codec,
                photometric="minisblack" if planar else "rgb",
                predictor=True,
                **options,
            )
            how = f"{codec} (lossless)"
        rows, cols = reader.grid
        result.levels.append({"shape": [c, h, w], "tiles": rows * cols, "how": how})


def _declared_sampling(photometric: str, sampling: tuple[int, int]) -> tuple[int, int]:
    """The YCbCrSubSampling tag of a level of JPEG tiles. Readers decode a JPEG tile as its
    own stream says (libtiff fixes the tag from the stream's frame header; tifffile and
    OpenSlide decode the stream as coded), except Bio-Formats 7.3, which on a YCbCr level
    tagged (1, 1) converts the decoded pixels from YCbCr a second time (12 dB, a magenta
    background; any other value reads exactly: bench/RESULTS.md, "OME-TIFF export"). A
    4:4:4 YCbCr level is therefore tagged with the TIFF default (2, 2), which every reader
    here reads equal to the store; subsampled levels carry their own."""
    if photometric == "ycbcr" and tuple(sampling) == (1, 1):
        return (2, 2)
    return tuple(sampling)


def _ome_metadata(slide: Slide, rgb: bool, names: list[str]) -> dict:
    meta: dict = {"axes": "YXS" if rgb else "CYX", "Name": slide.name}
    if slide.mpp:
        meta |= {
            "PhysicalSizeX": slide.mpp[0],
            "PhysicalSizeXUnit": UM,
            "PhysicalSizeY": slide.mpp[1],
            "PhysicalSizeYUnit": UM,
        }
    if not rgb and names:
        meta["Channel"] = {"Name": names}
    return meta


def _jpeg_tiles(reader, background: bytes) -> Iterator[bytes]:
    rows, cols = reader.grid
    for r in range(rows):
        coords = [(r, c) for c in range(cols)]
        for data in reader.fetch(coords):  # checked (CRC-32C) and stripped
            yield background if data is None else data


def _background_tile(reader, codec, channels: int) -> bytes:
    """A chunk never written (stores from before every chunk was): the background, encoded
    by the level's own codec, so it is coded as the level's other tiles are."""
    tile = np.full((reader.chunk_h, reader.chunk_w, channels), reader.background, np.uint8)
    return encode_chunk(codec, tile)


def _decoded_tiles(slide: Slide, index: int, tile: tuple[int, int], planar: bool):
    array = slide.array(index)
    c, h, w = array.shape
    th, tw = tile
    reader = slide.chunks(index)
    planes = range(c) if planar else [None]
    for plane in planes:
        for y in range(0, h, th):
            for x in range(0, w, tw):
                block = reader.read(y, min(y + th, h), x, min(x + tw, w))  # checked reads
                yield np.ascontiguousarray(block[..., plane] if plane is not None else block)


def _write_labels(tif: tifffile.TiffWriter, slide: Slide) -> list[str]:
    """Each label image's finest level as a further OME image (uint8, its own pixel size)."""
    written = []
    labels = slide.group.get("labels")
    for name in labels.attrs.get("ome", {}).get("labels", []) if labels else []:
        array = labels[name]["0"]
        mask = np.asarray(array[0] if array.ndim == 3 else array[:], np.uint8)
        meta = {"axes": "YX", "Name": f"{slide.name} {name}"}
        record = read_record(labels[name], LabelRecord, f"{slide.name}: labels/{name}")
        downsample = None if record is None else record.downsample
        if slide.mpp and downsample:
            meta |= {
                "PhysicalSizeX": slide.mpp[0] * downsample[1],
                "PhysicalSizeXUnit": UM,
                "PhysicalSizeY": slide.mpp[1] * downsample[0],
                "PhysicalSizeYUnit": UM,
            }
        tif.write(mask, tile=(256, 256), compression="adobe_deflate", metadata=meta)
        written.append(name)
    return written
