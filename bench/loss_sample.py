"""The PSNR `convert` reports for a JPEG level (a sample of `SAMPLE_CHUNKS` chunks read back)
against the PSNR over every chunk of the level, and what the sample costs.

Each slide is converted with JPEG asked for; every JPEG level is then read back whole, block
by block, and compared with the pixels it was encoded from (a source level's pixels as its
reader decodes them; a built level's: the 2x2 box average of the level before it, as stored).
The sample's cost is the time `Loss.measure` took, against the conversion's.

    python bench/loss_sample.py --size 12000     # prints a table, writes JSON
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import time
import warnings
from pathlib import Path

import numpy as np
import zarr
from make_slide import make_large_svs

from tilestore.conversion import convert
from tilestore.conversion.levels import downsample2
from tilestore.conversion.loss import SAMPLE_CHUNKS, Loss
from tilestore.errors import TilestoreWarning
from tilestore.sources import open_source

HERE = Path(__file__).resolve().parent
DATA = Path(os.environ.get("TILESTORE_DATA", HERE.parents[1] / "shared/data")) / "slides"


def _full_psnr(store: Path, src: Path, index: int, built: bool) -> float:
    """PSNR of a level's every chunk against the pixels it was encoded from, in row bands."""
    level = zarr.open_array(store / str(index), mode="r")
    _, height, width = level.shape
    band = level.chunks[1] * 8
    squared, values = 0.0, 0
    with open_source(src) as source:
        for y0 in range(0, height, band):
            y1 = min(y0 + band, height)
            written = np.moveaxis(level[:, y0:y1, :], 0, -1).astype(np.float64)
            if built:
                above = zarr.open_array(store / str(index - 1), mode="r")
                given = downsample2(np.moveaxis(above[:, 2 * y0 : 2 * y1, :], 0, -1))
                given = given[: y1 - y0, :width]
            else:
                given = source.levels[index].read(y0, y1, 0, width)
            squared += float(np.square(written - given).sum())
            values += written.size
    return 10 * math.log10(255**2 * values / squared)


def measure(src: Path, work: Path, **options) -> list[dict]:
    spent = [0.0]
    original = Loss.measure

    def timed(self, *args):
        started = time.perf_counter()
        original(self, *args)
        spent[0] += time.perf_counter() - started

    Loss.measure = timed
    out = work / "loss.ome.zarr"
    shutil.rmtree(out, ignore_errors=True)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", TilestoreWarning)
            report = convert(src, out, codec="jpeg", **options)
    finally:
        Loss.measure = original
    rows = []
    for level in report.levels:
        if not level.sampled:
            continue
        index = int(level.path)
        built = level.origin.startswith("built")
        chunks = math.prod(-(-side // report.chunk) for side in level.shape[1:])
        rows.append(
            {
                "slide": src.name,
                "options": options,
                "level": index,
                "chunks": chunks,
                "sampled": level.sampled,
                "sample_db": level.psnr,
                "full_db": round(_full_psnr(out, src, index, built), 2),
            }
        )
    rows[0].update(sample_s=round(spent[0], 3), convert_s=round(report.seconds, 2))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size", type=int, default=12_000)
    parser.add_argument("--work", type=Path, default=HERE / "data")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "loss_sample.json")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    large = make_large_svs(args.work / f"large-{args.size}.svs", args.size)
    runs = [
        (DATA / "CMU-1-Small-Region.svs", {"copy": False}),
        (DATA / "CMU-1-Small-Region.svs", {"copy": False, "chunk": 64}),
        (DATA / "stritt_test3-DAPI-2-387.ndpi", {"lossy_ok": True}),
        (DATA / "kidney-48-5.tif", {"chunk": 64}),
        (large, {"copy": False}),
    ]
    rows = [row for src, options in runs for row in measure(src, args.work, **options)]
    print(f"sample of {SAMPLE_CHUNKS} chunks against every chunk, JPEG q95:")
    print("| slide | options | level | chunks | sampled | sample dB | full dB | sample s |", end="")
    print(" convert s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        opts = ", ".join(f"{k}={v}" for k, v in r["options"].items()) or "-"
        print(
            f"| {r['slide']} | {opts} | {r['level']} | {r['chunks']:,} | {r['sampled']} | "
            f"{r['sample_db']} | {r['full_db']} | {r.get('sample_s', '')} | "
            f"{r.get('convert_s', '')} |"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
