"""What knowing stored state by its content costs (issue 69): each check the docs cite, timed
on this machine, with the work it sits beside.

- a slide's SHA-256 (what `embed --into` compares before it reuses a store), against reading
  the same bytes;
- a sidecar's tile sums (`tilestore.reading.inplace.tile_sums`: every in-place tile's
  CRC-32C), against making the whole sidecar (`open_in_place`, which includes them);
- opening a cohort's tile features (`open_embeddings`: shard indexes and 4 bytes a chunk
  compared with the recorded positions) and writing them (`EmbeddingWriter`, positions
  recorded as each shard lands);
- a plan's identity (`plan_uid`, `plan_recipe`) against making the plan.

    python bench/identity_costs.py --size 40000 --tiles 100000

Prints a table and writes JSON (--out). Medians of --repeat runs; the machine's load is
printed with them (a loaded machine's figures are upper bounds).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from bench.make_slide import make_large_svs  # noqa: E402


def _median(call, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def _read(path: Path) -> None:
    with open(path, "rb") as file:
        while file.read(2**24):
            pass


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while block := file.read(2**24):
            digest.update(block)
    return digest.hexdigest()


def slide_costs(slide: Path, folder: Path, repeat: int) -> dict[str, float]:
    from tilestore.conversion import open_in_place
    from tilestore.reading.inplace import tile_sums
    from tilestore.sources import open_source

    _read(slide)  # into the page cache: every figure below reads it from memory
    with open_source(slide) as source:
        levels = range(len(source.levels))
        sums = _median(lambda: tile_sums(source, levels), repeat)

    def sidecar() -> None:
        target = folder / "sidecars"
        shutil.rmtree(target, ignore_errors=True)
        opened = open_in_place(slide, target)
        opened.source.close()  # the slide's file stays open with the Slide

    return {
        "slide_gb": slide.stat().st_size / 1e9,
        "read_s": _median(lambda: _read(slide), repeat),
        "sha256_s": _median(lambda: _sha256(slide), repeat),
        "tile_sums_s": sums,
        "sidecar_s": _median(sidecar, repeat),
    }


def embeddings_costs(slide_file: Path, folder: Path, tiles: int, repeat: int) -> dict:
    import zarr

    import tilestore
    from tilestore.conversion import convert
    from tilestore.embeddings import EmbeddingWriter, RunIdentity, find_group
    from tilestore.plan import PlanOptions, plan_over_tissue, plan_recipe, plan_uid, save_plan
    from tilestore.reading import open_slide

    store = convert(slide_file, folder / "stores").store
    slide = open_slide(store)
    _, h, w = slide.shape
    # the stride that gives about `tiles` tiles of 224 px at about the slide's own um/px
    stride = max(8, min(224, int(((h * w) / tiles) ** 0.5)))
    options = PlanOptions(mpp=0.5, tile=224, stride=stride, min_tissue=0.0)
    planning = _median(lambda: plan_over_tissue(slide, options), repeat)
    plan = plan_over_tissue(slide, options)
    identity_s = _median(lambda: (plan_uid(plan), plan_recipe(plan)), repeat)
    uid = save_plan(slide, plan)
    rows = np.random.default_rng(0).standard_normal((len(plan), 1024)).astype(np.float16)
    run = RunIdentity({"name": "bench", "output_dim": 1024}, 256, "float16", "bf16", False)

    def write() -> None:
        writer = EmbeddingWriter(slide, plan, uid, run, overwrite=True)
        for block in writer.todo():
            writer.write(int(block), rows[block * 256 : (block + 1) * 256])
        writer.finish({})

    writing = _median(write, repeat)
    # the same group as one made before positions: its record declares none
    untied = folder / "untied.ome.zarr"
    shutil.copytree(store, untied)
    group = zarr.open_group(untied / find_group(untied, "bench"), mode="r+")
    attrs = dict(group.attrs["tilestore"])
    attrs.pop("positions", None)
    group.attrs["tilestore"] = attrs
    return {
        "plan_tiles": len(plan),
        "plan_s": planning,
        "plan_identity_s": identity_s,
        "write_s": writing,
        "batches": -(-len(plan) // 256),
        "open_tied_s": _median(lambda: tilestore.open_embeddings(store, "bench"), repeat),
        "open_untied_s": _median(lambda: tilestore.open_embeddings(untied, "bench"), repeat),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, default=40_000, help="the slide's side, px")
    parser.add_argument("--tiles", type=int, default=100_000, help="tiles opened at once")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "identity_costs.json")
    args = parser.parse_args()
    if args.repeat < 1:
        parser.error("--repeat: at least 1")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        slide = make_large_svs(folder / "large.svs", size=args.size)
        found = {
            "load": os.getloadavg(),
            "cpus": os.cpu_count(),
            **slide_costs(slide, folder, args.repeat),
            **embeddings_costs(slide, folder, args.tiles, args.repeat),
        }
    rows = [
        ("slide read (page cache)", f"{found['read_s']:.2f} s", f"{found['slide_gb']:.2f} GB"),
        ("its SHA-256 (--into reuse)", f"{found['sha256_s']:.2f} s", "the slide read whole"),
        ("its tiles' CRC-32C (tile_sums)", f"{found['tile_sums_s']:.2f} s", "every level"),
        ("the whole sidecar (open_in_place)", f"{found['sidecar_s']:.2f} s", "sums included"),
        ("a plan made", f"{found['plan_s'] * 1e3:.1f} ms", f"{found['plan_tiles']} tiles"),
        ("its uid and recipe", f"{found['plan_identity_s'] * 1e3:.2f} ms", ""),
        (
            "EmbeddingWriter, the whole group",
            f"{found['write_s']:.2f} s",
            f"{found['batches']} batches of 256 x 1024 float16, positions recorded",
        ),
        (
            "open_embeddings, tied",
            f"{found['open_tied_s'] * 1e3:.0f} ms",
            f"{found['plan_tiles']:,} tiles, positions compared",
        ),
        (
            "open_embeddings, not tied",
            f"{found['open_untied_s'] * 1e3:.0f} ms",
            "the same group, as made before positions",
        ),
    ]
    print(f"load average {found['load'][0]:.1f} on {found['cpus']} CPUs; medians of {args.repeat}")
    for name, value, note in rows:
        print(f"{name:36s} {value:>10s}  {note}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(found, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
