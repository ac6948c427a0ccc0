"""The ``ds.tiles`` accessor: embeddings back on their grid, PCA, k-means, similarity search.

Registered on every xarray Dataset shaped like `open_embeddings` output (``features`` on
(tile, feature) plus per-tile coordinates). Fits use scikit-learn on at most `sample` tiles
(all of them when there are fewer), then project or assign every tile lazily with dask, so
the methods scale from one slide to a cohort whose features do not fit in memory.

>>> ds = tilestore.open_embeddings("stores/*.ome.zarr", "uni")
>>> pcs = ds.tiles.pca(8)                  # (tile, component), lazy
>>> clusters = ds.tiles.kmeans(6, pcs=8)   # (tile,) cluster index
>>> ds.tiles.nearest(1234, k=20)           # most similar tiles across the cohort
>>> ds.tiles.grid(clusters, slide="A")     # (y, x) map of one slide
"""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
import xarray as xr

from tilestore.analysis.options import Clusters, Components, OptionalComponents, Sample, Seed
from tilestore.errors import AnalysisError, MixedResults, OptionError
from tilestore.options import checked

SAMPLE = 100_000  # tiles a fit sees at most: ample for PCA/k-means of foundation features


def register_accessor() -> None:
    """Make `ds.tiles` this accessor on every xarray Dataset (once; a second call does
    nothing). `tilestore.embeddings.open_embeddings` calls it for the datasets it returns;
    call it for a Dataset opened otherwise (xarray.open_zarr of an embeddings group)."""
    if getattr(xr.Dataset, "tiles", None) is not TilesAccessor:
        xr.register_dataset_accessor("tiles")(TilesAccessor)


