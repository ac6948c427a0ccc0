"""The ds.tiles accessor against numpy references: grid, pca, kmeans, nearest, rgb_map."""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest
import xarray as xr
from hypothesis import given, settings
from hypothesis import strategies as st

import tilestore
from tilestore.analysis import register_accessor
from tilestore.errors import AnalysisError, OptionError

STRIDE = 224.0


def cohort(features_per_slide: list[np.ndarray], cells: list[np.ndarray] | None = None):
    """An embeddings-shaped Dataset: slides stacked on tile, dask-backed, on a 224 px grid;
    made here, not by `open_embeddings`, so `ds.tiles` is registered as for any such Dataset."""
    register_accessor()
    names, rows, cols = [], [], []
    for i, f in enumerate(features_per_slide):
        n = len(f)
        rc = cells[i] if cells is not None else np.stack(np.divmod(np.arange(n), 7), axis=1)
        rows.append(rc[:, 0])
        cols.append(rc[:, 1])
        names.append(np.full(n, f"slide{i}"))
    row, col = np.concatenate(rows).astype(np.int32), np.concatenate(cols).astype(np.int32)
    features = np.concatenate(features_per_slide).astype(np.float32)
    ds = xr.Dataset(
        {"features": (("tile", "feature"), da.from_array(features, chunks=(37, -1)))},
        coords={
            "x": ("tile", (col * STRIDE).astype(np.int64)),
            "y": ("tile", (row * STRIDE).astype(np.int64)),
            "row": ("tile", row),
            "col": ("tile", col),
            "slide": ("tile", np.concatenate(names)),
        },
    )
    ds.attrs["slides"] = [
        {
            "name": f"slide{i}",
            "store": "",
            "footprint0": [STRIDE, STRIDE],
            "stride0": [STRIDE, STRIDE],
            "level": 0,
            "mpp": 0.5,
        }
        for i in range(len(features_per_slide))
    ]
    return ds, features


def blobs(k: int, per: int, dim: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    centres = rng.normal(0, 10, (k, dim))
    truth = np.repeat(np.arange(k), per)
    return centres[truth] + rng.normal(0, 0.5, (k * per, dim)), truth


def numpy_pca(x: np.ndarray, n: int):
    x = x.astype(np.float64)
    centred = x - x.mean(axis=0)
    values, vectors = np.linalg.eigh(np.cov(centred, rowvar=False))
    order = np.argsort(values)[::-1][:n]
    return centred @ vectors[:, order], values[order] / values.sum()


def test_pca_equals_numpy_eigendecomposition():
    rng = np.random.default_rng(1)
    base = rng.normal(size=(300, 16)) * np.linspace(5, 0.1, 16)
    ds, x = cohort([base[:180], base[180:]])
    pca = ds.tiles.pca(4)
    assert pca.dims == ("tile", "component") and isinstance(pca.data, da.Array)
    assert list(pca.component.values) == ["PC1", "PC2", "PC3", "PC4"]
    scores, ratio = numpy_pca(x, 4)
    got = pca.values
    signs = np.sign((got * scores).sum(axis=0))  # a component's sign is arbitrary
    np.testing.assert_allclose(got * signs, scores, rtol=1e-3, atol=1e-3)
    np.testing.assert_allclose(pca.attrs["explained_variance_ratio"], ratio, rtol=1e-4)
    assert pca.attrs["fitted_on"] == 300
    # per-tile coordinates come along
    np.testing.assert_array_equal(pca["slide"].values, ds["slide"].values)


def test_pca_fitted_on_a_sample_still_scores_every_tile():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(500, 8)) * np.array([10, 5, 1, 1, 1, 1, 1, 1])
    ds, _ = cohort([x])
    pca = ds.tiles.pca(2, sample=200)
    assert pca.attrs["fitted_on"] == 200 and pca.shape == (500, 2)
    # the leading axes of such anisotropic data are found from a sample too
    full, _ = numpy_pca(x, 2)
    corr = [abs(np.corrcoef(pca.values[:, i], full[:, i])[0, 1]) for i in range(2)]
    assert min(corr) > 0.99


