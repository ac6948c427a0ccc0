"""The engine on a sharded store against one file per chunk (GPU machine), in one run.

The large SVS of `make_slide.py` converted twice with the copy path, once in shards
(`convert`'s default) and once a file per chunk (`shard="off"`, the layout before); one
`Embedder` (the model loaded once, its decoder processes started) embeds each store in
turn, alternated over `--rounds` (overwrite: every run reads and computes every tile), and
the table gives each run's tiles/s and the sharded/unsharded ratio of the medians. With
`--decode cpu` and a fast model (ViT-S) the CPU decoders limit: reading the chunks (a byte
range of a shard, or a file) is what differs.

    python bench/shards_engine.py --model random:vit_small_patch16_224 --decode cpu
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import warnings
from pathlib import Path

from make_slide import make_large_svs

import tilestore
from tilestore.embed import Embedder, Options
from tilestore.plan import PlanOptions

HERE = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="random:vit_small_patch16_224")
    parser.add_argument("--decode", default="cpu")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--size", type=int, default=40_000)
    parser.add_argument("--work", type=Path, default=HERE / "data")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "shards_engine.json")
    args = parser.parse_args()
    slide = make_large_svs(args.work / f"large-{args.size}.svs", args.size)
    stores = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, shard in (("sharded", 32), ("file per chunk", "off")):
            folder = args.work / f"engine-shard-{shard}"
            stores[name] = tilestore.convert(slide, folder, shard=shard, overwrite=True).store
    files = {k: sum(len(n) for _, _, n in os.walk(v)) for k, v in stores.items()}
    runs: dict[str, list[float]] = {name: [] for name in stores}
    plan = PlanOptions(mpp=0.5, tile=224)
    with Embedder(args.model, Options(decode=args.decode, overwrite=True)) as embedder:
        embedder.embed([stores["sharded"]], plan=plan)  # warm: batch size, caches, graphs
        for _ in range(args.rounds):
            for name, store in stores.items():
                report = embedder.embed([store], plan=plan)
                runs[name].append(report.tiles_per_s)
                print(f"{name}: {report.tiles} tiles, {report.tiles_per_s:.0f} tiles/s")
        settings = embedder.settings
    median = {k: statistics.median(v) for k, v in runs.items()}
    ratio = median["sharded"] / median["file per chunk"]
    print(
        f"\n{args.model}, decode {settings.decode}, {settings.decoders} decoders, "
        f"batch {settings.batch_size}"
    )
    print("| store | files | tiles/s (runs) | median |")
    print("|---|---|---|---|")
    for name in stores:
        print(
            f"| {name} | {files[name]:,} | {' / '.join(f'{v:.0f}' for v in runs[name])} | "
            f"{median[name]:.0f} |"
        )
    print(f"sharded / file per chunk: {ratio:.3f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "machine": platform.node(),
                "model": args.model,
                "decode": settings.decode,
                "decoders": settings.decoders,
                "batch": settings.batch_size,
                "files": files,
                "runs": runs,
                "median": median,
                "ratio": ratio,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
