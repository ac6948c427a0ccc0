"""Explanations inside the store (`explain`): each tile's attention (where the model has
one) and its contribution to each output (the model's `tile_scores`: attention-weighted
per-tile logits, the head applied per tile, a gradient attribution...), the folds' mean,
written beside the tile features as ``learned/<name>`` with the run's recipe
(`tilestore.embeddings.scores.write_learned_scores`, `LearnedRecord`).

`open_embeddings` then carries them as columns ``<name>:attention`` and
``<name>:<output>``; `tilestore view` lists them with the other per-tile columns and
`tilestore export heatmap --column <name>:attention` draws them. Nothing is read but the
stored features: no re-tiling.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from tilestore.errors import OptionError, RunError
from tilestore.learn.options import resolve_device
from tilestore.learn.prediction import ensemble, open_run_stores
from tilestore.learn.run import load_models


def scores_name(run_dir: str | Path, name: str | None = None) -> str:
    """The set's name: `name`, else the run folder's name; refused where it is not a plain
    group name."""
    chosen = name if name is not None else Path(run_dir).resolve().name
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", chosen or ""):
        raise OptionError(
            f"name={chosen!r}: letters, digits, '_', '.', '-' only (a group of the store)"
        )
    return chosen


def tile_scores(models: list[Any], features: np.ndarray, device: str) -> tuple[np.ndarray, bool]:
    """(tiles, columns) float32: the attention (where the models have one) then each output's
    contribution per tile, the models' mean; and whether attention is the first column."""
    import torch

    dtype = next(models[0].parameters()).dtype
    x = torch.as_tensor(np.asarray(features, np.float32)).to(device=device, dtype=dtype)[None]
    with torch.no_grad():
        attention = [m(x).attention for m in models]
    contribution = ensemble(models, "tile_scores", x)[0].detach().cpu().numpy()  # may need grads
    if any(a is None for a in attention):
        return contribution.astype(np.float32), False
    mean = torch.stack([a.float() for a in attention]).mean(0)[0].cpu().numpy()
    return np.concatenate([mean[:, None], contribution], axis=1).astype(np.float32), True


def explain(
    run_dir: str | Path,
    stores: Any,
    *,
    name: str | None = None,
    fold: int | None = None,
    device: str | None = None,
    overwrite: bool = False,
) -> list[str]:
    """Write the run's per-tile scores into each store as the set `name` (the run folder's
    name by default); return the sets' paths in the stores. The stores are checked as
    `predict` checks them. A set of that name made by this run and fold is replaced; one
    made otherwise (another run, fold, model or task) is refused in one line before any
    store is written, unless `overwrite`."""
    from tilestore.embeddings.scores import write_learned_scores

    chosen = scores_name(run_dir, name)
    config, found, paths = open_run_stores(run_dir, stores)
    encoder = config["features"].get("slide_encoder")
    if encoder:
        raise RunError(
            f"{run_dir}: trained on {encoder!r} slide vectors, one per slide: its model "
            "scores no tiles (explain a run trained on tile features)"
        )
    device = resolve_device(device)
    models = load_models(run_dir, device, fold)
    run = {
        "run": str(Path(run_dir).resolve()),
        "model": config["options"]["model"],
        "task": config["task"],
        "features": config["features"],
        "fold": "ensemble" if fold is None else fold,
    }
    if not overwrite:
        for path, group in zip(paths, found, strict=True):
            _refuse_other_set(path, group.group, chosen, run)
    written = []
    for path, group in zip(paths, found, strict=True):
        values, has_attention = tile_scores(models, group.features[:], device)
        columns = (["attention"] if has_attention else []) + list(config["outputs"])
        tiles = {
            "finished": group.group.record.finished,
            "tiles": int(values.shape[0]),
            "path": group.group.path,
        }
        written.append(
            write_learned_scores(path, group.group.path, chosen, values, columns, run, tiles)
        )
    return written


def _refuse_other_set(store: str, group: Any, name: str, run: dict[str, Any]) -> None:
    """RunError where the store's set `name` was made by another run, fold, model or task."""
    import zarr

    from tilestore.embeddings.scores import learned_sets

    where = f"{store}: {group.path}"
    tiles = zarr.open_group(store, path=group.path, mode="r", zarr_format=3)
    held = learned_sets(tiles, where).get(name)
    if held is None:
        return
    keys = ("run", "model", "task", "fold")
    was = {k: held.record.run.get(k) for k in keys}
    differ = [k for k in keys if was[k] != run[k]]
    if differ:
        raise RunError(
            f"{store}: learned/{name} holds the scores of {was['run']} (fold {was['fold']}), "
            f"not this run's ({', '.join(differ)} differ): give another --name, or "
            "--overwrite to replace them"
        )
