"""A PNG to look at before spending GPU hours: thumbnail, tissue, ROI outlines, kept tiles."""

from __future__ import annotations

import os

import numpy as np
import shapely
from PIL import Image, ImageDraw

from tilestore.reading.slide import Slide, resize
from tilestore.urls import written_here

TISSUE_RGB = (0, 200, 80)
# tissue is outlined and barely tinted, so the stain's own colours stay readable under it
# (a 35% green fill turned H&E grey-green)
TISSUE_FILL_ALPHA = 28
ROI_COLORS = ((255, 200, 0), (255, 60, 60), (0, 170, 255), (200, 0, 255), (255, 255, 255))
TILE_RGB = (30, 90, 255)


def render_preview(
    slide: Slide, *, tissue=None, rois=None, plan=None, max_size: int = 1600
) -> Image.Image:
    """Return an RGB thumbnail (longer side <= max_size) with the overlays given."""
    pixels, scale = thumbnail(slide, max_size)
    image = Image.fromarray(pixels).convert("RGBA")
    overlay = Image.new("RGBA", image.size, (0, 0, 0, 0))
    draw = ImageDraw.Draw(overlay)
    if tissue is not None:
        inside = Image.fromarray(tissue.mask.astype(np.uint8) * 255).resize(
            image.size, Image.Resampling.NEAREST
        )
        edge = Image.fromarray(_outline(np.asarray(inside) > 0).astype(np.uint8) * 255)
        overlay.paste(
            Image.new("RGBA", image.size, (*TISSUE_RGB, TISSUE_FILL_ALPHA)), (0, 0), inside
        )
        overlay.paste(Image.new("RGBA", image.size, (*TISSUE_RGB, 255)), (0, 0), edge)
    if plan is not None and len(plan):
        x0, y0 = plan.x * scale, plan.y * scale
        size0 = plan.footprint0()
        for a, b, c, d in zip(x0, y0, x0 + size0[1] * scale, y0 + size0[0] * scale, strict=True):
            draw.rectangle((a, b, c - 1, d - 1), outline=(*TILE_RGB, 230))
    if rois is not None:
        palette = {name: ROI_COLORS[i % len(ROI_COLORS)] for i, name in enumerate(rois.class_names)}
        for geom, name in zip(rois.geometries, rois.classes, strict=True):
            for ring in _rings(geom):
                draw.line(
                    [(x * scale, y * scale) for x, y in ring], fill=(*palette[name], 255), width=2
                )
    return Image.alpha_composite(image, overlay).convert("RGB")


def _outline(mask: np.ndarray, width: int = 2) -> np.ndarray:
    """The pixels of `mask` within `width` px of its edge (where a neighbour is outside)."""
    inner = mask.copy()
    for _ in range(width):
        shrunk = inner.copy()
        shrunk[1:] &= inner[:-1]
        shrunk[:-1] &= inner[1:]
        shrunk[:, 1:] &= inner[:, :-1]
        shrunk[:, :-1] &= inner[:, 1:]
        inner = shrunk
    return mask & ~inner


def thumbnail(slide: Slide, max_size: int = 1600) -> tuple[np.ndarray, float]:
    """Return the whole slide as RGB uint8 (longer side <= max_size) and its scale to level 0.

    Read from the smallest level still at least that size, so it costs one small read.
    """
    _, h0, w0 = slide.shape
    scale = min(1.0, max_size / max(h0, w0))
    tw, th = max(1, round(w0 * scale)), max(1, round(h0 * scale))
    level = max((lv.index for lv in slide.levels if lv.width >= tw), default=0)
    lv = slide.levels[level]
    pixels = slide.read_region(0, 0, lv.width, lv.height, level=level)
    pixels = resize(pixels, tw, th) if (lv.width, lv.height) != (tw, th) else pixels
    return _as_rgb(pixels), scale


def save_preview(path: str | os.PathLike, slide: Slide, **overlays) -> None:
    """Write the preview PNG."""
    render_preview(slide, **overlays).save(written_here(path, "path"))


def _rings(geom) -> list[np.ndarray]:
    rings = []
    for poly in shapely.get_parts(geom):
        rings.append(shapely.get_coordinates(shapely.get_exterior_ring(poly)))
        rings.extend(
            shapely.get_coordinates(shapely.get_interior_ring(poly, i))
            for i in range(shapely.get_num_interior_rings(poly))
        )
    return rings


def _as_rgb(pixels: np.ndarray) -> np.ndarray:
    if pixels.dtype != np.uint8:
        peak = max(float(np.percentile(pixels, 99.5)), 1.0)
        pixels = np.clip(pixels / peak * 255, 0, 255).astype(np.uint8)
    if pixels.shape[2] == 1:
        return np.repeat(pixels, 3, axis=2)
    if pixels.shape[2] == 2:
        return np.concatenate([pixels, np.zeros_like(pixels[..., :1])], axis=2)
    return pixels[..., :3]