def test_kmeans_assigns_each_tile_to_its_nearest_centre():
    x, truth = blobs(4, 40, 12)
    ds, _ = cohort([x[:100], x[100:]])
    clusters = ds.tiles.kmeans(4, seed=3)
    labels = clusters.values
    centres = clusters.attrs["centers"]
    nearest = np.argmin(((x[:, None, :] - centres[None]) ** 2).sum(axis=2), axis=1)
    np.testing.assert_array_equal(labels, nearest)
    # well separated blobs: one cluster per blob, and centres are their members' means
    assert all(len(set(labels[truth == b])) == 1 for b in range(4))
    assert len(set(labels)) == 4
    for k in range(4):
        np.testing.assert_allclose(centres[k], x[labels == k].mean(axis=0), atol=1e-3)


def test_kmeans_on_principal_components():
    x, truth = blobs(3, 50, 64, seed=4)
    ds, _ = cohort([x])
    clusters = ds.tiles.kmeans(3, pcs=5)
    assert clusters.attrs["space"] == "PC1-PC5" and clusters.attrs["centers"].shape == (3, 5)
    labels = clusters.values
    assert all(len(set(labels[truth == b])) == 1 for b in range(3))
    projected = (x - clusters.attrs["pca_mean"]) @ clusters.attrs["pca_components"].T
    nearest = np.argmin(
        ((projected[:, None, :] - clusters.attrs["centers"][None]) ** 2).sum(axis=2), axis=1
    )
    np.testing.assert_array_equal(labels, nearest)


