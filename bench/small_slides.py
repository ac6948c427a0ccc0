"""Cohorts of many small slides (issue 68): conversion across the CPUs, embedding at the
model's speed, and a run's memory and open files over thousands of stores.

1. Conversion: `--convert` copies of CMU-1-Small-Region (45 tiles at 0.5 um/px, 224 px; each
   under its own name) converted by `tilestore convert --at-once auto`, and the first
   `--serial` of them one at a time (`--at-once 1`): seconds, and the stores compared file
   by file (their `created` time aside).
2. Embedding, for each `--archs` (timm, random weights: they cost what the real models
   cost), one `Embedder` kept warm across runs: one large store (a slide of `--large` px of
   real CMU-1 tissue), then `--small` of the converted stores (45 tiles each), then
   `--medium` stores of about 2,000 tiles (a slide of `--medium-px` px, its chunks hard
   linked): tiles/s of each against the large store's, the per-slide fixed cost the run's
   report measured (median and max on the critical path: the GPU's wait for a slide's
   first batch; and beside the model), GPU busy. Every store has the same plan ("bench").
3. `--flat` small stores in one run of the first arch: host RSS and open files sampled as
   it goes.
4. The first small store's features from the cohort run against that store embedded
   alone: equal bit for bit (each batch holds the same tiles).
   With `--stage-only N`: only the first N slide files made ready (converted, tissue mask)
   by a `Stager` for each of `--stage-at-once` (e.g. 1,2,auto), no model: seconds, and
   the stores compared file by file with the first setting's.
5. Slide files in, embeddings out (`embed --into`): the first `--into` slide files made
   ready (converted, tissue mask, plan) by a `Stager` with `--at-once auto` and with one
   worker, and embedded by the first arch as they land: wall and tiles/s against the
   same slides' stores.

    python bench/small_slides.py --archs vit_small_patch16_224,vit_large_patch16_224
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import psutil
import torch
from make_slide import make_large_svs

import tilestore
import tilestore.embed.engine as engine
from tilestore.embed import Embedder, Options, Stager
from tilestore.plan import PlanOptions, list_plans, plan_over_tissue, save_plan

HERE = Path(__file__).resolve().parent
PLAN = PlanOptions(mpp=0.5, tile=224, name="bench")
SOURCE = Path(os.environ.get("TILESTORE_DATA", HERE.parent.parent / "shared" / "data"))
SMALL = SOURCE / "slides" / "CMU-1-Small-Region.svs"


def planned(store: Path) -> Path:
    slide = tilestore.open_slide(store)
    if "bench" not in list_plans(slide):
        save_plan(slide, plan_over_tissue(slide, PLAN))
    return store


def tree(root: Path) -> dict[str, str]:
    """Each file's sha256 under root, the stores' `created` times blanked."""
    out = {}
    for folder, _, files in os.walk(root):
        for name in files:
            path = Path(folder) / name
            data = path.read_bytes()
            if name == "zarr.json":
                meta = json.loads(data)
                meta.get("attributes", {}).get("tilestore", {}).pop("created", None)
                data = json.dumps(meta, sort_keys=True).encode()
            out[str(path.relative_to(root))] = hashlib.sha256(data).hexdigest()
    return out


def convert_cohort(
    work: Path, count: int, serial: int, at_once: str = "auto"
) -> tuple[dict, list[Path]]:
    links = work / "slides"
    shutil.rmtree(links, ignore_errors=True)
    links.mkdir(parents=True)
    for i in range(count):
        os.symlink(SMALL.resolve(), links / f"s{i:04d}.svs")
    files = sorted(links.glob("*.svs"))

    def run(paths: list[Path], out: Path, at_once: str) -> float:
        shutil.rmtree(out, ignore_errors=True)
        started = time.perf_counter()
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "tilestore.cli",
                "convert",
                *map(str, paths),
                "-o",
                str(out),
                "--at-once",
                at_once,
            ],
            capture_output=True,
            text=True,
        )
        if done.returncode:
            raise SystemExit(done.stderr[-2000:])
        return time.perf_counter() - started

    parallel = run(files, work / "parallel", at_once)
    one = run(files[:serial], work / "serial", "1")
    a, b = tree(work / "serial"), tree(work / "parallel")
    same = sum(a[k] == b.get(k) for k in a)
    result = {
        "slides": count,
        "parallel_s": round(parallel, 1),
        "serial_slides": serial,
        "serial_s": round(one, 1),
        "serial_per_slide_s": round(one / serial, 3),
        "at_once": at_once,
        "files_compared": len(a),
        "files_equal": same,
        "cpus": os.cpu_count(),
    }
    print(
        f"convert: {count} slides at once ({at_once}) in {parallel:.1f} s; {serial} one at a "
        f"time in "
        f"{one:.1f} s ({one / serial:.3f} s a slide); files equal {same}/{len(a)}"
    )
    return result, sorted((work / "parallel").glob("*.ome.zarr"))


def linked_copies(store: Path, folder: Path, count: int, stem: str) -> list[Path]:
    """`count` copies of a store, chunk files hard linked, metadata copied."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    out = []
    for i in range(count):
        target = folder / f"{stem}{i:04d}.ome.zarr"
        shutil.copytree(store, target, copy_function=_link_chunks, ignore=_no_embeddings)
        out.append(target)
    return out


