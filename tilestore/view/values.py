"""Per-tile values of an embeddings group, for overlays and heatmaps: any numeric column
(tissue, roi, each QC share, and what later runs add), PCA colours, k-means clusters, the
cosine similarity to one tile (across every served slide with the model), or scores of the
user's own (a table of tile -> score).

Each is a `TileValues` of one slide: per-tile numbers on a colour scale, classes with names
and colours, or colours as they are, with the tiles' grid positions to draw them on.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tilestore.analysis.options import CLUSTERS
from tilestore.errors import ViewError
from tilestore.view.catalog import Catalog, Embedded
from tilestore.view.overlays import (
    Grid,
    Overlay,
    classes_legend,
    scale_legend,
    scale_rgba,
)

SPECIAL = ("pca", "clusters", "similarity")
SIMILARITIES = 8  # clicked tiles whose similarities are kept (each: 4 bytes a tile)


@dataclass(frozen=True)
class TileValues:
    """One slide's tiles and a value for each: `scalar` (n,) float (NaN: none), or
    `classes` (n,) int into `names`/`colours`, or `rgb` (n, 3) uint8 colours."""

    label: str
    rows: np.ndarray
    cols: np.ndarray
    grid: Grid
    meta: dict[str, Any]  # the slide's facts in the embeddings (footprint0, stride0...)
    x: np.ndarray
    y: np.ndarray
    scalar: np.ndarray | None = None
    classes: np.ndarray | None = None
    names: tuple[str, ...] = ()
    colours: np.ndarray | None = None  # (k, 4) uint8
    rgb: np.ndarray | None = None
    bounds: tuple[float, float] | None = None  # the scale's (min, max)

    def overlay(self) -> Overlay:
        """The values as a picture on the slide's tile grid, and its legend."""
        if self.scalar is not None:
            vmin, vmax = self.bounds or value_range(self.scalar)
            image, extent = self.grid.draw(
                self.rows, self.cols, scale_rgba(self.scalar, vmin, vmax)
            )
            return Overlay(image, extent, scale_legend(self.label, vmin, vmax))
        if self.classes is not None:
            image, extent = self.grid.draw(self.rows, self.cols, self.colours[self.classes])
            counts = np.bincount(self.classes, minlength=len(self.names))
            items = [
                (n, tuple(int(v) for v in c), int(k))
                for n, c, k in zip(self.names, self.colours, counts, strict=True)
            ]
            return Overlay(image, extent, classes_legend(items, len(self.classes)))
        rgba = np.concatenate([self.rgb, np.full((len(self.rgb), 1), 220, np.uint8)], axis=1)
        image, extent = self.grid.draw(self.rows, self.cols, rgba)
        return Overlay(image, extent, {"kind": "colours", "label": self.label})


def columns(catalog: Catalog, model: str) -> list[str]:
    """What a model's tiles can be coloured by: PCA, clusters, similarity, and every numeric
    per-tile column of its embeddings."""
    ds = catalog.embedded(model).ds
    per_tile = [
        str(name)
        for name, coord in ds.coords.items()
        if coord.dims == ("tile",)
        and (np.issubdtype(coord.dtype, np.floating) or coord.dtype.kind == "U")
        and name not in ("x_um", "y_um", "slide")
    ]
    return [*SPECIAL, *sorted(per_tile)]


