"""One slide file to embeddings, the whole job against the model's own time (GPU machine).

For each architecture (timm, random weights: the cost is the architecture's), each arm is a
fresh `tilestore embed SLIDE --model random:ARCH --into DIR --report R` process timed from
outside, as a user runs it:
  convert   - the slide converted into a store on the way in (the copy path), tissue, plan,
              embed (the first run: no batch-size memo);
  store there - again, the store "convert" made already there (not converted again), with
              the batch-size memo the first left, as a SLURM array's later tasks have it;
  convert again - converted afresh with that memo: a SLURM array's later task, each with a
              slide of its own to convert;
  in place  - `--in-place --sidecars DIR`: the slide's own tiles read through a sidecar.
--repeat N runs each arm N times in a row (the walls of fresh processes move by a second
or more from run to run): the row is the median run's.
Then the model alone: the same count of tiles through the same `Forward` (batch size,
precision and compile setting as the run's report says), uint8 tiles already on the GPU,
timed after a warm-up. The ratio whole job / model alone is what the slide costs beyond
its model; each arm's report gives where the rest went (set-up parts, first batch, stages).

As a pip-installed environment runs: bytecode cached (the lent machines set
PYTHONDONTWRITEBYTECODE; the timed processes run without it, after one untimed run that
compiles the bytecode).

    python bench/whole_job.py --size 100000 --archs vit_large_patch16_224,vit_small_patch16_224
    python bench/whole_job.py --cohort 15000,25000,100000 --archs vit_large_patch16_224
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
BEFORE = "before the engine (process start, imports)"  # the report's set-up part
REPO = HERE.parent
sys.path.insert(0, str(REPO))

ARMS = {
    "convert": [],
    "store there": [],
    "convert again": [],
    "in place": ["--in-place", "--sidecars", "{work}/sidecars"],
}


def run_arm(arch: str, slide: Path, work: Path, env: dict, arm: str) -> dict:
    """One fresh `tilestore embed` process; its wall and its report."""
    stem = f"{arch}-{arm.replace(' ', '-')}"
    into, report = work / stem, work / f"{stem}.json"
    if arm == "convert":  # a first run: no batch-size memo either
        shutil.rmtree(work / "cache", ignore_errors=True)
    if arm != "store there":
        shutil.rmtree(into, ignore_errors=True)
    else:  # the store "convert" made is there (not converted again), its features are not
        into = work / f"{arch}-convert"
        shutil.rmtree(into / "embeddings", ignore_errors=True)
        for group in into.glob("*/embeddings"):
            shutil.rmtree(group)
    shutil.rmtree(work / "sidecars", ignore_errors=True)
    (work / "sidecars").mkdir()
    extra = [a.format(work=work) for a in ARMS[arm]]
    wall = embed_process([slide], arch, into, report, env, work / f"{stem}.log", *extra)
    return {"arm": arm, "wall_s": round(wall, 2), "report": json.loads(report.read_text())}


def embed_process(slides, arch: str, into: Path, report: Path, env: dict, log: Path, *extra):
    """Wall seconds of one fresh `tilestore embed SLIDES --into` process (its output in log)."""
    cmd = [sys.executable, "-m", "tilestore.cli", "embed", *map(str, slides), "--model",
           f"random:{arch}", "--into", str(into), "--report", str(report), *extra]  # fmt: skip
    started = time.perf_counter()
    proc = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - started
    log.write_text(proc.stdout + "\n--- stderr ---\n" + proc.stderr)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return wall


def model_alone(arch: str, tiles: int, batch: int, precision: str, compile_: bool) -> float:
    """Seconds for `tiles` tiles through the run's Forward, tiles already on the GPU."""
    import torch

    from tilestore.embed.forward import Forward, place
    from tilestore.embed.models import load_model

    device = torch.device("cuda")
    loaded = place(load_model(f"random:{arch}", device=device), device)
    forward = Forward(loaded, device, precision, compile=compile_)
    size = loaded.transform.resize
    x = torch.randint(0, 255, (batch, size, size, 3), dtype=torch.uint8, device=device)
    for _ in range(5):
        forward(x, batch)
    torch.cuda.synchronize()
    full, rest = divmod(tiles, batch)
    started = time.perf_counter()
    for _ in range(full):
        forward(x, batch)
    if rest:  # the last batch as the engine runs it: the whole buffer, `rest` rows kept
        forward(x, rest)
    torch.cuda.synchronize()
    return time.perf_counter() - started


def cohort(arch: str, sizes: list[int], work: Path, env: dict) -> dict:
    """Slide files of these sizes in one `tilestore embed ... --into` process: its wall
    against the sum of each slide's model-alone time plus the time to its first batch (the
    first slide's preparation, the process's start and the model's load)."""
    from bench.make_slide import make_large_svs

    slides = []
    for size in sizes:
        made = HERE / "data" / f"large-{size}.svs"
        make_large_svs(made, size)
        slides.append(work / "cohort" / made.name)
        slides[-1].parent.mkdir(exist_ok=True)
        if not slides[-1].exists():
            slides[-1].symlink_to(made.resolve())
    into, report_path = work / f"cohort-{arch}", work / f"cohort-{arch}.json"
    shutil.rmtree(into, ignore_errors=True)
    wall = embed_process(slides, arch, into, report_path, env, work / f"cohort-{arch}.log")
    r = json.loads(report_path.read_text())
    alone = [
        model_alone(arch, s["tiles"], r["batch_size"], r["precision"], r["compile"])
        for s in r["slides"]
    ]
    first = r["setup_parts"].get(BEFORE, 0.0)
    first += r["setup_s"] + (r.get("first_batch_s") or 0.0)
    bound = sum(alone) + first
    return {
        "arch": arch, "sizes": sizes, "tiles": r["tiles"], "wall_s": round(wall, 2),
        "model_alone_s": round(sum(alone), 2), "to_first_batch_s": round(first, 2),
        "ratio": round(wall / bound, 3), "gpu_busy": r.get("gpu_busy_fraction"), "report": r,
    }  # fmt: skip