def _no_embeddings(folder: str, names: list[str]) -> list[str]:
    return ["embeddings"] if "embeddings" in names else []


def _link_chunks(source: str, target: str) -> None:
    if f"{os.sep}c{os.sep}" in source or os.path.basename(source) == "c":
        os.link(source, target)
    else:
        shutil.copy2(source, target)


class Sampled(threading.Thread):
    """Host RSS and open files every `every` s, with the tiles written so far: the run's
    process, and its worker processes together (store processes, decoders)."""

    def __init__(self, every: float = 2.0) -> None:
        super().__init__(daemon=True)
        self.every, self.tiles, self.rows = every, 0, []
        self.stop = threading.Event()
        self.started = time.perf_counter()

    def run(self) -> None:
        me = psutil.Process()
        while not self.stop.wait(self.every):
            rss, files = 0, 0
            for child in me.children(recursive=True):
                try:
                    rss, files = rss + child.memory_info().rss, files + child.num_fds()
                except psutil.Error:  # ended meanwhile
                    continue
            self.rows.append(
                {
                    "s": round(time.perf_counter() - self.started, 1),
                    "tiles": self.tiles,
                    "rss_mb": round(me.memory_info().rss / 2**20, 1),
                    "open_files": me.num_fds(),
                    "threads": me.num_threads(),
                    "workers_rss_mb": round(rss / 2**20, 1),
                    "workers_open_files": files,
                }
            )

    def progress(self, n: int, total: object) -> None:
        self.tiles += n


def embed_run(embedder: Embedder, stores: list[Path], sampled: Sampled | None = None) -> dict:
    started = time.perf_counter()
    report = embedder.embed(stores, plan="bench", progress=sampled.progress if sampled else None)
    wall = time.perf_counter() - started
    if report.failures:
        raise SystemExit(f"failures: {report.failures[:3]}")
    return {
        "stores": len(stores),
        "tiles": report.tiles,
        "wall_s": round(wall, 2),
        "tiles_per_s": round(report.tiles / wall, 1),
        "gpu_busy": report.gpu_busy_fraction,
        "per_slide": report.per_slide,
        "stages": report.stages,
    }


