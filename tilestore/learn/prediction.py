"""A run's models on new stores (`predict`): the folds' ensemble (their outputs' mean) or one
fold, per slide, after the one compatibility check: a store whose features are not the
run's (another model, scale, plan or recipe; `tilestore.embeddings.recipe.combine` against
the recipe the run recorded) is refused in one line before any model runs.

>>> table = predict("runs/msi", "new/*.ome.zarr")     # slide, store, an output per column
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from tilestore.errors import RunError
from tilestore.learn.bags import Source, recipe_of
from tilestore.learn.metrics import probabilities
from tilestore.learn.options import resolve_device
from tilestore.learn.run import load_models, read_config
from tilestore.learn.task import Task


def open_run_stores(run_dir: str | Path, stores: Any) -> tuple[dict, list[Any], list[str]]:
    """The run's config, and each store's features as the run reads them (`Source.read`:
    the run's model and plan, or its slide encoder's vector), the stores checked to be of
    the run's features (`combine`); their paths. RunError where the run recorded no
    features (bags given from memory)."""
    from tilestore.embeddings.groups import expand_stores
    from tilestore.embeddings.recipe import combine

    config = read_config(run_dir)
    features = config.get("features")
    if not features:
        raise RunError(
            f"{run_dir}: trained on bags from memory: it records no store recipe "
            "to check new stores against"
        )
    paths = [str(s) for s, _ in expand_stores(stores)]
    if not paths:
        raise RunError(f"{stores}: no stores")
    source = Source(features["model"], features["plan"], features.get("slide_encoder"))
    found = [source.read(p) for p in paths]
    run = (f"the run {run_dir}", recipe_of(features))
    what = f"{features['model']!r} " + (
        f"{source.slide_encoder!r} slide vectors" if source.slide_encoder else "features"
    )
    combine([run, *[(p, f.recipe) for p, f in zip(paths, found, strict=True)]], what)
    if found and int(found[0].features.shape[1]) != int(config["dim"]):
        raise RunError(
            f"{paths[0]}: features of width {found[0].features.shape[1]}, "
            f"the run's are {config['dim']}"
        )
    return config, found, paths


def predict(
    run_dir: str | Path,
    stores: Any,
    *,
    fold: int | None = None,
    device: str | None = None,
) -> pd.DataFrame:
    """Each store's slide through the run's models (the folds' mean; one with `fold`):
    a row per slide with its store and an output per column (`tilestore.learn.run
    .output_names`: a classification head's probabilities, the folds' mean); for one
    classification target also ``predicted`` (the class)."""
    import torch

    from tilestore.embeddings.groups import slide_name

    config, found, paths = open_run_stores(run_dir, stores)
    task = Task.from_json(config["task"])
    device = resolve_device(device)
    models = load_models(run_dir, device, fold)
    dtype = next(models[0].parameters()).dtype
    rows = []
    with torch.no_grad():
        for path, group in zip(paths, found, strict=True):
            x = torch.as_tensor(np.asarray(group.features[:], np.float32))
            x = x.to(device=device, dtype=dtype).unsqueeze(0)
            out = np.mean([_outputs(task, m(x).logits) for m in models], axis=0)
            rows.append(
                {
                    "slide": slide_name(path),
                    "store": path,
                    **dict(zip(config["outputs"], map(float, out), strict=True)),
                }
            )
    table = pd.DataFrame(rows, columns=["slide", "store", *config["outputs"]])
    if task.kind == "classification" and len(task.targets) == 1 and len(table):
        table["predicted"] = np.array(task.classes[0])[
            table[config["outputs"]].to_numpy().argmax(1)
        ]
    return table


def _outputs(task: Task, logits: Any) -> np.ndarray:
    """One model's outputs for one bag as a run's tables hold them: a classification head's
    probabilities (the folds' ensemble averages probabilities, not logits), else as given."""
    values = logits.float().cpu().numpy()
    if task.kind != "classification":
        return values[0]
    return np.concatenate([probabilities(values[:, head])[0] for head in task.heads()])


def ensemble(models: Sequence[Any], method: str, x: Any) -> Any:
    """The models' mean of `method` (a bound name: "tile_scores") on x."""
    import torch

    return torch.stack([getattr(m, method)(x).detach().float() for m in models]).mean(0)
