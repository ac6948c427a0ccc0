"""Previews draw the tissue, the ROI outlines and the kept tiles where they belong."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from PIL import Image

from tests.conftest import CMU
from tilestore.analysis.preview import ROI_COLORS, TILE_RGB, TISSUE_RGB, _outline, render_preview
from tilestore.masks.tissue import compute_tissue
from tilestore.plan import PlanOptions, plan_over_tissue
from tilestore.plan.annotations import load_annotations
from tilestore.reading.opening import open_slide


@pytest.fixture
def slide(tmp_path, stores):
    target = tmp_path / "cmu.ome.zarr"
    shutil.copytree(stores(CMU), target)
    return open_slide(target)


def _close(pixel, rgb, tol=60):
    return np.abs(pixel.astype(int) - np.array(rgb)).max() <= tol


def test_preview_overlays_land_on_their_coordinates(slide, tmp_path):
    roi = tmp_path / "roi.geojson"
    roi.write_text(
        json.dumps(
            {
                "type": "Feature",
                "geometry": {
                    "type": "Polygon",
                    "coordinates": [
                        [[400, 1000], [1600, 1000], [1600, 2200], [400, 2200], [400, 1000]]
                    ],
                },
            }
        )
    )
    rois = load_annotations(roi, size=(2220, 2967))
    plan = plan_over_tissue(slide, PlanOptions(roi=roi, min_tissue=0.0))
    tissue = compute_tissue(slide)
    image = np.asarray(render_preview(slide, tissue=tissue, rois=rois, plan=plan, max_size=1000))
    scale = 1000 / 2967
    assert image.shape == (1000, round(2220 * scale), 3)
    # the ROI's top edge is drawn in the first ROI colour at y = 1000 * scale
    assert _close(image[round(1000 * scale), round(1000 * scale)], ROI_COLORS[0])
    # a kept tile's left edge is drawn in the tile colour
    i = len(plan) // 2
    x, y = plan.x[i] * scale, (plan.y[i] + 112) * scale
    assert _close(image[int(y), int(np.ceil(x))], TILE_RGB, tol=90) or _close(
        image[int(y), int(x)], TILE_RGB, tol=90
    )
    # away from overlays the thumbnail is the slide itself (glass is near white)
    assert image[5, 5].min() > 200


def test_tissue_is_outlined_and_its_colours_stay_readable(slide):
    """Tissue is outlined, and its pixels inside keep the stain's colours (a light tint, not
    a green wash); glass is untouched."""
    tissue = compute_tissue(slide)
    plain = np.asarray(render_preview(slide, max_size=400)).astype(int)
    tinted = np.asarray(render_preview(slide, tissue=tissue, max_size=400)).astype(int)
    mask = (
        np.asarray(
            Image.fromarray(tissue.mask.astype(np.uint8) * 255).resize(
                plain.shape[1::-1], Image.Resampling.NEAREST
            )
        )
        > 0
    )
    edge = _outline(mask)
    inside = mask & ~edge
    assert inside.sum() > 1000 and edge.sum() > 100
    shift = np.abs(tinted - plain).sum(axis=2)
    assert np.median(shift[inside]) <= 45  # a tint of ~11% (the old 35% green fill: ~115)
    assert np.all(np.abs(tinted[edge] - np.array(TISSUE_RGB)).max(axis=1) <= 1)  # the outline
    assert (shift[~mask] == 0).mean() > 0.99  # glass as it was
