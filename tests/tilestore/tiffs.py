"""Small TIFFs written by tifffile for formats ../shared/data lacks (pixels from real slides)."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import tifffile

UM = "\u00b5m"


def ome_pyramid(path: Path, image: np.ndarray, mpp: float = 0.25) -> Path:
    """A 3-level pyramidal OME-TIFF with YCbCr JPEG tiles, as bfconvert or QuPath write."""
    opts = {"tile": (256, 256), "compression": "jpeg", "photometric": "rgb"}
    meta = {
        "PhysicalSizeX": mpp,
        "PhysicalSizeXUnit": UM,
        "PhysicalSizeY": mpp,
        "PhysicalSizeYUnit": UM,
    }
    with tifffile.TiffWriter(path, ome=True) as tif:
        tif.write(image, subifds=2, metadata=meta, **opts)
        tif.write(image[::2, ::2], subfiletype=1, **opts)
        tif.write(image[::4, ::4], subfiletype=1, **opts)
    return path


def ome_fluorescence(path: Path, shape=(3, 700, 900)) -> Path:
    """A 16-bit, 3-channel fluorescence OME-TIFF with named channels and sizes in nm."""
    rng = np.random.default_rng(1)
    data = (rng.random(shape) * 4000).astype(np.uint16)
    meta = {
        "axes": "CYX",
        "PhysicalSizeX": 325,
        "PhysicalSizeXUnit": "nm",
        "PhysicalSizeY": 325,
        "PhysicalSizeYUnit": "nm",
        "Channel": {"Name": ["DAPI", "FITC", "Cy5"], "IlluminationType": ["Epifluorescence"] * 3},
    }
    tifffile.imwrite(path, data, tile=(256, 256), compression="zlib", metadata=meta, ome=True)
    return path


def tiled(path: Path, image: np.ndarray, compression: str, tile=(256, 256), **kwargs) -> Path:
    """A generic tiled TIFF (no vendor metadata)."""
    tifffile.imwrite(path, image, tile=tile, compression=compression, photometric="rgb", **kwargs)
    return path


def patch_tag(src: Path, dst: Path, tag: str, value: int, page: int = 0) -> Path:
    """Copy a TIFF with one numeric tag of one of its pages overwritten in place."""
    data = bytearray(src.read_bytes())
    with tifffile.TiffFile(src) as tif:
        t = tif.pages[page].tags[tag]
        fmt = "<H" if t.dtype == 3 else "<I"
        struct.pack_into(fmt, data, t.valueoffset, value)
    dst.write_bytes(bytes(data))
    return dst


def _qpi_xml(kind: str, name: str | None = None, color: str | None = None) -> str:
    """A page's PerkinElmer-QPI-ImageDescription, as Vectra / PhenoImager write it."""
    fields = [
        ("DescriptionVersion", "2"),
        ("AcquisitionSoftware", "PerkinElmer-QPI"),
        ("ImageType", kind),
        ("Identifier", "tilestore-test"),
        ("IsUnmixedComponent", "False"),
        ("ExposureTime", "12000"),
        ("SignalUnits", "64"),
        *([("Name", name)] if name else []),
        *([("Color", color)] if color else []),
        ("Objective", "20x"),
    ]
    body = "".join(f"<{k}>{v}</{k}>" for k, v in fields)
    return (
        '<?xml version="1.0" encoding="utf-8"?>\r\n'
        f"<PerkinElmer-QPI-ImageDescription>{body}</PerkinElmer-QPI-ImageDescription>"
    )


def qptiff(path: Path, channels: dict[str, tuple[str, np.ndarray]], mpp: float = 0.5) -> Path:
    """A fluorescence QPTIFF: one greyscale page per channel at full and half resolution,
    a thumbnail between them, channel names and colours in each page's QPI XML, resolution
    in centimetres, LZW tiles of 256 px (as an Akoya Vectra 3 writes 8-bit component data)."""
    res = (1e4 / mpp, 1e4 / mpp)
    common = {"software": "PerkinElmer-QPI", "resolutionunit": "CENTIMETER", "metadata": None}
    tiled = {"tile": (256, 256), "compression": "lzw", "photometric": "minisblack"}
    with tifffile.TiffWriter(path) as tif:
        for name, (color, plane) in channels.items():
            xml = _qpi_xml("FullResolution", name, color)
            tif.write(plane, description=xml, resolution=res, **tiled, **common)
        first = next(iter(channels.values()))[1]
        thumb = np.stack([first[::8, ::8]] * 3, axis=-1)
        tif.write(thumb, description=_qpi_xml("Thumbnail"), photometric="rgb", **common)
        for name, (color, plane) in channels.items():
            xml = _qpi_xml("ReducedResolution", name, color)
            half = (res[0] / 2, res[1] / 2)
            tif.write(plane[::2, ::2], description=xml, resolution=half, **tiled, **common)
    return path


def ome_channels(path: Path, image: np.ndarray, names: list[str], colors: list[int]) -> Path:
    """A pyramidal OME-TIFF of one page per channel (C, Y, X), any dtype: named channels with
    OME colours (signed 32-bit RGBA), two sub-resolutions as SubIFDs, zstd tiles."""
    meta = {
        "axes": "CYX",
        "PhysicalSizeX": 0.325,
        "PhysicalSizeXUnit": UM,
        "PhysicalSizeY": 0.325,
        "PhysicalSizeYUnit": UM,
        "Channel": {
            "Name": names,
            "Color": colors,
            "IlluminationType": ["Epifluorescence"] * len(names),
        },
    }
    opts = {"tile": (256, 256), "compression": "zstd", "photometric": "minisblack"}
    with tifffile.TiffWriter(path, ome=True) as tif:
        tif.write(image, subifds=2, metadata=meta, **opts)
        tif.write(image[:, ::2, ::2], subfiletype=1, **opts)
        tif.write(image[:, ::4, ::4], subfiletype=1, **opts)
    return path