class TilesAccessor:
    """Tile-level analysis of an embeddings Dataset (see module docstring)."""

    def __init__(self, ds: xr.Dataset) -> None:
        self._ds = ds

    # -- slides -------------------------------------------------------------------------

    @property
    def slides(self) -> list[str]:
        """Names of the slides this Dataset describes (attrs order)."""
        return [s["name"] for s in self._ds.attrs.get("slides", [])]

    def positions(self, name: str | None = None) -> tuple[dict, np.ndarray]:
        """Return one slide's facts (attrs) and the positions of its tiles in this Dataset."""
        meta = self._meta(name)
        keep = np.flatnonzero(np.asarray(self._ds["slide"] == meta["name"]))
        if not len(keep):
            raise AnalysisError(f"slide {meta['name']!r} has no tiles in this Dataset")
        return meta, keep

    def slide(self, name: str | None = None) -> xr.Dataset:
        """Return the tiles of one slide (the only one if name is None)."""
        meta, keep = self.positions(name)
        sub = self._ds.isel(tile=keep)
        sub.attrs = {**self._ds.attrs, "slides": [meta]}
        return sub

    def _meta(self, name: str | None) -> dict:
        slides = self._ds.attrs.get("slides", [])
        if name is None:
            if len(slides) != 1:
                raise AnalysisError(
                    f"{len(slides)} slides here; name one ({', '.join(self.slides[:5])}"
                    f"{'...' if len(slides) > 5 else ''})"
                )
            return slides[0]
        for meta in slides:
            if meta["name"] == name:
                return meta
        raise AnalysisError(f"no slide {name!r}; slides: {', '.join(self.slides[:10])}")

    # -- the grid -----------------------------------------------------------------------

    def grid(self, values: str | xr.DataArray = "features", slide: str | None = None):
        """Return per-tile values as a (y, x, ...) DataArray on the slide's tile grid.

        values: a variable or coordinate name, or a DataArray on ``tile`` (pca scores,
        clusters...). Cells without a tile are NaN. The y, x coordinates are the level-0
        pixels of each cell's tile top-left corner, as the tiles' own x, y are.
        """
        meta, keep = self.positions(slide)
        sub, data = self._ds.isel(tile=keep), _values(self._ds, values).isel(tile=keep)
        row, col = np.asarray(sub["row"]), np.asarray(sub["col"])
        r0, c0 = int(row.min()), int(col.min())
        shape = (int(row.max()) - r0 + 1, int(col.max()) - c0 + 1)
        rest = data.shape[1:]
        out = np.full(shape + rest, np.nan, dtype=np.result_type(data.dtype, np.float32))
        out[row - r0, col - c0] = np.asarray(data)
        sy, sx = meta["stride0"]
        coords = {
            "y": np.rint((r0 + np.arange(shape[0])) * sy).astype(np.int64),
            "x": np.rint((c0 + np.arange(shape[1])) * sx).astype(np.int64),
        }
        coords.update({d: data[d].values for d in data.dims[1:] if d in data.coords})
        return xr.DataArray(
            out,
            dims=("y", "x", *data.dims[1:]),
            coords=coords,
            name=data.name,
            attrs={
                "slide": meta["name"],
                "store": meta["store"],
                "footprint0": meta["footprint0"],
                "stride0": meta["stride0"],
                "units": "level-0 pixel",
            },
        )

    def keep(self, **limits: float) -> xr.Dataset:
        """The tiles within limits on their per-tile columns: ``max_<column>=v`` keeps tiles
        whose column is at most v, ``min_<column>=v`` at least v (``keep(max_blur=0.7,
        max_ink=0.05)`` with the measures of the embedding pass); a tile a measure did not
        judge (NaN) is kept. The slides' facts stay as they were."""
        keep = np.ones(self._ds.sizes["tile"], bool)
        for key, limit in limits.items():
            bound, _, column = key.partition("_")
            if bound not in ("max", "min") or column not in self._ds.coords:
                have = [str(c) for c, v in self._ds.coords.items() if v.dims == ("tile",)]
                raise AnalysisError(
                    f"keep({key}=...): give max_<column> or min_<column> of a per-tile "
                    f"column ({', '.join(have)})"
                )
            values = np.asarray(self._ds[column], dtype=np.float64)
            over = values > limit if bound == "max" else values < limit
            keep &= ~(over & np.isfinite(values))
        out = self._ds.isel(tile=np.flatnonzero(keep))
        out.attrs = dict(self._ds.attrs)
        return out

    # -- decompositions ---------------------------------------------------------------

    @checked
    def pca(self, n: Components = 3, *, sample: Sample = SAMPLE, seed: Seed = 0) -> xr.DataArray:
        """Return the first `n` principal component scores of every tile, (tile, component).

        Fitted (scikit-learn PCA, components' signs made deterministic) on all tiles, or
        on `sample` random ones when there are more; scores are computed lazily.
        attrs: explained_variance_ratio, mean, components, fitted_on.
        """
        return self._pca(n, sample, seed)[0]

    def _pca(self, n: int, sample: int, seed: int) -> tuple[xr.DataArray, np.ndarray]:
        """The lazy scores, and the scores of the tiles the fit saw (already in memory)."""
        features = self._features()
        if not 1 <= n <= min(features.shape):
            raise AnalysisError(f"pca: n must be 1..{min(features.shape)} (got {n})")
        from sklearn.decomposition import PCA  # here: scikit-learn takes a second to import

        fit_on = _sample(features, sample, seed)
        if n > len(fit_on):
            raise OptionError(f"sample={sample}: a fit of {n} components needs {n} tiles or more")
        model = PCA(n_components=n, svd_solver="covariance_eigh").fit(fit_on)
        components = model.components_.astype(np.float32)
        offset = (model.mean_ @ model.components_.T).astype(np.float32)
        scores = features.map_blocks(
            _project, components.T, offset, chunks=(features.chunks[0], (n,)), dtype=np.float32
        )
        scored = self._per_tile(
            scores,
            "pca",
            ("component", [f"PC{i + 1}" for i in range(n)]),
            {
                "explained_variance_ratio": model.explained_variance_ratio_.tolist(),
                "mean": model.mean_.astype(np.float32),
                "components": components,
                "fitted_on": len(fit_on),
            },
        )
        return scored, _project(fit_on, components.T, offset)

    @checked
    def kmeans(
        self,
        k: Clusters,
        *,
        pcs: OptionalComponents = None,
        sample: Sample = SAMPLE,
        seed: Seed = 0,
    ) -> xr.DataArray:
        """Return each tile's k-means cluster (0..k-1), fitted with scikit-learn.

        pcs: cluster the first `pcs` principal components instead of the raw features
        (usual for 1024+ dimensional embeddings). Fitted on at most `sample` tiles; every
        tile is then assigned to its nearest centre, lazily. attrs: centers, inertia, space.
        """
        tiles = self._features().shape[0]
        if not 1 <= k <= tiles:
            raise AnalysisError(f"kmeans: k must be 1..{tiles} tiles (got {k})")
        from sklearn.cluster import KMeans

        if pcs:  # fit on the PCA sample's own scores: no second pass over the features
            pca, fit_on = self._pca(pcs, sample, seed)
            space = pca.data
        else:
            pca, space = None, self._features()
            fit_on = _sample(space, sample, seed)
        if k > len(fit_on):
            raise OptionError(f"sample={sample}: a fit of {k} clusters needs {k} tiles or more")
        model = KMeans(n_clusters=k, n_init=4, random_state=seed).fit(fit_on)
        centers = model.cluster_centers_.astype(np.float32)
        labels = space.map_blocks(
            _assign, centers, drop_axis=1, chunks=(space.chunks[0],), dtype=np.int32
        )
        return self._per_tile(
            labels,
            "cluster",
            None,
            {
                "centers": centers,
                "inertia": float(model.inertia_),
                "space": f"PC1-PC{pcs}" if pcs else "features",
                "fitted_on": len(fit_on),
                # the projection into that space, so centres can be compared with features
                **(
                    {"pca_mean": pca.attrs["mean"], "pca_components": pca.attrs["components"]}
                    if pca is not None
                    else {}
                ),
            },
        )

    @checked
    def rgb_map(self, *, sample: Sample = SAMPLE, seed: Seed = 0) -> xr.DataArray:
        """Return the first three principal components as colours, (tile, rgb) in [0, 1].

        Each component is stretched between its 1st and 99th percentile, so a few outlier
        tiles do not wash out the map.
        """
        scores = self.pca(3, sample=sample, seed=seed)
        values = np.asarray(scores, dtype=np.float32)
        lo, hi = np.percentile(values, [1, 99], axis=0)
        rgb = np.clip((values - lo) / np.where(hi > lo, hi - lo, 1), 0, 1)
        return xr.DataArray(
            rgb,
            dims=("tile", "rgb"),
            coords={**_tile_coords(scores), "rgb": list("RGB")},
            name="rgb",
            attrs={"explained_variance_ratio": scores.attrs["explained_variance_ratio"]},
        )

    # -- search -----------------------------------------------------------------------

    def nearest(self, query, k: int = 10, *, recipe=None, unchecked: bool = False) -> xr.Dataset:
        """Return the `k` tiles most similar (cosine) to each query, across all slides.

        query: a tile's position in this Dataset, 0 to its tiles - 1 (a negative one is
        refused, not counted from the end: an index gone wrong is likelier than one meant
        from the end); tiles of another Dataset `open_embeddings` returned (``other.isel(
        tile=[i])``), whose features are checked against these as a cohort's are
        (`tilestore.embeddings.recipe.combine`: MixedResults where their models,
        precisions or scales differ); or a feature vector, or an (m, feature) array of them,
        taken only with the `recipe` they were made with (`tilestore.embeddings.recipe`,
        e.g. ``recipe(meta)`` of the group they come from), checked alike, or with
        `unchecked` (the caller vouches for them: a vector of another model or scale of
        the right width is scored all the same). Returns a Dataset on (query, rank), rank 0
        the most similar, with ``tile`` (position), ``similarity`` and the tiles' slide, x,
        y, row, col. A tile given as the query finds itself first, with similarity 1.
        """
        features = self._features()
        if not isinstance(query, int | np.integer) or isinstance(query, bool):
            query = self._met(query, recipe, unchecked)
        queries = self._queries(query, features)
        if not 1 <= k <= features.shape[0]:
            raise AnalysisError(f"nearest: k must be 1..{features.shape[0]} (got {k})")
        unit = queries / np.linalg.norm(queries, axis=1, keepdims=True)
        scores = features.map_blocks(
            _cosine, unit.T, chunks=(features.chunks[0], (len(unit),)), dtype=np.float32
        )
        # one pass over the features: both reductions share the similarity tasks
        best, similarity = dask.compute(da.argtopk(scores, k, axis=0), da.topk(scores, k, axis=0))
        best, similarity = best.T, similarity.T  # (query, rank)
        out = xr.Dataset(
            {
                "tile": (("query", "rank"), best),
                "similarity": (("query", "rank"), similarity),
            }
        )
        for name in ("slide", "x", "y", "row", "col"):
            column = self._ds[name].isel(tile=xr.DataArray(best.ravel(), dims="hit"))
            out[name] = (("query", "rank"), np.asarray(column).reshape(best.shape))
        return out

    def _met(self, query, recipe, unchecked: bool):
        """The query's features, where they may meet this Dataset's (the recipes it carries,
        ``attrs["recipes"]``, asked: `Recipes.meet`); MixedResults where nothing says how
        they were made and the caller did not vouch for them."""
        theirs = query.attrs.get("recipes") if isinstance(query, xr.Dataset) else recipe
        if isinstance(query, xr.Dataset):
            if "features" not in query:
                raise AnalysisError("nearest: a Dataset query has no 'features' variable")
            query = query["features"].values
        if unchecked:
            return query
        mine = self._ds.attrs.get("recipes")
        if theirs is None or mine is None:
            raise MixedResults(
                "nearest: nothing says how "
                + ("the query" if theirs is None else "this Dataset's features")
                + " was made, so it cannot be checked against these tiles' model and scale; "
                "give tiles of a Dataset open_embeddings returned (other.isel(tile=[i])), "
                "the recipe= they were made with, or unchecked=True"
            )
        mine.meet(theirs, "query and tile features")
        return query

    def _queries(self, query, features: da.Array) -> np.ndarray:
        if isinstance(query, int | np.integer) and not isinstance(query, bool):
            if not 0 <= query < features.shape[0]:
                raise OptionError(
                    f"query={query}: no such tile (tiles 0 to {features.shape[0] - 1})"
                )
            return np.asarray(features[int(query)], dtype=np.float32)[None]
        q = np.atleast_2d(np.asarray(query, dtype=np.float32))
        if q.ndim != 2 or q.shape[1] != features.shape[1]:
            raise AnalysisError(
                f"nearest: query of shape {np.shape(query)} is not a {features.shape[1]}-d "
                "vector or (m, {features.shape[1]}) array"
            )
        if not np.all(np.linalg.norm(q, axis=1) > 0):
            raise AnalysisError("nearest: a zero query vector has no direction")
        return q

    # -- helpers ------------------------------------------------------------------------

    def _features(self) -> da.Array:
        if "features" not in self._ds:
            raise AnalysisError("no 'features' variable: open with tilestore.open_embeddings")
        data = self._ds["features"].data
        return data if isinstance(data, da.Array) else da.from_array(data, chunks=(65536, -1))

    def _per_tile(self, data, name: str, extra, attrs) -> xr.DataArray:
        dims = ("tile",) if extra is None else ("tile", extra[0])
        coords = dict(self._ds["features"].coords)
        if extra is not None:
            coords[extra[0]] = extra[1]
        return xr.DataArray(data, dims=dims, coords=coords, name=name, attrs=attrs)


