"""open_embeddings: one slide or a cohort as one lazy Dataset, read only when computed."""

from __future__ import annotations

import re
import shutil
import warnings

import dask.array as da
import numpy as np
import pytest
import zarr

import tilestore
from tests.conftest import group_of
from tests.counting import CountingStore
from tilestore.embeddings import list_embeddings, open_embeddings
from tilestore.errors import StoreError, TilestoreWarning
from tilestore.plan import load_plan
from tilestore.reading.opening import open_slide

LITE = "efficientnet-lite0"


def _group(store):
    return zarr.open_group(store / group_of(store, LITE), mode="r")


def test_one_slide_matches_its_group_and_plan(embedded_cohort):
    cmu = embedded_cohort[0]
    ds = tilestore.open_embeddings(cmu, LITE)
    group = _group(cmu)
    plan, _ = load_plan(open_slide(cmu), "classes")
    assert ds["features"].dims == ("tile", "feature")
    assert isinstance(ds["features"].data, da.Array)
    np.testing.assert_array_equal(ds["features"].values, group["features"][:])
    np.testing.assert_array_equal(ds["x"].values, plan.x)
    np.testing.assert_array_equal(ds["y"].values, plan.y)
    np.testing.assert_allclose(ds["x_um"].values, plan.x * 0.499)
    np.testing.assert_array_equal(ds["tissue"].values, plan.tissue)
    assert set(ds["slide"].values) == {"CMU-1-Small-Region"}
    # ROI classes come back as names, as the plan numbered them
    names = np.array(plan.classes)[plan.roi_class]
    np.testing.assert_array_equal(ds["roi_class"].values, names)
    assert {"Stroma", "Tumor"} <= set(ds["roi_class"].values)
    (meta,) = ds.attrs["slides"]
    assert meta["footprint0"] == [224.0, 224.0] and meta["stride0"] == [224.0, 224.0]
    assert meta["plan"] == "classes" and meta["tiles"] == len(plan)


def test_a_cohort_by_glob_stacks_slides_in_order(embedded_cohort):
    pattern = str(embedded_cohort[0].parent / "*.ome.zarr")
    ds = open_embeddings(pattern, LITE)
    sizes = [_group(s)["features"].shape[0] for s in embedded_cohort]
    assert ds.sizes["tile"] == sum(sizes)
    assert ds.tiles.slides == ["CMU-1-Small-Region", "skimage_ihc"]
    slide = ds["slide"].values
    assert (slide[: sizes[0]] == "CMU-1-Small-Region").all()
    assert (slide[sizes[0] :] == "skimage_ihc").all()
    # the IHC plan has no ROI: its tiles carry the empty class, CMU's keep theirs
    assert set(ds["roi_class"].values[sizes[0] :]) == {""}
    np.testing.assert_array_equal(
        ds["features"].values[sizes[0] :], _group(embedded_cohort[1])["features"][:]
    )


def test_opening_reads_no_features_until_computed(embedded_cohort):
    """Opening reads of each features chunk its last 4 bytes only (its CRC-32C, compared
    with its position: `tilestore.embeddings.tied`), every chunk's once."""
    counted = [CountingStore.local(s) for s in embedded_cohort]
    ds = open_embeddings(counted, LITE)
    features = [group_of(store, LITE) + "/features" for store in embedded_cohort]
    assert all(not c.log.chunk_keys(f) for c, f in zip(counted, features, strict=True))
    for c, store, key in zip(counted, embedded_cohort, features, strict=True):
        chunks = zarr.open_array(store / key, mode="r").nchunks
        ends = c.log.ends(key)
        assert len({k for k, _ in ends}) == len(ends) == chunks
        assert {n for _, n in ends} == {4}
    total = float(ds["features"].sum())
    assert np.isfinite(total)
    assert all(c.log.chunk_keys(f) for c, f in zip(counted, features, strict=True))


def test_list_embeddings(embedded_cohort):
    assert list_embeddings(embedded_cohort[0]) == [LITE]


def test_missing_group_names_what_the_store_has(embedded_cohort):
    with pytest.raises(StoreError, match=r"no embeddings/uni \(embeddings in this store: "):
        open_embeddings(embedded_cohort[0], "uni")


def test_unfinished_group_is_refused_or_skipped(embedded_cohort, tmp_path):
    broken = tmp_path / "broken.ome.zarr"
    shutil.copytree(embedded_cohort[1], broken)
    group = zarr.open_group(broken / group_of(broken, LITE), mode="r+")
    attrs = dict(group.attrs["tilestore"])
    group.attrs["tilestore"] = {**attrs, "complete": False}
    group["done"][0] = 0
    with pytest.raises(StoreError, match=r"unfinished \(\d+ of \d+ batches\); rerun"):
        open_embeddings([embedded_cohort[0], broken], LITE)
    with pytest.warns(TilestoreWarning, match="skipped: .*broken.ome.zarr"):
        ds = open_embeddings([embedded_cohort[0], broken], LITE, skip_missing=True)
    assert ds.tiles.slides == ["CMU-1-Small-Region"]


