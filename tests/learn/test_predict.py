"""predict: a run's models on new stores (the folds' mean or one fold), the same outputs as
the run's own; a store of other features refused in one line."""

from __future__ import annotations

import numpy as np
import pytest

from tilestore.errors import MixedResults, RunError
from tilestore.learn import build_cohort, predict, train

from .cohorts import FAST, copies


@pytest.fixture(scope="module")
def trained(embedded_cohort, tmp_path_factory):
    folder = tmp_path_factory.mktemp("learn")
    stores, table = copies(embedded_cohort, folder)
    cohort = build_cohort(table, stores, "efficientnet-lite0", targets="status")
    result = train(cohort, FAST, folder / "run")
    return stores, result


def test_predict_gives_a_row_per_slide_as_the_run_model_does(trained):
    import torch

    from tilestore.learn.run import load_models

    stores, result = trained
    table = predict(result.run_dir, stores[:2], device="cpu")
    assert list(table.columns) == ["slide", "store", "status:neg", "status:pos", "predicted"]
    assert list(table["slide"]) == ["P0", "P1"]
    # the same features, the same model: its outputs by hand
    import tilestore

    x = tilestore.open_embeddings(stores[0], "efficientnet-lite0").features.values
    (model,) = load_models(result.run_dir, "cpu")
    with torch.no_grad():
        logits = model(torch.as_tensor(np.asarray(x, np.float32))[None]).logits.numpy()[0]
    want = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()  # probabilities
    got = table.loc[0, ["status:neg", "status:pos"]].to_numpy(float)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert table.loc[0, "predicted"] == ["neg", "pos"][int(want.argmax())]


def test_a_store_of_another_scale_is_refused_in_one_line(trained, tmp_path):
    import shutil

    import zarr

    from tilestore.embeddings import find_group
    from tilestore.format.records import EmbeddingsRecord, read_record, write_record

    stores, result = trained
    other = tmp_path / "P9.ome.zarr"
    shutil.copytree(stores[0], other)
    # as a store embedded from tiles read at 1 um/px records itself
    group = zarr.open_group(other, path=find_group(other, "efficientnet-lite0"), mode="r+")
    was = read_record(group, EmbeddingsRecord, "test")
    write_record(group, EmbeddingsRecord.make("test", **{**was.to_attrs(), "mpp": 1.0}))
    with pytest.raises(MixedResults) as found:
        predict(result.run_dir, [stores[1], other], device="cpu")
    assert "\n" not in str(found.value) and "scale" in str(found.value)


def test_an_unfinished_run_is_refused(trained, tmp_path):
    import shutil

    stores, result = trained
    copy = tmp_path / "run"
    shutil.copytree(result.run_dir, copy)
    (copy / "finished.json").unlink()
    with pytest.raises(RunError, match="not a finished run"):
        predict(copy, stores[:1], device="cpu")
