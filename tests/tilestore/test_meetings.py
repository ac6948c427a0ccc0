"""Every place where results of several stores meet goes through `combine`: tile features,
zero-shot score columns, quality measures, `ds.tiles.nearest`'s query, slide vectors, the
cohort exports (h5, anndata, slides), `classify` and the viewer's PCA. Each test mixes two
scales (or, for columns beside the features, two records under one name) and expects the
refusal: MixedResults from the library, exit 2 and one line from the command.

The stores are cheap: one real store of CMU-1-Small-Region copied, planned at a scale, its
features written as given (`write_features`), not computed."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import zarr

import tilestore
from tests.conftest import CMU, group_of, run_cli
from tilestore.embeddings import MixedResults, open_slide_embeddings
from tilestore.embeddings.recipe import recipe
from tilestore.embeddings.scores import write_tile_scores
from tilestore.embeddings.slides import read_tile_features, write_slide_vector
from tilestore.embeddings.write import write_features
from tilestore.errors import TilestoreWarning
from tilestore.exports import cohort_to_h5
from tilestore.format.records import EmbeddingsRecord, read_record, write_record
from tilestore.plan import PlanOptions, save_plan
from tilestore.reading import open_slide
from tilestore.reading.labels import write_label

MODEL = {"name": "m", "output_dim": 8, "repo": "test/m"}
COARSE, FINE = PlanOptions(mpp=2.0, tile=128), PlanOptions(mpp=1.0, tile=128)
SCALES = r"more than one scale \(0\.998-2mpp-128px: 2 store\(s\) \(s0\.ome\.zarr, s1\.ome\.zarr\)\)"
PLIP = {"classes": ["tumor", "stroma"], "text_tower": "plip", "weights_sha256": "a" * 64,
        "logit_scale": 100.0, "logit_bias": 0.0,
        "prompts": {"file": "/here/tissue.json", "classnames": {"tumor": ["tumor"],
                    "stroma": ["stroma"]}, "templates": ["a photo of CLASSNAME"]}}  # fmt: skip


@pytest.fixture(scope="module")
def planned(tmp_path_factory, stores):
    """A store of CMU-1-Small-Region with its tissue mask made once; each store copies it."""
    base = tmp_path_factory.mktemp("base") / "base.ome.zarr"
    shutil.copytree(stores(CMU), base)
    tilestore.plan_slide(open_slide(base), COARSE)  # stores the mask
    return base


def _store(base: Path, folder: Path, index: int, options: PlanOptions, model=MODEL) -> Path:
    path = folder / f"s{index}.ome.zarr"
    shutil.copytree(base, path)
    slide = open_slide(path)
    plan = tilestore.plan_slide(slide, options)
    save_plan(slide, plan)
    rng = np.random.default_rng(index)
    width = model["output_dim"]
    write_features(path, model, rng.standard_normal((len(plan), width)).astype(np.float32),
                   plan=plan.name, batch_size=16)  # fmt: skip
    return path


@pytest.fixture
def two_scales(planned, tmp_path):
    """Two stores of one model's features, planned at 2 and at 1 um/px."""
    return [_store(planned, tmp_path, 0, COARSE), _store(planned, tmp_path, 1, FINE)]


@pytest.fixture
def one_scale(planned, tmp_path):
    """Two stores of one model's features, both planned at 2 um/px."""
    return [_store(planned, tmp_path, 0, COARSE), _store(planned, tmp_path, 1, COARSE)]


def _scores(store: Path, name: str, record: dict) -> None:
    tiles = read_tile_features(store, "m")
    probabilities = np.full((tiles.tiles, len(record["classes"])), 1 / len(record["classes"]))
    write_tile_scores(store, tiles.path, name, probabilities, record,
                      {**tiles.source(), "finished": tiles.finished})  # fmt: skip


# -- tile features: open_embeddings, and through it every reader of a cohort -----------------


def test_open_embeddings_refuses_tiles_of_two_scales(two_scales):
    with pytest.raises(MixedResults, match=SCALES):
        tilestore.open_embeddings(two_scales, "m")


# -- zero-shot score columns --------------------------------------------------------------


@pytest.mark.parametrize(
    "other, differs",
    [
        ({"text_tower": "conch"}, "scores text_tower: plip"),
        ({"logit_scale": 50.0}, "scores logit_scale: 100.0"),
        (
            {"prompts": {**PLIP["prompts"], "templates": ["an image of CLASSNAME"]}},
            "scores prompts",
        ),
    ],
)
def test_score_sets_of_one_name_made_otherwise_are_refused_or_left_out(one_scale, other, differs):
    a, b = one_scale
    _scores(a, "zs", PLIP)
    _scores(b, "zs", {**PLIP, **other})
    with pytest.raises(MixedResults, match=rf"s1\.ome\.zarr: its 'zs' scores .*{differs}"):
        tilestore.open_embeddings(one_scale, "m")
    with pytest.warns(TilestoreWarning, match=r"left out the 'zs' scores columns"):
        ds = tilestore.open_embeddings(one_scale, "m", skip_mixed=True)
    assert not [c for c in ds.coords if str(c).startswith("zs")]
    assert ds.sizes["tile"] == sum(len(tilestore.open_embeddings(s, "m").tile) for s in one_scale)


