"""Learning at scale from the stores: K-fold ABMIL on a cohort whose features are READ FROM
ITS STORES once (`build_cohort`, then `tilestore.learn.crossval`, which reads them onto the
device with `load_bags`), and the same cohort streamed from the stores where the device is
given too little room (`load_bags(memory=...)`: each batch read from the stores as asked).

The cohort is written first, not timed: one real store (CMU-1-Small-Region, converted by
`tilestore convert`'s library call), planned once with a small stride so it holds about
10,000 tiles of 224 px, copied `--slides` times, and each copy's tile features written by the
embedder's own writer (`EmbeddingWriter`: its shards, checksums and record, float16) from a
seeded generator: a positive slide has 5% of its tiles shifted by 1.5 along 8 dimensions,
as bench/learn_scale.py draws them. Peak GPU and host memory reported.

    python bench/learn_stores.py --device cuda               # 1,000 stores x ~10,000 x 1,024
    python bench/learn_stores.py --slides 12 --stride 112 --dim 32 --device cpu --epochs 2

prints a table and writes bench/results/learn_stores.json (or --json PATH).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import resource
import shutil
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
DATA = Path(os.environ.get("TILESTORE_DATA", HERE.parents[1] / "shared" / "data"))
MODEL = "synthetic-1024"


def _template(folder: Path, stride: int) -> Path:
    """The real store, converted and planned once."""
    from tilestore.conversion.converter import convert
    from tilestore.plan import PlanOptions, plan_over_tissue, save_plan
    from tilestore.reading.opening import open_slide

    store = convert(DATA / "slides" / "CMU-1-Small-Region.svs", folder / "template").store
    slide = open_slide(store)
    plan = plan_over_tissue(slide, PlanOptions(mpp=0.5, tile=224, stride=stride, min_tissue=0))
    save_plan(slide, plan)
    return store


def _write(job: tuple[Path, Path, int, int, int]) -> int:
    """One store: a copy of the template, its features written by the embedder's writer."""
    from tilestore.embeddings import EmbeddingWriter, RunIdentity
    from tilestore.plan import load_plan
    from tilestore.reading.opening import open_slide

    template, store, index, dim, seed = job
    shutil.copytree(template, store)
    slide = open_slide(store)
    plan, uid = load_plan(slide)
    model = {"name": MODEL, "output_dim": dim, "weights": f"seeded draw {seed}"}
    writer = EmbeddingWriter(slide, plan, uid, RunIdentity(model, 1024, "float16", "fp16", False))
    rng = np.random.default_rng(seed + index)
    positive = index % 2
    planted = max(1, len(plan) // 20)
    for block in writer.todo():
        start = int(block) * 1024
        rows = min(1024, len(plan) - start)
        x = rng.standard_normal((rows, dim), dtype=np.float32)
        if positive and start < planted:
            x[: planted - start, :8] += 1.5
        writer.write(int(block), x.astype(np.float16))
    writer.finish({})
    return len(plan)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--slides", type=int, default=1000)
    parser.add_argument("--stride", type=int, default=23, help="plan stride, px at 0.5 um/px")
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--patience", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--device", default=None)
    parser.add_argument("--stream-gib", type=float, default=4.0,
                        help="the room given to the streamed run (GiB)")  # fmt: skip
    parser.add_argument("--stream-epochs", type=int, default=1)
    parser.add_argument("--workers", type=int, default=min(16, os.cpu_count() or 1))
    parser.add_argument("--work", type=Path, default=Path("/tmp/learn_stores"))
    parser.add_argument("--json", type=Path, default=HERE / "results" / "learn_stores.json")
    args = parser.parse_args()

    import pandas as pd
    import torch

    from tilestore.learn import LearnOptions, build_cohort, crossval, make_splits
    from tilestore.learn.bags import load_bags
    from tilestore.learn.options import resolve_device

    device = resolve_device(args.device)
    cuda = device.startswith("cuda")
    shutil.rmtree(args.work, ignore_errors=True)
    (args.work / "stores").mkdir(parents=True)
    started = time.perf_counter()
    template = _template(args.work, args.stride)
    stores = [args.work / "stores" / f"S{i:05d}.ome.zarr" for i in range(args.slides)]
    jobs = [(template, s, i, args.dim, 0) for i, s in enumerate(stores)]
    with multiprocessing.get_context("spawn").Pool(args.workers) as pool:
        counts = pool.map(_write, jobs, chunksize=4)
    written = time.perf_counter() - started
    size = sum(f.stat().st_size for f in (args.work / "stores").rglob("*") if f.is_file())
    table = args.work / "clinical.csv"
    pd.DataFrame(
        {"PATIENT": [f"S{i:05d}" for i in range(args.slides)],
         "label": [str(i % 2) for i in range(args.slides)]}
    ).to_csv(table, index=False)  # fmt: skip
    options = LearnOptions(
        device=device, dtype=args.dtype, epochs=args.epochs, patience=args.patience,
        batch_size=args.batch_size, lr=args.lr,
    )  # fmt: skip

    if cuda:
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    cohort = build_cohort(table, [str(s) for s in stores], MODEL, targets="label")
    built = time.perf_counter() - started
    result = crossval(
        cohort, make_splits(cohort, args.folds, seed=0), options, args.work / "run",
        progress=lambda line: print(f"  {line}", file=sys.stderr, flush=True)
        if "fold" not in line or "epoch" not in line else None,
    )  # fmt: skip
    if cuda:
        torch.cuda.synchronize()
    wall = time.perf_counter() - started
    peak_gpu = torch.cuda.max_memory_allocated() / 2**30 if cuda else None
    peak_host = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20

    # streamed: the same cohort given too little room, one fold trained
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    bags = load_bags(cohort, device=device, dtype=args.dtype, memory=int(args.stream_gib * 2**30))
    one = make_splits(cohort, args.folds, seed=0)
    one = type(one)(one.folds[:1], one.seed, one.test)
    streamed = crossval(
        cohort, one, LearnOptions(**{**options.to_json(), "epochs": args.stream_epochs}),
        args.work / "streamed", bags=bags,
    )  # fmt: skip
    if cuda:
        torch.cuda.synchronize()
    stream_wall = time.perf_counter() - started
    stream_gpu = torch.cuda.max_memory_allocated() / 2**30 if cuda else None

    auroc = result.metrics["auroc"]
    rows = [
        ("cohort", f"{args.slides} stores x {counts[0]} tiles x {args.dim} (float16 stored), "
                   f"{args.folds} folds"),
        ("stores written (not timed below)", f"{written:.0f} s, {size / 2**30:.1f} GiB"),
        ("build_cohort (open, check, combine)", f"{built:.1f} s"),
        ("crossval: read from the stores once + every fold", f"{wall:.1f} s"),
        ("pooled AUROC", f"{auroc.value:.3f} [{auroc.low:.3f}, {auroc.high:.3f}]"),
        ("peak GPU memory", f"{peak_gpu:.2f} GiB" if peak_gpu is not None else "n/a"),
        ("peak host memory (RSS)", f"{peak_host:.2f} GiB"),
        (f"streamed (room {args.stream_gib:g} GiB): bags.streamed", str(bags.streamed)),
        (f"streamed: 1 fold, {args.stream_epochs} epoch(s), wall", f"{stream_wall:.1f} s"),
        ("streamed: peak GPU memory",
         f"{stream_gpu:.2f} GiB" if stream_gpu is not None else "n/a"),
        ("streamed: fold AUROC", f"{streamed.metrics['auroc'].value:.3f}"),
    ]  # fmt: skip
    width = max(len(r[0]) for r in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(
        json.dumps(
            {
                "args": {k: str(v) for k, v in vars(args).items()},
                "tiles_per_store": counts[0],
                "written_s": written,
                "stored_gib": size / 2**30,
                "build_cohort_s": built,
                "crossval_s": wall,
                "auroc": [auroc.value, auroc.low, auroc.high],
                "peak_gpu_gib": peak_gpu,
                "peak_host_gib": peak_host,
                "streamed": bags.streamed,
                "stream_s": stream_wall,
                "stream_peak_gpu_gib": stream_gpu,
                "device": torch.cuda.get_device_name(0) if cuda else "cpu",
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
