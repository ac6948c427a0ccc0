"""Pictures of embeddings: a map of per-tile values over the slide, and tile galleries.

Both return a matplotlib Figure (shown inline by Jupyter) and, given a path, save a PNG.
Figures are made without pyplot, so nothing here touches matplotlib's global state.

>>> plot_map(ds, ds.tiles.rgb_map(), path="pca.png")       # PCA colours over the slide
>>> clusters = ds.tiles.kmeans(6, pcs=8)
>>> plot_map(ds, clusters, path="clusters.png"); plot_gallery(ds, clusters, path="g.png")
>>> plot_hits(ds, ds.tiles.nearest(42, k=8))             # a query tile and its matches
"""

from __future__ import annotations

import io
import os

import dask.array as da
import numpy as np
import xarray as xr

from tilestore.analysis.preview import thumbnail
from tilestore.errors import AnalysisError
from tilestore.reading.opening import open_slide
from tilestore.reading.slide import resize


def _figure(**kwargs):
    """A matplotlib Figure that shows itself inline in Jupyter: made without pyplot (no
    global figure state, no GUI backend), a bare Figure has no display of its own there."""
    from matplotlib.figure import Figure

    class InlineFigure(Figure):
        def _repr_png_(self) -> bytes:
            buffer = io.BytesIO()
            self.savefig(buffer, format="png", dpi=100)
            return buffer.getvalue()

    return InlineFigure(**kwargs)


def cluster_colors(k: int) -> np.ndarray:
    """Return k distinct RGB colours in [0, 1] (tab10, then tab20 for more clusters)."""
    from matplotlib import colormaps

    cmap = colormaps["tab10" if k <= 10 else "tab20"]
    return np.array([cmap(i % cmap.N)[:3] for i in range(k)])


def plot_map(
    ds: xr.Dataset,
    values: xr.DataArray,
    *,
    slide: str | None = None,
    alpha: float = 0.6,
    max_size: int = 1600,
    title: str | None = None,
    path: str | os.PathLike | None = None,
):
    """Return a Figure of the slide's thumbnail with each tile's value drawn over its footprint.

    values: (tile, rgb) colours in [0, 1] (``ds.tiles.rgb_map()``), integer clusters
    (``ds.tiles.kmeans(k)``, one colour each, with a legend) or any 1-D float (viridis).
    Each cell is drawn centred on its tile, one grid stride wide, so with a stride equal
    to the tile size the cells are exactly the tiles' footprints.
    """
    from matplotlib.patches import Patch

    grid = ds.tiles.grid(values, slide=slide)
    rgba, legend = _colours(grid, values)
    store = open_slide(grid.attrs["store"])
    pixels, _ = thumbnail(store, max_size)
    _, h0, w0 = store.shape
    (fy, fx), (sy, sx) = grid.attrs["footprint0"], grid.attrs["stride0"]
    left = float(grid.x[0]) + (fx - sx) / 2
    top = float(grid.y[0]) + (fy - sy) / 2
    extent = (left, left + grid.sizes["x"] * sx, top + grid.sizes["y"] * sy, top)

    fig = _figure(figsize=(8, 8 * h0 / w0 + 0.6), layout="constrained")
    ax = fig.add_subplot()
    ax.imshow(pixels, extent=(0, w0, h0, 0))
    rgba[..., 3] *= alpha
    ax.imshow(rgba, extent=extent, interpolation="nearest")
    ax.set_xlim(0, w0)
    ax.set_ylim(h0, 0)
    ax.set_xlabel("x (level-0 px)")
    ax.set_ylabel("y (level-0 px)")
    ax.set_title(title or f"{grid.attrs['slide']}: {values.name or 'values'}")
    if legend:
        ax.legend(
            handles=[Patch(color=c, label=label) for label, c in legend],
            loc="upper left",
            bbox_to_anchor=(1.01, 1),
            fontsize="small",
        )
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig


def plot_gallery(
    ds: xr.Dataset,
    clusters: xr.DataArray,
    *,
    n: int = 8,
    size: int = 96,
    path: str | os.PathLike | None = None,
):
    """Return a Figure with a row of `n` tiles per cluster, the ones nearest its centre.

    With ``centers`` in the clusters' attrs (``ds.tiles.kmeans``) the most typical tiles are
    shown; otherwise the first of each cluster. Tiles are read from their stores at the
    plan's resolution, so the gallery is what the model saw.
    """
    labels = np.asarray(clusters)
    ks = np.unique(labels)
    picks = _typical(ds, clusters, labels, ks, n)
    colours = cluster_colors(int(ks.max()) + 1)
    return _tile_rows(
        ds,
        picks,
        [f"cluster {k}\n({int((labels == k).sum())})" for k in ks],
        [colours[k] for k in ks],
        n,
        size,
        path,
    )


