"""Slides in formats only OpenSlide reads, written from real pixels by Pillow (no vendor tool is
installable here): a Hamamatsu VMS is an INI file naming JPEG files with restart markers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

# OpenSlide indexes a VMS JPEG by its restart markers; it reads 4:4:4 files of Pillow's
_JPEG = {"quality": 90, "subsampling": 0, "restart_marker_blocks": 16}


def vms(folder: Path, pixels: np.ndarray, columns: int = 2, mpp: float = 0.5) -> Path:
    """Write `pixels` (h, w, 3) as a VMS of `columns` JPEG files side by side plus a 1/8 map;
    return the .vms path. Width must divide into columns of whole 8-px blocks."""
    folder.mkdir(parents=True, exist_ok=True)
    h, w = pixels.shape[:2]
    step = w // columns
    assert step * columns == w and step % 8 == 0 and h % 8 == 0, (h, w, columns)
    lines = [
        "[Virtual Microscope Specimen]",
        "NoLayers=1",
        f"NoJpegColumns={columns}",
        "NoJpegRows=1",
        f"PhysicalWidth={round(w * mpp * 1000)}",
        f"PhysicalHeight={round(h * mpp * 1000)}",
        "SourceLens=20",
        "MapFile=map.jpg",
    ]
    for col in range(columns):
        name = f"image-{col}.jpg"
        Image.fromarray(pixels[:, col * step : (col + 1) * step]).save(folder / name, **_JPEG)
        lines.append(f"ImageFile{f'({col},0)' if col else ''}={name}")
    Image.fromarray(np.ascontiguousarray(pixels[::8, ::8])).save(folder / "map.jpg", **_JPEG)
    path = folder / "slide.vms"
    path.write_text("\n".join(lines) + "\n")
    return path


def vms_reference(path: Path) -> np.ndarray:
    """The VMS's level 0 as Pillow decodes its JPEG files, side by side."""
    files = sorted(path.parent.glob("image-*.jpg"), key=lambda p: int(p.stem.split("-")[1]))
    return np.concatenate([np.asarray(Image.open(p)) for p in files], axis=1)


def _philips_level(number: int, mm: float, side: int) -> str:
    attr = '<Attribute Name="{}" Group="0x{}" Element="0x{}" PMSVR="{}">{}</Attribute>'
    return (
        '<DataObject ObjectType="PixelDataRepresentation">'
        + attr.format("PIIM_PIXEL_DATA_REPRESENTATION_NUMBER", "101D", "2001", "IUInt16", number)
        + attr.format("DICOM_PIXEL_SPACING", "0028", "0030", "IDoubleArray", f'"{mm}" "{mm}"')
        + attr.format("PIIM_PIXEL_DATA_REPRESENTATION_COLUMNS", "2001", "115E", "IUInt32", side)
        + attr.format("PIIM_PIXEL_DATA_REPRESENTATION_ROWS", "2001", "115D", "IUInt32", side)
        + "</DataObject>"
    )


def philips_tiff(path: Path, pixels: np.ndarray, mpp: float = 0.25) -> Path:
    """A two-level Philips-style TIFF (DPUfsImport XML, JPEG tiles) of square `pixels`."""
    import tifffile

    side = pixels.shape[0]
    levels = _philips_level(0, mpp / 1000, side) + _philips_level(1, mpp / 500, side // 2)
    xml = (
        '<?xml version="1.0" encoding="UTF-8" ?><DataObject ObjectType="DPUfsImport">'
        '<Attribute Name="PIM_DP_SCANNED_IMAGES" Group="0x301D" Element="0x1003" '
        'PMSVR="IDataObjectArray"><Array><DataObject ObjectType="DPScannedImage">'
        '<Attribute Name="PIM_DP_IMAGE_TYPE" Group="0x301D" Element="0x1004" PMSVR="IString">'
        "WSI</Attribute>"
        '<Attribute Name="DICOM_PIXEL_SPACING" Group="0x0028" Element="0x0030" '
        f'PMSVR="IDoubleArray">"{mpp / 1000}" "{mpp / 1000}"</Attribute>'
        '<Attribute Name="PIIM_PIXEL_DATA_REPRESENTATION_SEQUENCE" Group="0x1001" '
        f'Element="0x8B01" PMSVR="IDataObjectArray"><Array>{levels}</Array></Attribute>'
        "</DataObject></Array></Attribute></DataObject>"
    )
    opts = {"tile": (256, 256), "compression": "jpeg", "photometric": "rgb", "metadata": None}
    with tifffile.TiffWriter(path) as tif:
        tif.write(pixels, description=xml, software="Philips DP v1.0", **opts)
        tif.write(pixels[::2, ::2], subfiletype=1, description="level=1", **opts)
    return path
