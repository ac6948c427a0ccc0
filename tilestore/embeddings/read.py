"""Reading embeddings: one slide's or a cohort's groups opened as one lazy Dataset.

`open_embeddings` stacks the ``embeddings/<model>/<plan>`` groups (`tilestore.embeddings.layout`)
of one slide or a cohort along ``tile`` as dask arrays, so opening a thousand slides reads
their metadata only; features are read when a computation asks for them. The Dataset has
the ``ds.tiles`` accessor (`tilestore.analysis.register_accessor`: called as the Dataset is
returned, never as a side effect of an import).

>>> ds = tilestore.open_embeddings("stores/*.ome.zarr", "uni")
>>> ds.features           # (tile, feature), dask
>>> ds.slide, ds.x_um     # per-tile coordinates
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dask.array as da
import numpy as np
import xarray as xr
import zarr
from zarr.abc.store import Store

from tilestore.analysis import register_accessor
from tilestore.embeddings.groups import (
    StoreLike,
    check_rows,
    open_finished,
    read_each,
    refuse_shared_names,
    slide_name,
)
from tilestore.embeddings.layout import COORDINATES, COORDS, UNITS
from tilestore.embeddings.recipe import (
    Recipe,
    Recipes,
    ScaleLabel,
    combine,
    recipe,
    with_facts,
)
from tilestore.embeddings.scores import (
    LEARNED,
    ZEROSHOT,
    LearnedSet,
    ScoreSet,
    learned_recipe,
    learned_sets,
    score_recipe,
    score_sets,
)
from tilestore.errors import ChunkError, MixedResults, TilestoreWarning
from tilestore.format.records import LabelRecord, read_record
from tilestore.format.store import damage_as_store_error
from tilestore.options import checked

DASK_CHUNK_BYTES = 32 * 2**20


@checked
def open_embeddings(
    stores: StoreLike | Sequence[StoreLike],
    model: str,
    *,
    skip_missing: bool = False,
    slide_encoder: str | None = None,
    scale: ScaleLabel = None,
    plan: str | None = None,
    skip_mixed: bool = False,
) -> xr.Dataset:
    """Return the embeddings of one slide or many as one lazy Dataset on dim ``tile``; with
    `slide_encoder`, their slide embeddings instead, on (``slide``, ``feature``)
    (`tilestore.embeddings.slides.open_slide_embeddings`).

    Parameters
    ----------
    stores : str, path or list of them
        A store, a list of stores, or a glob pattern ("stores/*.ome.zarr").
    model : str
        The model name given to `tilestore embed` (uni, timm:vit_small_patch16_224...).
    skip_missing : bool
        Leave out (with a warning) slides whose group is absent or unfinished instead of
        raising. Stores matched by a glob pattern are always so left out (a cohort folder
        routinely holds stores `embed` has not reached yet); a store named on its own is
        an error unless skip_missing. A damaged group is an error either way.
    slide_encoder : str, optional
        Read this encoder's slide embeddings instead of the tiles'.
    scale : str, optional
        The stores' features must be one population
        (`tilestore.embeddings.recipe.combine`): made alike, and from tiles at one scale;
        of stores planned at several, the scale named here (e.g. "0.5mpp-224px") is kept
        and the others left out with a warning. None: several scales are refused
        (`MixedResults`, listing them).
    plan : str, optional
        The plan whose tiles' embeddings are read, where a store holds the model's
        embeddings of several plans (None: each store's only one; several refused, naming
        them).
    skip_mixed : bool
        Leave out (with a warning) per-tile columns whose records differ between the stores
        instead of raising MixedResults: a zero-shot score set of one name made with another
        text tower, prompts or logit scale, quality measures taken otherwise, QC shares of
        other artefact definitions (`meetings`: each compared by `combine`).

    Returns
    -------
    xarray.Dataset
        ``features`` (tile, feature) and every coordinate as dask arrays: nothing is read
        until computed. Coordinates: x, y (level-0 px, top-left), x_um, y_um, row, col,
        tissue, roi, roi_class (the class name) and slide. ``ds.attrs["slides"]``
        describes each slide's grid (store, tiles, footprint and stride in level-0 px,
        mpp) for plotting and export; ``ds.tiles`` is the analysis accessor.
    """
    if slide_encoder is not None:
        from tilestore.embeddings.slides import open_slide_embeddings

        return open_slide_embeddings(
            stores, model, slide_encoder, skip_missing=skip_missing, scale=scale, plan=plan
        )

    def part(store: StoreLike) -> dict[str, Any]:
        return _slide_part(store, model, plan)

    parts = read_each(stores, part, skip_missing, f"no embeddings of {model!r}")
    kept = combine(
        [(p["meta"]["store"], p["recipe"]) for p in parts], f"{model!r} embeddings", scale
    )
    parts = [parts[i] for i in kept]
    _columns_meet(parts, skip_mixed)
    refuse_shared_names([p["meta"]["name"] for p in parts])
    register_accessor()  # ds.tiles on what is returned
    widths = {p["features"].shape[1] for p in parts}
    if len(widths) > 1:  # groups from before the width was recorded
        raise MixedResults(f"{model!r} embeddings of widths {sorted(widths)}: open them apart")
    return _dataset(parts, model)


def _slide_part(store: StoreLike, model: str, plan: str | None) -> dict[str, Any]:
    """One slide's arrays (dask) and grid facts; StoreError if it has no finished group (its
    shapes checked at open, its features' and tokens' values as they are read)."""
    found = open_finished(store, model, plan)
    path, meta, members = found.path, found.meta, found.arrays
    with damage_as_store_error(store, path, found.fix):
        token = f"{Path(str(store)).resolve() if not isinstance(store, Store) else id(store)}"
        token = f"{token}-{path}-{meta.get('finished', '')}"
        features = members["features"]
        # Dask chunks of many stored batches: zarr then fetches a chunk's batches concurrently,
        # and a cohort has thousands, not millions, of tasks.
        batch, dim = features.chunks
        rows = batch * max(1, DASK_CHUNK_BYTES // (batch * dim * features.dtype.itemsize))
        arrays = {
            key: da.from_array(
                _Checked(members[key], f"{store}: {path}/{key}", found.fix, key == "features"),
                chunks=(rows, dim)[: members[key].ndim],
                name=f"{key}-{token}",
                meta=np.empty((0,) * members[key].ndim, members[key].dtype),  # no read to guess it
            )
            for key in ("features", *COORDS, *_qc_keys(meta))
        }
        measures: list[str] = []
        if "quality" in members:  # per-tile quality measures: a column each, as coordinates
            quality = members["quality"]
            measures = [str(m) for m in quality.attrs.get("measures", [])]
            table = _table(quality, f"{store}: {path}/quality", found.fix, rows, token)
            arrays.update({name: table[:, i] for i, name in enumerate(measures)})
        quality_measures = list(measures)
        labels: list[str] = []
        sets = score_sets(found.group, f"{store}: {path}")
        for name, score_set in sets.items():
            array, classes = score_set.probabilities, score_set.classes
            # zero-shot scores (`tilestore.embeddings.scores`): a column per class, and the
            # most probable class's name
            table = _table(array, f"{store}: {path}/{ZEROSHOT}/{name}", found.fix, rows, token)
            arrays.update({f"{name}:{c}": table[:, i] for i, c in enumerate(classes)})
            measures += [f"{name}:{c}" for c in classes]
            lut = np.array(classes)
            arrays[name] = table.map_blocks(
                _most_probable, lut=lut, drop_axis=1, dtype=lut.dtype, meta=np.empty(0, lut.dtype)
            )
            labels.append(name)
        learned = learned_sets(found.group, f"{store}: {path}")
        for name, learned_set in learned.items():
            array, columns = learned_set.scores, learned_set.columns
            # a trained model's tile scores (`tilestore.learn.explanation`): a column each
            table = _table(array, f"{store}: {path}/{LEARNED}/{name}", found.fix, rows, token)
            arrays.update({f"{name}:{c}": table[:, i] for i, c in enumerate(columns)})
            measures += [f"{name}:{c}" for c in columns]
        if "tokens" in members:  # the patch-token grids, a tile per row as the features
            tokens = members["tokens"]
            arrays["tokens"] = da.from_array(
                _Checked(tokens, f"{store}: {path}/tokens", found.fix, finite=True),
                chunks=tokens.chunks,
                name=f"tokens-{token}",
                meta=np.empty((0,) * tokens.ndim, tokens.dtype),
            )
    name = slide_name(store)
    grid = meta.get("grid") or {}
    downsample = grid.get("downsample", (1.0, 1.0))
    read, read_stride = grid.get("read", meta.get("read_px")), grid.get("read_stride")
    return {
        **arrays,
        "classes": list(meta.get("classes", [""])),
        "qc": _qc_keys(meta) + measures,  # optional per-tile columns (NaN where absent)
        "labels": labels,  # optional per-tile class names ("" where absent)
        "meta": {
            "name": name,
            "store": str(store),
            "tiles": int(features.shape[0]),
            "plan": meta.get("plan", {}).get("name"),
            "level": meta.get("level"),
            "mpp": meta.get("mpp"),
            "tile_size": meta.get("tile_size"),
            # footprint and stride of the grid in level-0 pixels, (y, x)
            "footprint0": [read * downsample[0], read * downsample[1]],
            "stride0": [
                (read_stride or read) * downsample[0],
                (read_stride or read) * downsample[1],
            ],
        },
        "model": meta.get("model", {}),
        "recipe": recipe(meta),
        "meetings": _meetings(store, found, quality_measures, sets, learned),
    }


def _table(array: zarr.Array, where: str, fix: str, rows: int, token: str) -> da.Array:
    """A stored (tile, column) table as dask reads it, `rows` tiles a chunk, its damage
    named (`_Checked`)."""
    return da.from_array(
        _Checked(array, where, fix),
        chunks=(rows, array.shape[1]),
        name=f"{where.rsplit(': ', 1)[-1].replace('/', '-')}-{token}",
        meta=np.empty((0, 0), array.dtype),
    )


@dataclass(frozen=True)
class Meeting:
    """Per-tile columns of one store that meet other stores' columns of the same names:
    what they are ("'tissue' scores"), their names, and the recipe they are compared on
    (the features' and the facts of their own record)."""

    what: str
    columns: tuple[str, ...]
    recipe: Recipe


def _meetings(
    store: StoreLike,
    found: Any,
    measures: list[str],
    sets: dict[str, ScoreSet],
    learned: dict[str, LearnedSet],
) -> list[Meeting]:
    """A slide's per-tile columns besides the features, each kind with its recipe: every
    score set, every learned set, the quality measures, the QC shares."""
    tiles, meta = recipe(found.meta), found.meta
    meetings = [
        Meeting(
            f"{name!r} scores",
            (name, *(f"{name}:{c}" for c in s.classes)),
            score_recipe(tiles, s.record),
        )
        for name, s in sets.items()
    ]
    meetings += [
        Meeting(
            f"{name!r} learned scores",
            tuple(f"{name}:{c}" for c in s.columns),
            learned_recipe(tiles, s.record),
        )
        for name, s in learned.items()
    ]
    quality = dict(meta.get("quality") or {})
    if measures:  # taken at one um/px and side, with one set of parameters
        facts = {k: quality.get(k) for k in ("measures", "mpp", "side", "params") if k in quality}
        meetings.append(
            Meeting("quality measures", tuple(measures), with_facts(tiles, "quality", facts))
        )
    if _qc_keys(meta):  # the shares of the artefacts the store's labels/qc defines
        facts = _qc_facts(store, found, meta)
        meetings.append(Meeting("QC shares", tuple(_qc_keys(meta)), with_facts(tiles, "qc", facts)))
    return meetings


def _qc_facts(store: StoreLike, found: Any, meta: dict[str, Any]) -> dict[str, Any]:
    """What the store's QC label says each artefact of the group's QC columns is (the
    labels/qc record's ``what``); empty where the label is gone or does not say."""
    where = f"{store}: labels/qc"
    try:
        group = zarr.open_group(found.group.store, path="labels/qc", mode="r", zarr_format=3)
    except (FileNotFoundError, KeyError, zarr.errors.NodeNotFoundError):
        return {}
    record = read_record(group, LabelRecord, where)
    what = dict((record.get("what") if record is not None else None) or {})
    return {f"{name} is": what.get(name) for name in meta.get("qc_classes", []) if name in what}


def _columns_meet(parts: list[dict[str, Any]], skip_mixed: bool) -> None:
    """Each kind of per-tile column the stores share by name put through `combine`: one made
    otherwise in some store is refused (MixedResults), or, with `skip_mixed`, left out of
    every slide with a warning (a column is one population or none)."""
    kinds: dict[str, list[tuple[str, Meeting]]] = {}
    for p in parts:
        for m in p["meetings"]:
            kinds.setdefault(m.what, []).append((p["meta"]["store"], m))
    for what, found in kinds.items():
        try:
            combine([(store, m.recipe) for store, m in found], what)
        except MixedResults as exc:
            if not skip_mixed:
                raise MixedResults(f"{exc} (or leave these columns out: skip_mixed=True)") from None
            gone = {c for _, m in found for c in m.columns}
            warnings.warn(f"left out the {what} columns ({exc})", TilestoreWarning, stacklevel=4)
            for p in parts:
                p["qc"] = [c for c in p["qc"] if c not in gone]
                p["labels"] = [c for c in p["labels"] if c not in gone]


def _qc_keys(meta: dict[str, Any]) -> list[str]:
    """The group's QC coordinate arrays: qc_<artefact>, each tile's share of it."""
    return [f"qc_{name}" for name in meta.get("qc_classes", [])]


class _Checked:
    """A zarr array as dask reads it, its damage (a checksum failing) a ChunkError naming
    the store and array rather than zarr's bare ValueError; with `finite` (features, tokens),
    a NaN or an infinity in the rows read is DamagedEmbeddings naming them (`check_rows`)."""

    def __init__(self, array: zarr.Array, where: str, fix: str, finite: bool = False) -> None:
        self.array, self.where, self.fix, self.finite = array, where, fix, finite
        self.shape, self.dtype, self.ndim = array.shape, array.dtype, array.ndim

    def __getitem__(self, key):
        try:
            values = self.array[key]
        except (ValueError, RuntimeError) as exc:
            raise ChunkError(f"{self.where}: damaged chunk: {exc}") from exc
        if self.finite:  # dask asks for a tuple of slices: the first says the first row
            rows = key[0] if isinstance(key, tuple) and key else key
            first = rows.start or 0 if isinstance(rows, slice) else 0
            check_rows(values, self.where, self.fix, first)
        return values


def _dataset(parts: list[dict[str, Any]], model: str) -> xr.Dataset:
    names = f"U{max(len(c) for p in parts for c in p['classes']) or 1}"
    name_width = max(len(p["meta"]["name"]) for p in parts)
    coords: dict[str, Any] = {
        key: ("tile", da.concatenate([p[key] for p in parts]))
        for key in COORDS
        if key != "roi_class"
    }
    # each slide numbers its own classes: its indices become its class names
    coords["roi_class"] = (
        "tile",
        da.concatenate(
            [
                p["roi_class"].map_blocks(
                    _lookup, lut=np.array(p["classes"], dtype=names), dtype=names
                )
                for p in parts
            ]
        ),
    )
    coords["slide"] = (
        "tile",
        da.concatenate(
            [
                da.full(
                    p["features"].shape[0],
                    p["meta"]["name"],
                    dtype=f"U{name_width}",
                    chunks=(p["features"].chunks[0],),
                )
                for p in parts
            ]
        ),
    )
    # QC shares as coordinates: NaN for the slides embedded without QC
    for key in sorted({k for p in parts for k in p["qc"]}):
        coords[key] = (
            "tile",
            da.concatenate(
                [
                    p[key]
                    if key in p
                    else da.full(
                        p["features"].shape[0],
                        np.nan,
                        dtype=np.float32,
                        chunks=(p["features"].chunks[0],),
                    )
                    for p in parts
                ]
            ),
        )
    # zero-shot classes by name: "" for the slides not scored with that set
    for key in sorted({k for p in parts for k in p["labels"]}):
        width = max(p[key].dtype.itemsize // 4 for p in parts if key in p)
        coords[key] = (
            "tile",
            da.concatenate(
                [
                    p[key].astype(f"U{width}")
                    if key in p
                    else da.full(
                        p["features"].shape[0],
                        "",
                        dtype=f"U{width}",
                        chunks=(p["features"].chunks[0],),
                    )
                    for p in parts
                ]
            ),
        )
    features = da.concatenate([p["features"] for p in parts])
    ds = xr.Dataset({"features": (("tile", "feature"), features)}, coords=coords)
    # the patch-token grids, where every slide stored them on one grid (`embed(tokens=...)`)
    if all("tokens" in p for p in parts) and len({p["tokens"].shape[1:] for p in parts}) == 1:
        dims = ("tile", "token_y", "token_x", "token_feature")
        ds["tokens"] = (dims, da.concatenate([p["tokens"] for p in parts]))
    for key, unit in UNITS.items():
        ds[key].attrs["units"] = unit
    ds.attrs = {
        "model": model,
        "model_info": parts[0]["model"],
        "slides": [p["meta"] for p in parts],
        "coordinates": COORDINATES,
        "recipes": Recipes(tuple((p["meta"]["store"], p["recipe"]) for p in parts)),
    }
    return ds


def _lookup(block: np.ndarray, lut: np.ndarray) -> np.ndarray:
    return lut[block]


def _most_probable(block: np.ndarray, lut: np.ndarray) -> np.ndarray:
    return lut[block.argmax(axis=1)]
