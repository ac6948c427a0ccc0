"""The engine of two source trees on one machine, run in turn: did a change move the speed?

Each run is a fresh process importing `embed` and `tilestore` from one tree: it loads the
model (timm random weights cost what the real ones cost), embeds the benchmark store once
untimed (compilation, CUDA set-up, page cache) and once timed, and reports tiles/s from
`embed()` to the last write, as bench/embed_engine.py's engine arm does. The trees
alternate (base, this, base, this...), so drift of the GPU's clock or the disk affects
both alike.

    git worktree add /tmp/base <commit>
    python bench/compare.py --base /tmp/base --model vit_base_patch16_224 --reps 3

A tree is put first on the child's PYTHONPATH as it is: a tree of today's layout (embed/ and
cli/ beside tilestore/) must be laid out as it installs first (`bench/device.sh` makes
/tmp/this; pass it as --this), one from before issue 32 runs from its source.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from stores import build

HERE = Path(__file__).resolve().parent

# Runs inside the tree under test; written for the public API of both old and new trees.
CHILD = """
import json, sys, time
import torch
try:  # one import name, tilestore (issue 32)
    from tilestore.embed import Embedder, Options, load_model
except ImportError:  # trees before it: embed was a top-level package
    from embed import Embedder, Options, load_model

store, arch, batch, decode, compiled = sys.argv[1:6]
loaded = load_model(f"random:{arch}")
batch = None if batch == "auto" else int(batch)
options = Options(batch_size=batch, decode=decode, compile=compiled == "1", overwrite=True)
t0 = time.perf_counter()
with Embedder(loaded, options) as embedder:
    setup = time.perf_counter() - t0
    embedder.embed([store], plan="bench")  # untimed: compiles, warms caches
    report = embedder.embed([store], plan="bench")
print(json.dumps({
    "tiles": report.tiles,
    "tiles_per_s": report.tiles / report.wall_s,
    "wall_s": report.wall_s,
    "setup_s": setup,
    "batch_size": report.batch_size,
    "first_batch_s": report.first_batch_s,
    "waiting_s": report.explained.get("waiting for tiles (read/decode bound)"),
    "gpu_util_mean": report.gpu_util_mean,
    "failures": report.failures,
}))
"""


def run(
    tree: Path,
    trees: dict[str, Path],
    store: Path,
    arch: str,
    batch: str,
    decode: str,
    compiled: bool,
) -> dict:
    """One measured run of the engine from `tree`, in a fresh process that sees no other."""
    others = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    hidden = {HERE.parent, *trees.values()}
    others = [p for p in others if Path(p).resolve() not in hidden]
    # each tree compiles into its own caches: neither loads graphs the other compiled
    caches = Path(os.environ.get("TMPDIR", "/tmp")) / "compare-caches" / tree.name
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tree), *others]),
        "TILESTORE_CACHE": str(caches / "tilestore"),
        "TORCHINDUCTOR_CACHE_DIR": str(caches / "inductor"),
    }
    args = [str(store), arch, str(batch), decode, "1" if compiled else "0"]
    done = subprocess.run(
        [sys.executable, "-c", CHILD, *args],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode:
        raise RuntimeError(f"{tree}: run failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if result.get("failures"):  # a tree that cannot embed the store measures nothing
        raise RuntimeError(f"{tree}: {result['failures']}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", type=Path, required=True, help="the other source tree")
    parser.add_argument(
        "--this", type=Path, default=HERE.parent, help="this tree, as it imports (device.sh)"
    )
    parser.add_argument("--model", default="vit_base_patch16_224")
    parser.add_argument("--batch", default="512", help="tiles per batch, or auto")
    parser.add_argument("--decode", default="cpu", choices=("cpu", "gpu"))
    parser.add_argument("--eager", action="store_true", help="do not compile the model")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--size", type=int, default=40_000)
    parser.add_argument("--work", type=Path, default=HERE / "data")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "compare.json")
    args = parser.parse_args()

    _, store, ycbcrs = build(args.work, args.size, (1024,) if args.decode == "gpu" else ())
    target = ycbcrs[0] if args.decode == "gpu" else store
    trees = {"base": args.base.resolve(), "this": args.this.resolve()}
    runs: dict[str, list[dict]] = {name: [] for name in trees}
    for rep in range(args.reps):
        for name, tree in trees.items():
            t0 = time.perf_counter()
            result = run(tree, trees, target, args.model, args.batch, args.decode, not args.eager)
            runs[name].append(result)
            print(
                f"rep {rep + 1} {name}: {result['tiles_per_s']:,.0f} tiles/s, batch "
                f"{result['batch_size']}, first batch {result['first_batch_s']} s, set-up "
                f"{result['setup_s']:.1f} s "
                f"({time.perf_counter() - t0:.0f} s in all)",
                flush=True,
            )
    medians = {name: statistics.median(r["tiles_per_s"] for r in rs) for name, rs in runs.items()}
    print(f"\n{args.model}, batch {args.batch}, decode {args.decode}")
    print("| tree | tiles/s, each run | median | set-up s, each run |")
    print("|---|---|---|---|")
    for name, rs in runs.items():
        each = ", ".join(f"{r['tiles_per_s']:,.0f}" for r in rs)
        setups = ", ".join(f"{r['setup_s']:.2f}" for r in rs)
        print(f"| {name} ({trees[name]}) | {each} | {medians[name]:,.0f} | {setups} |")
    print(f"\nthis / base (medians): {medians['this'] / medians['base']:.3f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "model": args.model,
                "batch": args.batch,
                "decode": args.decode,
                "compiled": not args.eager,
                "trees": {k: str(v) for k, v in trees.items()},
                "runs": runs,
                "medians": medians,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
