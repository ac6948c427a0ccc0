"""Overlays as pictures over a slide: each a transparent PNG, the level-0 extent it covers
from the slide's top-left corner, and its legend.

Label images (tissue, QC classes) are drawn from the store's `labels/`, one pixel per label
pixel. Per-tile values (a plan's cells kept or left out and why, an embeddings column, PCA
colours, clusters, a similarity) are drawn on the plan's tile grid, one cell per grid
position, each cell repeated a whole number of times so the browser's smoothing blurs only
cell edges. Pure numpy to PNG: the server and `export heatmap` draw with the same functions.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from tilestore.errors import ViewError
from tilestore.masks.tissue import read_tissue
from tilestore.plan.grid import TilePlan, tissue_fractions
from tilestore.qc.classes import ARTEFACTS
from tilestore.qc.store import read_qc
from tilestore.reading.slide import Slide

MAX_SIDE = 4096  # px: a grid overlay's cells are repeated up to this side (16 at most)
TISSUE_RGBA = (0, 200, 80, 150)
COLORMAP = "viridis"


@dataclass(frozen=True)
class Overlay:
    """A transparent picture over the slide: `extent` is the (w, h) in level-0 pixels it
    covers from (0, 0); `legend` says what its colours mean."""

    png: bytes
    extent: tuple[float, float]
    legend: dict[str, Any] = field(default_factory=dict)


def png(rgba: np.ndarray) -> bytes:
    """(h, w, 4) uint8 as PNG (fast compression: these are made per request)."""
    out = io.BytesIO()
    Image.fromarray(rgba, "RGBA").save(out, "PNG", compress_level=1)
    return out.getvalue()


def classes_legend(items: list[tuple[str, tuple[int, ...], int]], total: int) -> dict[str, Any]:
    """A legend of classes: name, colour and share of the cells (or pixels) counted."""
    return {
        "kind": "classes",
        "items": [
            {"name": n, "rgba": list(c), "count": int(k), "share": k / total if total else 0.0}
            for n, c, k in items
        ],
    }


def tissue_overlay(slide: Slide) -> Overlay:
    tissue = read_tissue(slide)
    if tissue is None:
        raise ViewError(f"{slide.name}: no tissue mask stored (run `tilestore tissue`)")
    mask = tissue.mask
    rgba = np.zeros((*mask.shape, 4), np.uint8)
    rgba[mask] = TISSUE_RGBA
    dy, dx = tissue.downsample
    legend = classes_legend([("tissue", TISSUE_RGBA, int(mask.sum()))], mask.size)
    legend["note"] = f"{tissue.method}, {tissue.polarity}"
    return Overlay(png(rgba), (mask.shape[1] * dx, mask.shape[0] * dy), legend)


def qc_overlay(slide: Slide) -> Overlay:
    qc = read_qc(slide)
    if qc is None:
        raise ViewError(f"{slide.name}: no QC maps stored (run `tilestore qc`)")
    lut = np.zeros((256, 4), np.uint8)
    items = []
    for value, name in enumerate(qc.classes, start=1):
        colour = ARTEFACTS[name].rgba if name in ARTEFACTS else (255, 0, 0, 160)
        lut[value] = colour
        items.append((name, colour, int((qc.label == value).sum())))
    dy, dx = qc.downsample
    flagged = classes_legend(items, int((qc.label > 0).sum()) or 1)
    return Overlay(png(lut[qc.label]), (qc.label.shape[1] * dx, qc.label.shape[0] * dy), flagged)


def roi_overlay(slide: Slide, path: str) -> Overlay:
    """The ROI polygons of an annotation file (QuPath GeoJSON, Aperio or ASAP XML, in level-0
    pixels), each class its colour: filled lightly, outlined."""
    from PIL import ImageDraw

    from tilestore.analysis.plots import cluster_colors
    from tilestore.plan.annotations import load_annotations

    _, h0, w0 = slide.shape
    rois = load_annotations(path, size=(w0, h0))
    scale = min(1.0, MAX_SIDE / max(h0, w0))
    size = (max(1, round(w0 * scale)), max(1, round(h0 * scale)))
    names = rois.class_names
    colours = np.rint(cluster_colors(max(1, len(names))) * 255).astype(int)
    fill = Image.new("RGBA", size, (0, 0, 0, 0))
    lines = Image.new("RGBA", size, (0, 0, 0, 0))
    draw_fill, draw_lines = ImageDraw.Draw(fill), ImageDraw.Draw(lines)
    for geometry, name in zip(rois.geometries, rois.classes, strict=True):
        r, g, b = colours[names.index(name)]
        for polygon in getattr(geometry, "geoms", [geometry]):
            ring = [(x * scale, y * scale) for x, y in polygon.exterior.coords]
            draw_fill.polygon(ring, fill=(r, g, b, 70))
            draw_lines.line(ring, fill=(r, g, b, 235), width=3)
    picture = Image.alpha_composite(fill, lines)
    counts = [int((rois.classes == n).sum()) for n in names]
    items = [
        (n or "unclassified", (*colours[i], 200), k)
        for i, (n, k) in enumerate(zip(names, counts, strict=True))
    ]
    legend = classes_legend(items, len(rois))
    legend["note"] = f"{Path(path).name}: {len(rois)} shapes ({rois.format})"
    return Overlay(png(np.asarray(picture)), (size[0] / scale, size[1] / scale), legend)


# -- per-tile grids ----------------------------------------------------------------------


@dataclass(frozen=True)
class Grid:
    """A plan's tile grid in level-0 pixels: cell (r, c) starts at (c * stride_x,
    r * stride_y); the grid has `shape` (rows, cols) cells."""

    shape: tuple[int, int]
    stride: tuple[float, float]  # (y, x) level-0 px between cells

    @classmethod
    def of_plan(cls, plan: TilePlan) -> Grid:
        spec = plan.spec
        return cls(spec.grid, (spec.read_stride * spec.downsample[0],
                               spec.read_stride * spec.downsample[1]))  # fmt: skip

    @classmethod
    def of_meta(cls, meta: dict[str, Any], rows: np.ndarray, cols: np.ndarray) -> Grid:
        """The grid of an embeddings group's slide (`open_embeddings` attrs) and its tiles."""
        sy, sx = meta["stride0"]
        return cls((int(rows.max()) + 1, int(cols.max()) + 1), (float(sy), float(sx)))

    def draw(self, rows: np.ndarray, cols: np.ndarray, rgba: np.ndarray) -> tuple[bytes, tuple]:
        """PNG of cells (rows[i], cols[i]) coloured rgba[i] (n, 4), the rest transparent,
        and its level-0 extent."""
        h, w = self.shape
        if h < 1 or w < 1:
            raise ViewError("the tile grid is empty")
        image = np.zeros((h, w, 4), np.uint8)
        image[rows, cols] = rgba
        repeat = int(max(1, min(16, MAX_SIDE // max(h, w))))
        image = np.repeat(np.repeat(image, repeat, axis=0), repeat, axis=1)
        return png(image), (w * self.stride[1], h * self.stride[0])


def scale_rgba(values: np.ndarray, vmin: float, vmax: float, alpha: int = 200) -> np.ndarray:
    """(n, 4) uint8 colours of values on the colour map (NaN: transparent)."""
    from matplotlib import colormaps

    span = vmax - vmin if vmax > vmin else 1.0
    scaled = np.clip((values - vmin) / span, 0, 1)
    rgba = np.rint(colormaps[COLORMAP](np.nan_to_num(scaled)) * 255).astype(np.uint8)
    rgba[:, 3] = np.where(np.isnan(values), 0, alpha)
    return rgba


def scale_legend(label: str, vmin: float, vmax: float) -> dict[str, Any]:
    """A legend of a continuous colour map: its stops as CSS colours and the range."""
    from matplotlib import colormaps

    stops = colormaps[COLORMAP](np.linspace(0, 1, 9))
    return {
        "kind": "scale",
        "label": label,
        "min": float(vmin),
        "max": float(vmax),
        "stops": [f"rgb({r * 255:.0f},{g * 255:.0f},{b * 255:.0f})" for r, g, b, _ in stops],
    }


# -- a plan's cells: kept, or why not ------------------------------------------------------

# why a grid cell is not in the plan, in the order the plan applies its rules
REASONS = {
    "kept": (40, 110, 255, 120),
    "too little tissue": (255, 150, 0, 150),
    "outside the ROI": (140, 140, 140, 150),
    "QC artefacts": (230, 30, 60, 170),
    "contrast filter": (170, 60, 220, 160),
    "not kept": (90, 90, 90, 120),
}


def plan_reasons(slide: Slide, plan: TilePlan) -> np.ndarray:
    """(rows, cols) index into REASONS of every cell of the plan's grid (-1: glass, no
    tissue at all, drawn clear). Why a cell was left out is recomputed from what the store
    holds: its tissue fraction from labels/tissue against min_tissue, its artefacts from
    labels/qc against max_artefact; the rest is the ROI where the plan had one, else the
    contrast filter where it used one."""
    names = list(REASONS)
    rows, cols = plan.spec.grid
    out = np.full((rows, cols), names.index("not kept"), np.int8)
    r, c = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
    r, c = r.ravel(), c.ravel()
    fh, fw = plan.footprint0()
    (sy, sx) = Grid.of_plan(plan).stride
    y0, x0 = r * sy, c * sx
    params = plan.params
    tissue = read_tissue(slide)
    if tissue is not None:
        frac = tissue_fractions(tissue.mask, tissue.downsample, y0, x0, fh, fw)
        out[r[frac <= 0], c[frac <= 0]] = -1
        low = frac < (params.get("min_tissue") or 0)
        out[r[low & (frac > 0)], c[low & (frac > 0)]] = names.index("too little tissue")
        undecided = ~low
    else:
        undecided = np.ones(len(r), bool)
    qc = read_qc(slide) if params.get("max_artefact") is not None else None
    if qc is not None:
        counted = params.get("exclude") or qc.classes
        share = np.sum(
            [tissue_fractions(qc.mask(n), qc.downsample, y0, x0, fh, fw) for n in counted],
            axis=0,
        )
        over = undecided & (share > params["max_artefact"])
        out[r[over], c[over]] = names.index("QC artefacts")
        undecided &= ~over
    rest = "outside the ROI" if params.get("roi") else None
    rest = rest or ("contrast filter" if params.get("filter") == "contrast" else "not kept")
    out[r[undecided], c[undecided]] = names.index(rest)
    out[plan.row, plan.col] = names.index("kept")
    return out


def plan_overlay(slide: Slide, plan: TilePlan) -> Overlay:
    reasons = plan_reasons(slide, plan)
    shown = reasons >= 0
    rr, cc = np.nonzero(shown)
    palette = np.array(list(REASONS.values()), np.uint8)
    grid = Grid.of_plan(plan)
    image, extent = grid.draw(rr, cc, palette[reasons[shown]])
    counts = np.bincount(reasons[shown], minlength=len(REASONS))
    items = [(n, c, int(k)) for (n, c), k in zip(REASONS.items(), counts, strict=True) if k]
    legend = classes_legend(items, int(shown.sum()))
    legend["note"] = (
        f"plan {plan.name}: {len(plan)} tiles of a {grid.shape[0]}x{grid.shape[1]} grid"
    )
    return Overlay(image, extent, legend)
