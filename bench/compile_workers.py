"""Compiled start with the compile cache warm: Inductor's compile worker pool or none.

Fresh `tilestore embed --compile` processes on one store (GPU machine): the first fills
the compile cache; each later one loads it, with Inductor's own cache emptied (another node
of a SLURM array). `--env-arms` adds runs with TORCHINDUCTOR_COMPILE_THREADS=1 set from the
start, to compare with the code's own choice.

    python bench/compile_workers.py --reps 2 [--env-arms]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from bench import coldstart as cs  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="random:vit_base_patch16_224")
    parser.add_argument("--slide", type=Path, default=HERE / "data" / "large-40000.svs")
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--env-arms", action="store_true")
    parser.add_argument("--work", type=Path, default=Path("/tmp/compile-workers"))
    args = parser.parse_args()
    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    if not args.slide.exists():
        from bench.make_slide import make_large_svs

        args.slide.parent.mkdir(parents=True, exist_ok=True)
        make_large_svs(args.slide, 40_000)
    inductor = args.work / "inductor"
    env = {
        **os.environ,
        "TILESTORE_CACHE": str(args.work / "cache"),
        "TORCHINDUCTOR_CACHE_DIR": str(inductor),
    }
    store = args.work / "stores" / "one.ome.zarr"
    cs.tilestore("convert", str(args.slide), "-o", str(store), env=env)
    cs.tilestore("tissue", str(store), env=env)

    def arm(name: str, extra: dict) -> dict:
        shutil.rmtree(inductor, ignore_errors=True)
        row = cs.embed_arm(name, [store], args.model, args.work, {**env, **extra}, "--compile")
        return row

    rows = [arm("cold (fills the cache)", {})]
    for i in range(args.reps):
        rows.append(arm(f"warm {i + 1}", {}))
        if args.env_arms:
            one = {"TORCHINDUCTOR_COMPILE_THREADS": "1"}
            rows.append(arm(f"warm {i + 1}, COMPILE_THREADS=1", one))
    print("| arm | process wall s | imports s | set-up s | warm-up s | after s |")
    print("|---|---|---|---|---|---|")
    for r in rows:  # after: the process's exit (wall less imports less the engine's wall)
        after = r["process wall s"] - r["before the engine s"] - r["engine wall s"]
        print(
            f"| {r['arm']} | {r['process wall s']} | {r['before the engine s']} | "
            f"{r['set-up s']:.2f} | {r['warm-up s']} | {after:.2f} |"
        )
    out = HERE / "results" / "compile-workers.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