def _tile_coords(data: xr.DataArray) -> dict:
    return {k: v for k, v in data.coords.items() if v.dims == ("tile",)}


def _values(ds: xr.Dataset, values) -> xr.DataArray:
    data = ds[values] if isinstance(values, str) else values
    if not isinstance(data, xr.DataArray) or data.dims[:1] != ("tile",):
        raise AnalysisError("grid: values must be a name or a DataArray whose first dim is tile")
    if data.sizes["tile"] != ds.sizes["tile"]:
        raise AnalysisError(
            f"grid: values have {data.sizes['tile']} tiles, the Dataset {ds.sizes['tile']}"
        )
    return data


def _sample(x: da.Array, size: int, seed: int) -> np.ndarray:
    """All rows of x as float32, or `size` random ones (sorted, so chunks are read in order)."""
    n = x.shape[0]
    if n > size:
        x = x[np.sort(np.random.default_rng(seed).choice(n, size, replace=False))]
    return np.asarray(x.compute(), dtype=np.float32)


def _project(block: np.ndarray, basis: np.ndarray, offset: np.ndarray) -> np.ndarray:
    return block.astype(np.float32) @ basis - offset


def _assign(block: np.ndarray, centers: np.ndarray) -> np.ndarray:
    block = block.astype(np.float32)
    # |x - c|^2 = |x|^2 - 2 x.c + |c|^2; |x|^2 is the same for every centre
    distance = (centers**2).sum(axis=1) - 2 * block @ centers.T
    return distance.argmin(axis=1).astype(np.int32)


def _cosine(block: np.ndarray, unit_queries: np.ndarray) -> np.ndarray:
    block = block.astype(np.float32)
    norm = np.sqrt(np.einsum("ij,ij->i", block, block))[:, None]
    return np.where(norm > 0, block @ unit_queries / np.where(norm > 0, norm, 1), -np.inf)
