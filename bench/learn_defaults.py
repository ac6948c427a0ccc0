"""Which training settings learn a weak signal: `tilestore.learn.crossval` under several
settings on the cohort `bench/learn_vs_stamp.py` gives STAMP (the same seeded features and
the same folds), each timed whole, the test AUROC of every fold printed. The defaults of
`tilestore.learn.LearnOptions` are the row this table chose.

The features go to the device once (`Bags.from_arrays`, no files), then every setting is
trained on the same bags. A setting is `key=value,...` of LearnOptions' fields.

    python bench/learn_defaults.py --device cuda
    python bench/learn_defaults.py --slides 40 --tiles 300 --dim 64 --device cpu \\
        --setting model=mean,epochs=3 --setting epochs=3,lr=1e-3

prints a table and writes bench/results/learn_defaults.json (or --json PATH).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

SETTINGS = (
    "schedule=constant,lr=1e-4,batch_size=8",  # the defaults before this table
    "schedule=constant,lr=1e-4,batch_size=1",
    "schedule=constant,lr=1e-3,batch_size=8",
    "lr=1e-4,batch_size=1",
    "lr=3e-4,batch_size=1",
    "lr=1e-3,batch_size=8",
    "lr=1e-3,batch_size=8,max_tiles=512",
    "lr=3e-4,batch_size=1,max_tiles=512",
    "lr=1e-3,batch_size=16,max_tiles=512,epochs=64,patience=16",
    "model=mean,lr=1e-3,batch_size=8",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--slides", type=int, default=200)
    parser.add_argument("--tiles", type=int, default=2000)
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--device", default=None)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--setting", action="append", default=None)
    parser.add_argument("--json", type=Path, default=HERE / "results" / "learn_defaults.json")
    args = parser.parse_args()

    import torch
    from learn_vs_stamp import cohort_features, parsed

    from tilestore.learn.bags import Bags
    from tilestore.learn.cohort import Cohort
    from tilestore.learn.options import resolve_device
    from tilestore.learn.run import crossval
    from tilestore.learn.splits import make_splits
    from tilestore.learn.task import Task

    device = resolve_device(args.device)
    features, labels = cohort_features(args.slides, args.tiles, args.dim, seed=0)
    names = tuple(f"S{i:05d}" for i in range(args.slides))
    task = Task("classification", ("label",), (("0", "1"),))
    cohort = Cohort.from_labels(task, names, labels[:, None])
    splits = make_splits(cohort, args.folds, seed=0)
    bags = Bags.from_arrays(
        features, [[i] for i in range(args.slides)], names=names, device=device, dtype=args.dtype
    )
    del features
    rows = []
    from sklearn.metrics import roc_auc_score

    for setting in args.setting or SETTINGS:
        options = parsed(setting, device, args.dtype)
        with tempfile.TemporaryDirectory() as tmp:
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            started = time.perf_counter()
            crossval(cohort, splits, options, Path(tmp) / "run", bags=bags, progress=None)
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            wall = time.perf_counter() - started
            import pandas as pd

            table = pd.read_csv(Path(tmp) / "run" / "predictions.csv")
        aurocs = [
            float(roc_auc_score(part["label"].astype(str) == "1", part["label:1"]))
            for _, part in table.groupby("fold")
        ]
        rows.append({"setting": setting, "wall_s": wall, "auroc": aurocs})
        print(
            f"{setting:<60} {wall:7.1f} s  mean {np.mean(aurocs):.3f}  "
            + " ".join(f"{a:.3f}" for a in aurocs),
            flush=True,
        )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(
        json.dumps(
            {
                "cohort": f"{args.slides} x {args.tiles} x {args.dim}, {args.folds} folds",
                "device": torch.cuda.get_device_name(0) if device.startswith("cuda") else "cpu",
                "rows": rows,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