def tile_values(
    catalog: Catalog,
    model: str,
    index: int,
    column: str,
    *,
    k: int = CLUSTERS,
    ref: int | None = None,
    scores: np.ndarray | None = None,
) -> TileValues:
    """Slide `index`'s values of `column` for `model` ("pca", "clusters" with k, "similarity"
    to tile `ref` of the model's tiles, a numeric column, or "scores": `scores`, one per
    tile of this slide)."""
    embedded = catalog.embedded(model)
    part = embedded.tiles_of(index)
    ds = embedded.ds.isel(tile=part)
    meta = embedded.ds.attrs["slides"][embedded.slides.index(index)]
    rows, cols = np.asarray(ds["row"]), np.asarray(ds["col"])
    base = {"rows": rows, "cols": cols, "grid": Grid.of_meta(meta, rows, cols), "meta": meta,
            "x": np.asarray(ds["x"]), "y": np.asarray(ds["y"])}  # fmt: skip
    if column == "pca":
        return TileValues("PC1-3 as RGB", **base, rgb=catalog.pca_colours(model)[part])
    if column == "clusters":
        from tilestore.analysis.plots import cluster_colors

        found = catalog.clusters(model, k)[part]  # first: it refuses a k out of 2-20
        colours = np.rint(cluster_colors(k) * 255).astype(np.uint8)
        colours = np.concatenate([colours, np.full((k, 1), 200, np.uint8)], axis=1)
        names = tuple(f"cluster {i}" for i in range(k))
        return TileValues(f"k-means, k={k}", **base, classes=found, names=names, colours=colours)
    if column == "similarity":
        if ref is None:
            raise ViewError("similarity: which tile? (ref=<tile>)")
        values = similarity(catalog, model, ref)[part]  # no such tile: said there
        if len(values) and embedded.population[ref] != embedded.population[part][0]:
            raise ViewError(
                f"similarity: tile {ref} is of slides whose {model} features may not meet "
                f"slide {index}'s (another scale or recipe); pick a tile of slide {index}'s"
            )
        return TileValues(f"cosine similarity to tile {ref}", **base, scalar=values,
                          bounds=(float(np.nanpercentile(values, 1)), 1.0))  # fmt: skip
    if column == "scores":
        if scores is None or len(scores) != len(rows):
            raise ViewError(f"scores: {0 if scores is None else len(scores)} for {len(rows)} tiles")
        return TileValues("scores", **base, scalar=np.asarray(scores, np.float64))
    if column in ds.coords and ds[column].dtype.kind == "U" and column != "slide":
        return _named(column, np.asarray(ds[column]), base)  # classes, such as roi_class
    if column not in ds.coords or column in ("x", "y", "row", "col", "slide"):
        raise ViewError(f"{model}: no per-tile column {column!r}; columns: "
                        f"{', '.join(columns(catalog, model))}")  # fmt: skip
    return TileValues(column, **base, scalar=np.asarray(ds[column], np.float64))


def _named(column: str, values: np.ndarray, base: dict[str, Any]) -> TileValues:
    """A column of names (a ROI class per tile) as classes, each its colour."""
    from tilestore.analysis.plots import cluster_colors

    names, classes = np.unique(values, return_inverse=True)
    colours = np.rint(cluster_colors(len(names)) * 255).astype(np.uint8)
    colours = np.concatenate([colours, np.full((len(names), 1), 200, np.uint8)], axis=1)
    shown = tuple(str(n) or "none" for n in names)
    return TileValues(column, **base, classes=classes, names=shown, colours=colours)


def value_range(values: np.ndarray) -> tuple[float, float]:
    """The (min, max) of the finite values ((0, 1) where there are none)."""
    finite = values[np.isfinite(values)]
    if not len(finite):
        return 0.0, 1.0
    return float(finite.min()), float(finite.max())


def similarity(catalog: Catalog, model: str, ref: int) -> np.ndarray:
    """Cosine similarity of every tile of the model (all served slides) to tile `ref`."""
    features = catalog.unit_features(model)
    if not 0 <= ref < len(features):
        raise ViewError(f"{model}: no tile {ref} (0-{len(features) - 1})")

    def compute(embedded: Embedded) -> np.ndarray:
        found = features @ features[ref]
        found[embedded.population != embedded.population[ref]] = np.nan  # may not meet
        return found

    return catalog.computed(model, f"similarity-{ref}", compute, keep=SIMILARITIES)


