"""Embedding benchmark (GPU machine): our engine vs the model alone vs a typical pipeline.

For each timm architecture (random weights cost what the foundation models cost:
vit_large_patch16_224 = UNI), in one process:
  ceiling  - the model alone: bf16 input already on the GPU, best batch, eager,
             torch.compile and torch.compile with CUDA graphs (every model unless --compile
             names fewer: compiled, ViT-S ran 27,800 tiles/s where eager gave 20,100 on an
             H100); the best of these, and the engine runs as that best did (compiled or
             not: compiled, the engine replays CUDA graphs);
  engine   - the engine end to end on a store built from real tissue (a large SVS of CMU-1
             tiles, converted with the copy path: Aperio's 240 px tiles as chunks) with
             --decode cpu, and on its YCbCr re-encodes (512 px chunks, nvJPEG's best alone:
             bench/nvjpeg.py, and 1,024 px, its best beside a model) with --decode gpu (and
             --decode cpu on the first), timed from embed() on a
             set-up Embedder (model on the GPU, decoder processes started: the set-up is
             reported apart, as the ceiling leaves out loading its model) to the last write;
  baseline - bench/baseline.py: DataLoader, 8 workers, OpenSlide read_region on the SOURCE
             slide, CPU transforms, batch 64, fp16.
  cli      - `tilestore embed` in a fresh process (model load and compilation included):
             the peak host RSS a user sees, free of this process's ceilings and compiles.
  paths    - (--runs paths) the engine on the copied store with each decode path (cpu, gpu:
             nvJPEG on the JPEG engines, both) at each of --cpus CPU counts (the process
             limited as `taskset -a` does), one slide and a cohort of three, each run's
             features against the CPU-decoded run's (docs/how-to/few-cpus-per-gpu.md).
Also: the engine's features vs the one-tile-at-a-time reference loop (cosine), peak GPU
memory, how soon the first batch was ready, and which stage limits.

    python bench/embed_engine.py --models vit_small_patch16_224,vit_base_patch16_224 --out x.json
    python bench/embed_engine.py --runs paths --cpus 4,8,16 --ycbcr-chunks ""
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import torch
from baseline import run_baseline
from gpu_decoders import gpu_decoder
from stores import build, copy_store

import tilestore
from tilestore.embed import Embedder, Options, embed
from tilestore.embed.graphs import GraphedForward
from tilestore.embed.models import load_model
from tilestore.embed.reference import cosine, reference_features
from tilestore.embeddings.layout import group_name
from tilestore.plan import PlanOptions, load_plan

HERE = Path(__file__).resolve().parent
QUALITY_RUNS = 5  # --runs quality: each of off and on, alternated


# how a ceiling runs the model: eager, compiled, or compiled and replayed as CUDA graphs
# (what the engine's --compile does on a GPU)
FORWARDS = {
    "eager": lambda module: module,
    "compiled": torch.compile,
    "graphs": lambda module: GraphedForward(torch.compile(module)),
}


def ceiling(module: torch.nn.Module, batches: list[int], how: str, seconds: float = 3.0) -> dict:
    """Best tiles/s of the model alone on bf16 input already on the GPU (and each batch's)."""
    best, rates = {"tiles_per_s": 0.0}, {}
    forward = FORWARDS[how](module)
    for batch in batches:
        x = torch.randn(batch, 3, 224, 224, device="cuda").contiguous(
            memory_format=torch.channels_last
        )
        try:
            with torch.inference_mode(), torch.autocast("cuda", dtype=torch.bfloat16):
                for _ in range(3):
                    forward(x)
                torch.cuda.synchronize()
                n, t0 = 0, time.perf_counter()
                while time.perf_counter() - t0 < seconds:
                    forward(x)
                    n += batch
                torch.cuda.synchronize()
                rate = n / (time.perf_counter() - t0)
        except torch.OutOfMemoryError:
            break
        rates[batch] = rate
        if rate > best["tiles_per_s"]:
            best = {"tiles_per_s": rate, "batch": batch}
        del x
        torch.cuda.empty_cache()
    best["compiled"] = how != "eager"
    best["how"] = how
    best["rates"] = rates
    return best


def engine_batch(ceiling: dict, within: float = 0.03) -> int:
    """The smallest batch whose model-only rate is within `within` of the best: a smaller
    batch fills the pipeline sooner and, compiled (fixed shape), pads a slide's last batch
    less."""
    return min(b for b, r in ceiling["rates"].items() if r >= (1 - within) * ceiling["tiles_per_s"])


def gpu_state() -> dict:
    """The GPU's temperature, SM clock and power now (NVML): the ceilings run at the power
    cap (an H100 held 700 W and clocked down to 1,545 MHz for ViT-L's compiled batches),
    so each measurement says in what state the GPU was."""
    return {
        "temp_c": torch.cuda.temperature(),
        "sm_clock_mhz": torch.cuda.clock_rate(),
        "power_w": round(torch.cuda.power_draw() / 1000, 1),
    }


def reset_peaks() -> None:
    """Start a run's peaks afresh: GPU allocator stats, and the process's VmHWM (Linux),
    which otherwise holds the ceiling's and torch.compile's peaks from earlier."""
    torch.cuda.reset_peak_memory_stats()
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        pass


def limit_cpus(count: int, every: list[int]) -> list[int]:
    """Run this process, every thread of it and every process it starts from now on, on the
    first `count` of the CPUs `every` (as `taskset -a` does to a running process): what a
    SLURM job of `count` CPUs per GPU gets. The engine reads its CPU count from the affinity
    (`tilestore.cpus.usable_cpus`)."""
    cpus = every[:count]
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            os.sched_setaffinity(int(tid), cpus)
    return cpus


def stored_features(store: Path, arch: str) -> np.ndarray:
    """The store's features of the model, as float32."""
    group = tilestore.open_slide(store).group[group_name(model_name(arch))]
    return group["features"][...].astype(np.float32)


def path_runs(
    entry: dict, arch: str, stores: list[Path], loaded, batch: int, compiled: bool, args
) -> None:
    """The engine on the copied store with each decode path (--paths: cpu, gpu, both; the
    GPU ones with each of --gpu-decoders), at each CPU count (the process limited to that
    many CPUs), on one slide and on a cohort of three: tiles/s, and each GPU-decoded run's
    features against the CPU-decoded run's (cosine, tile by tile)."""
    from tilestore.embed import nvjpeg

    every = sorted(os.sched_getaffinity(0))
    wanted = args.paths.split(",")
    paths = [("cpu", "cpu", None)] if "cpu" in wanted else []
    paths += [
        (decode, name if decode == "gpu" else f"{name}+cpu", gpu_decoder(name))
        for name in args.gpu_decoders.split(",")
        if name
        for decode in ("gpu", "both")
        if decode in wanted
    ]
    most = dict(pair.split(":") for pair in args.path_tiles.split(",") if pair).get(arch)
    most = int(most) if most else None
    kept = nvjpeg.GPU_DECODERS
    try:
        for count in [int(c) for c in args.cpus.split(",")]:
            limit_cpus(count, every)
            for decode, name, kind in paths:
                nvjpeg.GPU_DECODERS = (kind,) if kind else kept
                for label, slides in (("slide", stores[:1]), ("cohort", stores)):
                    key = f"paths_{count}_{name}_{label}"
                    tag = f"{count} CPUs, {name}, {label} of {len(slides)}"
                    try:
                        run = engine_run(
                            slides, loaded, batch, decode, compiled, tag, max_tiles=most
                        )
                    except Exception as exc:  # kept in the results; the other paths go on
                        print(f"  engine {tag} failed: {exc}", flush=True)
                        entry[key] = {"error": str(exc)}
                        continue
                    decoded = sorted({s["decode"] for s in run["slides"]})
                    run.update(cpus=count, path=name, decoded=decoded, asked=decode)
                    if decoded != [decode]:  # a GPU path that fell back: not what it says
                        print(f"  {tag}: decoded {decoded}: {run['warnings']}", flush=True)
                    done = run["slides"][0]["tiles"]  # the plan's first tiles (max_tiles)
                    features = stored_features(slides[0], arch)[:done]
                    if name == "cpu":
                        entry.setdefault("_cpu_features", features)
                    reference = entry.get("_cpu_features")
                    if reference is not None:
                        run["cosine_vs_cpu_min"] = float(cosine(features, reference).min())
                    entry[key] = run
    finally:
        nvjpeg.GPU_DECODERS = kept
        limit_cpus(len(every), every)
        entry.pop("_cpu_features", None)


def engine_run(
    stores: list[Path],
    loaded,
    batch: int,
    decode: str,
    compiled: bool,
    tag: str,
    tokens: int | None = None,
    quality: bool = False,
    max_tiles: int | None = None,
) -> dict:
    options = Options(
        max_tiles=max_tiles,
        batch_size=batch,
        decode=decode,
        compile=compiled,
        overwrite=True,
        tokens=tokens,
        quality=quality,
    )
    reset_peaks()
    state = gpu_state()
    rss_before = psutil.Process().memory_info().rss / 2**20
    with Embedder(loaded, options) as embedder:  # set-up: model on the GPU, decoders started
        report = embedder.embed(stores, plan="bench")
        stats = getattr(getattr(embedder.gpu_jpeg, "decoder", None), "stats", None)
    if report.failures:
        raise RuntimeError(report.failures)
    data = report.to_json()
    # The ceiling leaves out loading and warming the model; the run leaves out the set-up
    # (reported apart) but keeps everything after: reads, the pipeline fill, the warm-up
    # at the run's batch size, the last writes.
    data["tiles_per_s_with_setup"] = report.tiles_per_s
    data["tiles_per_s"] = report.tiles / (report.wall_s - report.setup_s)
    data["rss_before_mb"] = round(rss_before, 1)  # this process's, before the run
    data["gpu_state_before"] = state
    if stats and report.decode == "gpu":
        data["gpu_decoder_stats"] = dict(stats)
        print(f"  {tag}: GPU decoder {stats}", flush=True)
    print(
        f"  engine {tag}: {report.tiles} tiles, {data['tiles_per_s']:.0f} tiles/s from embed() "
        f"to the last write (set-up {report.setup_s:.2f} s before it; "
        f"{data['tiles_per_s_with_setup']:.0f} tiles/s with it); "
        f"first batch {report.first_batch_s} s; "
        f"{report.explained}; stages {report.stages}; GPU util {report.gpu_util_mean}; "
        f"RSS {rss_before:.0f} MB before, {report.peak_rss_mb:.0f} MB peak; GPU before {state}",
        flush=True,
    )
    return data


def measures_cost(batch: int, repeats: int = 20) -> float:
    """GPU ms of the per-tile quality measures alone for one batch of 224 px tiles (the
    part of a batch's time they add, next to the model's)."""
    from tilestore.embed.forward import QualityLayout

    layout = QualityLayout(0.5, 224)
    tiles = torch.randint(0, 255, (batch, 224, 224, 3), dtype=torch.uint8, device="cuda")
    with torch.inference_mode():
        for _ in range(3):
            layout.measure(tiles)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(repeats):
            layout.measure(tiles)
        torch.cuda.synchronize()
    ms = (time.perf_counter() - t0) / repeats * 1000
    print(f"  measures alone: {ms:.2f} ms per batch of {batch}", flush=True)
    return ms


def stored_bytes(store: Path, arch: str, array: str) -> int:
    """Bytes on disk of one array of the store's embeddings group (its files, compressed)."""
    folder = store / group_name(model_name(arch)) / array
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def model_name(arch: str) -> str:
    """A timm architecture as ``random:<arch>``; ``random:<registered>`` and the like as given
    (a registered encoder's own build, random weights: ViT-H and ViT-g as they are built)."""
    return arch if ":" in arch else f"random:{arch}"


def cli_run(store: Path, arch: str, batch: int, compiled: bool, out: Path) -> dict:
    """`tilestore embed` in a fresh process, as a user runs it: model load and compilation
    included, and its peak RSS free of this benchmark's own (ceilings, compiles, baseline)."""
    report = out.with_name(f"cli-{arch}.json")
    command = [
        sys.executable,
        "-m",
        "tilestore.cli",
        "embed",
        str(store),
        "--model",
        model_name(arch),
    ]
    command += ["--plan", "bench", "--batch-size", str(batch), "--decode", "cpu"]
    command += ["--overwrite", "--report", str(report)] + (["--compile"] if compiled else [])
    t0 = time.perf_counter()
    done = subprocess.run(
        command, cwd=HERE.parent, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    if done.returncode:  # kept in the results, and the other runs go on
        error = done.stderr.strip().splitlines()[-1:] or [f"exit {done.returncode}"]
        print(f"  cli (fresh process) failed: {error[0]}", flush=True)
        return {"error": error[0], "peak_rss_mb": float("nan")}
    data = json.loads(report.read_text())
    data["process_s"] = time.perf_counter() - t0
    print(
        f"  cli (fresh process): {data['tiles_per_s']:.0f} tiles/s over its "
        f"{data['wall_s']:.1f} s (setup {data['setup_s']:.1f} s); process "
        f"{data['process_s']:.1f} s; peak RSS {data['peak_rss_mb']:.0f} MB",
        flush=True,
    )
    return data


def check_features(store: Path, arch: str, slide, plan, loaded) -> dict:
    """The stored features of 48 random tiles vs the one-tile-at-a-time reference loop."""
    picks = np.random.default_rng(0).choice(len(plan), 48, replace=False)
    stored = tilestore.open_slide(store).group[group_name(model_name(arch))]["features"]
    features = stored.get_orthogonal_selection((picks, slice(None))).astype(np.float32)
    out = {}
    for precision in ("bf16", "fp32"):
        ref = reference_features(
            slide, plan, loaded, indices=picks, device="cuda", precision=precision
        )
        out[f"cosine_vs_reference_{precision}_min"] = float(cosine(features, ref).min())
    return out


def limiting(run: dict) -> str:
    """The stage a run waited on: GPU compute, unless the GPU sat idle between batches (CUDA
    events: the fill before the first batch, a fixed cost of every run, is not counted) or
    the loop lost time elsewhere for over 5% of the loop."""
    idle = run["stages"].get("gpu_idle", 0.0)
    other = run["explained"].get("other (launches, writer back-pressure)", 0.0)
    if max(idle, other) <= 0.05 * run["stages"]["loop"]:
        return "GPU compute"
    return "reading/decoding tiles" if idle >= other else "launch overhead / writer"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--models", default="vit_small_patch16_224,vit_base_patch16_224,vit_large_patch16_224"
    )
    parser.add_argument(
        "--compile",
        default="all",
        help="models (or 'all') whose ceiling is also measured compiled; where compiling "
        "gives the better ceiling, the engine runs compiled too",
    )
    parser.add_argument(
        "--runs",
        default="cpu,gpu,ycbcr,cohort,cli,baseline",
        help="which runs to make besides the ceilings (a subset for a quick look)",
    )
    parser.add_argument(
        "--switch-interval",
        type=float,
        default=None,
        help="sys.setswitchinterval for the runs (seconds; Python's default is 0.005)",
    )
    parser.add_argument("--size", type=int, default=40_000)
    parser.add_argument(
        "--ycbcr-chunks",
        default="512,1024",
        help="chunk px of the re-encoded (nvJPEG) stores; --decode cpu runs on the first",
    )
    parser.add_argument(
        "--tokens",
        default="",
        help="token grids (0: the model's own) for runs that also store patch tokens "
        "(--runs tokens): tiles/s and bytes per tile against the same run without",
    )
    parser.add_argument(
        "--cpus",
        default="4,8,16",
        help="CPU counts the decode paths run at (--runs paths): the process limited to the "
        "first N CPUs of its affinity, every thread of it and the processes it starts",
    )
    parser.add_argument(
        "--paths", default="cpu,gpu,both", help="decode paths --runs paths compares"
    )
    parser.add_argument(
        "--gpu-decoders",
        default="OwnNvjpeg",
        help="GPU decoders for the gpu and both paths of --runs paths, by class name "
        "(tilestore.embed.nvjpeg's, or bench/gpu_decoders.py's NvImageCodec), each alone "
        "in GPU_DECODERS",
    )
    parser.add_argument(
        "--path-chunks",
        type=int,
        default=None,
        help="run --runs paths on the YCbCr re-encode in chunks of this many px (one of "
        "--ycbcr-chunks) rather than on the copied store",
    )
    parser.add_argument(
        "--path-tiles",
        default="",
        help="tiles per slide for a model's --runs paths, e.g. vit_large_patch16_224:8192 "
        "(the plan's first tiles: a slow model's runs shorter, its fraction of the ceiling "
        "the same)",
    )
    parser.add_argument("--baseline-tiles", type=int, default=12_000)
    parser.add_argument("--work", type=Path, default=HERE / "data")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "embed.json")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True
    if args.switch_interval:
        sys.setswitchinterval(args.switch_interval)
    torch.backends.cudnn.allow_tf32 = True

    t0 = time.perf_counter()
    runs = set(args.runs.split(","))
    chunks = tuple(int(c) for c in args.ycbcr_chunks.split(",") if c)
    source, store, ycbcrs = build(args.work, args.size, chunks)
    ycbcr = ycbcrs[0] if ycbcrs else None
    gpu_runs = {
        "engine_gpu" if i == 0 else f"engine_gpu_{chunk}": (chunk, path)
        for i, (chunk, path) in enumerate(zip(chunks, ycbcrs, strict=True))
    }
    small = args.work / "stores" / "CMU-1-Small-Region.ome.zarr"
    if not small.exists():
        data = Path(os.environ.get("TILESTORE_DATA", HERE.parents[1] / "shared" / "data"))
        tilestore.convert(data / "slides" / "CMU-1-Small-Region.svs", args.work / "stores")
    cohort = [store] + [
        copy_store(store, args.work / f"cohort-{i}" / store.name)
        for i in ((1, 2) if runs & {"cohort", "cli", "paths"} else ())
    ]  # a run over several slides: the next one streams while the last batches compute
    path_stores = cohort
    if args.path_chunks:  # the paths runs on a YCbCr re-encode of this chunk size instead
        chosen = ycbcrs[chunks.index(args.path_chunks)]
        path_stores = [chosen] + [
            copy_store(chosen, args.work / f"cohort-{i}-{args.path_chunks}" / chosen.name)
            for i in (1, 2)
        ]
    slide = tilestore.open_slide(store)
    plan, _ = load_plan(slide, "bench")
    print(f"data ready in {time.perf_counter() - t0:.1f} s: {len(plan)} tiles", flush=True)
    results = {
        "machine": {
            "gpu": torch.cuda.get_device_name(),
            "cpus": os.cpu_count(),
            "torch": torch.__version__,
            "python": platform.python_version(),
            "switch_interval": sys.getswitchinterval(),
        },
        "slide": {"size": args.size, "tiles": len(plan), "ycbcr_chunks": chunks},
        "models": {},
    }
    compiled_models = set(
        args.models.split(",") if args.compile == "all" else args.compile.split(",")
    )
    for arch in args.models.split(","):
        print(f"== {arch}", flush=True)
        loaded = load_model(model_name(arch), device="cuda")  # random weights drawn there
        module = loaded.module.cuda().eval().to(memory_format=torch.channels_last)
        entry = {"gpu_state": {"before_ceilings": gpu_state()}}
        entry["eager"] = ceiling(module, [64, 128, 256, 512, 1024], "eager")
        print(f"  ceiling eager {entry['eager']}", flush=True)
        if arch in compiled_models:
            eager_best = entry["eager"]["batch"]
            for how in ("compiled", "graphs"):
                entry[how] = ceiling(module, [eager_best // 2, eager_best, 2 * eager_best], how)
                print(f"  ceiling {how} {entry[how]}", flush=True)
        best = max((entry[how] for how in FORWARDS if how in entry), key=lambda c: c["tiles_per_s"])
        compiled = best["compiled"]  # the engine runs as the better ceiling did
        entry["ceiling"] = best
        entry["gpu_state"]["after_ceilings"] = gpu_state()
        batch = engine_batch(best)
        entry["engine_batch"] = batch
        print(f"  engine batch {batch} (smallest within 3% of the best ceiling)", flush=True)
        if compiled:  # compile once, on a small store, so the measured runs are steady
            warm = Options(batch_size=batch, compile=True, overwrite=True)
            t1 = time.perf_counter()
            embed(
                [small],
                loaded,
                plan=PlanOptions(mpp=0.5, tile=224, min_tissue=0.0),
                options=warm,
            )
            entry["compile_s"] = time.perf_counter() - t1
            print(f"  compiled in {entry['compile_s']:.0f} s (warm-up run)", flush=True)
        if "paths" in runs:
            path_runs(entry, arch, path_stores, loaded, batch, compiled, args)
        if "cpu" in runs:
            entry["engine_cpu"] = engine_run([store], loaded, batch, "cpu", compiled, "cpu")
        if "quality" in runs:  # the per-tile measures' cost: without and with, alternated
            if compiled:  # the measures compiled in too, before the measured runs
                embed(
                    [small],
                    loaded,
                    plan=PlanOptions(mpp=0.5, tile=224, min_tissue=0.0),
                    options=Options(batch_size=batch, compile=True, overwrite=True, quality=True),
                )
            for i in range(QUALITY_RUNS):
                for on in (False, True):
                    tag = f"cpu, quality {'on' if on else 'off'} ({i + 1})"
                    entry[f"quality_{'on' if on else 'off'}_{i + 1}"] = engine_run(
                        [store], loaded, batch, "cpu", compiled, tag, quality=on
                    )
            entry["measures_ms_per_batch"] = measures_cost(batch)
        if "tokens" in runs:  # the features alone, then with each token grid, on one store
            for grid in [int(g) for g in args.tokens.split(",") if g]:
                run = engine_run(
                    [store], loaded, batch, "cpu", compiled, f"cpu, tokens {grid}", tokens=grid
                )
                run["token_grid"] = grid
                run["tokens_bytes_per_tile"] = stored_bytes(store, arch, "tokens") / run["tiles"]
                run["features_bytes_per_tile"] = (
                    stored_bytes(store, arch, "features") / run["tiles"]
                )
                entry[f"tokens_{grid}"] = run
                print(
                    f"  tokens {grid}: {run['tokens_bytes_per_tile']:,.0f} B per tile stored "
                    f"(features {run['features_bytes_per_tile']:,.0f} B)",
                    flush=True,
                )
        if "gpu" in runs:
            for key, (chunk, path) in gpu_runs.items():
                tag = f"gpu (YCbCr, {chunk} px chunks)"
                entry[key] = engine_run([path], loaded, batch, "gpu", compiled, tag)
                entry[key]["chunk"] = chunk
        if "ycbcr" in runs and ycbcr is not None:
            entry["engine_cpu_ycbcr"] = engine_run(
                [ycbcr], loaded, batch, "cpu", compiled, "cpu (YCbCr)"
            )
        if "cohort" in runs:
            entry["cohort_cpu"] = engine_run(
                cohort, loaded, batch, "cpu", compiled, f"cohort of {len(cohort)} (cpu)"
            )
        if "cli" in runs:  # a fresh process draws its own random weights: not on the store checked
            entry["cli"] = cli_run(cohort[-1], arch, batch, compiled, args.out)
        tokened = [
            k
            for k in entry
            if k.startswith(("tokens_", "quality_o", "paths_")) and "error" not in entry[k]
        ]
        for key in ("engine_cpu", *gpu_runs, "engine_cpu_ycbcr", "cohort_cpu", *tokened):
            if key in entry:
                entry[key]["vs_ceiling"] = entry[key]["tiles_per_s"] / best["tiles_per_s"]
                entry[key]["limited_by"] = limiting(entry[key])
        if "engine_cpu" in entry:
            entry.update(check_features(store, arch, slide, plan, loaded))
        if "baseline" in runs:
            n = min(args.baseline_tiles, len(plan))
            base = run_baseline(
                str(source),
                plan.x[:n],
                plan.y[:n],
                copy.deepcopy(loaded.module),
                mean=loaded.transform.mean,
                std=loaded.transform.std,
            )
            entry["baseline"] = base
            engines = [entry[k]["tiles_per_s"] for k in ("engine_cpu", *gpu_runs) if k in entry]
            entry["vs_baseline"] = max(engines, default=0.0) / base["tiles_per_s"]
            print(f"  baseline {base}; engine/baseline {entry['vs_baseline']:.2f}", flush=True)
        results["models"][arch] = entry
        args.out.parent.mkdir(parents=True, exist_ok=True)  # after each model: kept if cut off
        args.out.write_text(json.dumps(results, indent=2, default=str))
        del loaded, module
        torch.cuda.empty_cache()
    print_table(results)
    print_tokens(results)
    print_quality(results)
    print_paths(results)
    print(f"JSON: {args.out}")


def print_table(results: dict) -> None:
    print(
        f"\n{results['machine']['gpu']}, {results['machine']['cpus']} CPUs; "
        f"{results['slide']['tiles']} tiles of 224 px at 0.5 um/px"
    )
    head = (
        "model",
        "ceiling",
        "engine cpu-dec",
        "engine gpu-dec",
        "gpu-dec, other chunks",
        "cpu-dec same store",
        "cohort x3 cpu-dec",
        "baseline",
        "vs ceil",
        "vs base",
        "limited by",
        "RSS MB (cli)",
        "GPU MB",
        "cos bf16",
    )
    print(" | ".join(head))
    for arch, e in results["models"].items():
        others = [e[k] for k in e if k.startswith("engine_gpu_")]
        runs = [e[k] for k in ("engine_cpu", "engine_gpu") if k in e] + others
        best = max(runs, key=lambda r: r["tiles_per_s"], default=None)

        print(
            " | ".join(
                [
                    arch.replace("_patch16_224", ""),
                    f"{e['ceiling']['tiles_per_s']:.0f} ({e['ceiling'].get('how', '-')})",
                    _rate(e.get("engine_cpu")),
                    _rate(e.get("engine_gpu")),
                    ", ".join(f"{_rate(r)} at {r['chunk']} px" for r in others) or "-",
                    _rate(e.get("engine_cpu_ycbcr")),
                    _rate(e.get("cohort_cpu")),
                    f"{e['baseline']['tiles_per_s']:.0f}" if "baseline" in e else "-",
                    f"{best['vs_ceiling']:.2f}" if best else "-",
                    f"{e['vs_baseline']:.2f}x" if "vs_baseline" in e else "-",
                    best["limited_by"] if best else "-",
                    f"{e['cli']['peak_rss_mb']:.0f}" if "cli" in e else "-",
                    _gpu_mb(*runs),
                    f"{e['cosine_vs_reference_bf16_min']:.4f}" if "engine_cpu" in e else "-",
                ]
            )
        )


def print_tokens(results: dict) -> None:
    """Runs that also stored patch tokens, against the same store's features-only run."""
    rows = [
        (arch, e[k], e.get("engine_cpu"))
        for arch, e in results["models"].items()
        for k in e
        if k.startswith("tokens_")
    ]
    if not rows:
        return
    print(
        "\nmodel | token grid | tiles/s (vs ceiling) | vs features only | token B/tile | "
        "feature B/tile"
    )
    for arch, run, plain in rows:
        grid = run["token_grid"] or "the model's"
        ratio = f"{run['tiles_per_s'] / plain['tiles_per_s']:.3f}" if plain else "-"
        print(
            f"{arch} | {grid} | {_rate(run)} | {ratio} | {run['tokens_bytes_per_tile']:,.0f} | "
            f"{run['features_bytes_per_tile']:,.0f}"
        )


def print_quality(results: dict) -> None:
    """Runs without and with the per-tile quality measures, alternated on one store."""
    models = {a: e for a, e in results["models"].items() if "quality_on_1" in e}
    if not models:
        return
    print(
        f"\nmodel | quality off ({QUALITY_RUNS} runs) | quality on ({QUALITY_RUNS} runs) | "
        "on / off | GPU computing s, off / on | other s, off / on | measures ms/batch (eager)"
    )
    for arch, e in models.items():
        runs = {
            on: [e[f"quality_{on}_{i}"] for i in range(1, QUALITY_RUNS + 1)] for on in ("off", "on")
        }
        rates = {on: [r["tiles_per_s"] for r in runs[on]] for on in runs}
        parts = {
            part: {on: sum(r["explained"][key] for r in runs[on]) / len(runs[on]) for on in runs}
            for part, key in (
                ("gpu", "GPU computing"),
                ("other", "other (launches, writer back-pressure)"),
            )
        }
        print(
            f"{arch} | {', '.join(f'{r:.0f}' for r in rates['off'])} | "
            f"{', '.join(f'{r:.0f}' for r in rates['on'])} | "
            f"{sum(rates['on']) / sum(rates['off']):.3f} | "
            f"{parts['gpu']['off']:.3f} / {parts['gpu']['on']:.3f} | "
            f"{parts['other']['off']:.3f} / {parts['other']['on']:.3f} | "
            f"{e['measures_ms_per_batch']:.2f} (batch {e['engine_batch']})"
        )


def print_paths(results: dict) -> None:
    """Each decode path at each CPU count: one slide and a cohort of three, tiles/s (fraction
    of the model's ceiling), and the features against the CPU-decoded run's."""
    rows = {}
    for arch, e in results["models"].items():
        for key, run in e.items():
            if key.startswith("paths_"):
                _, cpus, name, label = key.split("_", 3)
                rows.setdefault((arch, int(cpus), name), {})[label] = run
    if not rows:
        return
    print("\nmodel | CPUs | decode | one slide (vs ceiling) | cohort of 3 | limited by | cos")
    for (arch, cpus, name), runs in rows.items():
        slide, cohort = runs.get("slide", {}), runs.get("cohort", {})
        cos = min(r.get("cosine_vs_cpu_min", 1.0) for r in runs.values() if "error" not in r)
        print(
            f"{arch.replace('_patch16_224', '')} | {cpus} | {name} | "
            f"{_rate(slide) if 'tiles_per_s' in slide else slide.get('error', '-')} | "
            f"{_rate(cohort) if 'tiles_per_s' in cohort else cohort.get('error', '-')} | "
            f"{slide.get('limited_by', '-')} | {cos:.5f}"
            + ("" if slide.get("decoded") == [slide.get("asked")] else " (fell back)")
        )


def _rate(run: dict | None) -> str:
    return f"{run['tiles_per_s']:.0f} ({run['vs_ceiling']:.2f})" if run else "-"


def _gpu_mb(*runs: dict) -> str:
    values = [r["peak_gpu_allocated_mb"] for r in runs if r.get("peak_gpu_allocated_mb")]
    return f"{max(values):.0f}" if values else "-"


if __name__ == "__main__":
    main()