def stage_only(work: Path, count: int, settings: list[str]) -> list[dict]:
    """`count` copies of CMU-1-Small-Region (each its own name) made ready by a Stager
    (converted into a folder, the default plan's tissue mask), for each at-once setting."""
    links = work / "stage-slides"
    shutil.rmtree(links, ignore_errors=True)
    links.mkdir(parents=True)
    for i in range(count):
        os.symlink(SMALL.resolve(), links / f"s{i:04d}.svs")
    slides = sorted(links.glob("*.svs"))
    rows, first = [], None
    print("| at once | workers | slides | seconds | s a slide | files equal to the first row's |")
    print("|---|---|---|---|---|---|")
    for setting in settings:
        at_once = setting if setting == "auto" else int(setting)
        into = work / f"stage-{setting}"
        shutil.rmtree(into, ignore_errors=True)
        started = time.perf_counter()
        stager = Stager(slides, into, None, at_once=at_once)
        workers = len(stager._workers)
        failed = [s for s in stager if s.error is not None]
        seconds = time.perf_counter() - started
        if failed:
            raise SystemExit(f"{failed[0].given}: {failed[0].error}")
        made = tree(into)
        first = first or made
        same = sum(first[k] == made.get(k) for k in first)
        rows.append({"at_once": setting, "workers": workers, "slides": count,
                     "seconds": round(seconds, 2), "files": len(first), "equal": same})  # fmt: skip
        print(f"| {setting} | {workers} | {count} | {seconds:.1f} | {seconds / count:.3f} | "
              f"{same} / {len(first)} |")  # fmt: skip
    return rows


def into_run(embedder: Embedder, slides: list[Path], into: Path, at_once) -> dict:
    """The slide files made ready by a Stager (`embed --into --at-once`) as they are
    embedded: the clock starts when the Stager is made (it starts converting at once)."""
    shutil.rmtree(into, ignore_errors=True)
    started = time.perf_counter()
    report = embedder.embed(Stager(slides, into, PLAN, at_once=at_once), plan=PLAN)
    wall = time.perf_counter() - started
    if report.failures:
        raise SystemExit(f"failures: {report.failures[:3]}")
    return {
        "stores": len(slides),
        "tiles": report.tiles,
        "wall_s": round(wall, 2),
        "tiles_per_s": round(report.tiles / wall, 1),
        "gpu_busy": report.gpu_busy_fraction,
        "per_slide": report.per_slide,
        "stages": report.stages,
    }


