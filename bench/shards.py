"""Sharded stores against one file per chunk: files, copy-path conversion, region reads.

In one run on one machine, on the large SVS of `make_slide.py` (real tissue, Aperio's 240 px
tiles): the store written with shards (`convert`'s default, 32 x 32 chunks per shard) and
with one file per chunk (`shard="off"`, the layout before), each conversion in its own process,
alternated over `--rounds`; the files each store holds; random 256 px level-0 region reads
from each; and the files a slide of `--cohort-size` px and a cohort of `--cohort` such slides
would make, computed from the level plan and the shard shape (no slide of that size made).

    python bench/shards.py --size 40000          # prints a table, writes JSON
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import time
from pathlib import Path

import numpy as np
import zarr
from convert import PEAK_RSS, in_child
from make_slide import make_large_svs
from zarr.codecs import Crc32cCodec

import tilestore
from tilestore.format.shards import SHARD_CHUNKS, shard_shape

HERE = Path(__file__).resolve().parent

CONVERT = (
    PEAK_RSS
    + """
import tilestore

src, out, shard = sys.argv[1], sys.argv[2], sys.argv[3]
shard = "off" if shard == "off" else int(shard)
t0 = time.perf_counter()
r = tilestore.convert(src, out, shard=shard)
print(json.dumps({"seconds": time.perf_counter() - t0, "peak_rss_mb": peak_rss_mb(),
                  "chunks": sum(lv.chunks for lv in r.levels)}))