def test_score_sets_made_alike_are_one_column_whatever_the_prompts_files_path(one_scale):
    a, b = one_scale
    _scores(a, "zs", PLIP)
    _scores(b, "zs", {**PLIP, "prompts": {**PLIP["prompts"], "file": "/there/t.json"}})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ds = tilestore.open_embeddings(one_scale, "m")
    assert set(np.unique(ds["zs"].values)) == {"tumor"}  # equal probabilities: the first
    assert np.allclose(ds["zs:stroma"].values, 0.5)


def test_a_score_set_only_one_store_has_is_its_own_column(one_scale):
    a, _ = one_scale
    _scores(a, "zs", PLIP)
    ds = tilestore.open_embeddings(one_scale, "m")
    labels = ds["zs"].values
    assert set(labels[ds["slide"].values == "s0"]) == {"tumor"}
    assert set(labels[ds["slide"].values == "s1"]) == {""}


# -- quality measures ---------------------------------------------------------------------


def _quality(store: Path, params: dict) -> None:
    """The group given per-tile quality measures, as a run with quality writes them."""
    path = group_of(store, "m")
    group = zarr.open_group(store, path=path, mode="a", zarr_format=3)
    tiles = group["features"].shape[0]
    group.create_array("quality", data=np.ones((tiles, 2), np.float32),
                       chunks=(*group["features"].chunks[:1], 2),
                       attributes={"measures": ["blur", "dark"]})  # fmt: skip
    record = read_record(group, EmbeddingsRecord, path)
    quality = {"measures": ["blur", "dark"], "mpp": 2.0, "side": 128, "params": params}
    write_record(group, record.replace(quality=quality))


def test_quality_measures_taken_otherwise_are_refused_or_left_out(one_scale):
    a, b = one_scale
    _quality(a, {"blur_sigma": 1.0})
    _quality(b, {"blur_sigma": 2.0})
    with pytest.raises(MixedResults, match=r"its quality measures .*quality params"):
        tilestore.open_embeddings(one_scale, "m")
    with pytest.warns(TilestoreWarning, match=r"left out the quality measures columns"):
        ds = tilestore.open_embeddings(one_scale, "m", skip_mixed=True)
    assert "blur" not in ds.coords and "dark" not in ds.coords


# -- QC shares ------------------------------------------------------------------------------


