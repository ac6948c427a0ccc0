"""Tiles out to QuPath: GeoJSON tile objects over the original slide, classified (clusters,
or any classes) and with measurements (PCs, tissue and ROI fractions, any per-tile value).

Written under a temporary name and renamed when whole (`tilestore.exports.files`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import xarray as xr

from tilestore.analysis.plots import cluster_colors
from tilestore.exports.files import write_whole


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


def _number(value) -> float | None:
    value = float(value)
    return value if np.isfinite(value) else None
