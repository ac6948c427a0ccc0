"""Cohort benchmark (a multi-GPU machine): `embed_cohort` on 1 GPU, then on every GPU.

A cohort of `--slides` stores (copies of one large store built from real CMU-1 tissue, each
with the same 0.5 um/px 224 px plan; with `--sizes`, stores of those sizes in turn: a real
cohort's mix, whose largest slides are split into slices, the largest first) is embedded
with a timm architecture (random weights cost what the foundation models cost:
vit_large_patch16_224 = UNI) through dask-cuda's LocalCUDACluster, first with one worker on
GPU 0, then one worker per GPU, on fresh copies.
With `--inputs stores,slides` each GPU count runs twice: on the stores, then on the slide
files themselves (hard links of the SVS files the stores were made from), converted on the
workers into a fresh folder with the same plan's tiles (`embed_cohort(..., into=...)`): the
slides' wall against the stores' is what preparing on the workers costs.
Prints cohort tiles/s for each, the ratio, per-worker tiles and NVML GPU utilisation, and
writes JSON.

    python bench/embed_cohort.py --arch vit_large_patch16_224 --slides 8 --size 40000
    python bench/embed_cohort.py --slides 10 --inputs stores,slides \
        --sizes 15000,20000,25000,30000,40000,50000,60000,70000,85000,100000
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch
from make_slide import make_large_svs

import tilestore
from tilestore.embed.cohort import cpu_share, embed_cohort, local_cluster
from tilestore.embed.models import get_model
from tilestore.embed.settings import Options
from tilestore.plan import PlanOptions, list_plans, plan_over_tissue, save_plan

PLAN = PlanOptions(mpp=0.5, tile=224, name="bench")  # the stores' plan; the slides' too

HERE = Path(__file__).resolve().parent


def build(work: Path, size: int) -> Path:
    """The large SVS converted by copying its tiles, with the plan 'bench'."""
    store = work / "source" / f"large-{size}.ome.zarr"
    if not store.exists():
        source = make_large_svs(work / f"large-{size}.svs", size)
        tilestore.convert(source, work / "source")
    slide = tilestore.open_slide(store)
    if "bench" not in list_plans(slide):
        save_plan(slide, plan_over_tissue(slide, PLAN))
    return store


def _link_chunks(source: str, target: str) -> None:
    """Chunks are only read: hard-link them (fast); copy metadata, which runs rewrite."""
    if f"{os.sep}c{os.sep}" in source:
        os.link(source, target)
    else:
        shutil.copy2(source, target)


def run(
    stores: list[Path],
    work: Path,
    gpus: int,
    slides: int,
    arch: str,
    options: Options,
    inputs: str = "stores",
) -> dict:
    """The cohort of `slides` stores, taking the given stores in turn (mixed sizes); with
    inputs "slides", their slide files instead, converted on the workers."""
    folder = work / f"gpus{gpus}-{inputs}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    cohort = []
    for i in range(slides):
        store = stores[i % len(stores)]
        if inputs == "slides":  # the SVS the store was made from (build: work/source/..)
            target = folder / f"slide{i:02d}.svs"
            os.link(store.parent.parent / store.name.replace(".ome.zarr", ".svs"), target)
        else:
            target = folder / f"slide{i:02d}.ome.zarr"
            shutil.copytree(store, target, copy_function=_link_chunks)
        cohort.append(target)
    client = local_cluster("local-cuda", gpus)
    try:
        share = cpu_share(len(client.nthreads()))
        t0 = time.perf_counter()
        report = embed_cohort(
            cohort,
            f"random:{arch}",
            client,
            plan="bench" if inputs == "stores" else PLAN,
            options=options,
            into=folder / "stores" if inputs == "slides" else None,
            cpus_per_worker=share,
        )
        wall = time.perf_counter() - t0
    finally:
        client.cluster.close()
        client.close()
    result = report.to_json()
    result["steady_tiles_per_s"] = round(report.tiles / (wall - report.setup_s), 1)
    result["decoders_per_worker"] = sorted({w["decoders"] for w in result["per_worker"].values()})
    shutil.rmtree(folder, ignore_errors=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--arch", default="vit_large_patch16_224")
    parser.add_argument("--slides", type=int, default=8)
    parser.add_argument("--size", type=int, default=40_000)
    parser.add_argument(
        "--sizes",
        help="a mixed cohort: slide sides in px, comma-separated, taken in turn (e.g. "
        "15000,25000,40000,60000,100000); default: every slide --size",
    )
    parser.add_argument(
        "--inputs",
        default="stores",
        help="stores, slides, or stores,slides: what each GPU count embeds (slides: the "
        "SVS files, converted on the workers)",
    )
    parser.add_argument(
        "--counts", help="the GPU counts to run, comma-separated (default: 1 and every GPU)"
    )
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--work", type=Path, default=Path("/tmp/tilestore-cohort"))
    parser.add_argument("--out", type=Path, default=HERE / "results" / "embed_cohort.json")
    args = parser.parse_args()

    gpus = torch.cuda.device_count()
    if gpus < 2:
        sys.exit(f"needs 2 or more GPUs, found {gpus}")
    args.work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else [args.size]
    stores = [build(args.work, size) for size in sizes]
    per_store = [tilestore.open_slide(s).group["plans/bench/x"].shape[0] for s in stores]
    tiles = [per_store[i % len(stores)] for i in range(args.slides)]
    print(f"stores ready in {time.perf_counter() - t0:.0f} s: tiles per slide {tiles}")
    options = Options(batch_size=args.batch_size, device="cuda", decode="cpu")
    # this process imports timm for a random: name once, before the first arm's clock (as the
    # CLI does at its door), so every arm's coordinator starts alike
    get_model(f"random:{args.arch}")
    results = {
        "arch": args.arch,
        "slides": args.slides,
        "sizes": sizes,
        "tiles_per_slide": tiles,
        "gpu": torch.cuda.get_device_name(0),
        "cores": os.cpu_count(),
        "runs": {},
    }
    kinds = args.inputs.split(",")
    if not kinds or set(kinds) - {"stores", "slides"}:
        sys.exit(f"--inputs {args.inputs}: stores, slides or stores,slides")
    counts = [int(c) for c in args.counts.split(",")] if args.counts else [1, gpus]
    for n in counts:
        for kind in kinds:
            print(f"\n{n} GPU(s), {kind}...", flush=True)
            results["runs"][f"{n} {kind}"] = run(
                stores, args.work, n, args.slides, args.arch, options, kind
            )
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(results, indent=2))
    runs = results["runs"]
    for kind in kinds if {1, gpus} <= set(counts) else []:
        one, many = runs[f"1 {kind}"], runs[f"{gpus} {kind}"]
        results[f"speedup {kind}"] = round(many["tiles_per_s"] / one["tiles_per_s"], 3)
        results[f"steady_speedup {kind}"] = round(
            many["steady_tiles_per_s"] / one["steady_tiles_per_s"], 3
        )
    args.out.write_text(json.dumps(results, indent=2))

    print(
        f"\n{args.arch}, {args.slides} slides of {sizes} px ({sum(tiles)} tiles), {results['gpu']}"
    )
    print("| GPUs, inputs | tiles | wall s | setup s | tiles/s | after setup | slides / stores |")
    print("|---|---|---|---|---|---|---|")
    for key, r in runs.items():
        n = key.split()[0]
        versus = (
            f"{r['wall_s'] / runs[f'{n} stores']['wall_s']:.3f}"
            if key.endswith("slides") and f"{n} stores" in runs
            else "-"
        )
        print(
            f"| {key} | {r['tiles']} | {r['wall_s']:.1f} | {r['setup_s']:.1f} | "
            f"{r['tiles_per_s']:.0f} | {r['steady_tiles_per_s']:.0f} | {versus} |"
        )
        for address, w in r["per_worker"].items():
            util = np.mean(w["gpu_util"]) if w["gpu_util"] else float("nan")
            idle = r["idle"].get(address, {})
            gaps = ", ".join(f"{k} {v:.1f}" for k, v in idle.items())
            print(
                f"|   {address} | {w['tiles']} | {w['tasks']} tasks | GPU util {util:.0f}% | "
                f"idle s: {gaps} |||"
            )
    for key, r in runs.items():  # when each store's slices went out, and what it cost here
        landed = {p["store"]: p["landed_s"] for p in r["prepared"]}
        print(f"{key}: store ready at s (landed from its worker; planned here in s):")
        print("   " + "; ".join(
            f"{Path(s['store']).stem.split('.')[0]} {s['ready_s']:.1f}"
            + (f" ({landed[s['store']]:.1f}; {s['planned_s']:.2f})" if s["store"] in landed
               else f" ({s['planned_s']:.2f})")
            for s in sorted(r["slides"], key=lambda s: s["ready_s"])
        ))  # fmt: skip
    for kind in kinds if {1, gpus} <= set(counts) else []:
        print(
            f"{kind}: {gpus} GPUs / 1 GPU: {results[f'speedup {kind}']:.2f}x end to end, "
            f"{results[f'steady_speedup {kind}']:.2f}x after setup (model load on each worker)"
        )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
