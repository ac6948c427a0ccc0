"""The slides a viewer serves, and what it computes of them once: each model's features (unit
length, for similarity), PCA colours and k-means clusters over all the stores opened (over
each population of them, where their features may not meet: other scales, other recipes).

A `Catalog` is made from opened `Slide`s (and the paths the user gave, for the panel) and
never writes. Embeddings are read as `open_embeddings` reads them, over every served store
that has the model's finished group, so a similarity search or a cluster spans the slides
opened together.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tilestore.errors import MixedResults, ViewError
from tilestore.format.records import EmbeddingsRecord, read_record
from tilestore.reading.slide import Slide


@dataclass
class Served:
    """One slide as served: its index in the slide list, its `Slide`, where it came from."""

    index: int
    slide: Slide
    path: str
    store: str  # the store the slide reads from (a sidecar's, for a slide read in place)
    roi: str | None = None  # an annotation file of the slide's ROIs, to draw


@dataclass
class Embedded:
    """One model's embeddings over the served slides that have them."""

    model: str
    ds: Any  # the xarray Dataset `open_embeddings` gives
    slides: list[int]  # served index of each slide in ds, in ds's order
    starts: np.ndarray  # first tile of each slide in ds
    cache: dict[str, Any] = field(default_factory=dict)
    # (tiles,) the population of each tile: slides whose features may meet (one scale, one
    # recipe: `recipe.combine`) share one; PCA, clusters and similarity stay within it
    population: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.population is None:
            self.population = np.zeros(self.ds.sizes["tile"], np.int32)

    def tiles_of(self, index: int) -> slice:
        """The tiles of served slide `index` in ds."""
        if index not in self.slides:
            raise ViewError(f"slide {index} has no {self.model} embeddings")
        at = self.slides.index(index)
        end = self.starts[at + 1] if at + 1 < len(self.starts) else self.ds.sizes["tile"]
        return slice(int(self.starts[at]), int(end))

    def populations(self) -> list[np.ndarray]:
        """The tiles of each population (all tiles, where the slides may all meet)."""
        return [np.flatnonzero(self.population == p) for p in np.unique(self.population)]

    def slide_of(self, tile: int) -> int:
        """The served index of the slide a tile of ds belongs to; ViewError for no tile."""
        if not 0 <= tile < self.ds.sizes["tile"]:
            raise ViewError(f"{self.model}: no tile {tile} (0-{self.ds.sizes['tile'] - 1})")
        return self.slides[int(np.searchsorted(self.starts, tile, side="right")) - 1]


