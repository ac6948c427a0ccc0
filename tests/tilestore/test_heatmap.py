"""Heatmaps out: a similarity, clusters or the user's own scores as a PNG over the slide, an
OME-Zarr label image in the store and QuPath GeoJSON tiles, each holding the same values."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import zarr
from PIL import Image

from tilestore.errors import ViewError
from tilestore.exports.heatmap import (
    heatmap_values,
    write_geojson,
    write_heatmap,
    write_labels,
    write_png,
)

MODEL = "efficientnet-lite0"


@pytest.fixture
def cmu(embedded_cohort, tmp_path):
    """A private copy of the embedded CMU-1-Small-Region store (labels are written into it)."""
    return shutil.copytree(embedded_cohort[0], tmp_path / embedded_cohort[0].name)


def test_similarity_as_png_label_and_geojson(cmu, tmp_path):
    heat = heatmap_values(cmu, MODEL, "similarity", ref=5)
    values = heat.values
    want = values.scalar
    assert want[5] == pytest.approx(1.0, abs=1e-6)

    picture = Image.open(write_png(heat, tmp_path / "sim.png"))
    assert picture.format == "PNG" and picture.size[0] > 500

    name = write_labels(heat)
    label = zarr.open_group(cmu / "labels" / name, mode="r")
    grid = np.asarray(label["0"])[0]
    assert grid.shape == values.grid.shape
    assert grid[values.rows[5], values.cols[5]] == 254  # the reference itself, at the top
    lo, hi = values.bounds
    expected = 1 + np.rint(np.clip((want - lo) / (hi - lo), 0, 1) * 253)
    np.testing.assert_array_equal(grid[values.rows, values.cols], expected)
    assert (grid > 0).sum() == len(want)
    props = label.attrs["ome"]["image-label"]["properties"]
    assert len(props) == 255 and props[254]["name"] == "1"
    assert "labels" in zarr.open_group(cmu / "labels", mode="r").attrs["ome"]
    assert name in zarr.open_group(cmu / "labels", mode="r").attrs["ome"]["labels"]

    doc = json.loads(write_geojson(heat, tmp_path / "sim.geojson").read_text())
    assert len(doc["features"]) == len(want)
    measured = [f["properties"]["measurements"] for f in doc["features"]]
    key = next(k for k in measured[0] if k.startswith("cosine"))
    np.testing.assert_allclose([m[key] for m in measured], want, rtol=1e-6)


def test_the_tile_under_a_point_is_the_reference(cmu):
    by_tile = heatmap_values(cmu, MODEL, "similarity", ref=9)
    x, y = by_tile.values.x[9] + 5, by_tile.values.y[9] + 5
    by_point = heatmap_values(cmu, MODEL, "similarity", at=(x, y))
    np.testing.assert_array_equal(by_point.values.scalar, by_tile.values.scalar)
    with pytest.raises(ViewError, match="give ref=<tile> or at="):
        heatmap_values(cmu, MODEL, "similarity")


def test_clusters_as_classes_in_the_label_and_geojson(cmu, tmp_path):
    heat = heatmap_values(cmu, MODEL, "clusters", k=3)
    name = write_labels(heat)
    grid = np.asarray(zarr.open_group(cmu / "labels" / name, mode="r")["0"])[0]
    values = heat.values
    np.testing.assert_array_equal(grid[values.rows, values.cols], values.classes + 1)
    props = zarr.open_group(cmu / "labels" / name, mode="r").attrs["ome"]["image-label"]
    assert [p["name"] for p in props["properties"]] == ["no tile", "cluster 0", "cluster 1",
                                                        "cluster 2"]  # fmt: skip
    doc = json.loads(write_geojson(heat, tmp_path / "c.geojson").read_text())
    names = [f["properties"]["classification"]["name"] for f in doc["features"]]
    assert names == [f"cluster {c}" for c in values.classes]


@pytest.mark.parametrize("by", ["tile", "xy"])
def test_your_own_scores_from_csv_or_parquet(cmu, tmp_path, by):
    import pandas as pd

    base = heatmap_values(cmu, MODEL, "tissue")
    n = len(base.values.rows)
    score = np.linspace(0, 1, n)[::-1]
    keep = np.arange(0, n, 2)  # a score for every other tile: the rest have none
    if by == "tile":
        table = pd.DataFrame({"tile": keep, "prob": score[keep]})
        path = tmp_path / "scores.csv"
        table.to_csv(path, index=False)
    else:
        table = pd.DataFrame(
            {"x": base.values.x[keep], "y": base.values.y[keep], "prob": score[keep]}
        )
        path = tmp_path / "scores.parquet"
        table.to_parquet(path)
    heat = heatmap_values(cmu, MODEL, "prob", scores=path)
    got = heat.values.scalar
    np.testing.assert_allclose(got[keep], score[keep])
    assert np.isnan(np.delete(got, keep)).all()


def test_scores_naming_no_tile_are_refused_not_dropped(cmu, tmp_path):
    path = tmp_path / "scores.csv"
    path.write_text("tile,score\n0,0.5\n99999,0.7\n")
    with pytest.raises(ViewError, match=r"scores.csv: tile 99999 is not one of the slide's"):
        heatmap_values(cmu, MODEL, "score", scores=path)
    path.write_text("x,y,score\n3,4,0.5\n")
    with pytest.raises(ViewError, match=r"no tile of the slide starts at \(3, 4\)"):
        heatmap_values(cmu, MODEL, "score", scores=path)
    path.write_text("tile,other\n0,1\n")
    with pytest.raises(ViewError, match=r"no column 'score' \(columns: tile, other\)"):
        heatmap_values(cmu, MODEL, "score", scores=path)


def test_pca_colours_have_no_values_to_export(cmu, tmp_path):
    heat = heatmap_values(cmu, MODEL, "pca")
    assert write_png(heat, tmp_path / "pca.png").exists()
    with pytest.raises(ViewError, match="colours, not values"):
        write_labels(heat)


def test_write_heatmap_writes_the_forms_asked_for_in_order(cmu, tmp_path):
    heat = heatmap_values(cmu, MODEL, "clusters", k=3)
    written = write_heatmap(heat, png=tmp_path / "c.png", label=True)
    assert written == [str(tmp_path / "c.png"), f"{cmu}/labels/heatmap-{heat.name}"]
    assert (tmp_path / "c.png").stat().st_size > 0 and (
        cmu / "labels" / f"heatmap-{heat.name}"
    ).is_dir()
    assert not (tmp_path / "c.geojson").exists()
    assert write_heatmap(heat, geojson=tmp_path / "c.geojson") == [str(tmp_path / "c.geojson")]
