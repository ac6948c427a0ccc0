"""One slide in seconds (GPU machine): where a fresh process's seconds go, before and after.

Every arm is `tilestore embed` in a fresh process, timed from outside (process wall), with
the run report's own breakdown (before the engine: process start and imports; set-up
parts; warm-up and compilation; the loop):
  eager, first     - no batch-size memo, no compile cache: the batch search runs;
  eager            - the memo from the run before;
  compiled, cold   - --compile, an empty compile cache and Inductor cache;
  compiled, warm   - --compile, the compile cache from the run before, Inductor's own local
                     cache emptied (as on another node of a SLURM array);
  array loop       - N fresh processes, one store each, against one process over the N;
  slide, 1 command - `tilestore embed SLIDE --into DIR` (convert + tissue + plan + embed in
                     one process) against the four commands in four processes.

    python bench/coldstart.py --model random:vit_base_patch16_224 --stores 10
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
REPO = HERE.parent
sys.path.insert(0, str(REPO))


def tilestore(*args: str, env: dict) -> float:
    """Run `tilestore ARGS` in a fresh process; its wall seconds."""
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "tilestore.cli", *args], env=env, capture_output=True, text=True
    )
    wall = time.perf_counter() - started
    if proc.returncode:
        raise SystemExit(f"tilestore {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
    return wall


def embed_arm(name, stores, model, work, env, *extra) -> dict:
    report = work / f"report-{name.replace(' ', '-').replace(',', '')}.json"
    wall = tilestore(
        "embed",
        *map(str, stores),
        "--model",
        model,
        "--overwrite",
        "--report",
        str(report),
        *extra,
        env=env,
    )
    r = json.loads(report.read_text())
    before = r["setup_parts"].get("before the engine (process start, imports)", 0.0)
    first = before + r["setup_s"] + (r["first_batch_s"] or 0.0)
    return {
        "arm": name,
        "process wall s": round(wall, 2),
        "tiles": r["tiles"],
        "start to first batch s": round(first, 2),
        "before the engine s": before,
        "set-up s": r["setup_s"],
        "engine wall s": r["wall_s"],
        "set-up parts": r["setup_parts"],
        "warm-up s": r["explained"].get("model warm-up (CUDA set-up, compilation)"),
        "GPU computing s": r["explained"].get("GPU computing"),
        "batch": r["batch_size"],
        "batch note": r.get("batch_note"),
        "notes": r.get("notes", []),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="random:vit_base_patch16_224")
    parser.add_argument("--slide", type=Path, default=HERE / "data" / "large-40000.svs")
    parser.add_argument("--size", type=int, default=40_000)
    parser.add_argument("--stores", type=int, default=10, help="stores in the array loop")
    parser.add_argument(
        "--compiled-loop", action="store_true", help="the array loop compiled too, not eager only"
    )
    parser.add_argument("--work", type=Path, default=Path("/tmp/coldstart"))
    parser.add_argument("--out", type=Path, default=HERE / "results" / "coldstart.json")
    args = parser.parse_args()
    work = args.work
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    if not args.slide.exists():
        from bench.make_slide import make_large_svs

        args.slide.parent.mkdir(parents=True, exist_ok=True)
        make_large_svs(args.slide, args.size)
    cache, inductor = work / "cache", work / "inductor"
    env = {**os.environ, "TILESTORE_CACHE": str(cache), "TORCHINDUCTOR_CACHE_DIR": str(inductor)}
    # as a pip-installed environment runs: bytecode cached (the lent GPU machine sets this,
    # and its torch has no .pyc: every process would compile torch's sources, +6 s)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    store = work / "stores" / "one.ome.zarr"
    tilestore("convert", str(args.slide), "-o", str(store), env=env)
    tilestore("tissue", str(store), env=env)
    rows = [embed_arm("eager, first", [store], args.model, work, env)]
    rows.append(embed_arm("eager", [store], args.model, work, env))
    rows.append(embed_arm("compiled, cold", [store], args.model, work, env, "--compile"))
    shutil.rmtree(inductor, ignore_errors=True)  # another node: only our cache travels
    rows.append(embed_arm("compiled, warm", [store], args.model, work, env, "--compile"))
    for row in rows:
        print(json.dumps(row))

    copies = []
    for i in range(args.stores):
        copy = work / "array" / f"s{i}.ome.zarr"
        shutil.copytree(store, copy)
        copies.append(copy)
    loop = {}
    for compiled in (False, True) if args.compiled_loop else (False,):
        flags = ("--compile",) if compiled else ()
        started = time.perf_counter()
        for copy in copies:
            tilestore("embed", str(copy), "--model", args.model, "--overwrite", *flags, env=env)
        tasks = time.perf_counter() - started
        one = tilestore(
            "embed", *map(str, copies), "--model", args.model, "--overwrite", *flags, env=env
        )
        loop["compiled" if compiled else "eager"] = {
            "tasks s": round(tasks, 1),
            "one process s": round(one, 1),
            "ratio": round(tasks / one, 2),
        }
        print(json.dumps(loop))

    into = work / "into"
    one_command = tilestore(
        "embed", str(args.slide), "--model", args.model, "--into", str(into), env=env
    )
    made = work / "four" / "four.ome.zarr"
    four = [
        tilestore("convert", str(args.slide), "-o", str(made), env=env),
        tilestore("tissue", str(made), env=env),
        tilestore("plan", str(made), "--mpp", "0.5", "--tile", "224", env=env),
        tilestore("embed", str(made), "--model", args.model, env=env),
    ]
    slide = {
        "one command s": round(one_command, 1),
        "four commands s": [round(s, 1) for s in four],
        "four total s": round(sum(four), 1),
    }
    print(json.dumps(slide))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"arms": rows, "array": loop, "slide": slide}, indent=2))

    print(f"\n{args.model}, one {rows[0]['tiles']:,}-tile store, fresh processes")
    print(
        "| arm | process wall s | start to first batch s | before engine s | set-up s "
        "| warm-up s | GPU s | batch |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['arm']} | {r['process wall s']} | {r['start to first batch s']} | "
            f"{r['before the engine s']} | {r['set-up s']} | {r['warm-up s']} | "
            f"{r['GPU computing s']} | {r['batch']} |"
        )
    for r in rows:
        print(r["arm"], "set-up parts:", r["set-up parts"], r["notes"], r["batch note"])
    print(f"array loop of {args.stores}: {loop}")
    print(f"slide: {slide}")


if __name__ == "__main__":
    main()