def plot_hits(
    ds: xr.Dataset,
    hits: xr.Dataset,
    *,
    size: int = 96,
    path: str | os.PathLike | None = None,
):
    """Return a Figure of ``ds.tiles.nearest`` results: a row per query, best match first."""
    tiles = np.asarray(hits["tile"])
    similarity = np.asarray(hits["similarity"])
    fig = _tile_rows(
        ds,
        list(tiles),
        [f"query {q}" for q in range(len(tiles))],
        [None] * len(tiles),
        tiles.shape[1],
        size,
        None,
    )
    names = np.asarray(hits["slide"])
    for ax, sim, name in zip(fig.axes, similarity.ravel(), names.ravel(), strict=True):
        ax.set_title(f"{name[:14]}\n{sim:.3f}", fontsize="x-small")
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig


def _tile_rows(ds, picks, labels, colours, n, size, path):
    """A Figure with one row of tile images per entry of picks (tile positions in ds)."""
    fig = _figure(figsize=(n * 1.1, len(picks) * 1.25), layout="constrained")
    axes = fig.subplots(len(picks), n, squeeze=False)
    slides = {m["name"]: m for m in ds.attrs["slides"]}
    x, y, names = (np.asarray(ds[c]) for c in ("x", "y", "slide"))
    opened: dict[str, object] = {}
    for r, row in enumerate(picks):
        for c in range(n):
            ax = axes[r, c]
            ax.set_xticks([])
            ax.set_yticks([])
            if c < len(row):
                meta = slides[names[row[c]]]
                if meta["name"] not in opened:
                    opened[meta["name"]] = open_slide(meta["store"])
                t = row[c]
                ax.imshow(_tile(opened[meta["name"]], meta, int(x[t]), int(y[t]), size))
            if colours[r] is not None:
                for spine in ax.spines.values():
                    spine.set_color(colours[r])
                    spine.set_linewidth(3)
        axes[r, 0].set_ylabel(labels[r], fontsize="small")
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig


def _colours(grid: xr.DataArray, values: xr.DataArray):
    """RGBA cells for a grid, and legend entries for categorical values."""
    data = grid.values
    if data.ndim == 3:
        if data.shape[2] != 3:
            raise AnalysisError("plot_map: 2-D values must be (tile, 3) colours")
        rgba = np.concatenate([np.nan_to_num(data), np.isfinite(data[..., :1])], axis=2)
        return rgba.astype(np.float32), None
    present = np.isfinite(data)
    if np.issubdtype(values.dtype, np.integer):
        k = int(np.nanmax(data)) + 1
        colours = cluster_colors(k)
        rgb = colours[np.where(present, data, 0).astype(int)]
        counts = np.bincount(data[present].astype(int), minlength=k)  # this slide's tiles
        legend = [(f"cluster {i} ({counts[i]})", colours[i]) for i in range(k) if counts[i]]
    else:
        from matplotlib import colormaps

        lo, hi = np.nanpercentile(data, [1, 99])
        rgb = colormaps["viridis"](np.clip((data - lo) / (hi - lo or 1), 0, 1))[..., :3]
        legend = None
    return np.concatenate([rgb, present[..., None]], axis=2).astype(np.float32), legend


def _typical(ds, clusters, labels, ks, n) -> list[np.ndarray]:
    """Per cluster, the (up to) n tiles nearest its centre, in the space it was fitted in."""
    attrs = clusters.attrs
    if attrs.get("centers") is None:
        return [np.flatnonzero(labels == k)[:n] for k in ks]
    features = ds.tiles._features()
    label_blocks = da.from_array(labels, chunks=(features.chunks[0],))
    distance = da.map_blocks(
        _distance_to_centre,
        features,
        label_blocks[:, None],
        attrs["centers"],
        attrs.get("pca_components"),
        attrs.get("pca_mean"),
        drop_axis=1,
        dtype=np.float32,
    ).compute()
    picks = []
    for k in ks:
        members = np.flatnonzero(labels == k)
        picks.append(members[np.argsort(distance[members], kind="stable")[:n]])
    return picks


def _distance_to_centre(block, labels, centers, components, mean) -> np.ndarray:
    block = block.astype(np.float32)
    if components is not None:
        block = (block - mean) @ components.T
    return np.linalg.norm(block - centers[labels[:, 0]], axis=1)


def _tile(slide, meta: dict, x: int, y: int, size: int) -> np.ndarray:
    read = round(meta["footprint0"][1] / slide.levels[meta["level"]].downsample[1])
    pixels = slide.read_region(x, y, read, read, level=meta["level"])
    return resize(pixels[..., :3], size, size)
