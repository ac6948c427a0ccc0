"""One compile per SLURM array: N concurrent `tilestore embed --compile` tasks, started at
once as an array's tasks are, with one fresh shared compile cache (one compiles, the others
wait and load its entry) against N that each compile (a compile cache of their own each,
as before the lock), and N that find the entry made beforehand (`tilestore models
compile`: here, the shared arm's entry copied). Each task has its own Inductor cache and
tilestore cache (a node's), and its own copy of the store.

    python bench/compile_once.py [--tasks 4] [--reps 1] [--model random:vit_tiny_patch16_224]
        [--device cuda --batch-size 256 --precision bf16]

Prints a markdown table; writes bench/results/compile-once.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SLIDE = HERE.parent.parent / "shared" / "data" / "slides" / "CMU-1-Small-Region.svs"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="random:vit_tiny_patch16_224")
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--device", default="cpu", help="cpu, or cuda: the tasks share the GPU")
    parser.add_argument("--batch-size", default="8")
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--slide", type=Path, default=SLIDE)
    parser.add_argument("--work", type=Path, default=Path("/tmp/compile-once"))
    args = parser.parse_args()
    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    _tilestore("convert", args.slide, "-o", args.work / "source")
    (store,) = (args.work / "source").glob("*.ome.zarr")
    rows = []
    for rep in range(args.reps):
        for arm in ARMS:
            rows.append(_arm(arm, rep, store, args))
    print(f"{args.tasks} concurrent tasks, {args.model}, {_machine()}")
    print(
        "| arm | rep | wall s (all tasks) | task wall s (min-max) | warm-up s (min-max) "
        "| compiled | waited | CPU s |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        walls, warm = r["task_wall_s"], r["warm_up_s"]
        print(
            f"| {r['arm']} | {r['rep']} | {r['wall_s']:.1f} | {min(walls):.1f}-{max(walls):.1f} "
            f"| {min(warm):.1f}-{max(warm):.1f} | {r['compiled']} | {r['waited']} "
            f"| {r['cpu_s']:.0f} |"
        )
    out = HERE / "results" / "compile-once.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"machine": _machine(), "model": args.model, "rows": rows}, indent=2))


ARMS = ("each its own cache", "one shared cache", "entry made beforehand")


def _arm(arm: str, rep: int, store: Path, args) -> dict:
    """Start the tasks at once; their walls, the whole's, the CPU of all, who compiled."""
    folder = args.work / f"{rep}-{ARMS.index(arm)}"
    shared = folder / "compile-cache"
    if arm == ARMS[2]:  # the entry the shared arm's task compiled
        shutil.copytree(args.work / f"{rep}-1" / "compile-cache", shared)
    tasks = []
    cpu_before = _children_cpu()
    started = time.perf_counter()
    for k in range(args.tasks):
        node = folder / f"task{k}"
        copy = node / store.name
        shutil.copytree(store, copy)
        cache = node / "compile-cache" if arm == ARMS[0] else shared
        env = {
            **os.environ,
            "TORCHINDUCTOR_CACHE_DIR": str(node / "inductor"),
            "TILESTORE_CACHE": str(node / "tilestore-cache"),
        }
        command = [
            *("embed", copy, "--model", args.model, "--compile", "--compile-cache", cache),
            *("--batch-size", args.batch_size, "--device", args.device),
            *("--precision", args.precision),
            *("--mpp", "0.5", "--tile", "224", "--max-tiles", "16"),
        ]
        log = open(node / "task.err", "w")  # noqa: SIM115 (the child's, closed at exit)
        tasks.append((_start(command, env, node / "task.out", log), time.perf_counter(), node))
    ended: dict[int, float] = {}
    watchers = [threading.Thread(target=_watch, args=(process, ended)) for process, _, _ in tasks]
    for watcher in watchers:
        watcher.start()
    for watcher in watchers:
        watcher.join()
    if any(process.returncode for process, _, _ in tasks):
        raise SystemExit(f"a task failed: see {folder}")
    walls = [ended[process.pid] - began for process, began, _ in tasks]
    wall = max(ended.values()) - started
    logs = [(node / "task.err").read_text() for _, _, node in tasks]
    reports = [(node / "task.out").read_text() for _, _, node in tasks]
    return {
        "arm": arm,
        "rep": rep,
        "wall_s": round(wall, 2),
        "task_wall_s": [round(w, 2) for w in walls],
        "warm_up_s": [float(WARM_UP.search(report).group(1)) for report in reports],
        "compiled": sum(f"compiling {args.model}" in log for log in logs),
        "waited": sum("waiting for " in log for log in logs),
        "cpu_s": round(_children_cpu() - cpu_before, 1),
        "entries": len(list(folder.rglob("*.bin"))),
    }


WARM_UP = re.compile(r"model warm-up \(CUDA set-up, compilation\) ([0-9.]+) s")


def _watch(process: subprocess.Popen, ended: dict[int, float]) -> None:
    """The moment the task ends (each watched on its own: waited in turn, a task that ends
    early would be timed when the one before it ends)."""
    process.wait()
    ended[process.pid] = time.perf_counter()


def _start(command, env, out: Path, err) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tilestore.cli", *map(str, command)],
        stdout=open(out, "w"),
        stderr=err,
        env=env,
    )


def _children_cpu() -> float:
    """User and system seconds of every process waited for so far (their children too)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _tilestore(*args) -> None:
    subprocess.run([sys.executable, "-m", "tilestore.cli", *map(str, args)], check=True)


def _machine() -> str:
    import torch

    return (
        f"{platform.node()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
        f"{time.strftime('%Y-%m-%d')}"
    )


if __name__ == "__main__":
    main()
