"""Tiles out to QuPath: GeoJSON tile objects over the original slide, classified (clusters,
or any classes) and with measurements (PCs, tissue and ROI fractions, any per-tile value).

Written under a temporary name and renamed when whole (`tilestore.exports.files`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import numpy as np

from tilestore.analysis.options import PCS, OptionalClusters, OptionalComponents
from tilestore.exports.files import Exported, write_whole
from tilestore.exports.options import Model, PlanName, Store
from tilestore.exports.tiles import analyse_tiles
from tilestore.options import Opt, checked

if TYPE_CHECKING:  # xarray and the plots load when a file is written
    import xarray as xr


def to_qupath(
    ds: xr.Dataset,
    path: str | os.PathLike,
    *,
    clusters: xr.DataArray | None = None,
    measurements: xr.DataArray | None = None,
    slide: str | None = None,
    class_names: list[str] | None = None,
) -> Path:
    """Write one slide's tiles as QuPath GeoJSON tile objects; return the path.

    Each tile is a square over its footprint in level-0 pixels (which are the original
    slide's pixels, so QuPath shows them in place over the source file). clusters: the
    ``classification`` ("Cluster k", or `class_names[k]`; coloured as in our plots).
    measurements: a (tile, m)
    DataArray, e.g. ``ds.tiles.pca(5)``, stored as QuPath measurements named after its
    second coordinate; tissue and ROI fractions are always included.
    """
    from tilestore.analysis.plots import cluster_colors

    meta, keep = ds.tiles.positions(slide)
    sub = ds.isel(tile=keep)
    x, y = np.asarray(sub["x"], np.float64), np.asarray(sub["y"], np.float64)
    fh, fw = meta["footprint0"]
    columns: dict[str, np.ndarray] = {
        "tissue": np.asarray(sub["tissue"]),
        "roi": np.asarray(sub["roi"]),
    }
    if measurements is not None:
        values = np.asarray(measurements.isel(tile=keep), dtype=np.float64)
        names = [str(v) for v in measurements[measurements.dims[1]].values]
        columns.update({n: values[:, i] for i, n in enumerate(names)})
    labels = None
    if clusters is not None:
        labels = np.asarray(clusters.isel(tile=keep)).astype(int)
        colours = np.rint(cluster_colors(int(np.asarray(clusters).max()) + 1) * 255).astype(int)
    features = []
    for i in range(len(x)):
        ring = [[x[i], y[i]], [x[i] + fw, y[i]], [x[i] + fw, y[i] + fh], [x[i], y[i] + fh]]
        props: dict = {
            "objectType": "tile",
            "measurements": {k: _number(v[i]) for k, v in columns.items()},
        }
        if labels is not None:
            props["classification"] = {
                "name": class_names[labels[i]] if class_names else f"Cluster {labels[i]}",
                "color": colours[labels[i]].tolist(),
            }
        features.append(
            {
                "type": "Feature",
                "geometry": {"type": "Polygon", "coordinates": [[*ring, ring[0]]]},
                "properties": props,
            }
        )
    doc = {"type": "FeatureCollection", "features": features}
    return write_whole(path, lambda tmp: tmp.write_text(json.dumps(doc), encoding="utf-8"))


@checked
def export_qupath(
    store: Store,
    *,
    model: Model,
    clusters: OptionalClusters = None,
    pcs: OptionalComponents = PCS,
    output: Annotated[
        Path | None,
        Opt("GeoJSON file.", none="<slide>.<model>.geojson here", short="o", writes="file"),
    ] = None,
    plan: PlanName = None,
) -> Exported:
    """`tilestore export qupath`: the store analysed (`analyse_tiles`: clusters, PCs as
    measurements), `to_qupath`, and a line.

    In QuPath: File > Import objects from file, over the ORIGINAL slide (same pixels).
    """
    from tilestore.embeddings.layout import model_folder

    found = analyse_tiles([store], model, clusters=clusters, pcs=pcs, components=True,
                          plan=plan)  # fmt: skip
    ds = found.ds
    name = ds.tiles.slides[0]
    target = output or Path(f"{name}.{model_folder(model).split('/')[-1]}.geojson")
    to_qupath(ds, target, clusters=found.clusters, measurements=found.components)
    return Exported((f"{name}: {ds.sizes['tile']} tiles -> {target}",))


def _number(value) -> float | None:
    value = float(value)
    return value if np.isfinite(value) else None
