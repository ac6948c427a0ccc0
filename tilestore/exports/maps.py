"""A slide's embeddings out as pictures: the first three principal components as colours over
its thumbnail and, given clusters, the clusters as a map and a gallery of their most typical
tiles (PNG files, drawn by `tilestore.analysis.plots`).
"""

from __future__ import annotations

import os
from pathlib import Path

import xarray as xr

from tilestore.analysis.plots import plot_gallery, plot_map


def write_maps(
    ds: xr.Dataset, path: str | os.PathLike, *, clusters: xr.DataArray | None = None
) -> list[Path]:
    """Write the PCA colour map of one slide's tiles at `path` and, with `clusters` (e.g.
    ``ds.tiles.kmeans(6)``), ``<path stem>-clusters.png`` and ``-gallery.png``; return the
    files written."""
    path = Path(path)
    plot_map(ds, ds.tiles.rgb_map(), path=path, title=f"{ds.tiles.slides[0]}: PC1-3 as RGB")
    written = [path]
    if clusters is not None:
        stem = path.with_suffix("")
        for kind, plot in (("clusters", plot_map), ("gallery", plot_gallery)):
            target = Path(f"{stem}-{kind}.png")
            plot(ds, clusters, path=target)
            written.append(target)
    return written
