"""Embeddings out to other tools: QuPath GeoJSON tiles and AnnData (.h5ad) for scanpy/squidpy.

Both write to a temporary name beside the target and rename when done, so a failed export
never leaves a file that looks whole.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import xarray as xr

from tilestore.analysis.accessor import AnalysisError
from tilestore.analysis.plots import cluster_colors
from tilestore.analysis.preview import thumbnail
from tilestore.reading.opening import open_slide


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
    return _write(path, lambda tmp: tmp.write_text(json.dumps(doc), encoding="utf-8"))


def to_anndata(
    ds: xr.Dataset,
    path: str | os.PathLike,
    *,
    obs: dict[str, xr.DataArray] | None = None,
    images: bool = True,
    max_size: int = 2000,
) -> Path:
    """Write the tiles as an AnnData .h5ad: X = features, obs = tile table; return the path.

    obsm["spatial"] holds each tile's centre in level-0 pixels; with `images`,
    uns["spatial"][slide] holds a thumbnail and the scale factors squidpy expects
    (``sq.pl.spatial_scatter(adata, library_key="slide", library_id=...)``). obs: extra
    per-tile columns, e.g. {"cluster": ds.tiles.kmeans(8)}.
    """
    import anndata
    import pandas as pd

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
    return _write(path, lambda tmp: adata.write_h5ad(tmp))


def _number(value) -> float | None:
    value = float(value)
    return value if np.isfinite(value) else None


def _write(path: str | os.PathLike, write) -> Path:
    path = Path(path)
    tmp = path.with_name(f".partial-{path.name}")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
