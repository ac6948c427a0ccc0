"""explain: each tile's attention and contribution written into the store beside its
features; open_embeddings carries them as columns, the viewer lists them, the heatmap export
draws them; a set made from features embedded again since is left out."""

from __future__ import annotations

import numpy as np
import pytest

import tilestore
from tilestore.learn import build_cohort, explain, train

from .cohorts import FAST, copies


@pytest.fixture(scope="module")
def explained(embedded_cohort, tmp_path_factory):
    folder = tmp_path_factory.mktemp("learn")
    stores, table = copies(embedded_cohort, folder, n=4)
    cohort = build_cohort(table, stores, "efficientnet-lite0", targets="status")
    result = train(cohort, FAST, folder / "msi", valid=0.5)
    written = explain(result.run_dir, stores[:2], device="cpu")
    return stores, result, written


def test_scores_are_columns_of_open_embeddings(explained):
    from tilestore.learn.explanation import tile_scores
    from tilestore.learn.run import load_models

    stores, result, written = explained
    assert written[0].endswith("/learned/msi")
    ds = tilestore.open_embeddings(stores[0], "efficientnet-lite0")
    for column in ("msi:attention", "msi:status:neg", "msi:status:pos"):
        assert column in ds.coords
    attention = np.asarray(ds["msi:attention"], np.float64)
    assert attention.shape == (ds.sizes["tile"],)
    assert abs(attention.sum() - 1) < 1e-4 and (attention >= 0).all()  # softmax over tiles
    want, _ = tile_scores(load_models(result.run_dir, "cpu"), ds.features.values, "cpu")
    np.testing.assert_allclose(np.asarray(ds["msi:status:pos"]), want[:, 2], rtol=1e-6)
    # a store not explained has no such column
    assert "msi:attention" not in tilestore.open_embeddings(stores[3], "efficientnet-lite0").coords


def test_the_record_names_the_run_and_its_features(explained):
    import zarr

    from tilestore.embeddings import find_group
    from tilestore.format.records import LearnedRecord, read_record

    stores, _, written = explained
    group = zarr.open_group(stores[0], path=written[0], mode="r", zarr_format=3)
    record = read_record(group, LearnedRecord, "test")
    assert record.columns == ("attention", "status:neg", "status:pos")
    assert (
        record.run["model"] == "abmil" and record.run["features"]["model"] == "efficientnet-lite0"
    )
    assert record.made_from and find_group(stores[0], "efficientnet-lite0") in written[0]


def test_the_heatmap_export_draws_them(explained, tmp_path):
    from tilestore.exports.heatmap import heatmap_values, write_png

    stores, _, _ = explained
    values = heatmap_values(stores[0], "efficientnet-lite0", "msi:attention")
    png = write_png(values, tmp_path / "attention.png")
    assert png.stat().st_size > 0
    from tilestore.reading.opening import open_slide
    from tilestore.view.catalog import Catalog
    from tilestore.view.values import columns

    catalog = Catalog([open_slide(stores[0])], [str(stores[0])], [str(stores[0])])
    assert {"msi:attention", "msi:status:pos"} <= set(columns(catalog, "efficientnet-lite0"))


def test_a_set_of_that_name_from_another_run_is_refused_unless_overwrite(explained, tmp_path):
    import zarr

    from tilestore.errors import RunError

    stores, result, written = explained
    again = explain(result.run_dir, stores[:1], device="cpu")  # the same run: replaced
    assert again == written[:1]
    other = tmp_path / "msi"  # another run folder of the same name: the same set name
    import shutil

    shutil.copytree(result.run_dir, other)
    before = zarr.open_group(stores[0], path=written[0], mode="r")["scores"][:]
    with pytest.raises(RunError, match=r"learned/msi holds the scores of .*run differ"):
        explain(other, stores[:2], device="cpu")
    after = zarr.open_group(stores[0], path=written[0], mode="r")["scores"][:]
    np.testing.assert_array_equal(before, after)  # nothing written
    assert explain(other, stores[:1], device="cpu", overwrite=True) == written[:1]
    from tilestore.format.records import LearnedRecord, read_record

    group = zarr.open_group(stores[0], path=written[0], mode="r", zarr_format=3)
    assert read_record(group, LearnedRecord, "test").run["run"] == str(other.resolve())
    explain(result.run_dir, stores[:1], device="cpu", overwrite=True)  # as the module had it


def test_two_runs_sets_of_one_name_never_meet_as_one_column(explained, tmp_path):
    """Store 0 keeps the module's run's set `msi`; store 1's is replaced by another run's
    (overwrite): opened together, the column is refused, or left out with skip_mixed."""
    import shutil

    from tilestore.errors import MixedResults

    stores, result, _ = explained
    other = tmp_path / "msi"
    shutil.copytree(result.run_dir, other)
    explain(other, stores[1:2], device="cpu", overwrite=True)
    try:
        with pytest.raises(MixedResults, match="msi"):
            tilestore.open_embeddings(stores[:2], "efficientnet-lite0")
        with pytest.warns(Warning, match="msi"):
            ds = tilestore.open_embeddings(stores[:2], "efficientnet-lite0", skip_mixed=True)
        assert "msi:attention" not in ds.coords
    finally:
        explain(result.run_dir, stores[1:2], device="cpu", overwrite=True)  # as it was