def features(store: Path, arch: str) -> np.ndarray:
    group = tilestore.open_slide(store).group[f"embeddings/random-{arch}/bench"]
    return np.asarray(group["features"][:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--archs", default="vit_small_patch16_224,vit_large_patch16_224")
    parser.add_argument("--convert", type=int, default=400)
    parser.add_argument("--serial", type=int, default=40)
    parser.add_argument("--small", type=int, default=400)
    parser.add_argument("--medium", type=int, default=100)
    parser.add_argument("--medium-px", type=int, default=17_000)  # about 2,000 tiles
    parser.add_argument("--convert-at-once", default="auto")
    parser.add_argument("--cohorts", default="small,medium", help="embedded beside the large")
    parser.add_argument(
        "--store-processes", type=int, help="the engine's STORE_PROCESSES (default: its own)"
    )
    parser.add_argument("--large", type=int, default=40_000)
    parser.add_argument("--flat", type=int, default=2_000)
    parser.add_argument("--into", type=int, default=100)
    parser.add_argument("--stage-only", type=int, default=0)
    parser.add_argument("--stage-at-once", default="1,auto")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--work", type=Path, default=Path("/tmp/small_slides"))
    parser.add_argument("--reuse", action="store_true", help="the stores a run before made")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "small_slides.json")
    args = parser.parse_args()
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    result: dict = {"device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"}
    if args.store_processes:
        engine.STORE_PROCESSES = args.store_processes
    result["store_processes"] = getattr(engine, "STORE_PROCESSES", None)  # (a build before)

    if args.stage_only:
        result["stage"] = stage_only(work, args.stage_only, args.stage_at_once.split(","))
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))
        print(f"\nwritten {args.out}")
        return
    if args.reuse and (work / "medium").is_dir():  # a run before made them (--reuse)
        small = sorted((work / "parallel").glob("*.ome.zarr"))
        large = work / "large" / "large.ome.zarr"
        medium = sorted((work / "medium").glob("*.ome.zarr"))
        if (work / "result.json").exists():
            result["convert"] = json.loads((work / "result.json").read_text())["convert"]
    else:
        result["convert"], small = convert_cohort(
            work, args.convert, args.serial, args.convert_at_once
        )
        (work / "result.json").write_text(json.dumps(result))
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(planned, small))
        large = planned(
            tilestore.convert(
                make_large_svs(work / "large.svs", args.large), work / "large", overwrite=True
            ).store
        )
        medium_one = planned(
            tilestore.convert(
                make_large_svs(work / "medium.svs", args.medium_px),
                work / "medium1",
                overwrite=True,
            ).store
        )
        medium = linked_copies(medium_one, work / "medium", args.medium, "m")
    small = small[: args.small]

    rows = []
    for index, arch in enumerate(args.archs.split(",")):
        options = Options(batch_size=args.batch_size, overwrite=True)
        with Embedder(f"random:{arch}", options) as embedder:
            embed_run(embedder, [small[0]])  # warm: the model's first batch
            ref = embed_run(embedder, [large])
            alone = features(small[0], arch)
            runs = {"large": ref, "small": embed_run(embedder, small)}
            same = np.array_equal(alone, features(small[0], arch), equal_nan=True)
            if "medium" in args.cohorts.split(","):
                runs["medium"] = embed_run(embedder, medium)
            if index == 0 and args.flat:
                flat = linked_copies(small[1], work / "flat", args.flat, "f")  # planned
                sampled = Sampled()
                sampled.start()
                runs["flat"] = embed_run(embedder, flat, sampled)
                sampled.stop.set()
                sampled.join()
                runs["flat"]["samples"] = sampled.rows
            if index == 0 and args.into:
                slides = sorted((work / "slides").glob("*.svs"))[: args.into]
                runs["stores"] = embed_run(embedder, small[: len(slides)])
                for at_once in ("auto", 1):
                    runs[f"into, at once {at_once}"] = into_run(
                        embedder, slides, work / f"into-{at_once}", at_once
                    )
        for name in ("small", "medium")[: len(runs) - 1]:
            run = runs[name]
            run["vs_large"] = round(run["tiles_per_s"] / ref["tiles_per_s"], 3)
        for name, run in runs.items():
            if name.startswith("into"):  # against the same slides' stores
                run["vs_large"] = round(run["tiles_per_s"] / runs["stores"]["tiles_per_s"], 3)
        rows.append({"arch": arch, "bitwise_alone": bool(same), **runs})
        print(
            f"\n{arch} (batch {args.batch_size}); the small store alone vs in the cohort: "
            f"{'bitwise equal' if same else 'DIFFERENT'}"
        )
        print(
            "| cohort | stores | tiles | wall s | tiles/s | vs ref | GPU busy | "
            "critical path ms (median, max) | beside ms (median, max) | parts (median ms) |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|")
        # vs ref: against the large store's tiles/s; an `into` run, the same slides' stores'
        for name, run in runs.items():
            if name == "flat":
                continue
            fixed = run["per_slide"] or {}
            path, beside = fixed.get("critical_path_ms", {}), fixed.get("beside_ms", {})
            print(
                f"| {name} | {run['stores']} | {run['tiles']:,} | {run['wall_s']} | "
                f"{run['tiles_per_s']:,.0f} | {run.get('vs_large', 1.0)} | {run['gpu_busy']} | "
                f"{path.get('median')}, {path.get('max')} | {beside.get('median')}, "
                f"{beside.get('max')} | {fixed.get('parts_median_ms')} |"
            )
        if "flat" in runs:
            flat = runs["flat"]
            print(f"\n{args.flat} small stores in one run: {flat['tiles_per_s']:,.0f} tiles/s")
            print("| s | tiles | RSS MB | open files | threads | workers' RSS MB | their files |")
            print("|---|---|---|---|---|---|---|")
            samples = flat["samples"]
            for row in samples[:: max(1, len(samples) // 12)] + samples[-1:]:
                print(
                    f"| {row['s']} | {row['tiles']:,} | {row['rss_mb']} | "
                    f"{row['open_files']} | {row['threads']} | {row['workers_rss_mb']} | "
                    f"{row['workers_open_files']} |"
                )
        result["embed"] = rows
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))  # each arch's as it ends
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"\nwritten {args.out}")


if __name__ == "__main__":
    main()