def test_bad_inputs(embedded_cohort, tmp_path):
    with pytest.raises(StoreError, match="no store matches"):
        open_embeddings(str(tmp_path / "*.ome.zarr"), LITE)
    with pytest.raises(StoreError, match="no such store"):
        open_embeddings(tmp_path / "nope.ome.zarr", LITE)
    twin = tmp_path / "twin"
    shutil.copytree(embedded_cohort[1], twin / embedded_cohort[1].name)
    with pytest.raises(StoreError, match="share the slide name 'skimage_ihc'"):
        open_embeddings([embedded_cohort[1], twin / embedded_cohort[1].name], LITE)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TilestoreWarning)
        with pytest.raises(StoreError, match="no embeddings of 'uni' in 1 store"):
            open_embeddings(embedded_cohort[0], "uni", skip_missing=True)


def test_a_cohort_glob_leaves_out_stores_not_embedded_with_a_note(embedded_cohort, tmp_path):
    """A cohort folder holds stores `embed` has not reached: a glob leaves them out, saying
    so; named on their own they are an error unless skip_missing."""
    import shutil
    import warnings

    import zarr

    from tilestore.errors import StoreError, TilestoreWarning

    folder = tmp_path / "cohort"
    folder.mkdir()
    for store in embedded_cohort:
        shutil.copytree(store, folder / store.name)
    bare = folder / "bare.ome.zarr"
    shutil.copytree(embedded_cohort[0], bare)
    shutil.rmtree(bare / "embeddings")
    half = folder / "half.ome.zarr"
    shutil.copytree(embedded_cohort[0], half)
    group = zarr.open_group(half / group_of(half, "efficientnet-lite0"), mode="r+")
    attrs = dict(group.attrs["tilestore"])
    attrs["complete"] = False
    group.attrs["tilestore"] = attrs
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always", TilestoreWarning)
        ds = open_embeddings(str(folder / "*.ome.zarr"), "efficientnet-lite0")
    assert sorted(ds.tiles.slides) == sorted(
        s.name.removesuffix(".ome.zarr") for s in embedded_cohort
    )
    notes = sorted(str(w.message) for w in said)
    assert notes[0].startswith(f"skipped: {bare}: no embeddings/efficientnet-lite0")
    assert notes[1].startswith(
        f"skipped: {half}: embeddings/efficientnet-lite0/classes is unfinished"
    )
    with pytest.raises(StoreError, match="no embeddings/efficientnet-lite0"):
        open_embeddings([*embedded_cohort, bare], "efficientnet-lite0")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TilestoreWarning)
        kept = open_embeddings([*embedded_cohort, bare], "efficientnet-lite0", skip_missing=True)
    assert len(kept.tiles.slides) == 2


def _cohort_copy(embedded_cohort, tmp_path):
    copies = [tmp_path / s.name for s in embedded_cohort]
    for source, copy in zip(embedded_cohort, copies, strict=True):
        shutil.copytree(source, copy)
    return copies


def _edit_record(store, edit):
    group = zarr.open_group(store / group_of(store, LITE), mode="r+")
    meta = dict(group.attrs["tilestore"])
    edit(meta)
    group.attrs["tilestore"] = meta


@pytest.mark.parametrize(
    ("fact", "value", "shown"),
    [
        ("precision", "bf16", r"precision: fp32 \(CMU-1-Small-Region.ome.zarr\) vs bf16"),
        ("pooling", "cls+mean", r"pooling: model \(CMU-1-Small-Region.ome.zarr\) vs cls\+mean"),
        ("transform_sha", "0123456789abcdef", r"transform_sha: "),
        ("revision", "abc", r"revision: 0.1.0 \(CMU-1-Small-Region.ome.zarr\) vs abc"),
        (
            "weights_sha256",
            "0" * 64,
            r"weights_sha256: [0-9a-f]{64} \(CMU-1-Small-Region.ome.zarr\) vs 0{64}",
        ),
    ],
)
def test_a_cohort_embedded_under_other_settings_is_refused(
    embedded_cohort, tmp_path, fact, value, shown
):
    """The same model name, another recipe: the features are not one population."""
    cmu, ihc = _cohort_copy(embedded_cohort, tmp_path)

    def edit(meta):
        if fact == "precision":
            meta["precision"] = value
        else:
            meta["model"] = {**meta["model"], fact: value}

    _edit_record(ihc, edit)
    with pytest.raises(StoreError) as refused:
        open_embeddings([cmu, ihc], LITE)
    message = str(refused.value)
    assert "\n" not in message and str(ihc) in message and cmu.name in message
    assert re.search(shown, message) and "other settings" in message


def test_a_group_recorded_before_the_recipe_opens_with_a_new_one(embedded_cohort, tmp_path):
    """A group written before transform hashes were recorded is compared on its transform."""
    cmu, ihc = _cohort_copy(embedded_cohort, tmp_path)
    old = ("transform_sha", "family", "input_size", "projection", "architecture")

    def make_old(meta):
        meta["model"] = {k: v for k, v in meta["model"].items() if k not in old}

    _edit_record(ihc, make_old)
    assert open_embeddings([cmu, ihc], LITE).sizes["tile"] > 0

    def other_transform(meta):
        transform = {**meta["model"]["transform"], "mean": [0.4, 0.4, 0.4]}
        meta["model"] = {**meta["model"], "transform": transform}

    _edit_record(ihc, other_transform)
    with pytest.raises(StoreError, match="transform_sha"):
        open_embeddings([cmu, ihc], LITE)
