"""Conversion and region-read benchmark on a large SVS assembled from real tissue.

Measures, in one run on one machine:
  - copy path (JPEG tiles copied) vs forced decode+encode (--no-copy): wall time, ratio;
  - store size vs source size; peak RSS of each conversion (each runs in its own process);
  - random 256x256 level-0 region reads/s: our store (Slide.read_region) vs tifffile's zarr
    view of the source (the efficient way to read regions from a TIFF with tifffile);
  - export of the copied store as a pyramidal OME-TIFF (`tilestore.exports.ometiff`): time, peak
    RSS, and the JPEG decodes it made (the copy path makes none);
  - DICOM arm (--dicom): the same slide as a multi-level DICOM series (wsidicomizer, JPEG
    baseline frames of 256 px), converted with its frames copied vs decoded and re-encoded.

    python bench/convert.py --size 40000            # prints a table, writes JSON
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import tifffile
import zarr
from make_slide import make_large_svs

import tilestore
from tilestore.conversion.sidecar import sidecar_for

HERE = Path(__file__).resolve().parent

PEAK_RSS = """
import json, sys, time

def peak_rss_mb():
    # VmHWM belongs to this address space; ru_maxrss would carry the parent's peak over exec.
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
"""

CONVERT = (
    PEAK_RSS
    + """
import tilestore

src, out, copy = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
t0 = time.perf_counter()
r = tilestore.convert(src, out, copy=copy)
wall = time.perf_counter() - t0
print(json.dumps({
    "seconds": wall, "store_bytes": r.store_bytes, "source_bytes": r.source_bytes,
    "peak_rss_mb": peak_rss_mb(),
    "levels": [[lv.path, lv.write, lv.chunks, round(lv.seconds, 2)] for lv in r.levels],
}))
"""
)

EXPORT = (
    PEAK_RSS
    + """
import imagecodecs
from tilestore.format import chunks
from tilestore.exports.ometiff import to_ome_tiff

decodes = []
original = imagecodecs.jpeg8_decode
def counted(*args, **kwargs):
    decodes.append(1)
    return original(*args, **kwargs)
imagecodecs.jpeg8_decode = chunks.imagecodecs.jpeg8_decode = counted

t0 = time.perf_counter()
r = to_ome_tiff(sys.argv[1], sys.argv[2], overwrite=True)
print(json.dumps({"seconds": time.perf_counter() - t0, "bytes": r.bytes,
                  "peak_rss_mb": peak_rss_mb(), "jpeg_decodes": len(decodes),
                  "levels": r.levels}))
"""
)


def in_child(script: str, *args: object) -> dict:
    """Run a script in a fresh process (its own peak RSS); the JSON of its last line."""
    os.sync()  # no writeback left over from earlier work (it halved the copy path's speed)
    proc = subprocess.run(
        [sys.executable, "-c", script, *map(str, args)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_export(store: Path, target: Path) -> dict:
    """`to_ome_tiff` in a fresh process: time, peak RSS, and how many JPEG decodes it made."""
    return in_child(EXPORT, store, target)


def run_conversion(src: Path, out: Path, copy: bool) -> dict:
    shutil.rmtree(out, ignore_errors=True)  # a fresh output: deleting an old store is not timed
    return in_child(CONVERT, src, out, "1" if copy else "0")


def region_reads(store: Path, src: Path, n: int, size: int = 256, seed: int = 0) -> dict:
    """Random level-0 regions from the store, from the slide read in place (its sidecar made
    first, untimed), and through tifffile's zarr view of the slide."""
    slide = tilestore.open_slide(store)
    shutil.rmtree(sidecar_for(src), ignore_errors=True)
    started = time.perf_counter()
    in_place = tilestore.open_in_place(src)
    sidecar_s = time.perf_counter() - started
    _, height, width = slide.shape
    rng = np.random.default_rng(seed)
    xs = rng.integers(0, width - size, n)
    ys = rng.integers(0, height - size, n)
    with tifffile.TiffFile(src) as tif:
        source = zarr.open_array(tif.series[0].aszarr(level=0), mode="r")
        for x, y in zip(xs[:20], ys[:20], strict=True):  # warm all three
            slide.read_region(int(x), int(y), size, size, level=0)
            in_place.read_region(int(x), int(y), size, size, level=0)
            source[y : y + size, x : x + size]
        t = time.perf_counter()
        for x, y in zip(xs, ys, strict=True):
            placed = in_place.read_region(int(x), int(y), size, size, level=0)
        in_place_s = time.perf_counter() - t
        t0 = time.perf_counter()
        for x, y in zip(xs, ys, strict=True):
            ours = slide.read_region(int(x), int(y), size, size, level=0)
        t1 = time.perf_counter()
        for x, y in zip(xs, ys, strict=True):
            theirs = source[y : y + size, x : x + size]
        t2 = time.perf_counter()
        assert np.array_equal(ours, theirs), "store and source disagree"
        assert np.array_equal(placed, theirs), "in place and source disagree"
    shutil.rmtree(sidecar_for(src), ignore_errors=True)
    return {
        "store_per_s": n / (t1 - t0),
        "in_place_per_s": n / in_place_s,
        "tifffile_per_s": n / (t2 - t1),
        "sidecar_made_s": sidecar_s,
    }


