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
from typing import TYPE_CHECKING, Annotated

import numpy as np

from tilestore.analysis.options import CLUSTERS, Clusters
from tilestore.errors import OptionError, ViewError
from tilestore.exports.files import Exported
from tilestore.exports.options import Model, Store
from tilestore.options import Opt, checked
from tilestore.view.options import TileIndex

if TYPE_CHECKING:  # the viewer's values and the slide load when a heatmap is made
    from tilestore.reading.slide import Slide
    from tilestore.view.values import TileValues

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
    from tilestore.reading.opening import open_slide
    from tilestore.view.catalog import Catalog
    from tilestore.view.values import match_scores, read_scores, tile_at, tile_values

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
    from tilestore.view.overlays import scale_rgba
    from tilestore.view.values import value_range

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


@checked
def export_heatmap(
    store: Store,
    *,
    model: Model,
    column: Annotated[
        str,
        Opt(
            "A per-tile column (tissue, roi, qc_<artefact>, roi_class...), clusters, "
            "similarity (with --tile or --at), or with --scores the score column to read."
        ),
    ] = "score",
    tile: TileIndex = None,
    at: Annotated[
        str | None, Opt("similarity: to the tile under level-0 X,Y.", metavar="X,Y")
    ] = None,
    k: Clusters = CLUSTERS,
    scores: Annotated[
        Path | None,
        Opt(
            "Your own scores: Parquet or CSV with 'tile' (or 'x', 'y' level-0 px) and the "
            "score column."
        ),
    ] = None,
    png: Annotated[Path | None, Opt("Write the heatmap over the slide.", writes="file")] = None,
    geojson: Annotated[
        Path | None,
        Opt("Write QuPath tile objects with the value as a measurement.", writes="file"),
    ] = None,
    label: Annotated[bool, Opt("Write it into the store as an OME-Zarr label image.")] = False,
) -> Exported:
    """`tilestore export heatmap`: `heatmap_values`, `write_heatmap` in each form asked, and
    a line; refused before any store is read where no form or no values are asked for."""
    if not (png or geojson or label):
        raise OptionError("give at least one of png=<file>, geojson=<file>, label=True")
    if scores is None and column == "score":
        raise OptionError(
            "column='score' names no values: give a per-tile column, clusters or similarity, "
            "or scores=<file>"
        )
    point = None
    if at is not None:
        try:
            point = tuple(float(v) for v in at.split(","))
        except ValueError:
            point = ()
        if len(point) != 2:
            raise OptionError(f"at={at!r}: two numbers, X,Y in level-0 px")
    found = heatmap_values(store, model, column, k=k, ref=tile, at=point, scores=scores)
    written = write_heatmap(found, png=png, geojson=geojson, label=label)
    return Exported(
        (f"{found.values.label}: {len(found.values.rows)} tiles -> " + ", ".join(written),)
    )
