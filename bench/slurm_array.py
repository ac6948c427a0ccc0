"""The SLURM array of docs/how-to/cohort-slurm.md with `--compile`, under a real one-node SLURM
(slurm-wlm started as `tests/slurm.py` starts it; root): N tasks, one store each, sharing one
compile cache as the page says (one task compiles, the others wait for it and load its entry),
against N tasks with a compile cache each (every task compiles, as before the cache had a lock).
Each task has an Inductor cache of its own, as it would on its own node. CPU only:
efficientnet-lite0 on copies of CMU-1-Small-Region.

    python bench/slurm_array.py [--tasks 4]

Prints a markdown table per arm (each task's log: what it did about the compile, the
compile's or the wait's seconds, the task's wall) and writes bench/results/slurm-array.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from tests.slurm import Slurm, array_script  # noqa: E402

SLIDE = HERE.parent.parent / "shared" / "data" / "slides" / "CMU-1-Small-Region.svs"
ARMS = {
    "one shared compile cache (the recipe)": "$PWD/compile-cache",
    "a compile cache per task (no lock to share)": "$PWD/compile-cache-$SLURM_ARRAY_TASK_ID",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--work", type=Path, default=None)
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="slurm-array-"))
    source = work / "source"
    subprocess.run([sys.executable, "-m", "tilestore.cli", "convert", SLIDE, "-o", source],
                   check=True, capture_output=True)  # fmt: skip
    (store,) = source.glob("*.ome.zarr")
    slurm = Slurm.start(work / "slurm")
    slurm.env["PATH"] = f"{Path(sys.executable).parent}:{slurm.env['PATH']}"
    slurm.env["OMP_NUM_THREADS"] = "1"
    results = []
    try:
        for arm, cache in ARMS.items():
            results.append(_arm(slurm, arm, cache, store, work, args.tasks))
    finally:
        slurm.stop()
    when = datetime.now().strftime("%Y-%m-%d")
    print(f"{args.tasks} array tasks, {platform.node()}, {when}, CPU ({_cpus()} cores)\n")
    for result in results:
        print(f"{result['arm']}: array wall {result['wall_s']:.0f} s, compiled in "
              f"{result['compiled']} task(s)\n")  # fmt: skip
        print("| task | compile | its seconds | task wall s |")
        print("|---|---|---|---|")
        for t in result["tasks"]:
            print(f"| {t['task']} | {t['did']} | {t['seconds']} | {t['wall_s']} |")
        print()
    out = HERE / "results" / "slurm-array.json"
    out.parent.mkdir(exist_ok=True)
    record = {"date": when, "machine": platform.node(), "arms": results}
    out.write_text(json.dumps(record, indent=1))


def _arm(slurm: Slurm, arm: str, cache: str, store: Path, work: Path, tasks: int) -> dict:
    folder = work / re.sub(r"\W+", "-", arm).strip("-")
    for k in range(tasks):
        shutil.copytree(store, folder / "stores" / f"{k}-{store.name}")
    script = folder / "embed.sbatch"
    script.write_text(array_script(tasks, compile_cache=cache))
    started = time.monotonic()
    job = slurm.sbatch(script, cwd=folder)
    slurm.wait(job, timeout=3600)
    wall = time.monotonic() - started
    codes = slurm.exit_codes(job)
    rows = []
    for k in range(tasks):
        log = (folder / f"slurm-{job}_{k}.out").read_text()
        rows.append({"task": k, **_compile_of(log), "wall_s": _task_wall(slurm, f"{job}_{k}"),
                     "state": codes.get(f"{job}_{k}"), "log": log})  # fmt: skip
    return {
        "arm": arm,
        "wall_s": round(wall, 1),
        "compiled": sum(r["did"] == "compiled" for r in rows),
        "tasks": rows,
    }


def _compile_of(log: str) -> dict:
    """What a task's log says it did about the compile, and how long that took."""
    compiled = re.search(r"compiled \S+ in ([\d.]+) s", log)
    if "waiting for " in log:
        waited = re.search(r"loaded compiled graphs from .*", log)
        return {"did": "waited, then loaded" if waited else "waited", "seconds": None}
    if compiled:
        return {"did": "compiled", "seconds": float(compiled.group(1))}
    if "loaded compiled graphs" in log:
        return {"did": "loaded", "seconds": None}
    return {"did": "?", "seconds": None}


def _task_wall(slurm: Slurm, task: str) -> int | None:
    shown = slurm.run("scontrol", "-o", "show", "job", task, check=False).stdout
    times = dict(re.findall(r"\b(StartTime|EndTime)=(\S+)", shown))
    try:
        start, end = (datetime.fromisoformat(times[k]) for k in ("StartTime", "EndTime"))
    except (KeyError, ValueError):
        return None
    return int((end - start).total_seconds())


def _cpus() -> int:
    import os

    return os.cpu_count() or 1


if __name__ == "__main__":
    main()
