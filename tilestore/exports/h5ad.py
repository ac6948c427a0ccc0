"""Tiles out to scanpy and squidpy: an AnnData .h5ad, X the features, obs the tile table,
obsm["spatial"] each tile's centre, and (optionally) each slide's thumbnail where squidpy
looks for it.

Written under a temporary name and renamed when whole (`tilestore.exports.files`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import numpy as np

from tilestore.analysis.options import PCS, OptionalClusters, OptionalComponents
from tilestore.embeddings.recipe import ScaleLabel
from tilestore.errors import AnalysisError
from tilestore.exports.files import Exported, write_whole
from tilestore.exports.options import Model, PlanName, SkipMissing, Stores
from tilestore.exports.tiles import analyse_tiles
from tilestore.options import Opt, checked

if TYPE_CHECKING:  # xarray loads with the embeddings
    import xarray as xr


def to_anndata(
    ds: xr.Dataset,
    path: str | os.PathLike,
    *,
    obs: dict[str, xr.DataArray] | None = None,
    images: bool = True,
    max_size: int = 2000,
) -> Path:
    """Write the tiles as an AnnData .h5ad: X = features, obs = tile table; return the path.

    `obsm["spatial"]` holds each tile's centre in level-0 pixels; with `images`,
    `uns["spatial"][slide]` holds a thumbnail and the scale factors squidpy expects
    (``sq.pl.spatial_scatter(adata, library_key="slide", library_id=...)``). obs: extra
    per-tile columns, e.g. {"cluster": ds.tiles.kmeans(8)}.
    """
    import anndata
    import pandas as pd

    from tilestore.analysis.preview import thumbnail
    from tilestore.reading.opening import open_slide

    table = {
        name: np.asarray(ds[name])
        for name in ("slide", "x", "y", "x_um", "y_um", "row", "col", "tissue", "roi", "roi_class")
    }
    for name, values in (obs or {}).items():
        if values.sizes.get("tile") != ds.sizes["tile"]:
            raise AnalysisError(f"to_anndata: obs[{name!r}] is not one value per tile")
        table[name] = np.asarray(values)
    frame = pd.DataFrame(table, index=[f"{s}:{i}" for i, s in enumerate(table["slide"])])
    for name in ("slide", "roi_class"):
        frame[name] = frame[name].astype("category")
    slides = {m["name"]: m for m in ds.attrs["slides"]}
    half = np.array(
        [
            [slides[s]["footprint0"][1] / 2, slides[s]["footprint0"][0] / 2]
            for s in frame["slide"].cat.categories
        ]
    )
    centre = np.stack([table["x"], table["y"]], axis=1) + half[frame["slide"].cat.codes]
    uns: dict = {
        "tilestore": {"model": ds.attrs.get("model"), "slides": json.dumps(list(slides.values()))}
    }
    if images:
        uns["spatial"] = {}
        for name in frame["slide"].cat.categories:
            meta = slides[name]
            slide = open_slide(meta["store"])
            pixels, _ = thumbnail(slide, max_size)
            uns["spatial"][name] = {
                "images": {"lowres": pixels},
                "scalefactors": {
                    "tissue_lowres_scalef": pixels.shape[1] / slide.shape[2],
                    "spot_diameter_fullres": float(meta["footprint0"][1]),
                },
                "metadata": {"store": meta["store"], "mpp": meta["mpp"] or float("nan")},
            }
    adata = anndata.AnnData(
        X=np.asarray(ds["features"], dtype=np.float32),
        obs=frame,
        obsm={"spatial": centre.astype(np.float64)},
        uns=uns,
    )
    return write_whole(path, lambda tmp: adata.write_h5ad(tmp))


@checked
def export_anndata(
    stores: Stores,
    *,
    model: Model,
    output: Annotated[Path, Opt("The .h5ad file to write.", short="o", writes="file")],
    clusters: OptionalClusters = None,
    pcs: OptionalComponents = PCS,
    images: Annotated[bool, Opt("Store thumbnails for squidpy in uns['spatial'].")] = True,
    skip_missing: SkipMissing = False,
    scale: ScaleLabel = None,
    plan: PlanName = None,
) -> Exported:
    """`tilestore export anndata`: the stores analysed as one cohort (`analyse_tiles`),
    `to_anndata` with the clusters as obs, and a line."""
    found = analyse_tiles(stores, model, clusters=clusters, pcs=pcs, skip_missing=skip_missing,
                          scale=scale, plan=plan)  # fmt: skip
    ds = found.ds
    obs = {"cluster": found.clusters} if found.clusters is not None else None
    to_anndata(ds, output, obs=obs, images=images)
    return Exported((f"{len(ds.tiles.slides)} slide(s), {ds.sizes['tile']} tiles -> {output}",))