"""
)


def files(store: Path) -> int:
    return sum(len(names) for _, _, names in os.walk(store))


def reads_per_s(store: Path, n: int, size: int = 256, seed: int = 0) -> float:
    slide = tilestore.open_slide(store)
    _, height, width = slide.shape
    rng = np.random.default_rng(seed)
    xs, ys = rng.integers(0, width - size, n), rng.integers(0, height - size, n)
    for x, y in zip(xs[:20], ys[:20], strict=True):  # warm
        slide.read_region(int(x), int(y), size, size, level=0)
    started = time.perf_counter()
    for x, y in zip(xs, ys, strict=True):
        slide.read_region(int(x), int(y), size, size, level=0)
    return n / (time.perf_counter() - started)


def files_of(side: int, tile: int, per: int | str) -> int:
    """Chunk or shard files of a square RGB slide of `side` px with Aperio's levels (4x, 16x
    in the file) and 2x levels built down to 1,024 px; per="off": one file per chunk."""
    shapes, s = [], side
    while True:
        shapes.append(s)
        if s <= 1024:
            break
        s = -(-s // (4 if len(shapes) < 3 else 2))
    total = 0
    for s in shapes:
        chunks = -(-s // tile)
        if per != "off":
            shard = shard_shape((3, tile, tile), (3, s, s), per)[1] // tile
            total += (-(-chunks // shard)) ** 2
        else:
            total += chunks**2
    return total + 2 * len(shapes) + 1  # each level's zarr.json, the root's, and 0/c/0 folders


def features_writes(work: Path, tiles: int, dim: int, batch: int) -> list[dict]:
    """Embeddings written as `EmbeddingWriter` writes them (a shard written once its batches
    are in, then its done flags), per shard size: files, seconds, ms per batch."""
    from tilestore.format.codecs import zstd_codecs
    from tilestore.format.shards import sharded

    rng = np.random.default_rng(0)
    values = rng.standard_normal((batch, dim)).astype("float16")
    blocks = -(-tiles // batch)
    rows = []
    for per in (1, 4, 16, 64):
        path = work / "features.zarr"
        shutil.rmtree(path, ignore_errors=True)
        group = zarr.open_group(path, mode="w")
        features = group.create_array(
            "features",
            shape=(tiles, dim),
            dtype="float16",
            fill_value=np.nan,
            **sharded(zstd_codecs(level=1), (batch, dim), (per * batch, dim), True),
        )
        done = group.create_array(
            "done",
            shape=(blocks,),
            dtype="uint8",
            fill_value=0,
            **sharded({"compressors": [Crc32cCodec()]}, (1,), (per,), True),
        )
        started = time.perf_counter()
        for first in range(0, blocks, per):
            last = min(first + per, blocks)
            lo, hi = first * batch, min(last * batch, tiles)
            features[lo:hi] = np.resize(values, (hi - lo, dim))
            done[first:last] = 1
        seconds = time.perf_counter() - started
        rows.append(
            {
                "shard_tiles": per * batch,
                "files": files(path),
                "seconds": round(seconds, 3),
                "ms_per_batch": round(1000 * seconds / blocks, 3),
            }
        )
        shutil.rmtree(path)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size", type=int, default=40_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--reads", type=int, default=500)
    parser.add_argument("--cohort-size", type=int, default=100_000)
    parser.add_argument("--cohort", type=int, default=3000)
    parser.add_argument("--work", type=Path, default=HERE / "data")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "shards.json")
    parser.add_argument("--features-only", action="store_true")
    args = parser.parse_args()
    feats = features_writes(args.work, 100_000, 1024, 256)
    print("embeddings of 100,000 tiles, ViT-L (1,024-d float16), batch 256:")
    print("| tiles per shard | files | write s | ms per batch |\n|---|---|---|---|")
    for row in feats:
        print(
            f"| {row['shard_tiles']:,} | {row['files']} | {row['seconds']:.2f} | "
            f"{row['ms_per_batch']:.2f} |"
        )
    if args.features_only:
        return
    src = make_large_svs(args.work / f"large-{args.size}.svs", args.size)
    arms = {"sharded": SHARD_CHUNKS, "file per chunk": "off"}
    runs: dict[str, list[dict]] = {name: [] for name in arms}
    for _ in range(args.rounds):  # alternated: the machine's drift falls on both
        for name, shard in arms.items():
            out = args.work / f"shards-{shard}.ome.zarr"
            shutil.rmtree(out, ignore_errors=True)
            runs[name].append(in_child(CONVERT, src, out, shard))
    stores = {name: args.work / f"shards-{shard}.ome.zarr" for name, shard in arms.items()}
    counts = {name: files(store) for name, store in stores.items()}
    reads = {name: reads_per_s(store, args.reads) for name, store in stores.items()}
    reads_again = {name: reads_per_s(store, args.reads, seed=1) for name, store in stores.items()}
    per_slide = {name: files_of(args.cohort_size, 240, shard) for name, shard in arms.items()}
    result = {
        "machine": f"{platform.node()} {os.cpu_count()} CPUs",
        "date": time.strftime("%Y-%m-%d"),
        "slide": f"{args.size} px SVS (make_slide.py)",
        "runs": runs,
        "files": counts,
        "reads_per_s": [reads, reads_again],
        "features": feats,
        "computed": {"side": args.cohort_size, "per_slide": per_slide, "cohort": args.cohort},
    }
    print(f"{result['slide']}, {result['machine']}, {args.rounds} alternated rounds\n")
    print("| store | files | convert s (each round) | peak RSS MB | 256 px reads/s (2 passes) |")
    print("|---|---|---|---|---|")
    for name in arms:
        seconds = [r["seconds"] for r in runs[name]]
        print(
            f"| {name} | {counts[name]:,} | {' / '.join(f'{s:.2f}' for s in seconds)} "
            f"(median {statistics.median(seconds):.2f}) | "
            f"{max(r['peak_rss_mb'] for r in runs[name]):.0f} | "
            f"{reads[name]:.0f} / {reads_again[name]:.0f} |"
        )
    speedup = statistics.median(r["seconds"] for r in runs["file per chunk"]) / statistics.median(
        r["seconds"] for r in runs["sharded"]
    )
    print(f"\ncopy-path conversion, sharded vs file per chunk: {speedup:.2f}x faster")
    print(f"\ncomputed, a {args.cohort_size:,} px slide (240 px tiles), {args.cohort:,} of them:")
    print("| store | files per slide | files per cohort |\n|---|---|---|")
    for name in arms:
        print(f"| {name} | {per_slide[name]:,} | {per_slide[name] * args.cohort:,} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
