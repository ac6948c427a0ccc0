"""Cohort analysis benchmark: open 1,000 slides' embeddings lazily, search 10 million tiles.

Writes a synthetic cohort once (bench/data/analysis/, reused while the parameters match):
`--slides` stores of `--tiles` tiles each with the embeddings layout the embedder writes
(features float16 in 1,024-tile chunks, zstd; coordinates; done flags; attributes), with
low-rank-plus-noise features like real ones. Then, in one process, times and measures:

- open: ``tilestore.open_embeddings(glob, model)`` against the plain-xarray way
  (``xr.open_zarr`` per store, then ``xr.concat``), both lazy;
- nearest: ``ds.tiles.nearest(query, k)`` over every tile (dask, all cores) against the
  usual loop (each slide's features read with zarr, cosine, keep the top k);
- pca: ``ds.tiles.pca(8)`` fitted on a 100k-tile sample, then all scores computed.

    python bench/analysis.py                    # 1000 x 10,000 tiles x 384 features
    python bench/analysis.py --slides 100       # quicker
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import xarray as xr
import zarr
from zarr.codecs import ZstdCodec

import tilestore
from tilestore.embeddings import group_name

HERE = Path(__file__).resolve().parent
MODEL = "random:vit_small_patch16_224"


def make_cohort(root: Path, slides: int, tiles: int, dim: int, seed: int = 0) -> None:
    """Write `slides` stores holding only embeddings/<model> (what analysis reads)."""
    marker = root / "cohort.json"
    params = {"slides": slides, "tiles": tiles, "dim": dim, "seed": seed, "layout": 2}
    if marker.exists() and json.loads(marker.read_text()) == params:
        return
    rng = np.random.default_rng(seed)
    basis = rng.standard_normal((32, dim), dtype=np.float32)
    side = int(np.ceil(np.sqrt(tiles)))
    t0 = time.perf_counter()
    for s in range(slides):
        group = zarr.open_group(root / f"slide{s:04d}.ome.zarr", mode="w").require_group(
            group_name(MODEL)
        )
        mix = rng.standard_normal((tiles, 32), dtype=np.float32)
        features = mix @ basis + 0.3 * rng.standard_normal((tiles, dim), dtype=np.float32)
        row, col = np.divmod(np.arange(tiles, dtype=np.int32), side)
        columns = {
            "x": col.astype(np.int64) * 224,
            "y": row.astype(np.int64) * 224,
            "x_um": col * 112.0,
            "y_um": row * 112.0,
            "row": row,
            "col": col,
            "tissue": np.ones(tiles, np.float32),
            "roi": np.ones(tiles, np.float32),
            "roi_class": np.zeros(tiles, np.int16),
        }
        for key, values in columns.items():
            group.create_array(
                key, data=values, dimension_names=("tile",), compressors=[ZstdCodec(level=3)]
            )
        array = group.create_array(
            "features",
            shape=(tiles, dim),
            chunks=(1024, dim),
            dtype="float16",
            dimension_names=("tile", "feature"),
            compressors=[ZstdCodec(level=1)],
        )
        array[:] = features.astype(np.float16)
        array.attrs["coordinates"] = " ".join(columns)
        group.create_array(
            "done", data=np.ones(-(-tiles // 1024), np.uint8), dimension_names=("batch",)
        )
        group.attrs["tilestore"] = {
            "model": {"name": MODEL, "output_dim": dim},
            "plan": {"name": "0.5mpp-224px", "uid": f"{s:016x}"},
            "tiles": tiles,
            "tile_size": 224,
            "mpp": 0.5,
            "level": 0,
            "read_px": 224,
            "grid": {"level": 0, "downsample": [1.0, 1.0], "read": 224, "read_stride": 224},
            "classes": [""],
            "complete": True,
        }
        if (s + 1) % 100 == 0:
            print(f"  wrote {s + 1}/{slides} groups ({time.perf_counter() - t0:.0f} s)")
    marker.write_text(json.dumps(params))


class Peak:
    """Peak RSS of this process while a block runs (sampled every 20 ms), in MB above start."""

    def __enter__(self) -> Peak:
        self.proc = psutil.Process()
        self.start = self.peak = self.proc.memory_info().rss
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()
        self.t0 = time.perf_counter()
        return self

    def _sample(self) -> None:
        while not self.stop.wait(0.02):
            self.peak = max(self.peak, self.proc.memory_info().rss)

    def __exit__(self, *exc) -> None:
        self.seconds = time.perf_counter() - self.t0
        self.stop.set()
        self.thread.join()
        self.peak = max(self.peak, self.proc.memory_info().rss)
        self.mb = (self.peak - self.start) / 2**20


def baseline_open(paths: list[Path]) -> xr.Dataset:
    """What one writes without open_embeddings: open_zarr per store, concat on tile."""
    parts = [xr.open_zarr(p, group=group_name(MODEL), consolidated=False) for p in paths]
    return xr.concat(parts, dim="tile", data_vars="all", coords="minimal", compat="override")


def baseline_nearest(paths: list[Path], query: np.ndarray, k: int):
    """The usual loop: each slide's features, cosine to the query, running top k."""
    unit = query / np.linalg.norm(query)
    best_s, best_i = np.full(0, -np.inf, np.float32), np.zeros(0, np.int64)
    offset = 0
    for p in paths:
        f = zarr.open_group(p / group_name(MODEL), mode="r")["features"][:].astype(np.float32)
        sims = f @ unit / np.linalg.norm(f, axis=1)
        top = np.argpartition(-sims, min(k, len(sims) - 1))[:k]
        best_s = np.concatenate([best_s, sims[top]])
        best_i = np.concatenate([best_i, top + offset])
        keep = np.argsort(-best_s, kind="stable")[:k]
        best_s, best_i = best_s[keep], best_i[keep]
        offset += len(f)
    return best_i, best_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--slides", type=int, default=1000)
    parser.add_argument("--tiles", type=int, default=10_000)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--data", type=Path, default=HERE / "data" / "analysis")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "analysis.json")
    args = parser.parse_args()

    args.data.mkdir(parents=True, exist_ok=True)
    print(f"cohort: {args.slides} slides x {args.tiles} tiles x {args.dim} features (float16)")
    make_cohort(args.data, args.slides, args.tiles, args.dim)
    paths = sorted(args.data.glob("*.ome.zarr"))[: args.slides]
    n = len(paths) * args.tiles
    gb = n * args.dim * 2 / 1e9
    rows = []

    with Peak() as ours_open:
        ds = tilestore.open_embeddings(str(args.data / "*.ome.zarr"), MODEL)
    assert ds.sizes["tile"] == n
    with Peak() as base_open:
        baseline = baseline_open(paths)
    assert baseline.sizes["tile"] == n
    del baseline
    rows.append(("open (lazy)", ours_open, base_open, "open_zarr per store + xr.concat"))

    query = np.asarray(ds["features"][12_345], dtype=np.float32)
    with Peak() as ours_nn:
        hits = ds.tiles.nearest(query, k=args.k)
    with Peak() as base_nn:
        base_i, _ = baseline_nearest(paths, query, args.k)
    assert hits["tile"].values[0, 0] == 12_345 == base_i[0]
    assert set(hits["tile"].values[0]) == set(base_i.tolist())
    rows.append((f"nearest k={args.k}", ours_nn, base_nn, "per-slide zarr read + numpy loop"))

    with Peak() as ours_pca:
        scores = ds.tiles.pca(8).compute()
    rows.append(("pca(8): fit 100k + score all", ours_pca, None, ""))

    print(f"\n{n:,} tiles, {gb:.1f} GB of float16 features, {os.cpu_count()} cores\n")
    print(f"{'step':30s} {'ours s':>9s} {'ours MB':>9s} {'base s':>9s} {'base MB':>9s} ratio")
    result = {
        "slides": len(paths),
        "tiles": n,
        "dim": args.dim,
        "features_gb": round(gb, 2),
        "cores": os.cpu_count(),
        "machine": platform.processor() or platform.machine(),
        "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "steps": {},
    }
    for name, ours, base, what in rows:
        ratio = f"{base.seconds / ours.seconds:5.2f}x" if base else "  -"
        base_s, base_mb = (base.seconds, base.mb) if base else (float("nan"), float("nan"))
        print(f"{name:30s} {ours.seconds:9.2f} {ours.mb:9.0f} {base_s:9.2f} {base_mb:9.0f} {ratio}")
        result["steps"][name] = {
            "ours_s": round(ours.seconds, 3),
            "ours_peak_mb": round(ours.mb, 1),
            "baseline": what,
            "baseline_s": round(base.seconds, 3) if base else None,
            "baseline_peak_mb": round(base.mb, 1) if base else None,
        }
    result["nearest_gb_per_s"] = round(gb / ours_nn.seconds, 2)
    result["pca_explained"] = scores.attrs["explained_variance_ratio"]
    print(f"\nnearest: {gb / ours_nn.seconds:.2f} GB/s of float16 features")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
