"""A slide's embeddings out as pictures: the first three principal components as colours over
its thumbnail and, given clusters, the clusters as a map and a gallery of their most typical
tiles (PNG files, drawn by `tilestore.analysis.plots`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

from tilestore.analysis.options import MAX_CLUSTERS, PCS, OptionalComponents
from tilestore.exports.files import Exported
from tilestore.exports.options import Model, PlanName, Store
from tilestore.exports.tiles import analyse_tiles
from tilestore.options import Opt, checked

if TYPE_CHECKING:  # xarray and matplotlib load when a map is drawn
    import xarray as xr


def write_maps(
    ds: xr.Dataset, path: str | os.PathLike, *, clusters: xr.DataArray | None = None
) -> list[Path]:
    """Write the PCA colour map of one slide's tiles at `path` and, with `clusters` (e.g.
    ``ds.tiles.kmeans(6)``), ``<path stem>-clusters.png`` and ``-gallery.png``; return the
    files written."""
    from tilestore.analysis.plots import plot_gallery, plot_map

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


@checked
def export_map(
    store: Store,
    *,
    model: Model,
    output: Annotated[Path, Opt("PNG of the PCA colour map.", short="o", writes="file")],
    clusters: Annotated[
        int | None,
        Opt(
            "Also write <output>-clusters.png and -gallery.png with k clusters.",
            low=2,
            high=MAX_CLUSTERS,
            none="none",
        ),
    ] = None,
    pcs: OptionalComponents = PCS,
    plan: PlanName = None,
) -> Exported:
    """`tilestore export map`: the store analysed (`analyse_tiles`), `write_maps`, and the
    files written on one line."""
    found = analyse_tiles([store], model, clusters=clusters, pcs=pcs, plan=plan)
    written = write_maps(found.ds, output, clusters=found.clusters)
    return Exported((" ".join(map(str, written)),))
