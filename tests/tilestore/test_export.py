"""QuPath GeoJSON and AnnData exports: re-imported, they give back the tiles and classes."""

from __future__ import annotations

import anndata
import numpy as np
import pytest
import shapely

from tilestore.exports import to_anndata, to_qupath
from tilestore.plan.annotations import load_annotations


def test_qupath_export_round_trips_through_our_annotation_loader(embedded_ds, tmp_path):
    clusters = embedded_ds.tiles.kmeans(3, pcs=8)
    pcs = embedded_ds.tiles.pca(3)
    path = to_qupath(
        embedded_ds,
        tmp_path / "tiles.geojson",
        clusters=clusters,
        measurements=pcs,
        slide="CMU-1-Small-Region",
    )
    back = load_annotations(path, size=(2220, 2967))
    cmu = embedded_ds.tiles.slide("CMU-1-Small-Region")
    x, y = cmu["x"].values, cmu["y"].values
    assert len(back) == len(x)
    squares = shapely.box(x, y, x + 224, y + 224)
    assert shapely.equals(back.geometries, squares).all()
    labels = clusters.values[: len(x)]
    np.testing.assert_array_equal(back.classes, [f"Cluster {k}" for k in labels])
    import json

    first = json.loads(path.read_text())["features"][0]["properties"]
    assert first["objectType"] == "tile"
    assert first["measurements"]["PC1"] == pytest.approx(float(pcs.values[0, 0]), rel=1e-5)
    assert first["measurements"]["tissue"] == pytest.approx(float(cmu["tissue"].values[0]))
    assert len(first["classification"]["color"]) == 3
    assert not list(tmp_path.glob(".partial-*"))


def test_a_failed_export_leaves_no_file(embedded_ds, tmp_path):
    target = tmp_path / "missing-dir" / "tiles.geojson"
    with pytest.raises(OSError):
        to_qupath(embedded_ds, target, slide="skimage_ihc")
    assert not target.exists()


def test_anndata_export_for_scanpy_and_squidpy(embedded_ds, tmp_path):
    clusters = embedded_ds.tiles.kmeans(2, pcs=4)
    path = to_anndata(embedded_ds, tmp_path / "tiles.h5ad", obs={"cluster": clusters})
    adata = anndata.read_h5ad(path)
    np.testing.assert_array_equal(adata.X, embedded_ds["features"].values.astype(np.float32))
    assert list(adata.obs["slide"].cat.categories) == ["CMU-1-Small-Region", "skimage_ihc"]
    np.testing.assert_array_equal(adata.obs["cluster"].values, clusters.values)
    centres = np.stack([embedded_ds["x"].values + 112, embedded_ds["y"].values + 112], axis=1)
    np.testing.assert_array_equal(adata.obsm["spatial"], centres)
    lib = adata.uns["spatial"]["CMU-1-Small-Region"]
    lowres = lib["images"]["lowres"]
    assert lowres.shape[1] == round(2220 * lib["scalefactors"]["tissue_lowres_scalef"])
    assert lib["scalefactors"]["spot_diameter_fullres"] == 224.0
    assert set(adata.obs["roi_class"].cat.categories) == {"", "Stroma", "Tumor"}
