"""Maps and galleries: tiles drawn exactly over their footprints, typical tiles first."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

import tilestore
from tilestore.analysis.plots import plot_gallery, plot_map


def test_cluster_map_overlay_covers_the_tiles_footprints(embedded_ds, tmp_path):
    clusters = embedded_ds.tiles.kmeans(3, pcs=8)
    fig = plot_map(embedded_ds, clusters, slide="CMU-1-Small-Region", path=tmp_path / "map.png")
    thumb, overlay = fig.axes[0].get_images()
    cmu = embedded_ds.tiles.slide("CMU-1-Small-Region")
    x, y = cmu["x"].values, cmu["y"].values
    # not shifted by half a tile, not transposed: the overlay spans the tiles' bounding box
    assert overlay.get_extent() == pytest.approx((x.min(), x.max() + 224, y.max() + 224, y.min()))
    assert thumb.get_extent() == pytest.approx((0, 2220, 2967, 0))
    cells = overlay.get_array()
    row = (y - y.min()) // 224
    col = (x - x.min()) // 224
    assert (cells[row, col, 3] > 0).all()  # every tile is drawn...
    assert (cells[..., 3] > 0).sum() == len(x)  # ...and nothing else
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    counts = np.bincount(clusters.values[: len(x)], minlength=3)
    assert legend == [f"cluster {k} ({counts[k]})" for k in range(3) if counts[k]]
    with Image.open(tmp_path / "map.png") as png:
        assert png.size[0] > 600


def test_rgb_map_colours_are_the_pca_colours(embedded_ds):
    rgb = embedded_ds.tiles.rgb_map()
    fig = plot_map(embedded_ds, rgb, slide="CMU-1-Small-Region", alpha=1.0)
    cells = fig.axes[0].get_images()[1].get_array()
    cmu = embedded_ds.tiles.slide("CMU-1-Small-Region")
    row = (cmu["y"].values - cmu["y"].values.min()) // 224
    col = (cmu["x"].values - cmu["x"].values.min()) // 224
    np.testing.assert_allclose(cells[row, col, :3], rgb.values[: len(row)], atol=1e-6)


def test_gallery_shows_the_tiles_nearest_each_centre_first(embedded_ds, tmp_path):
    clusters = embedded_ds.tiles.kmeans(3)  # on the features: typical = nearest the centre
    fig = plot_gallery(embedded_ds, clusters, n=4, size=32, path=tmp_path / "gallery.png")
    axes = np.array(fig.axes).reshape(3, 4)
    labels = clusters.values
    features = embedded_ds["features"].values
    x, y = embedded_ds["x"].values, embedded_ds["y"].values
    slides = {m["name"]: tilestore.open_slide(m["store"]) for m in embedded_ds.attrs["slides"]}
    for k in range(3):
        members = np.flatnonzero(labels == k)
        best = members[
            np.argmin(np.linalg.norm(features[members] - clusters.attrs["centers"][k], axis=1))
        ]
        shown = axes[k, 0].get_images()[0].get_array()
        slide = slides[str(embedded_ds["slide"].values[best])]
        expected = slide.read_region(int(x[best]), int(y[best]), 224, 224, level=0)
        assert shown.shape == (32, 32, 3)
        assert np.abs(shown.astype(int).mean((0, 1)) - expected.mean((0, 1))).max() < 6
        assert len(axes[k, 0].get_ylabel()) and f"({len(members)})" in axes[k, 0].get_ylabel()


def test_hits_row_starts_with_the_query_tile(embedded_ds):
    from tilestore.analysis.plots import plot_hits

    hits = embedded_ds.tiles.nearest(10, k=3)
    fig = plot_hits(embedded_ds, hits, size=32)
    assert len(fig.axes) == 3
    first = fig.axes[0]
    assert first.get_title().endswith("1.000") and "CMU-1-Small-Re" in first.get_title()
    cmu = tilestore.open_slide(embedded_ds.attrs["slides"][0]["store"])
    x, y = int(embedded_ds["x"].values[10]), int(embedded_ds["y"].values[10])
    expected = cmu.read_region(x, y, 224, 224, level=0).mean((0, 1))
    shown = first.get_images()[0].get_array().astype(int).mean((0, 1))
    assert np.abs(shown - expected).max() < 6