def _with_qc(base: Path, folder: Path, index: int, what: str) -> Path:
    """A store whose labels/qc marks the top half 'pen' (saying what a pen artefact is:
    `what`), planned and given features: its tiles' QC shares are columns."""
    path = folder / f"q{index}.ome.zarr"
    shutil.copytree(base, path)
    slide = open_slide(path)
    h, w = -(-slide.shape[1] // 16), -(-slide.shape[2] // 16)
    label = np.zeros((h, w), np.uint8)
    label[: h // 2] = 1
    facts = {"classes": ["pen"], "downsample": [16.0, 16.0], "what": {"pen": what}}
    classes = [("background", (0, 0, 0, 0)), ("pen", (0, 0, 255, 255))]
    write_label(slide, "qc", label, (16.0, 16.0), classes, facts, method="test")
    plan = tilestore.plan_slide(open_slide(path), COARSE)
    assert list(plan.qc) == ["pen"]
    save_plan(open_slide(path), plan)
    features = np.random.default_rng(index).standard_normal((len(plan), 8)).astype(np.float32)
    write_features(path, MODEL, features, plan=plan.name, batch_size=16)
    return path


def test_qc_shares_of_other_artefact_definitions_are_refused_or_left_out(planned, tmp_path):
    a = _with_qc(planned, tmp_path, 0, "ink of a marker pen")
    b = _with_qc(planned, tmp_path, 1, "ink, or any dark blue stain")
    c = _with_qc(planned, tmp_path, 2, "ink of a marker pen")
    ds = tilestore.open_embeddings([a, c], "m")  # defined alike: one column
    assert ds["qc_pen"].values.max() > 0.5 and not np.isnan(ds["qc_pen"].values).any()
    with pytest.raises(MixedResults, match=r"q1\.ome\.zarr: its QC shares .*qc pen is"):
        tilestore.open_embeddings([a, b], "m")
    with pytest.warns(TilestoreWarning, match=r"left out the QC shares columns"):
        ds = tilestore.open_embeddings([a, b], "m", skip_mixed=True)
    assert "qc_pen" not in ds.coords


# -- ds.tiles.nearest ----------------------------------------------------------------------


def test_nearest_refuses_a_query_of_another_scale_or_one_that_says_nothing(two_scales, planned):
    coarse = tilestore.open_embeddings(two_scales[0], "m")
    fine = tilestore.open_embeddings(two_scales[1], "m")
    with pytest.raises(MixedResults, match=r"more than one scale"):
        coarse.tiles.nearest(fine.isel(tile=[0]), k=3)
    fine_meta = read_record(zarr.open_group(two_scales[1], path=group_of(two_scales[1], "m")),
                            EmbeddingsRecord, "fine").to_attrs()  # fmt: skip
    vector = fine["features"].values[0]
    with pytest.raises(MixedResults, match=r"more than one scale"):
        coarse.tiles.nearest(vector, k=3, recipe=recipe(fine_meta))
    with pytest.raises(MixedResults, match=r"^nearest: nothing says how the query was made"):
        coarse.tiles.nearest(vector, k=3)
    # the caller vouches for the vector: scored as given
    hits = coarse.tiles.nearest(vector, k=3, unchecked=True)
    assert hits["tile"].shape == (1, 3)
    # tiles of the same store at the same scale are checked and found, themselves first
    again = tilestore.open_embeddings(two_scales[0], "m")
    hits = coarse.tiles.nearest(again.isel(tile=[4]), k=2)
    assert hits["tile"].values[0, 0] == 4
    assert hits["similarity"].values[0, 0] == pytest.approx(1.0, abs=1e-6)


# -- slide vectors and the exports of cohorts -----------------------------------------------


def test_slide_vectors_of_tiles_at_two_scales_are_refused(two_scales):
    for store in two_scales:
        tiles = read_tile_features(store, "m")
        record = {"weights": None, "revision": None, "precision": "fp32", "dim": 8}
        write_slide_vector(tiles, "mean", tiles.features.mean(axis=0), record)
    with pytest.raises(MixedResults, match=SCALES):
        open_slide_embeddings(two_scales, "m", "mean")
    done = run_cli("export", "slides", *two_scales, "-m", "m", "--slide-encoder", "mean",
                   "-o", two_scales[0].parent / "slides.csv")  # fmt: skip
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "more than one scale" in done.stderr
    assert not (two_scales[0].parent / "slides.csv").exists()


def test_the_h5_cohort_export_refuses_two_scales(two_scales, tmp_path):
    with pytest.raises(MixedResults, match=SCALES):
        cohort_to_h5(two_scales, "m", tmp_path / "h5")
    assert not list(tmp_path.rglob("*.h5"))


def test_the_anndata_export_refuses_two_scales_in_one_line(two_scales, tmp_path):
    output = tmp_path / "tiles.h5ad"
    done = run_cli("export", "anndata", *two_scales, "-m", "m", "-o", output, "--no-images")
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "more than one scale" in done.stderr and not output.exists()


# -- classify -----------------------------------------------------------------------------


def test_classify_refuses_stores_of_two_scales_before_the_text_tower_loads(planned, tmp_path):
    plip = {"name": "plip", "output_dim": 8, "repo": "vinid/plip"}
    stores = [_store(planned, tmp_path, 0, COARSE, plip), _store(planned, tmp_path, 1, FINE, plip)]
    prompts = tmp_path / "tissue.json"
    prompts.write_text(json.dumps({"classnames": {"tumor": ["tumor"], "stroma": ["stroma"]}}))
    # no weights anywhere: the refusal is said before any are looked for
    done = run_cli("classify", *stores, "--model", "plip", "--prompts", prompts,
                   "--weights", tmp_path / "absent", "--device", "cpu")  # fmt: skip
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "'plip' embeddings come from tiles at more than one scale" in done.stderr
    assert not any((s / group_of(s, "plip") / "zeroshot").exists() for s in stores)


# -- the viewer ---------------------------------------------------------------------------


def test_the_viewer_computes_pca_within_each_scale_never_across(two_scales):
    from tilestore.view.catalog import Catalog

    slides = [open_slide(s) for s in two_scales]
    catalog = Catalog(slides, [str(s) for s in two_scales], [str(s) for s in two_scales])
    embedded = catalog.embedded("m")
    assert len(embedded.populations()) == 2  # a population per scale
    per_slide = [len(tilestore.open_embeddings(s, "m").tile) for s in two_scales]
    assert [len(p) for p in embedded.populations()] == per_slide
    # a query against the viewer's Dataset meets both populations' recipes: refused
    with pytest.raises(MixedResults, match=r"more than one scale"):
        embedded.ds.tiles.nearest(embedded.ds.isel(tile=[0]), k=1)
