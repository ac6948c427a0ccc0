"""What making one slide file ready costs before its first batch: the stager's work (CPU only).

`tilestore embed SLIDE --into DIR` (convert) or `--in-place` hands each slide to a worker
process that makes its store (converted, or its sidecar) and its tissue mask
(`tilestore.embed.inputs.prepare`); the GPU waits for it on the first slide. This times that
function in a fresh process per run, each from scratch (the store or sidecar removed), and
prints its wall and its own account ("store", "tissue"), for the tree on sys.path: run it
under two trees' PYTHONPATH to compare them on one machine.

    python bench/prepare.py bench/data/large-100000.svs --modes convert,in-place --runs 2
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

ONE = """
import json, sys, time
from pathlib import Path
from tilestore.embed.inputs import prepare
slide, mode, out = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
started = time.perf_counter()
into, sidecars = (out, None) if mode == "convert" else (None, out)
made = prepare(slide, into, "otsu", True, sidecars)
seconds = made[2] if len(made) > 2 else None  # trees before the stager said its steps
print(json.dumps({"wall_s": round(time.perf_counter() - started, 3), "steps": seconds,
                  "tissue": (made[1] or {}).get("tissue")}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("slide", type=Path)
    parser.add_argument("--modes", default="convert,in-place")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--work", type=Path, default=Path("/tmp/prepare-bench"))
    parser.add_argument("--label", default="")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rows = []
    for run in range(args.runs):
        for mode in args.modes.split(","):
            shutil.rmtree(args.work, ignore_errors=True)
            args.work.mkdir(parents=True)
            started = time.perf_counter()
            proc = subprocess.run(
                [sys.executable, "-c", ONE, str(args.slide.resolve()), mode, str(args.work)],
                capture_output=True,
                text=True,
                check=True,
                cwd="/",  # the tree on PYTHONPATH, not one in the folder it is run from
            )
            row = {"label": args.label, "mode": mode, "run": run, **json.loads(proc.stdout)}
            row["process_s"] = round(time.perf_counter() - started, 3)
            rows.append(row)
            print(
                f"{args.label:>8} {mode:>9} run {run}: prepare {row['wall_s']:6.2f} s "
                f"(process {row['process_s']:.2f} s) steps {row['steps']}",
                flush=True,
            )
    shutil.rmtree(args.work, ignore_errors=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
