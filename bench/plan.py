"""Planning benchmark: a 100k x 100k px slide at 0.5 um/px, 224 px tiles, a 500-polygon ROI.

Times the pure planning core (grid, exact tissue fractions, exact ROI fractions with
classes, chunk listing, chunk schedule) on a synthetic but slide-like input: a tissue
mask at 8 um/px made of smooth blobs (about 40 % tissue) and 500 irregular ROI polygons
(64 vertices each, some overlapping, two classes). The baseline is the per-tile loop many
scripts use (one shapely intersection per tile with the unioned ROI plus a mask mean),
timed on a random sample of tiles and extrapolated; the note says so.

    python bench/plan.py            # prints a table, writes bench/results/plan.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np
import shapely
from scipy import ndimage

from tilestore.plan.annotations import Annotations
from tilestore.plan.grid import grid_spec, make_plan
from tilestore.plan.tiles import chunk_schedule

HERE = Path(__file__).resolve().parent


def synthetic_inputs(side: int, mpp: float, polygons: int, overlapping: bool, seed: int = 0):
    """Mask at 8 um/px of smooth blobs (~40 % tissue) and 500 star-shaped ROI polygons in it.

    overlapping=False: regions drawn apart, as pathologists annotate them (radii 300-1500 px,
    centres at least 2 radii apart). True: random radii up to 3000 px, so most overlap and
    must be merged (the worst case for the planner).
    """
    rng = np.random.default_rng(seed)
    mask_side = round(side * mpp / 8.0)
    noise = ndimage.gaussian_filter(rng.random((mask_side // 8, mask_side // 8)), 6)
    noise = np.kron(noise, np.ones((8, 8)))[:mask_side, :mask_side]
    mask = noise > np.quantile(noise, 0.6)
    ys, xs = np.nonzero(mask)
    scale = side / mask_side
    angles = np.linspace(0, 2 * np.pi, 64, endpoint=False)
    centres, radii = [], []
    while len(centres) < polygons:
        i = rng.integers(len(ys))
        cx, cy = (xs[i] + 0.5) * scale, (ys[i] + 0.5) * scale
        radius = rng.uniform(300, 3000) if overlapping else rng.uniform(300, 1500)
        if not overlapping and any(
            np.hypot(cx - x, cy - y) < 1.6 * (radius + r)
            for (x, y), r in zip(centres, radii, strict=True)
        ):
            continue
        centres.append((cx, cy))
        radii.append(radius)
    geoms = []
    for (cx, cy), radius in zip(centres, radii, strict=True):
        r = radius * (1 + 0.3 * rng.standard_normal(64)).clip(0.4, 1.6)
        geoms.append(shapely.Polygon(np.c_[cx + r * np.cos(angles), cy + r * np.sin(angles)]))
    geoms = shapely.intersection(
        shapely.make_valid(np.array(geoms, dtype=object)), shapely.box(0, 0, side, side)
    )
    classes = np.where(rng.random(polygons) < 0.7, "Tumor", "Stroma")
    rois = Annotations(Path("synthetic"), "bench", geoms, classes.astype(str), classes.astype(str))
    return mask, (side / mask_side, side / mask_side), rois


def baseline(spec, mask, mask_ds, rois, sample: int, seed: int = 1) -> float:
    """Seconds per tile of the common per-tile loop (shapely on the ROI union, mask mean)."""
    rows, cols = spec.grid
    rng = np.random.default_rng(seed)
    idx = rng.choice(rows * cols, sample, replace=False)
    union = rois.union()
    t0 = time.perf_counter()
    for i in idx:
        r, c = divmod(int(i), cols)
        x0, y0 = c * spec.read_stride, r * spec.read_stride
        box = shapely.box(x0, y0, x0 + spec.read, y0 + spec.read)
        box.intersection(union).area / box.area
        my0, mx0 = int(y0 / mask_ds[0]), int(x0 / mask_ds[1])
        mask[
            my0 : int((y0 + spec.read) / mask_ds[0]) + 1,
            mx0 : int((x0 + spec.read) / mask_ds[1]) + 1,
        ].mean()
    return (time.perf_counter() - t0) / sample


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--side", type=int, default=100_000)
    parser.add_argument("--polygons", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--baseline-sample", type=int, default=3000)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "plan.json")
    args = parser.parse_args()

    mpp = 0.5
    spec = grid_spec(0, (1.0, 1.0), (args.side, args.side), mpp, mpp, 224, tolerance=0.02)
    rows, cols = spec.grid
    cases = {}
    for label, overlapping in (("disjoint", False), ("overlapping", True)):
        mask, mask_ds, rois = synthetic_inputs(args.side, mpp, args.polygons, overlapping)
        runs = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            tissue_only = make_plan(
                spec,
                name="t",
                chunk_shape=(256, 256),
                tissue=mask,
                tissue_downsample=mask_ds,
                min_tissue=0.5,
                min_roi=0.5,
            )
            t1 = time.perf_counter()
            plan = make_plan(
                spec,
                name="r",
                chunk_shape=(256, 256),
                tissue=mask,
                tissue_downsample=mask_ds,
                min_tissue=0.5,
                rois=rois,
                min_roi=0.5,
            )
            t2 = time.perf_counter()
            chunks = plan.needed_chunks()
            steps = chunk_schedule(plan)
            t3 = time.perf_counter()
            runs.append((t1 - t0, t2 - t1, t3 - t2, t3 - t1))
        med = np.median(np.array(runs), axis=0)
        merged = len(shapely.get_parts(shapely.union_all(rois.geometries)))
        cases[label] = {
            "tissue_only_s": med[0],
            "roi_plan_s": med[1],
            "chunks_schedule_s": med[2],
            "roi_plan_total_s": med[3],
            "tiles_tissue_only": len(tissue_only),
            "tiles_with_roi": len(plan),
            "chunks": len(chunks),
            "steps": len(steps),
            "roi_regions_after_merging": merged,
        }
    per_tile = baseline(spec, mask, mask_ds, rois, args.baseline_sample)
    baseline_total = per_tile * rows * cols
    result = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "slide_px": args.side,
        "mpp": mpp,
        "tile": 224,
        "grid_tiles": rows * cols,
        "roi_polygons": args.polygons,
        "mask_shape": list(mask.shape),
        "tissue_fraction": float(mask.mean()),
        "cases": cases,
        "repeats": args.repeat,
        "baseline_seconds_per_tile": per_tile,
        "baseline_extrapolated_seconds": baseline_total,
        "speedup_vs_baseline_overlapping": baseline_total
        / cases["overlapping"]["roi_plan_total_s"],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(
        f"slide {args.side} x {args.side} px at {mpp} um/px, 224 px tiles: {rows * cols:,} grid "
        f"tiles; mask {mask.shape[1]}x{mask.shape[0]} ({mask.mean():.0%} tissue); "
        f"{args.polygons} ROI polygons, 2 classes; {os.cpu_count()} CPUs; median of "
        f"{args.repeat}"
    )
    print(f"{'':<44}{'disjoint ROI':>14}{'overlapping ROI':>17}")
    d, o = cases["disjoint"], cases["overlapping"]
    lines = [
        ("ROI regions after merging overlaps", "roi_regions_after_merging", "{:,}"),
        ("plan, tissue only (s)", "tissue_only_s", "{:.3f}"),
        ("plan, tissue + ROI (s)", "roi_plan_s", "{:.3f}"),
        ("chunk list + chunk schedule (s)", "chunks_schedule_s", "{:.3f}"),
        ("ROI plan end to end (s; target well < 1)", "roi_plan_total_s", "{:.3f}"),
        ("tiles kept with ROI", "tiles_with_roi", "{:,}"),
        ("chunks to read", "chunks", "{:,}"),
    ]
    for name, key, fmt in lines:
        print(f"{name:<44}{fmt.format(d[key]):>14}{fmt.format(o[key]):>17}")
    print(
        f"baseline per-tile loop on the overlapping ROI: {per_tile * 1e6:.0f} us/tile on "
        f"{args.baseline_sample} sampled tiles -> {baseline_total:.0f} s extrapolated for the "
        f"grid; ours {result['speedup_vs_baseline_overlapping']:.0f}x faster"
    )
    print(f"JSON: {args.out}")


if __name__ == "__main__":
    main()