class Catalog:
    """The served slides; each model's embeddings opened and analysed on first use."""

    def __init__(
        self,
        slides: Sequence[Slide],
        paths: Sequence[str],
        stores: Sequence[str],
        rois: Sequence[str | None] | None = None,
    ):
        if not slides:
            raise ViewError("no slide to show")
        rois = list(rois) if rois is not None else [None] * len(slides)
        if len(rois) != len(slides):
            raise ViewError(f"{len(rois)} ROI files for {len(slides)} slides: one per slide")
        self.served = [
            Served(i, s, str(p), str(st), None if r is None else str(r))
            for i, (s, p, st, r) in enumerate(zip(slides, paths, stores, rois, strict=True))
        ]
        self._embedded: dict[str, Embedded] = {}
        self._lock = threading.Lock()

    def get(self, index: int) -> Served:
        if not 0 <= index < len(self.served):
            raise ViewError(f"no slide {index} (slides 0-{len(self.served) - 1})")
        return self.served[index]

    def models(self, index: int | None = None) -> dict[str, dict[str, Any]]:
        """model name -> its run facts, for the finished embeddings groups of one slide (or
        of any served slide)."""
        found: dict[str, dict[str, Any]] = {}
        for served in self.served if index is None else [self.get(index)]:
            for facts in finished_groups(served.slide):
                found.setdefault(facts["model"]["name"], facts)
        return found

    def embedded(self, model: str) -> Embedded:
        """The model's embeddings over every served slide that has them (opened once)."""
        with self._lock:
            if model not in self._embedded:
                self._embedded[model] = self._open(model)
            return self._embedded[model]

    def _open(self, model: str) -> Embedded:
        from tilestore.embeddings import open_embeddings

        having = [s for s in self.served if model in self.models(s.index)]
        if not having:
            raise ViewError(f"no served slide has finished {model!r} embeddings")
        try:
            ds = open_embeddings([s.store for s in having], model)
        except MixedResults:  # each slide's tiles are still served, with those they may meet
            return self._open_apart(model, having)
        counts = [int(m["tiles"]) for m in ds.attrs["slides"]]
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
        return Embedded(model, ds, [s.index for s in having], starts)

    def _open_apart(self, model: str, having: list[Served]) -> Embedded:
        """The slides of a cohort whose features may not meet (scales or recipes differ),
        in populations that may (each slide joins the first whose slides `combine` accepts
        it with): one Dataset of all their tiles for what is per tile, each tile marked
        with its population for what is computed over tiles together."""
        import xarray as xr

        from tilestore.embeddings import open_embeddings
        from tilestore.embeddings.recipe import Recipes, combine, recipe

        populations: list[list[tuple[Served, Any]]] = []
        for served in having:
            mine = (served.store, recipe(self.models(served.index)[model]))
            for members in populations:
                try:
                    combine([(s.store, r) for s, r in members] + [mine], "embeddings")
                except MixedResults:
                    continue
                members.append((served, mine[1]))
                break
            else:
                populations.append([(served, mine[1])])
        parts = [open_embeddings([s.store for s, _ in m], model) for m in populations]
        order = [s.index for m in populations for s, _ in m]
        ds = xr.concat(parts, dim="tile", join="outer", combine_attrs="drop")
        ds.attrs = {
            **parts[0].attrs,
            "slides": [m for p in parts for m in p.attrs["slides"]],
            # every population's: a query checked against them is refused where they differ
            "recipes": Recipes(tuple(f for p in parts for f in p.attrs["recipes"].found)),
        }
        counts = [int(m["tiles"]) for m in ds.attrs["slides"]]
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
        population = np.repeat(
            np.arange(len(parts), dtype=np.int32), [p.sizes["tile"] for p in parts]
        )
        return Embedded(model, ds, order, starts, population=population)

    def computed(
        self, model: str, key: str, compute: Callable[[Embedded], Any], keep: int | None = None
    ) -> Any:
        """`compute(embedded)` for this model, once (features, PCA colours, clusters); with
        `keep`, only the last `keep` results of keys sharing this key's family (the part
        before its last '-') are kept (a similarity per clicked tile)."""
        embedded = self.embedded(model)
        with self._lock:
            if key not in embedded.cache:
                if keep is not None:
                    family = key.rsplit("-", 1)[0] + "-"
                    kin = [k for k in embedded.cache if k.startswith(family)]
                    for old in kin[: max(0, len(kin) - keep + 1)]:
                        del embedded.cache[old]
                embedded.cache[key] = compute(embedded)
            return embedded.cache[key]

    def unit_features(self, model: str) -> np.ndarray:
        """(tiles, dim) float32 features of unit length, all served slides: cosine is a dot."""

        def compute(embedded: Embedded) -> np.ndarray:
            features = np.asarray(embedded.ds["features"].values, dtype=np.float32)
            norms = np.linalg.norm(features, axis=1, keepdims=True)
            return features / np.maximum(norms, np.finfo(np.float32).tiny)

        return self.computed(model, "unit", compute)

    def pca_colours(self, model: str) -> np.ndarray:
        """(tiles, 3) uint8: the first three principal components as RGB (`ds.tiles.rgb_map`)."""

        def compute(embedded: Embedded) -> np.ndarray:
            out = np.zeros((embedded.ds.sizes["tile"], 3), np.uint8)
            for rows in embedded.populations():
                rgb = np.asarray(embedded.ds.isel(tile=rows).tiles.rgb_map().values, np.float32)
                out[rows] = np.rint(np.clip(rgb, 0, 1) * 255).astype(np.uint8)
            return out

        return self.computed(model, "pca", compute)

    def clusters(self, model: str, k: int) -> np.ndarray:
        """(tiles,) k-means cluster of each tile (`ds.tiles.kmeans`, on 16 PCs)."""
        if not 2 <= k <= 20:
            raise ViewError(f"clusters: k={k}; ask for 2 to 20")

        def compute(embedded: Embedded) -> np.ndarray:
            out = np.zeros(embedded.ds.sizes["tile"], np.int16)
            for rows in embedded.populations():
                if k > len(rows):
                    raise ViewError(f"clusters: k={k} for {len(rows)} tiles")
                part = embedded.ds.isel(tile=rows)
                out[rows] = np.asarray(part.tiles.kmeans(k, pcs=16).values, dtype=np.int16)
            return out

        return self.computed(model, f"kmeans-{k}", compute)


def finished_groups(slide: Slide) -> list[dict[str, Any]]:
    """The `tilestore` attributes of a store's finished embeddings groups (each model's of
    each plan, `tilestore.embeddings.list_groups`)."""
    from tilestore.embeddings import list_groups

    found = []
    for _, _, path in list_groups(slide.group.store):
        record = read_record(slide.group[path], EmbeddingsRecord, f"{slide.name}: {path}")
        if record is not None and record.complete and record.model is not None:
            found.append(record.to_attrs())
    return found
