"""What tying chunks to their positions costs: region reads, and recording them at conversion.

Two stores: the large SVS of real tissue (`make_slide.py`: Aperio's 240 px JPEG tiles,
copied; `--size` px) and a lossless one (`convert(codec="zstd")` of a `--zstd-size` px
slide, read through zarr, each chunk first read and tied by us), converted afresh. Each is
read as converted ("tied": each chunk's last 4 bytes compared with the CRC-32C recorded for
its position, `tilestore.format.positions`) and as a copy without its positions and their
attribute ("untied": a store made before them, read as it was):
  reads   - random 256 px level-0 regions through `Slide.read_region`, one thread, both
            stores open in one process and read in turn (`--rounds` batches of `--reads`,
            the order swapped each round): regions per second of the process's CPU time
            (steadier than the wall clock on a shared machine) and of wall time;
  fetch   - `ChunkReader.fetch` of 4 chunks (a region's, no decoding): microseconds a call,
            what the check itself adds;
  old     - (`--old DIR`, a tree of the code before, e.g. `git archive <commit>`) each
            store read by this code and the untied one by the code before, each in a child
            process, in turn, the order rotated each round;
  record  - the seconds the conversion spent recording positions: `crcs_of` (the copy path,
            from what it packs), `read_back` (the block path: shard indexes, 4 bytes a
            chunk), `record` (writing them), against the conversion's.

    python bench/positions.py --size 40000 --rounds 20 --old /tmp/oldtree
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from make_slide import make_large_svs

import tilestore
from tilestore.format import positions

HERE = Path(__file__).resolve().parent

READS = """
import json, sys, time
import numpy as np
import tilestore
assert tilestore.__file__.startswith(sys.argv[1]), tilestore.__file__
store, n, seed = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
slide = tilestore.open_slide(store)
_, height, width = slide.shape
rng = np.random.default_rng(seed)
xs, ys = rng.integers(0, width - 256, n + 20), rng.integers(0, height - 256, n + 20)
for x, y in zip(xs[:20], ys[:20]):
    slide.read_region(int(x), int(y), 256, 256, level=0)
wall, cpu = time.perf_counter(), time.process_time()
for x, y in zip(xs[20:], ys[20:]):
    slide.read_region(int(x), int(y), 256, 256, level=0)
