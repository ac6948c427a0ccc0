"""The format table (docs/guide/convert.md): each input kind converted with the defaults,
level 0 compared with the reference reader of its format (tifffile, wsidicom, OpenSlide,
Pillow).

Real files come from ../shared/data (TILESTORE_DATA); the others are made from them by
tools: wsidicomizer (DICOM series of JPEG baseline, JPEG 2000 and uncompressed frames from
the real SVS), Pillow (a Hamamatsu VMS of the real SVS's pixels), tifffile (a Philips TIFF of
them, a Vectra-like QPTIFF and a 5-channel 16-bit OME-TIFF from the real
DAPI NDPI), with the test suite's writers.

    python bench/formats.py            # prints a markdown table, writes JSON
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import tifffile
from PIL import Image

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the test suite's writers of tool-made files

from tests.tilestore import tiffs, vendors  # noqa: E402
from tilestore.conversion.converter import convert  # noqa: E402
from tilestore.reading.opening import open_slide  # noqa: E402
from tilestore.sources import open_source  # noqa: E402

DATA = Path(os.environ.get("TILESTORE_DATA", REPO.parent / "shared" / "data")) / "slides"
HERE = Path(__file__).resolve().parent


def wsidicom_level0(path: Path) -> np.ndarray:
    from wsidicom import WsiDicom

    with WsiDicom.open(path) as wsi:
        level = wsi.levels.base_level
        size = (level.size.width, level.size.height)
        return np.asarray(wsi.read_region((0, 0), level.level, size))


def tifffile_level0(path: Path) -> np.ndarray:
    with tifffile.TiffFile(path) as tif:
        series = max(tif.series, key=lambda s: s.size) if tif.is_ome else tif.series[0]
        image = series.levels[0].asarray()
        axes = series.levels[0].axes
    return np.moveaxis(image, 0, -1) if axes.startswith(("C", "I")) else image


def pillow(path: Path) -> np.ndarray:
    with Image.open(path) as img:
        return np.asarray(img.convert("RGB"))


def openslide_level0(path: Path) -> np.ndarray:
    import openslide

    with openslide.OpenSlide(str(path)) as slide:
        return np.asarray(slide.read_region((0, 0), 0, slide.dimensions).convert("RGB"))


def dicomized(folder: Path, encoding=None) -> Path:
    from wsidicomizer import WsiDicomizer
    from wsidicomizer.sources import TiffSlideSource

    # transcoded series: their base level only (wsidicomizer writes short edge frames in the
    # levels it adds, which wsidicom cannot decode uncompressed)
    extra = {"encoding": encoding, "force_transcoding": True} if encoding else {}
    WsiDicomizer.convert(
        DATA / "CMU-1-Small-Region.svs",
        folder,
        tile_size=256,
        preferred_source=TiffSlideSource,
        add_missing_levels=encoding is None,
        include_label=False,
        include_overview=False,
        include_thumbnail=False,
        **extra,
    )
    return folder


def inputs(work: Path) -> list[tuple[str, Path, object]]:
    """(kind, path, reference reader) for every row."""
    from wsidicom.codec import Jpeg2kSettings, NumpySettings

    cmu = tifffile.imread(DATA / "CMU-1-Small-Region.svs")
    ndpi = tifffile.imread(DATA / "stritt_test3-DAPI-2-387.ndpi", level=1)
    markers = {"DAPI": ("0,0,255", ndpi[..., 2]), "CD8": ("0,255,0", ndpi[..., 1])}
    markers["PanCK"] = ("255,0,0", ndpi[..., 0])
    tissue = ndpi[:1024, :1280].astype(np.uint16)
    noise = np.random.default_rng(5).integers(0, 300, (5, *tissue.shape[:2]))
    five = np.stack([tissue[..., i % 3] * (40 + 9 * i) + noise[i] for i in range(5)])
    names = ["DAPI", "CD3", "CD20", "PD-L1", "Ki67"]
    real, wsi, tiff, osl = "(real)", wsidicom_level0, tifffile_level0, openslide_level0
    return [
        (f"Aperio SVS {real}", DATA / "CMU-1-Small-Region.svs", tiff),
        (f"Hamamatsu NDPI, fluorescence {real}", DATA / "stritt_test3-DAPI-2-387.ndpi", tiff),
        (f"plain TIFF, strips {real}", DATA / "kidney-48-5.tif", tiff),
        (f"PNG {real}", DATA / "skimage_ihc.png", pillow),
        (f"JPEG {real}", DATA / "stardist_histo.jpg", pillow),
        ("DICOM, JPEG baseline (real CAMELYON file)", DATA / "camelyon_lymphnode_jpeg.dcm", wsi),
        ("DICOM series, JPEG baseline (wsidicomizer)", dicomized(work / "dcm-jpeg"), wsi),
        (
            "DICOM, JPEG 2000 (wsidicomizer)",
            dicomized(work / "dcm-j2k", Jpeg2kSettings(levels=[0])),
            wsi,
        ),
        ("DICOM, uncompressed (wsidicomizer)", dicomized(work / "dcm-raw", NumpySettings()), wsi),
        (
            "Hamamatsu VMS, 2 JPEG files (Pillow)",
            vendors.vms(work / "vms", np.ascontiguousarray(cmu[:2048, :2048]), mpp=0.5),
            osl,
        ),
        (
            "Philips TIFF (tifffile)",
            vendors.philips_tiff(work / "philips.tiff", np.ascontiguousarray(cmu[:2048, :2048])),
            osl,
        ),
        ("QPTIFF, 3 x 8-bit markers (tifffile)", tiffs.qptiff(work / "q.qptiff", markers), tiff),
        (
            "OME-TIFF, 5 x 16-bit channels (tifffile)",
            tiffs.ome_channels(work / "five.ome.tif", five.astype(np.uint16), names, [255] * 5),
            tiff,
        ),
    ]


def compare(stored: np.ndarray, reference: np.ndarray) -> str:
    if stored.shape != reference.shape:
        return f"shape {stored.shape} vs {reference.shape}"
    if np.array_equal(stored, reference):
        return "equal"
    mse = np.mean((stored.astype(np.float64) - reference.astype(np.float64)) ** 2)
    peak = float(np.iinfo(stored.dtype).max)
    return f"PSNR {10 * np.log10(peak**2 / mse):.1f} dB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "formats.json")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for kind, path, reference in inputs(work):
            started = time.perf_counter()
            report = convert(path, work / "stores", mpp=0.5 if "PNG" in kind else None)
            seconds = time.perf_counter() - started
            stored = np.moveaxis(open_slide(report.store).to_dask(0).compute(), 0, -1)
            with open_source(path) as source:
                reader = type(source).__name__
            rows.append(
                {
                    "input": kind,
                    "reader": reader,
                    "codec": report.codec,
                    "level 0": report.levels[0].write,
                    "levels": len(report.levels),
                    "channels": f"{stored.shape[2]} x {stored.dtype}",
                    "vs reference": compare(stored, reference(path)),
                    "seconds": round(seconds, 2),
                }
            )
            shutil.rmtree(report.store)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=2))
    columns = list(rows[0])
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for row in rows:
        print("| " + " | ".join(str(row[c]) for c in columns) + " |")
    print(f"JSON: {args.out}")


if __name__ == "__main__":
    main()
