"""Learning at scale: K-fold ABMIL on synthetic tile features held in memory (the issue's
1,000 slides x 10,000 tiles x 1,024 features in bf16 by default), timed whole: the bags
made on the device once, then `tilestore.learn.crossval` (every fold's training with early
stopping, its test predictions, the metrics and the run folder). Peak GPU and host memory
reported. No zarr: the features are drawn on the device (`Bags.from_arrays`), a slide at a
time, from a seeded generator; a positive slide has 5% of its tiles shifted along a few
feature dimensions, so the folds' AUROC says the model learned.

    python bench/learn_scale.py                         # the issue's size, on the GPU
    python bench/learn_scale.py --slides 60 --tiles 200 --dim 64 --device cpu --epochs 3

prints a table and writes bench/results/learn_scale.json (or --json PATH).
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


class Synthetic:
    """Slide i's features (tiles, dim), drawn on the device from seed + i when asked."""

    def __init__(self, slides: int, tiles: int, dim: int, device: str, seed: int) -> None:
        self.slides, self.tiles, self.dim, self.device, self.seed = slides, tiles, dim, device, seed
        self.labels = np.arange(slides) % 2

    def __len__(self) -> int:
        return self.slides

    def __getitem__(self, i: int):
        import torch

        g = torch.Generator(device=self.device).manual_seed(self.seed + i)
        x = torch.randn((self.tiles, self.dim), generator=g, device=self.device)
        if self.labels[i]:
            planted = max(1, self.tiles // 20)
            x[:planted, :8] += 1.5
        return x


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--slides", type=int, default=1000)
    parser.add_argument("--tiles", type=int, default=10_000)
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--patience", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--model", default="abmil")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--device", default=None)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", type=Path, default=HERE / "results" / "learn_scale.json")
    args = parser.parse_args()

    import torch

    from tilestore.learn.bags import Bags
    from tilestore.learn.cohort import Cohort
    from tilestore.learn.options import LearnOptions, resolve_device
    from tilestore.learn.run import crossval
    from tilestore.learn.splits import make_splits
    from tilestore.learn.task import Task

    device = resolve_device(args.device)
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    data = Synthetic(args.slides, args.tiles, args.dim, device, seed=0)
    patients = tuple(f"S{i:05d}" for i in range(args.slides))
    cohort = Cohort.from_labels(
        Task("classification", ("label",), (("0", "1"),)), patients, data.labels[:, None]
    )
    started = time.perf_counter()
    bags = Bags.from_arrays(
        data, [[i] for i in range(args.slides)], names=patients, device=device, dtype=args.dtype
    )
    if cuda:
        torch.cuda.synchronize()
    made = time.perf_counter() - started
    options = LearnOptions(
        model=args.model,
        epochs=args.epochs,
        patience=args.patience,
        batch_size=args.batch_size,
        lr=1e-3,
        device=device,
        dtype=args.dtype,
        threads=args.threads,
    )
    lines: list[str] = []
    with tempfile.TemporaryDirectory() as folder:
        started = time.perf_counter()
        result = crossval(
            cohort,
            make_splits(cohort, args.folds, seed=0),
            options,
            Path(folder) / "run",
            bags=bags,
            progress=lines.append,
        )
        if cuda:
            torch.cuda.synchronize()
        wall = time.perf_counter() - started
        epochs = [
            json.loads((Path(folder) / "run" / f"fold_{k}" / "fold.json").read_text())["epochs"]
            for k in range(args.folds)
        ]
    auroc = result.metrics.get("auroc")
    found = {
        "slides": args.slides,
        "tiles": args.tiles,
        "dim": args.dim,
        "dtype": args.dtype,
        "folds": args.folds,
        "model": args.model,
        "batch_size": args.batch_size,
        "epochs_run": epochs,
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "bags_s": made,
        "crossval_s": wall,
        "total_s": made + wall,
        "features_gib": args.slides * args.tiles * args.dim * bags.features.element_size() / 2**30,
        "peak_gpu_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
        "peak_host_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "auroc": None if auroc is None else [auroc.value, auroc.low, auroc.high],
        "host": platform.node(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
    }
    rows = [
        ("cohort", f"{args.slides:,} slides x {args.tiles:,} tiles x {args.dim:,} ({args.dtype})"),
        ("features on the device", f"{found['features_gib']:.2f} GiB, made in {made:.1f} s"),
        (f"{args.folds}-fold {args.model}", f"{wall:.1f} s (epochs per fold: {epochs})"),
        (
            "pooled AUROC",
            "n/a" if auroc is None else f"{auroc.value:.3f} [{auroc.low:.3f}, {auroc.high:.3f}]",
        ),
        ("peak GPU memory", "n/a" if not cuda else f"{found['peak_gpu_gib']:.2f} GiB"),
        ("peak host memory (RSS)", f"{found['peak_host_gib']:.2f} GiB"),
        ("device", found["device"]),
    ]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(found, indent=1))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
