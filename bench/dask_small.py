"""Many small slides on Dask workers (issue 68): one slice a task against several small
slides' slices a task (`tilestore.embed.settings.TASK_TILES`), on one local cluster.

`--stores` hard-linked copies of CMU-1-Small-Region's store (45 tiles each, the plan
"bench"), embedded by `embed_cohort` on a `LocalCluster` of `--workers` worker processes
(one thread each) with `--model` (timm's smallest ViT by default: the per-task set-up shows
against a model that costs little), each way `--repeats` times, alternating; every run
writes the embeddings again (overwrite). Prints one line a run and writes JSON.

    python bench/dask_small.py --stores 40 --workers 1
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from distributed import Client, LocalCluster
from small_slides import SMALL, linked_copies, planned

import tilestore
import tilestore.embed.cohort as cohort
from tilestore.embed import Options, embed_cohort

HERE = Path(__file__).parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--stores", type=int, default=40)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--model", default="random:test_vit")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--work", type=Path, default=Path("/tmp/dask_small"))
    parser.add_argument("--out", type=Path, default=HERE / "results" / "dask_small.json")
    args = parser.parse_args()
    base = args.work / "base.ome.zarr"
    if not base.exists():
        args.work.mkdir(parents=True, exist_ok=True)
        tilestore.convert(SMALL, base)
    stores = linked_copies(planned(base), args.work / "s", args.stores, "s")
    options = Options(device="cpu", batch_size=64, overwrite=True)
    grouped = cohort.TASK_TILES
    runs = []
    with (
        LocalCluster(
            n_workers=args.workers, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster,
        Client(cluster) as client,
    ):
        embed_cohort(stores[:2], args.model, client, plan="bench", options=options)  # warm
        for repeat in range(args.repeats):
            for way, task_tiles in (("a slice a task", 0), ("small slices together", grouped)):
                cohort.TASK_TILES = task_tiles
                started = time.perf_counter()
                report = embed_cohort(stores, args.model, client, plan="bench", options=options)
                wall = time.perf_counter() - started
                tasks = len(report.timeline)
                run = {
                    "way": way,
                    "repeat": repeat,
                    "stores": len(stores),
                    "tiles": report.tiles,
                    "tasks": tasks,
                    "wall_s": round(wall, 2),
                    "tiles_per_s": round(report.tiles / wall, 1),
                    "failures": len(report.failures),
                }
                runs.append(run)
                print(
                    f"| {way} | {run['stores']} | {run['tiles']:,} | {tasks} | {run['wall_s']} "
                    f"| {run['tiles_per_s']:,.0f} |",
                    flush=True,
                )
    cohort.TASK_TILES = grouped
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"model": args.model, "workers": args.workers, "runs": runs}))


if __name__ == "__main__":
    main()
