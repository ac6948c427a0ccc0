"""How long a finished `tilestore embed` keeps its process (GPU machine): Python's teardown
against the CLI's `os._exit` (tilestore.cli.main._leave).

Each run is a fresh process that calls `tilestore.cli.main` for `embed STORE --model MODEL
--overwrite` and writes the time the command returned; the process wall is taken from outside.
"teardown" stops `_leave` from ending the process (as before it), "os._exit" is the CLI as shipped.

    python bench/exit.py STORE --model random:vit_base_patch16_224 --reps 3
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CHILD = """
import sys, time
import tilestore.cli.main
if sys.argv[1] == "teardown":  # the process as it ended before: through sys.exit
    def _leave(code):
        sys.stderr.write(f"RETURNED {time.time()}\\n")
        sys.exit(code)
    tilestore.cli.main._leave = _leave
else:
    import os
    _exit = os._exit
    def _marked(code):
        sys.stderr.write(f"RETURNED {time.time()}\\n"); sys.stderr.flush()
        _exit(code)
    os._exit = _marked
sys.argv = ["tilestore", *sys.argv[2:]]
tilestore.cli.main.main()
"""


def one(mode: str, store: str, model: str) -> dict:
    env = {**os.environ}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # as a pip-installed environment runs
    started = time.time()
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, mode, "embed", store, "--model", model, "--overwrite"],
        capture_output=True,
        text=True,
        env=env,
        cwd=HERE.parent,
    )
    ended = time.time()
    if proc.returncode:
        raise SystemExit(f"embed failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    returned = [float(x.split()[1]) for x in proc.stderr.splitlines() if x.startswith("RETURNED ")]
    after = round(ended - returned[0], 2)
    return {"mode": mode, "wall s": round(ended - started, 2), "after s": after}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("store")
    parser.add_argument("--model", default="random:vit_base_patch16_224")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "exit.json")
    args = parser.parse_args()
    rows = []
    for _ in range(args.reps):
        for mode in ("teardown", "os._exit"):
            rows.append(one(mode, args.store, args.model))
            print(json.dumps(rows[-1]), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=2))
    print("\n| process end | wall s | after the command returned s |\n|---|---|---|")
    for mode in ("teardown", "os._exit"):
        mine = [r for r in rows if r["mode"] == mode]
        walls = " / ".join(str(r["wall s"]) for r in mine)
        after = " / ".join(str(r["after s"]) for r in mine)
        print(f"| {mode} | {walls} | {after} |")


if __name__ == "__main__":
    main()
