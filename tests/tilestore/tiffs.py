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


def patch_tag(src: Path, dst: Path, tag: str, value: int) -> Path:
    """Copy a TIFF with one numeric tag of its first page overwritten in place."""
    data = bytearray(src.read_bytes())
    with tifffile.TiffFile(src) as tif:
        t = tif.pages.first.tags[tag]
        fmt = "<H" if t.dtype == 3 else "<I"
        struct.pack_into(fmt, data, t.valueoffset, value)
    dst.write_bytes(bytes(data))
    return dst
