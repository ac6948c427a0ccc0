"""Heatmaps out, for other tools: any per-tile values the viewer draws (a column, clusters,
the similarity to one tile, or the user's own scores) as a PNG over the slide, as an
OME-Zarr label image in the store (napari, and any OME-Zarr viewer, show it beside the
slide) and as QuPath GeoJSON tiles with the value as a measurement.

>>> values = heatmap_values("A.ome.zarr", "uni", "similarity", ref=1234)
>>> write_png(values, "A-similar.png"); write_labels(values); write_geojson(values, "A.geojson")
>>> write_heatmap(values, png="A-similar.png", label=True)   # those asked for, in that order
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tilestore.analysis.options import CLUSTERS, Clusters
from tilestore.errors import ViewError
from tilestore.options import checked
from tilestore.reading.opening import open_slide
from tilestore.reading.slide import Slide
from tilestore.view.catalog import Catalog
from tilestore.view.options import TileIndex
from tilestore.view.overlays import scale_rgba
from tilestore.view.values import (
    TileValues,
    match_scores,
    read_scores,
    tile_at,
    tile_values,
    value_range,
)

LEVELS = 254  # a scalar heatmap's label values 1-254 (0: no tile)


@dataclass(frozen=True)
class Heatmap:
    """One slide's per-tile values, ready to write: the values, the slide, the model's
    embeddings of it (`ds`, one slide), a name for what they are and the store, as given."""

    values: TileValues
    slide: Slide
    ds: object  # the slide's embeddings Dataset
    name: str
    store: str


@checked
def heatmap_values(
    store: str | os.PathLike,
    model: str,
    column: str,
    *,
    k: Clusters = CLUSTERS,
    ref: TileIndex = None,
    at: tuple[float, float] | None = None,
    scores: str | os.PathLike | None = None,
) -> Heatmap:
    """A store's per-tile values of `column` for `model`: a numeric or class column, "pca"
    (as colours, PNG only), "clusters" (k), "similarity" to tile `ref` or to the tile under
    level-0 point `at`, or, with `scores` (Parquet/CSV of tile or x, y -> score), the user's
    scores named by `column` (default "score")."""
    slide = open_slide(store)
    catalog = Catalog([slide], [str(store)], [str(store)])
    if scores is not None:
        table = read_scores(scores, None if column == "scores" else column)
        base = tile_values(catalog, model, 0, "tissue")
        found = match_scores(base, table, str(scores))
        values = tile_values(catalog, model, 0, "scores", scores=found)
        name = f"scores-{Path(scores).stem}"
    else:
        if column == "similarity" and ref is None:
            if at is None:
                raise ViewError("similarity: to which tile? give ref=<tile> or at=(x, y)")
            ref = tile_at(catalog, model, 0, *at)
        values = tile_values(catalog, model, 0, column, k=k, ref=ref)
        name = {"similarity": f"similarity-tile{ref}", "clusters": f"clusters-{k}"}.get(
            column, column
        )
    ds = catalog.embedded(model).ds
    return Heatmap(values, slide, ds, f"{_safe(model)}-{_safe(name)}", str(store))


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)


def write_png(heatmap: Heatmap, path: str | os.PathLike, max_size: int = 1600) -> Path:
    """The values over the slide's thumbnail, with their colour bar or legend."""
    from io import BytesIO

    from matplotlib.colors import Normalize
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch
    from PIL import Image

    from tilestore.analysis.preview import thumbnail

    values, slide = heatmap.values, heatmap.slide
    overlay = values.overlay()
    _, h0, w0 = slide.shape
    pixels, _ = thumbnail(slide, max_size)
    cells = np.asarray(Image.open(BytesIO(overlay.png)).convert("RGBA"))
    fig = Figure(figsize=(8, 8 * h0 / w0 + 0.8), layout="constrained")
    ax = fig.add_subplot()
    ax.imshow(pixels, extent=(0, w0, h0, 0))
    ax.imshow(cells, extent=(0, overlay.extent[0], overlay.extent[1], 0), interpolation="nearest")
    ax.set_xlim(0, w0)
    ax.set_ylim(h0, 0)
    ax.set_title(f"{slide.name}: {values.label}")
    legend = overlay.legend
    if legend.get("kind") == "scale":
        from matplotlib import colormaps
        from matplotlib.cm import ScalarMappable

        mappable = ScalarMappable(Normalize(legend["min"], legend["max"]), colormaps["viridis"])
        fig.colorbar(mappable, ax=ax, label=values.label, shrink=0.6)
    elif legend.get("kind") == "classes":
        ax.legend(
            handles=[
                Patch(color=np.array(i["rgba"][:3]) / 255, label=f"{i['name']} ({i['count']})")
                for i in legend["items"]
            ],
            loc="upper left",
            bbox_to_anchor=(1.01, 1),
            fontsize="small",
        )
    path = Path(path)
    tmp = path.with_name(f".{path.name}.partial")
    fig.savefig(tmp, dpi=120, format="png")
    tmp.replace(path)
    return path