def brute_nearest(x: np.ndarray, q: np.ndarray, k: int):
    sims = (x / np.linalg.norm(x, axis=1, keepdims=True)) @ (
        q / np.linalg.norm(q, axis=1, keepdims=True)
    ).T
    order = np.argsort(-sims, axis=0, kind="stable")[:k].T
    return order, np.take_along_axis(sims.T, order, axis=1)


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(5, 200),
    dim=st.integers(2, 24),
    m=st.integers(1, 4),
    k=st.integers(1, 5),
    seed=st.integers(0, 2**16),
)
def test_nearest_equals_brute_force_cosine(n, dim, m, k, seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, dim))
    split = n // 2
    ds, x32 = cohort([x[:split], x[split:]] if split else [x])
    q = rng.normal(size=(m, dim))
    k = min(k, n)
    hits = ds.tiles.nearest(q, k=k, unchecked=True)
    order, sims = brute_nearest(x32.astype(np.float64), q, k)
    np.testing.assert_array_equal(hits["tile"].values, order)
    np.testing.assert_allclose(hits["similarity"].values, sims, rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(hits["slide"].values, ds["slide"].values[order])
    np.testing.assert_array_equal(hits["x"].values, ds["x"].values[order])


def test_a_tile_as_query_finds_itself_first():
    x, _ = blobs(3, 30, 10)
    ds, _ = cohort([x[:45], x[45:]])
    hits = ds.tiles.nearest(50, k=5)
    assert hits["tile"].values[0, 0] == 50
    assert hits["similarity"].values[0, 0] == pytest.approx(1.0, abs=1e-6)
    assert (np.diff(hits["similarity"].values[0]) <= 1e-7).all()
    assert set(hits["tile"].values[0]) <= set(range(30, 60))  # its own blob


def test_nearest_rejects_bad_queries():
    ds, _ = cohort([np.random.default_rng(0).normal(size=(20, 6))])
    with pytest.raises(AnalysisError, match="not a 6-d vector"):
        ds.tiles.nearest(np.ones(5), unchecked=True)
    with pytest.raises(AnalysisError, match="zero query"):
        ds.tiles.nearest(np.zeros(6), unchecked=True)
    for query in (20, -1, -20, np.int64(-1)):  # a negative index is refused, not from the end
        with pytest.raises(OptionError, match=rf"^query={query}: no such tile \(tiles 0 to 19\)$"):
            ds.tiles.nearest(query)
    with pytest.raises(AnalysisError, match="k must be"):
        ds.tiles.nearest(0, k=21)


def test_a_fit_on_no_tiles_or_too_few_is_refused_naming_sample():
    ds, _ = cohort([np.random.default_rng(0).normal(size=(20, 6))])
    for call in (ds.tiles.pca, ds.tiles.rgb_map, lambda **kw: ds.tiles.kmeans(2, **kw)):
        for bad in (0, -5, 2.5, True):
            with pytest.raises(OptionError, match=rf"^sample={bad}: must be a whole number"):
                call(sample=bad)
        with pytest.raises(OptionError, match=r"^seed=-1: must be a whole number from 0"):
            call(seed=-1)
    with pytest.raises(OptionError, match=r"^sample=2: a fit of 3 components needs 3 tiles"):
        ds.tiles.pca(3, sample=2)
    with pytest.raises(OptionError, match=r"^sample=3: a fit of 4 clusters needs 4 tiles"):
        ds.tiles.kmeans(4, sample=3)
    assert ds.tiles.pca(3, sample=3).attrs["fitted_on"] == 3


@settings(max_examples=30, deadline=None)
@given(data=st.data(), rows=st.integers(1, 9), cols=st.integers(1, 9))
def test_grid_puts_each_tile_in_its_cell(data, rows, cols):
    cells = np.array([(r, c) for r in range(rows) for c in range(cols)])
    keep = data.draw(
        st.lists(st.integers(0, len(cells) - 1), min_size=1, max_size=len(cells), unique=True)
    )
    chosen = cells[np.sort(keep)]
    values = np.arange(len(chosen) * 3, dtype=np.float32).reshape(-1, 3)
    ds, _ = cohort([values], cells=[chosen])
    grid = ds.tiles.grid("features")
    r0, c0 = chosen.min(axis=0)
    assert grid.dims == ("y", "x", "feature")
    assert grid.shape[:2] == tuple(chosen.max(axis=0) - chosen.min(axis=0) + 1)
    np.testing.assert_array_equal(grid.values[chosen[:, 0] - r0, chosen[:, 1] - c0], values)
    assert np.isnan(grid.values).sum() == (grid.shape[0] * grid.shape[1] - len(chosen)) * 3
    # cell coordinates are the tiles' own level-0 x, y
    np.testing.assert_array_equal(grid.y.values[chosen[:, 0] - r0], ds["y"].values)
    np.testing.assert_array_equal(grid.x.values[chosen[:, 1] - c0], ds["x"].values)


def test_grid_of_a_cohort_needs_a_slide_name():
    ds, _ = cohort([np.ones((5, 2)), 2 * np.ones((6, 2))])
    with pytest.raises(AnalysisError, match="2 slides here; name one"):
        ds.tiles.grid()
    grid = ds.tiles.grid("features", slide="slide1")
    assert np.nanmin(grid.values) == 2 and grid.attrs["slide"] == "slide1"
    with pytest.raises(AnalysisError, match="no slide 'x'"):
        ds.tiles.grid(slide="x")


def test_rgb_map_stretches_the_first_three_components():
    rng = np.random.default_rng(5)
    x = rng.normal(size=(400, 10)) * np.linspace(4, 1, 10)
    ds, x32 = cohort([x])
    rgb = ds.tiles.rgb_map()
    assert rgb.dims == ("tile", "rgb") and rgb.shape == (400, 3)
    assert float(rgb.min()) == 0.0 and float(rgb.max()) == 1.0
    scores, _ = numpy_pca(x32, 3)
    signs = np.sign([np.corrcoef(rgb.values[:, i], scores[:, i])[0, 1] for i in range(3)])
    scores = scores * signs
    lo, hi = np.percentile(scores, [1, 99], axis=0)
    np.testing.assert_allclose(rgb.values, np.clip((scores - lo) / (hi - lo), 0, 1), atol=1e-3)


def test_on_real_embeddings_clusters_and_grid_line_up(embedded_cohort):
    ds = tilestore.open_embeddings(embedded_cohort, "efficientnet-lite0")
    clusters = ds.tiles.kmeans(3, pcs=8)
    grid = ds.tiles.grid(clusters, slide="CMU-1-Small-Region")
    cmu = ds.tiles.slide("CMU-1-Small-Region")
    x, y = cmu["x"].values, cmu["y"].values
    ix = np.searchsorted(grid.x.values, x)
    iy = np.searchsorted(grid.y.values, y)
    np.testing.assert_array_equal(grid.x.values[ix], x)
    np.testing.assert_array_equal(grid.values[iy, ix], clusters.values[: len(x)])
    # the IHC slide's tiles are unlike any H&E tile: a query from it finds its own slide
    ihc_tile = len(x)
    hits = ds.tiles.nearest(ihc_tile, k=2)
    assert set(hits["slide"].values[0]) == {"skimage_ihc"}
