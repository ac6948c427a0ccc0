"""Ours against STAMP on the same features, folds and card: `tilestore.learn.crossval` and
STAMP's own `stamp crossval` (its source from github:KatherLab/STAMP, on PYTHONPATH).

One cohort of synthetic tile features (a slide a patient; a positive slide has a share of its
tiles shifted along a few feature dimensions, weakly, so the folds' AUROC is not 1), written
once as STAMP reads them: a ``<slide>.h5`` per slide in STAMP's layout by the same writer
`tilestore export h5 --layout stamp` calls (`tilestore.exports.h5`), a clinical and a slide
table, and our folds as STAMP's ``splits.json`` (so both train and test on the same
patients). Then, each timed whole (its process's start included):

- STAMP: ``python -m stamp --config <yaml> crossval`` (its defaults: batch 64 bags of 512
  tiles, 32 epochs, patience 16, the test fold as its validation set) with the model named
  (``--stamp-model vit`` its default, or ``trans_mil``);
- ours: ``tilestore.learn.crossval`` on the same files' features (read into one tensor on the
  device once, in the same process the time counts), with early stopping on an inner
  validation part of each fold's training patients (STAMP stops on the test fold itself),
  under LearnOptions' defaults or each ``--setting key=value,...`` given.

The test AUROC of every fold from each, and both walls, printed as a table and written as
JSON.

    PYTHONPATH=.stamp/src:$PYTHONPATH python bench/learn_vs_stamp.py --slides 300 \\
        --tiles 4000 --dim 1024 --device cuda
    python bench/learn_vs_stamp.py --slides 40 --tiles 300 --dim 64 --device cpu \
        --setting epochs=3 --setting model=mean,epochs=3 --skip-stamp
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def cohort_features(slides: int, tiles: int, dim: int, seed: int) -> tuple[list, np.ndarray]:
    """Each slide's features (tiles, dim) float32 and its label (half positive): a positive
    slide has 10% of its tiles shifted by 0.35 along 16 dimensions."""
    rng = np.random.default_rng(seed)
    labels = (np.arange(slides) % 2).astype(np.int64)
    rng.shuffle(labels)
    out = []
    for i in range(slides):
        x = rng.standard_normal((tiles, dim), dtype=np.float32)
        if labels[i]:
            x[: max(1, tiles // 10), :16] += 0.35
        out.append(x)
    return out, labels


def write_stamp_inputs(folder: Path, features: list, labels: np.ndarray, splits) -> None:
    """The H5 files (STAMP's layout, by our exporter's writer), the tables and splits.json."""
    import h5py
    import pandas as pd

    from tilestore.embeddings.recipe import Recipe
    from tilestore.embeddings.slides import TileFeatures
    from tilestore.exports.h5 import _stamp

    feats = folder / "features"
    feats.mkdir(parents=True, exist_ok=True)
    names = [f"S{i:05d}" for i in range(len(features))]
    for name, x in zip(names, features, strict=True):
        n = x.shape[0]
        side = int(np.ceil(np.sqrt(n)))
        row, col = np.divmod(np.arange(n), side)
        tiles = TileFeatures(
            store=name, name=name, model="synthetic", features=x,
            x=(col * 224).astype(np.int64), y=(row * 224).astype(np.int64),
            row=row.astype(np.int64), col=col.astype(np.int64),
            footprint0=(224.0, 224.0), stride0=(224.0, 224.0), mpp=0.5, tile_size=224,
            plan="synthetic", finished="", recipe=Recipe({}, None, None, None), model_info={},
            slide_mpp=(0.5, 0.5), slide_shape=(side * 224, side * 224),
        )  # fmt: skip
        with h5py.File(feats / f"{name}.h5", "w") as f:
            _stamp(f, tiles, {})
    pd.DataFrame({"PATIENT": names, "label": [str(v) for v in labels]}).to_csv(
        folder / "clini.csv", index=False
    )
    pd.DataFrame({"PATIENT": names, "FILENAME": [f"{n}.h5" for n in names]}).to_csv(
        folder / "slide.csv", index=False
    )
    stamp_out = folder / "stamp"
    stamp_out.mkdir(exist_ok=True)
    (stamp_out / "splits.json").write_text(
        json.dumps(
            {
                "splits": [
                    {"train_patients": sorted({*f.train, *f.valid}), "test_patients": list(f.test)}
                    for f in splits.folds
                ]
            },
            indent=4,
        )
    )


def run_stamp(folder: Path, args) -> tuple[float, list[float]]:
    """STAMP's crossval in its own process, timed; each split's test AUROC."""
    import pandas as pd
    import yaml
    from sklearn.metrics import roc_auc_score

    config = {
        "crossval": {
            "output_dir": str(folder / "stamp"),
            "clini_table": str(folder / "clini.csv"),
            "slide_table": str(folder / "slide.csv"),
            "feature_dir": str(folder / "features"),
            "task": "classification",
            "ground_truth_label": "label",
            "categories": ["0", "1"],
            "patient_label": "PATIENT",
            "filename_label": "FILENAME",
            "n_splits": args.folds,
        },
        "advanced_config": {
            "seed": 0,
            "max_epochs": args.stamp_epochs,
            "patience": args.stamp_patience,
            "batch_size": 64,
            "bag_size": 512,
            "num_workers": args.workers,
            "model_name": args.stamp_model,
            "model_params": {},
        },
    }
    path = folder / "stamp.yaml"
    path.write_text(yaml.safe_dump(config))
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "stamp", "--config", str(path), "crossval"],
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - started
    if done.returncode != 0:
        sys.stderr.write(done.stdout[-4000:] + done.stderr[-8000:])
        raise SystemExit(f"STAMP's crossval failed ({done.returncode})")
    aurocs = []
    for k in range(args.folds):
        preds = pd.read_csv(folder / "stamp" / f"split-{k}" / "patient-preds.csv")
        aurocs.append(float(roc_auc_score(preds["label"].astype(str) == "1", preds["label_1"])))
    return wall, aurocs


def parsed(setting: str, device: str, dtype: str):
    """LearnOptions from `key=value,...` (values typed as the field's default is; the rest
    LearnOptions' defaults)."""
    import dataclasses

    from tilestore.learn.options import LearnOptions

    fields = {f.name: f for f in dataclasses.fields(LearnOptions)}
    given: dict = {"device": device, "dtype": dtype}
    for part in filter(None, setting.split(",")):
        key, value = part.split("=", 1)
        kind = type(fields[key].default) if fields[key].default is not None else int
        given[key] = value if kind is str else (value == "true" if kind is bool else kind(value))
    return LearnOptions(**given)


def run_ours(
    folder: Path, labels: np.ndarray, splits, args, setting: str
) -> tuple[float, list[float], dict]:
    """Our crossval on the same H5 files' features, the read into the device counted."""
    import h5py
    import pandas as pd
    import torch
    from sklearn.metrics import roc_auc_score

    from tilestore.learn.bags import Bags
    from tilestore.learn.cohort import Cohort
    from tilestore.learn.run import crossval
    from tilestore.learn.task import Task

    cuda = args.device.startswith("cuda")
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    names = tuple(f"S{i:05d}" for i in range(len(labels)))
    started = time.perf_counter()

    class Files:
        def __len__(self) -> int:
            return len(names)

        def __getitem__(self, i: int) -> np.ndarray:
            with h5py.File(folder / "features" / f"{names[i]}.h5", "r") as f:
                return f["feats"][:]

    bags = Bags.from_arrays(
        Files(), [[i] for i in range(len(names))], names=names, device=args.device,
        dtype=args.dtype,
    )  # fmt: skip
    cohort = Cohort.from_labels(
        Task("classification", ("label",), (("0", "1"),)), names, labels[:, None]
    )
    options = parsed(setting, args.device, args.dtype)
    run = folder / f"ours-{len(os.listdir(folder))}"
    crossval(cohort, splits, options, run, bags=bags, overwrite=run.exists(), progress=None)
    if cuda:
        torch.cuda.synchronize()
    wall = time.perf_counter() - started
    table = pd.read_csv(run / "predictions.csv")
    aurocs = []
    for k in range(args.folds):
        part = table[table["fold"] == k]
        aurocs.append(float(roc_auc_score(part["label"].astype(str) == "1", part["label:1"])))
    memory = {
        "peak_gpu_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
    }
    return wall, aurocs, memory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--slides", type=int, default=300)
    parser.add_argument("--tiles", type=int, default=4000)
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument(
        "--setting", action="append", default=None,
        help="Ours: LearnOptions as key=value,... (repeat for several; default: its defaults)",
    )  # fmt: skip
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--stamp-model", default="vit")
    parser.add_argument("--stamp-epochs", type=int, default=32)
    parser.add_argument("--stamp-patience", type=int, default=16)
    parser.add_argument("--workers", type=int, default=min(os.cpu_count() or 1, 16))
    parser.add_argument("--work", type=Path, default=Path("/tmp/learn_vs_stamp"))
    parser.add_argument("--skip-stamp", action="store_true")
    parser.add_argument("--json", type=Path, default=HERE / "results" / "learn_vs_stamp.json")
    args = parser.parse_args()

    from tilestore.learn.cohort import Cohort
    from tilestore.learn.splits import make_splits
    from tilestore.learn.task import Task

    features, labels = cohort_features(args.slides, args.tiles, args.dim, seed=0)
    names = tuple(f"S{i:05d}" for i in range(args.slides))
    cohort = Cohort.from_labels(
        Task("classification", ("label",), (("0", "1"),)), names, labels[:, None]
    )
    splits = make_splits(cohort, args.folds, seed=0)
    args.work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    write_stamp_inputs(args.work, features, labels, splits)
    written = time.perf_counter() - started
    del features
    ours = []
    for setting in args.setting or [""]:
        wall, auroc, memory = run_ours(args.work, labels, splits, args, setting)
        ours.append({"setting": setting or "defaults", "wall_s": wall, "auroc": auroc, **memory})
    stamp_wall, stamp_auroc = (None, None) if args.skip_stamp else run_stamp(args.work, args)
    rows = [
        ("cohort", f"{args.slides} slides x {args.tiles} tiles x {args.dim}, {args.folds} folds"),
        ("H5 files written (not timed below)", f"{written:.1f} s"),
    ]
    for o in ours:
        rows += [
            (f"ours ({o['setting']}) wall", f"{o['wall_s']:.1f} s"
             + (f" = {o['wall_s'] / stamp_wall:.3f}x STAMP" if stamp_wall else "")),
            (f"ours ({o['setting']}) AUROC per fold", " ".join(f"{a:.3f}" for a in o["auroc"])),
        ]  # fmt: skip
    if stamp_wall is not None:
        rows += [
            (f"STAMP ({args.stamp_model}) wall", f"{stamp_wall:.1f} s"),
            ("STAMP AUROC per fold", " ".join(f"{a:.3f}" for a in stamp_auroc)),
        ]
    width = max(len(r[0]) for r in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(
        json.dumps(
            {
                "args": {k: str(v) for k, v in vars(args).items()},
                "ours": ours,
                "stamp_wall_s": stamp_wall,
                "stamp_auroc": stamp_auroc,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