def write_labels(heatmap: Heatmap) -> str:
    """The values as an OME-Zarr label image in the store (`labels/heatmap-...`), one label
    pixel per grid cell: a scalar quantised to 1-254 (0: no tile; each value's number in the
    label's properties), classes as 1..k with their names. Returns the label's name."""
    from tilestore.reading.labels import write_label

    values = heatmap.values
    grid = values.grid
    label = np.zeros(grid.shape, np.uint8)
    if values.scalar is not None:
        vmin, vmax = values.bounds or value_range(values.scalar)
        span = vmax - vmin if vmax > vmin else 1.0
        finite = np.isfinite(values.scalar)
        level = 1 + np.rint(np.clip((values.scalar - vmin) / span, 0, 1) * (LEVELS - 1))
        label[values.rows[finite], values.cols[finite]] = level[finite].astype(np.uint8)
        steps = vmin + np.arange(LEVELS) / (LEVELS - 1) * span
        colours = scale_rgba(steps, vmin, vmax, alpha=220)
        classes = [("no tile", (0, 0, 0, 0))] + [
            (f"{v:.6g}", tuple(int(c) for c in rgba))
            for v, rgba in zip(steps, colours, strict=True)
        ]
        facts = {"min": vmin, "max": vmax, "levels": LEVELS}
    elif values.classes is not None:
        label[values.rows, values.cols] = values.classes.astype(np.uint8) + 1
        classes = [("no tile", (0, 0, 0, 0))] + [
            (n, tuple(int(v) for v in c)) for n, c in zip(values.names, values.colours, strict=True)
        ]
        facts = {}
    else:
        raise ViewError(f"{values.label}: colours, not values: a label image needs values")
    name = f"heatmap-{heatmap.name}"
    write_label(
        heatmap.slide,
        name,
        label,
        grid.stride,
        classes,
        {"values": values.label, "model": heatmap.ds.attrs["model"], **facts},
        "tile grid",
    )
    return name


def write_geojson(heatmap: Heatmap, path: str | os.PathLike) -> Path:
    """The tiles as QuPath tile objects: a scalar as a measurement named after it, classes
    as their classification."""
    import xarray as xr

    from tilestore.exports.qupath import to_qupath

    values = heatmap.values
    n = len(values.rows)
    if values.scalar is not None:
        measure = xr.DataArray(
            values.scalar[:, None],
            dims=("tile", "measurement"),
            coords={"measurement": [_safe(values.label)]},
        )
        return to_qupath(heatmap.ds, path, measurements=measure)
    if values.classes is not None:
        labels = xr.DataArray(values.classes.astype(np.int64), dims=("tile",))
        return to_qupath(heatmap.ds, path, clusters=labels, class_names=list(values.names))
    raise ViewError(f"{values.label}: colours, not values, for {n} tiles: no GeoJSON of them")


def write_heatmap(
    heatmap: Heatmap,
    *,
    png: str | os.PathLike | None = None,
    geojson: str | os.PathLike | None = None,
    label: bool = False,
) -> list[str]:
    """Write `heatmap` in each form asked: a PNG over the slide at `png`, QuPath GeoJSON at
    `geojson`, and with `label` an OME-Zarr label image in its store; return what was
    written, in that order (the label as ``<store>/labels/<name>``)."""
    written = []
    if png:
        written.append(str(write_png(heatmap, png)))
    if geojson:
        written.append(str(write_geojson(heatmap, geojson)))
    if label:
        written.append(f"{heatmap.store}/labels/{write_labels(heatmap)}")
    return written
