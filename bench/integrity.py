"""What chunk checksums cost: the same store with and without them, read and embedded in turn.

The large SVS of real tissue is converted twice with the copy path (240 px chunks), with
each chunk's CRC-32C (the default) and without (`convert(checksums=False)`). Then, runs
interleaved so the machine's drift hits both alike:
  read    - random 256 px regions through `Slide.read_region` (one thread): regions/s;
  decode  - (GPU machine) the decoder processes feeding the GPU, no model (bench/decode.py's
            `feed`): tiles/s;
  embed   - (GPU machine) the engine, one Embedder (compiled, batch 512, decode="cpu") run on
            each store in turn after one untimed run: tiles/s from embed() to the last write.

    python bench/integrity.py --model vit_small_patch16_224 --reps 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from decode import feed
from stores import build

from tilestore.cpus import usable_cpus
from tilestore.embed import Embedder, Options
from tilestore.embed.models import load_model
from tilestore.reading.opening import open_slide

HERE = Path(__file__).resolve().parent


def read_rate(store: Path, regions: int, seed: int) -> float:
    """Random 256 px regions of level 0 per second."""
    slide = open_slide(store)
    _, h, w = slide.shape
    rng = np.random.default_rng(seed)
    ys, xs = rng.integers(0, h - 256, regions), rng.integers(0, w - 256, regions)
    t0 = time.perf_counter()
    for y, x in zip(ys.tolist(), xs.tolist(), strict=True):
        slide.read_region(x, y, 256, 256, level=0)
    return regions / (time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="vit_small_patch16_224")
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--regions", type=int, default=2000)
    parser.add_argument("--size", type=int, default=40_000)
    parser.add_argument("--work", type=Path, default=HERE / "data")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "integrity.json")
    args = parser.parse_args()
    stores = {
        "checksums": build(args.work, args.size, ())[1],
        "none": build(args.work, args.size, (), checksums=False)[1],
    }
    cuda = torch.cuda.is_available()
    results: dict = {
        "machine": {
            "gpu": torch.cuda.get_device_name() if cuda else None,
            "cpus": os.cpu_count(),
        },
        "runs": {name: {"read": [], "decode": [], "embed": []} for name in stores},
    }
    embedder = None
    if cuda:
        loaded = load_model(f"random:{args.model}")
        options = Options(batch_size=args.batch, decode="cpu", compile=True, overwrite=True)
        embedder = Embedder(loaded, options)
        embedder.embed([stores["checksums"]], plan="bench")  # compiles; warms the caches
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else None
    for rep in range(args.reps):
        for name, store in stores.items():
            runs = results["runs"][name]
            runs["read"].append(read_rate(store, args.regions, seed=rep))
            line = f"rep {rep + 1} {name}: read {runs['read'][-1]:,.0f} regions/s"
            if cuda:
                fed = feed(store, "cpu", max(2, usable_cpus() - 2), device)
                runs["decode"].append(fed["tiles_per_s"])
                report = embedder.embed([store], plan="bench")
                runs["embed"].append(report.tiles / report.wall_s)
                line += f", decode {fed['tiles_per_s']:,} tiles/s, embed {runs['embed'][-1]:,.0f}"
            print(line, flush=True)
    if embedder is not None:
        embedder.close()
    print(f"\n| measure | with checksums | without | ratio | {args.model}, {args.reps} reps |")
    print("|---|---|---|---|---|")
    for measure in ("read", "decode", "embed"):
        with_, without = (results["runs"][n][measure] for n in ("checksums", "none"))
        if not with_:
            continue
        a, b = statistics.median(with_), statistics.median(without)
        results.setdefault("medians", {})[measure] = {"checksums": a, "none": b, "ratio": a / b}
        spread = f"{min(with_):,.0f}-{max(with_):,.0f} / {min(without):,.0f}-{max(without):,.0f}"
        print(f"| {measure} | {a:,.0f} | {b:,.0f} | {a / b:.3f} | {spread} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    print(f"JSON: {args.out}")


if __name__ == "__main__":
    main()
