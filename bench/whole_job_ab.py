"""Two trees' whole job on one slide, fresh `tilestore embed` processes interleaved (GPU
machine): new, base, base, new, ... so that a machine's drift (page cache, clocks, the
previous run's exit) falls on both alike. Walls of fresh processes move by a second or more
from run to run; one tree run after the other can differ by more than the change does.

Arms (ViT-L at the batch size its search picks is `--batch 128`; the batch is fixed so
neither tree searches):
  store there   - the slide's store made already (one untimed run first), its features not;
  in place      - `--in-place --sidecars DIR`, the sidecar made again each run;
  convert again - the store removed before each run: converted on the way in.
Both trees' bytecode is compiled first (untimed, as an installed package has it); the model
alone (the tiles the first, untimed run embedded, through the same `Forward`,
`bench.whole_job.model_alone`) is measured in the same call, for the ratios.

    python bench/whole_job_ab.py SLIDE --arch vit_large_patch16_224 --batch 128 \
        --base /tmp/basethis --new /tmp/this --pairs 2 --out ab.json [--arms "convert again"]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ARMS = ("store there", "in place", "convert again")
BEFORE = "before the engine (process start, imports)"


def run(tree: Path, arm: str, args, work: Path, env0: dict) -> dict:
    """One fresh `tilestore embed` process of this tree: its wall and its report's parts."""
    env = {**env0, "PYTHONPATH": f"{args.site}:{tree}", "TILESTORE_CACHE": str(work / tree.name)}
    into, extra = work / "stores", []
    if arm == "in place":
        shutil.rmtree(work / "sidecars", ignore_errors=True)
        (work / "sidecars").mkdir()
        extra = ["--in-place", "--sidecars", str(work / "sidecars")]
    elif arm == "convert again":
        for store in into.glob("*.ome.zarr"):
            shutil.rmtree(store)
    else:
        for group in into.glob("*/embeddings"):
            shutil.rmtree(group)
    report = work / "report.json"
    cmd = [sys.executable, "-m", "tilestore.cli", "embed", str(args.slide), "--model",
           f"random:{args.arch}", "--into", str(into), "--report", str(report), "--batch-size",
           str(args.batch), *extra]  # fmt: skip
    started = time.perf_counter()
    done = subprocess.run(cmd, env=env, cwd=tree, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    r = json.loads(report.read_text())
    return {
        "tree": str(tree), "arm": arm, "wall_s": round(wall, 2),
        "before_engine_s": r["setup_parts"][BEFORE], "setup_s": round(r["setup_s"], 2),
        "first_batch_s": r.get("first_batch_s"), "warm_up_s": r["stages"].get("warm_up"),
        "engine_s": round(r["wall_s"], 2), "tiles": r["tiles"],
        "stager_s": [p["seconds"] for p in r.get("prepared", [])],
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("slide", type=Path)
    parser.add_argument("--arch", default="vit_large_patch16_224")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--base", type=Path, required=True, help="the base tree (PYTHONPATH)")
    parser.add_argument("--new", type=Path, required=True, help="the new tree (PYTHONPATH)")
    parser.add_argument("--site", default="/tmp/site", help="the wheels' folder, on PYTHONPATH")
    parser.add_argument("--pairs", type=int, default=2, help="runs of each tree per arm")
    parser.add_argument("--arms", default=",".join(ARMS), help="comma-separated, in this order")
    parser.add_argument("--work", type=Path, default=Path("/tmp/whole_job_ab"))
    parser.add_argument("--out", type=Path, default=Path("whole_job_ab.json"))
    args = parser.parse_args()
    for flag, value in (("--batch", args.batch), ("--pairs", args.pairs)):
        if value < 1:
            parser.error(f"{flag} {value}: at least 1")
    arms = [arm.strip() for arm in args.arms.split(",")]
    if not arms or any(arm not in ARMS for arm in arms) or len(set(arms)) < len(arms):
        parser.error(f"--arms {args.arms}: choose among {', '.join(ARMS)}, each once")
    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    env0 = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env0.pop("PYTHONDONTWRITEBYTECODE", None)
    for tree in (args.base, args.new):  # bytecode compiled, as an installed package has it
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree)], check=True)
    first = run(args.new, "store there", args, args.work, env0)  # converts it once, untimed
    call = f"model_alone({args.arch!r}, {first['tiles']}, {args.batch}, 'bf16', False)"
    code = f"from bench.whole_job import model_alone; print({call})"
    alone = float(subprocess.run(
        [sys.executable, "-c", code], env={**env0, "PYTHONPATH": f"{args.site}:{args.new}"},
        cwd=args.new, capture_output=True, text=True, check=True).stdout.split()[-1])  # fmt: skip
    print(f"model alone: {alone:.2f} s", flush=True)
    rows = []
    for arm in arms:
        for i in range(args.pairs):
            for tree in (args.new, args.base) if i % 2 == 0 else (args.base, args.new):
                rows.append(run(tree, arm, args, args.work, env0))
                print(json.dumps(rows[-1]), flush=True)
    args.out.write_text(json.dumps({"model_alone_s": alone, "rows": rows}))
    print(f"\n{args.slide.name}, {args.arch}, batch {args.batch}; model alone {alone:.2f} s")
    print("| arm | tree | walls s | median ratio | before the engine s (median) |")
    print("|---|---|---|---|---|")
    for arm in arms:
        for tree in (args.base, args.new):
            mine = [r for r in rows if r["arm"] == arm and r["tree"] == str(tree)]
            walls = [r["wall_s"] for r in mine]
            before = statistics.median(r["before_engine_s"] for r in mine)
            print(f"| {arm} | {tree} | {', '.join(map(str, walls))} | "
                  f"{statistics.median(walls) / alone:.3f} | {before:.2f} |")  # fmt: skip


if __name__ == "__main__":
    main()