def tile_at(catalog: Catalog, model: str, index: int, x: float, y: float) -> int:
    """The model's tile (index over all served slides) of slide `index` under level-0 point
    (x, y): of the tiles whose footprint holds it, the one whose centre is nearest."""
    embedded = catalog.embedded(model)
    part = embedded.tiles_of(index)
    ds = embedded.ds.isel(tile=part)
    meta = embedded.ds.attrs["slides"][embedded.slides.index(index)]
    fh, fw = meta["footprint0"]
    tx, ty = np.asarray(ds["x"], np.float64), np.asarray(ds["y"], np.float64)
    inside = (tx <= x) & (x < tx + fw) & (ty <= y) & (y < ty + fh)
    if not inside.any():
        raise ViewError(f"no {model} tile at ({x:.0f}, {y:.0f}) of slide {index}")
    candidates = np.flatnonzero(inside)
    distance = (tx[candidates] + fw / 2 - x) ** 2 + (ty[candidates] + fh / 2 - y) ** 2
    return part.start + int(candidates[np.argmin(distance)])


def nearest(catalog: Catalog, model: str, ref: int, k: int, within: int | None = None):
    """The k tiles most similar to `ref` (itself left out): (tile, served slide, score),
    over every served slide, or only slide `within`."""
    scores = np.nan_to_num(similarity(catalog, model, ref), nan=-np.inf)  # a copy
    scores[ref] = -np.inf
    embedded = catalog.embedded(model)
    if within is not None:
        part = embedded.tiles_of(within)
        keep = np.full(len(scores), False)
        keep[part] = True
        scores[~keep] = -np.inf
    k = int(min(k, np.isfinite(scores).sum()))
    if k <= 0:
        return []
    top = np.argpartition(-scores, k - 1)[:k]
    top = top[np.argsort(-scores[top])]
    return [(int(t), embedded.slide_of(int(t)), float(scores[t])) for t in top]


def read_scores(path: str | os.PathLike, column: str | None = None) -> dict[str, np.ndarray]:
    """A user's per-tile scores from Parquet or CSV: a ``tile`` column (the tile's index in
    the slide's embeddings) or ``x`` and ``y`` (its level-0 top-left corner), and the score
    (`column`, or ``score``). Returns {"tile" or "x"/"y": ..., "score": ...}."""
    import pandas as pd

    path = Path(path)
    try:
        table = pd.read_parquet(path) if path.suffix.lower() == ".parquet" else pd.read_csv(path)
    except (OSError, ValueError) as exc:
        raise ViewError(f"{path}: cannot read scores ({exc})") from exc
    column = column or "score"
    if column not in table.columns:
        raise ViewError(
            f"{path}: no column {column!r} (columns: {', '.join(map(str, table.columns))})"
        )
    keys = ["tile"] if "tile" in table.columns else ["x", "y"]
    if not set(keys) <= set(table.columns):
        raise ViewError(f"{path}: needs a 'tile' column, or 'x' and 'y' (level-0 px)")
    out = {key: table[key].to_numpy() for key in keys}
    out["score"] = pd.to_numeric(table[column], errors="coerce").to_numpy(np.float64)
    return out


def match_scores(values: TileValues, scores: dict[str, np.ndarray], where: str) -> np.ndarray:
    """The slide's tiles' scores from `read_scores` (NaN for a tile without one); a score
    naming no tile of the slide is an error, never dropped silently."""
    out = np.full(len(values.rows), np.nan)
    if "tile" in scores:
        tiles = scores["tile"].astype(np.int64)
        bad = (tiles < 0) | (tiles >= len(out))
        if bad.any():
            raise ViewError(f"{where}: tile {int(tiles[bad][0])} is not one of the slide's "
                            f"{len(out)} tiles")  # fmt: skip
        out[tiles] = scores["score"]
        return out
    lookup = {(int(x), int(y)): i for i, (x, y) in enumerate(zip(values.x, values.y, strict=True))}
    for x, y, score in zip(scores["x"], scores["y"], scores["score"], strict=True):
        at = lookup.get((int(x), int(y)))
        if at is None:
            raise ViewError(f"{where}: no tile of the slide starts at ({x}, {y}) (level-0 px)")
        out[at] = score
    return out