def stage_table(report: dict) -> list[str]:
    """The report's own account: set-up parts, first batch, explained loop, stages."""
    lines = [f"    set-up {report['setup_s']:.2f} s: " + ", ".join(
        f"{k} {v:.2f}" for k, v in report.get("setup_parts", {}).items())]  # fmt: skip
    if report.get("first_batch_s") is not None:
        lines.append(f"    first batch ready {report['first_batch_s']:.2f} s into the loop")
    lines.append("    " + ", ".join(f"{k} {v}" for k, v in report.get("explained", {}).items()))
    lines.append("    stages: " + ", ".join(f"{k} {v}" for k, v in report["stages"].items()))
    for slide in report.get("slides", []):
        if "reading" in slide:
            lines.append(f"    reading: {slide['reading']}")
        if "decode_why" in slide:
            lines.append(f"    decode: {slide.get('decode')} ({slide['decode_why']})")
    for c in report.get("converted", []):
        lines.append(f"    converted: {json.dumps(c)[:300]}")
    for p in report.get("prepared", [])[:3]:
        lines.append(f"    prepared beside the run (s): {json.dumps(p['seconds'])}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--slide", type=Path, help="default: bench/data/large-SIZE.svs")
    parser.add_argument("--size", type=int, default=100_000)
    parser.add_argument("--archs", default="vit_large_patch16_224,vit_small_patch16_224")
    parser.add_argument("--arms", default="convert,store there,convert again,in place")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each arm: the median's row")
    parser.add_argument(
        "--cohort", help="slide sides (px, comma-separated): one --into run of those slides"
    )
    parser.add_argument("--work", type=Path, default=Path("/tmp/whole_job"))
    parser.add_argument("--out", type=Path, default=HERE / "results" / "whole_job.json")
    args = parser.parse_args()
    if args.repeat < 1:
        parser.error(f"--repeat {args.repeat}: at least 1 run of each arm")
    slide = args.slide or HERE / "data" / f"large-{args.size}.svs"
    if not slide.exists():
        from bench.make_slide import make_large_svs

        slide.parent.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        make_large_svs(slide, args.size)
        print(f"made {slide} in {time.perf_counter() - started:.1f} s", flush=True)
    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    linked = args.work / slide.name  # outputs and sidecars stay in the work folder
    linked.symlink_to(slide.resolve())
    env = {**os.environ, "TILESTORE_CACHE": str(args.work / "cache"), "HF_HUB_OFFLINE": "1"}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    # bytecode compiled once, as an installed package has it (untimed)
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "tilestore"),
                    *sys.path[1:2]], env=env, capture_output=True)  # fmt: skip
    subprocess.run([sys.executable, "-c", "import tilestore.cli.main, tilestore.embed.engine, "
                    "timm, torch"], env=env, cwd=REPO, capture_output=True)  # fmt: skip

    if args.cohort:
        sizes = [int(v) for v in args.cohort.split(",")]
        got = [cohort(arch, sizes, args.work, env) for arch in args.archs.split(",")]
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(got))
        print(f"\n{len(sizes)} slide files of {sizes} px through --into, one process")
        print("| model | tiles | wall s | sum of model alone s | to first batch s | "
              "wall / (model alone + first) | GPU busy |")  # fmt: skip
        print("|---|---|---|---|---|---|---|")
        for c in got:
            print(f"| {c['arch']} | {c['tiles']:,} | {c['wall_s']} | {c['model_alone_s']} | "
                  f"{c['to_first_batch_s']} | {c['ratio']} | {c['gpu_busy']} |")  # fmt: skip
            print("\n".join(stage_table(c["report"])))
        return
    rows = []
    for arch in args.archs.split(","):
        for arm in args.arms.split(","):
            runs = [run_arm(arch, linked, args.work, env, arm) for _ in range(args.repeat)]
            ranked = sorted(runs, key=lambda run: run["wall_s"])
            got = ranked[(len(ranked) - 1) // 2]  # the median (the lower of two)
            r = got["report"]
            alone = model_alone(arch, r["tiles"], r["batch_size"], r["precision"], r["compile"])
            row = {
                "arch": arch, "arm": arm, "tiles": r["tiles"], "wall_s": got["wall_s"],
                "walls_s": [run["wall_s"] for run in runs],
                "model_alone_s": round(alone, 2), "ratio": round(got["wall_s"] / alone, 2),
                "batch": r["batch_size"], "precision": r["precision"],
                "gpu_busy": r.get("gpu_busy_fraction"), "setup_s": r["setup_s"],
                "before_engine_s": r["setup_parts"].get(BEFORE),
                "first_batch_s": r.get("first_batch_s"), "report": r,
            }  # fmt: skip
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "report"}), flush=True)
            print("\n".join(stage_table(r)), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"slide": str(slide), "size": args.size, "rows": rows}))
    print(f"\n{slide.name}, whole job (fresh process) against the model alone")
    print("| model | arm | tiles | whole job s (runs) | model alone s | ratio | before the "
          "engine s | set-up s | first batch s | GPU busy |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        runs = ", ".join(map(str, r["walls_s"]))
        print(f"| {r['arch']} | {r['arm']} | {r['tiles']:,} | {r['wall_s']} ({runs}) | "
              f"{r['model_alone_s']} | {r['ratio']} | {r['before_engine_s']} | "
              f"{r['setup_s']:.2f} | {r['first_batch_s']} | {r['gpu_busy']} |")  # fmt: skip


if __name__ == "__main__":
    main()