def make_dicom(svs: Path, folder: Path) -> Path:
    """The slide as a DICOM WSI series (made once; wsidicomizer through tiffslide)."""
    if folder.exists() and any(folder.glob("*.dcm")):
        return folder
    from wsidicomizer import WsiDicomizer
    from wsidicomizer.sources import TiffSlideSource

    shutil.rmtree(folder, ignore_errors=True)
    WsiDicomizer.convert(
        svs, folder, tile_size=256, preferred_source=TiffSlideSource, add_missing_levels=True
    )
    return folder


def conversion_rows(arm: str, copy: dict, reencode: dict) -> list[tuple[str, str, str]]:
    """The table's rows for one input: the copy path against decode + re-encode."""
    return [
        (f"{arm}copy path: time", f"{copy['seconds']:.1f} s", ""),
        (f"{arm}decode+encode: time", f"{reencode['seconds']:.1f} s", ""),
        (f"{arm}copy speed-up", f"{reencode['seconds'] / copy['seconds']:.1f}x", ">= 10x"),
        (
            f"{arm}store / source (copy)",
            f"{copy['store_bytes'] / copy['source_bytes']:.3f}x",
            "<= 1.1x",
        ),
        (
            f"{arm}peak RSS copy / re-encode",
            f"{copy['peak_rss_mb']:.0f} / {reencode['peak_rss_mb']:.0f} MB",
            "< 1024 MB",
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size", type=int, default=40_000)
    parser.add_argument("--reads", type=int, default=500)
    parser.add_argument("--work", type=Path, default=HERE / "data")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "convert.json")
    parser.add_argument("--dicom", action=argparse.BooleanOptionalAction, default=True)
    args = parser.parse_args()

    src = make_large_svs(args.work / f"large-{args.size}.svs", args.size)
    out = args.work / "stores"
    copy = run_conversion(src, out, copy=True)
    store = out / f"large-{args.size}.ome.zarr"
    reads = region_reads(store, src, args.reads)
    exported = run_export(store, args.work / f"large-{args.size}.ome.tiff")
    (args.work / f"large-{args.size}.ome.tiff").unlink()
    reencode = run_conversion(src, args.work / "stores-reencode", copy=False)
    shutil.rmtree(args.work / "stores-reencode", ignore_errors=True)

    dicom = {}
    if args.dicom:
        folder = make_dicom(src, args.work / f"large-{args.size}-dicom")
        dicom["copy"] = run_conversion(folder, args.work / "stores-dicom", copy=True)
        dicom["reencode"] = run_conversion(folder, args.work / "stores-dicom-re", copy=False)
        shutil.rmtree(args.work / "stores-dicom-re", ignore_errors=True)
        dicom["copy_speedup"] = dicom["reencode"]["seconds"] / dicom["copy"]["seconds"]
        dicom["size_vs_source"] = dicom["copy"]["store_bytes"] / dicom["copy"]["source_bytes"]

    result = {
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "slide": {"path": str(src), "size_px": args.size, "bytes": copy["source_bytes"]},
        "copy": copy,
        "reencode": reencode,
        "copy_speedup": reencode["seconds"] / copy["seconds"],
        "size_vs_source": copy["store_bytes"] / copy["source_bytes"],
        "reads": reads,
        "export": exported,
        "read_ratio": reads["store_per_s"] / reads["tifffile_per_s"],
        "dicom": dicom,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))

    gb = 1 << 30
    rows = [
        (
            "slide",
            f"{args.size} x {args.size} px, {copy['source_bytes'] / gb:.2f} GB, "
            f"{os.cpu_count()} CPUs",
            "",
        ),
        *conversion_rows("", copy, reencode),
        ("256 px region reads/s: store", f"{reads['store_per_s']:.0f}", ""),
        ("256 px region reads/s: tifffile", f"{reads['tifffile_per_s']:.0f}", ""),
        ("reads store / tifffile", f"{result['read_ratio']:.2f}x", ""),
        ("256 px region reads/s: TIFF in place", f"{reads['in_place_per_s']:.0f}", ""),
        ("in place: sidecar made in", f"{reads['sidecar_made_s']:.1f} s", ""),
        ("export OME-TIFF: time", f"{exported['seconds']:.1f} s", ""),
        (
            "export: peak RSS, JPEG decodes",
            f"{exported['peak_rss_mb']:.0f} MB, {exported['jpeg_decodes']}",
            "decodes: 0",
        ),
        (
            "export: file / store",
            f"{exported['bytes'] / 2**20:.0f} MB / {copy['store_bytes'] / 2**20:.0f} MB",
            "",
        ),
    ]
    if dicom:
        rows += conversion_rows("DICOM: ", dicom["copy"], dicom["reencode"])
    width = max(len(r[0]) for r in rows)
    print(f"{'measure':<{width}}  {'value':<34}  target")
    for name, value, target in rows:
        print(f"{name:<{width}}  {value:<34}  {target}")
    print("levels (copy):", copy["levels"])
    print("levels (re-encode):", reencode["levels"])
    if dicom:
        print("DICOM levels (copy):", dicom["copy"]["levels"])
    print(f"JSON: {args.out}")


if __name__ == "__main__":
    main()