print(json.dumps([n / (time.perf_counter() - wall), n / (time.process_time() - cpu)]))
"""


def untied_copy(store: Path, to: Path) -> Path:
    """`store` as one made before positions: their arrays and attribute removed."""
    if not to.exists():
        shutil.copytree(store, to)
        for folder in to.rglob(positions.GROUP):
            shutil.rmtree(folder)
        meta = to / "zarr.json"
        doc = json.loads(meta.read_text())
        doc["attributes"]["tilestore"]["integrity"].pop("positions", None)
        meta.write_text(json.dumps(doc))
    return to


def reads(code: Path, store: Path, n: int, seed: int) -> list[float]:
    """[regions/s of wall time, of CPU time] of the code at `code` reading `store`, in a
    child process (each arm alike: a fresh reader, its own caches)."""
    env = {**os.environ, "PYTHONPATH": str(code)}
    run = subprocess.run(
        [sys.executable, "-c", READS, str(code), str(store), str(n), str(seed)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
        cwd=tempfile.gettempdir(),  # not this checkout, which `-c` would put first on sys.path
    )
    return json.loads(run.stdout)


def in_turn(stores: dict[str, Path], rounds: int, n: int) -> dict[str, list[list[float]]]:
    """Per arm, [regions/s of wall time, of CPU time] of each round, both stores open in
    this process and read in turn, the same regions, the order swapped each round."""
    slides = {arm: tilestore.open_slide(store) for arm, store in stores.items()}
    _, height, width = next(iter(slides.values())).shape
    rng = np.random.default_rng(0)
    out: dict[str, list[list[float]]] = {arm: [] for arm in slides}
    for round_ in range(rounds):
        xs, ys = rng.integers(0, width - 256, n + 10), rng.integers(0, height - 256, n + 10)
        order = list(slides) if round_ % 2 else list(slides)[::-1]
        for arm in order:
            slide = slides[arm]
            for x, y in zip(xs[:10].tolist(), ys[:10].tolist(), strict=True):
                slide.read_region(x, y, 256, 256, level=0)
            wall, cpu = time.perf_counter(), time.process_time()
            for x, y in zip(xs[10:].tolist(), ys[10:].tolist(), strict=True):
                slide.read_region(x, y, 256, 256, level=0)
            out[arm].append([n / (time.perf_counter() - wall), n / (time.process_time() - cpu)])
    return out


def fetch_us(stores: dict[str, Path], rounds: int, calls: int = 2000) -> dict[str, list[float]]:
    """Per arm, microseconds (CPU) of `ChunkReader.fetch` of 4 chunks of level 0 (a 2 x 2
    block, as a region reads them), no decoding, in turn each round."""
    readers = {arm: tilestore.open_slide(store).chunks(0) for arm, store in stores.items()}
    rows, cols = next(iter(readers.values())).grid
    rng = np.random.default_rng(1)
    out: dict[str, list[float]] = {arm: [] for arm in readers}
    for round_ in range(rounds):
        tops = zip(
            rng.integers(0, rows - 1, calls).tolist(),
            rng.integers(0, cols - 1, calls).tolist(),
            strict=True,
        )
        blocks = [[(r, c), (r, c + 1), (r + 1, c), (r + 1, c + 1)] for r, c in tops]
        order = list(readers) if round_ % 2 else list(readers)[::-1]
        for arm in order:
            reader = readers[arm]
            started = time.process_time()
            for block in blocks:
                reader.fetch(block)
            out[arm].append((time.process_time() - started) / calls * 1e6)
    return out


def converted(source: Path, out: Path, codec: str) -> tuple[object, float, dict[str, float]]:
    """Convert `source` afresh; return its report, the conversion's seconds, and the seconds
    spent in each of `positions`' writing functions during it (summed over the threads)."""
    spent = {"crcs_of": 0.0, "read_back": 0.0, "record": 0.0}
    originals = {name: getattr(positions, name) for name in spent}

    def timed(name):
        def run(*args, **kwargs):
            started = time.perf_counter()
            try:
                return originals[name](*args, **kwargs)
            finally:
                spent[name] += time.perf_counter() - started

        return run

    shutil.rmtree(out, ignore_errors=True)
    for name in spent:  # the writers call them through the module
        setattr(positions, name, timed(name))
    try:
        started = time.perf_counter()
        report = tilestore.convert(source, out, codec=codec)
        seconds = time.perf_counter() - started
    finally:
        for name, function in originals.items():
            setattr(positions, name, function)
    return report, seconds, spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, default=40_000)
    parser.add_argument("--zstd-size", type=int, default=12_000)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--reads", type=int, default=300)
    parser.add_argument("--old", type=Path, default=None)
    parser.add_argument("--old-rounds", type=int, default=6)
    parser.add_argument("--work", type=Path, default=HERE / "data")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "positions.json")
    args = parser.parse_args()
    made = {}
    for name, size, codec in (("jpeg", args.size, "auto"), ("zstd", args.zstd_size, "zstd")):
        source = make_large_svs(args.work / f"large-{size}.svs", size)
        out = args.work / f"positions-{name}"
        report, seconds, spent = converted(source, out, codec)
        store = report.store
        made[name] = {
            "levels": [f"{lv.path}: {lv.write}" for lv in report.levels],
            "convert_s": seconds,
            "positions_s": spent,
            "stores": {"tied": store, "untied": untied_copy(store, out / "untied.zarr")},
        }
    turns = {
        name: in_turn(found["stores"], args.rounds, args.reads) for name, found in made.items()
    }
    fetches = {name: fetch_us(found["stores"], args.rounds) for name, found in made.items()}
    olds: dict[str, dict[str, list]] = {}
    if args.old is not None:
        here = Path(tilestore.__file__).parents[1]
        arms = {
            "tied": (here, "tied"),
            "untied": (here, "untied"),
            "old code": (args.old, "untied"),
        }
        for name, found in made.items():
            olds[name] = {arm: [] for arm in arms}
            for seed in range(args.old_rounds):
                order = list(arms)[seed % 3 :] + list(arms)[: seed % 3]
                for arm in order:
                    code, which = arms[arm]
                    olds[name][arm].append(reads(code, found["stores"][which], args.reads, seed))
    result = {
        "machine": f"{platform.node()} {os.cpu_count()} CPUs",
        "date": time.strftime("%Y-%m-%d"),
        "stores": {
            name: f"{size} px" for name, size in (("jpeg", args.size), ("zstd", args.zstd_size))
        },
        "in_turn": turns,
        "fetch_us": fetches,
        "old_code": olds,
        "convert_s": {name: found["convert_s"] for name, found in made.items()},
        "positions_s": {name: found["positions_s"] for name, found in made.items()},
    }
    print(f"{result['machine']}; {args.rounds} rounds of {args.reads} 256 px regions, in turn")
    print(
        "| store | arm | regions/s CPU, median (range) | wall, median | fetch of 4 chunks, us CPU |"
    )
    print("|---|---|---|---|---|")
    for name, by_arm in turns.items():
        for arm, values in by_arm.items():
            walls, cpus = [w for w, _ in values], [c for _, c in values]
            print(
                f"| {name} | {arm} | {statistics.median(cpus):.0f} "
                f"({min(cpus):.0f}-{max(cpus):.0f}) | {statistics.median(walls):.0f} | "
                f"{statistics.median(fetches[name][arm]):.1f} |"
            )
        paired = [t[1] / u[1] for t, u in zip(by_arm["tied"], by_arm["untied"], strict=True)]
        lo, hi = min(paired), max(paired)
        print(
            f"| {name} | tied / untied, each round (same regions) | "
            f"{statistics.median(paired):.3f} ({lo:.3f}-{hi:.3f}) | | |"
        )
    if olds:
        print(f"\neach in a child process, {args.old_rounds} rounds, the order rotated:")
        print("| store | arm | regions/s CPU, median (range) | wall, median |\n|---|---|---|---|")
        for name, by_arm in olds.items():
            for arm, values in by_arm.items():
                walls, cpus = [w for w, _ in values], [c for _, c in values]
                print(
                    f"| {name} | {arm} | {statistics.median(cpus):.0f} "
                    f"({min(cpus):.0f}-{max(cpus):.0f}) | {statistics.median(walls):.0f} |"
                )
    print("\nrecording positions during the conversion (seconds, summed over its threads):")
    print("| store | levels | convert s | crcs_of (copy path) | read_back (block path) | record |")
    print("|---|---|---|---|---|---|")
    for name, found in made.items():
        spent = found["positions_s"]
        print(
            f"| {name} | {', '.join(found['levels'])} | {found['convert_s']:.2f} | "
            f"{spent['crcs_of']:.3f} | "
            f"{spent['read_back']:.3f} | {spent['record']:.3f} |"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
