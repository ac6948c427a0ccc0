"""Results meet only where they were made alike (`tilestore.embeddings.recipe.combine`): stores
planned at different scales are refused by every cohort reader and export, or kept by the
scale the user names; features of another recipe are refused; a run says how it read each
slide and refuses tiles that are not the model's input unless asked."""

from __future__ import annotations

import re
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tilestore
from tests.conftest import CMU, SLIDES, group_of, run_cli
from tilestore.embed import Options, embed
from tilestore.embeddings import MixedResults, open_slide_embeddings
from tilestore.embeddings.recipe import Scale, combine, parse_scale, recipe
from tilestore.embeddings.write import write_features
from tilestore.errors import OptionError, TilestoreWarning
from tilestore.exports import cohort_to_h5
from tilestore.plan import PlanOptions, save_plan
from tilestore.reading import open_slide

MODEL = {"name": "m", "output_dim": 8, "repo": "test/m"}
SLIDE = SLIDES / CMU

plans = st.builds(
    PlanOptions,
    mpp=st.sampled_from([0.5, 1.0, 2.0]),
    tile=st.sampled_from([32, 64, 128]),
    stride=st.sampled_from([None, 16]),
    min_tissue=st.just(0.0),
)


@pytest.fixture(scope="module")
def planned(tmp_path_factory, stores):
    """A store of CMU-1 with its tissue mask made once; each example copies it."""
    base = tmp_path_factory.mktemp("base") / "base.ome.zarr"
    shutil.copytree(stores(CMU), base)
    tilestore.plan_slide(open_slide(base), PlanOptions(mpp=2.0, tile=128))  # stores the mask
    return base


def _store_with(
    base: Path, folder: Path, index: int, options: PlanOptions, model: dict = MODEL
) -> Path:
    path = folder / f"s{index}.ome.zarr"
    shutil.copytree(base, path)
    slide = open_slide(path)
    plan = tilestore.plan_slide(slide, options)
    save_plan(slide, plan)
    features = np.random.default_rng(index).standard_normal((len(plan), 8)).astype(np.float32)
    write_features(path, model, features, plan=plan.name, batch_size=16)
    return path


def _scale(options: PlanOptions) -> Scale:
    return Scale(options.mpp, options.tile, options.stride or options.tile)


@settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(chosen=st.lists(plans, min_size=2, max_size=3))
def test_stores_of_random_plans_meet_only_at_one_scale(planned, tmp_path_factory, chosen):
    folder = tmp_path_factory.mktemp("cohort")
    paths = [_store_with(planned, folder, i, p) for i, p in enumerate(chosen)]
    scales = [_scale(p) for p in chosen]
    alike = all(s.matches(scales[0]) for s in scales)
    if alike:
        ds = tilestore.open_embeddings(paths, "m")
        assert len(ds.attrs["slides"]) == len(paths)
        assert len(cohort_to_h5(paths, "m", folder / "h5")) == len(paths)
    else:
        with pytest.raises(MixedResults, match=r"more than one scale.*name the one to keep"):
            tilestore.open_embeddings(paths, "m")
        with pytest.raises(MixedResults):
            cohort_to_h5(paths, "m", folder / "h5")
        assert not (folder / "h5").exists() or not list((folder / "h5").iterdir())
    # naming a scale keeps exactly the stores at it, and says the others were left out
    label = scales[0].label
    assert parse_scale(label).matches(scales[0])
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always", TilestoreWarning)
        ds = tilestore.open_embeddings(paths, "m", scale=label)
    kept = [m["store"] for m in ds.attrs["slides"]]
    assert kept == [str(p) for p, s in zip(paths, scales, strict=True) if s.matches(scales[0])]
    assert bool(said) == (len(kept) < len(paths))


def test_a_cohort_of_another_recipe_is_refused_whatever_its_scale(planned, tmp_path):
    a = _store_with(planned, tmp_path, 0, PlanOptions(mpp=1.0, tile=64, min_tissue=0))
    b = _store_with(planned, tmp_path, 1, PlanOptions(mpp=1.0, tile=64, min_tissue=0))
    group = open_slide(b).writable_group()[group_of(b, "m")]
    attrs = dict(group.attrs["tilestore"])
    attrs["model"] = {**attrs["model"], "repo": "test/other"}
    group.attrs["tilestore"] = attrs
    with pytest.raises(MixedResults, match=r"other settings.*repo: test/m \(s0.ome.zarr\) vs"):
        tilestore.open_embeddings([a, b], "m")
    with pytest.raises(MixedResults, match=r"other settings"):
        tilestore.open_embeddings([a, b], "m", scale="1mpp-64px")


def test_the_refusal_lists_each_scale_and_its_stores(planned, tmp_path):
    paths = [
        _store_with(planned, tmp_path, 0, PlanOptions(mpp=0.5, tile=128, min_tissue=0)),
        _store_with(planned, tmp_path, 1, PlanOptions(mpp=2.0, tile=32, min_tissue=0)),
        _store_with(planned, tmp_path, 2, PlanOptions(mpp=0.5, tile=128, min_tissue=0)),
    ]
    with pytest.raises(MixedResults) as refused:
        tilestore.open_embeddings(paths, "m")
    message = str(refused.value)
    # the pixels' own um/px: CMU's level 0 (0.499) read as is for 0.5
    assert "0.499mpp-128px: 2 store(s)" in message and "2mpp-32px: 1 store(s)" in message
    assert "\n" not in message
    with pytest.raises(MixedResults, match=r"scale='1mpp-64px': none of these"):
        tilestore.open_embeddings(paths, "m", scale="1mpp-64px")


@pytest.mark.parametrize("label", ["0mpp-64px", "0.0mpp-64px", "1mpp-0px", "1mpp-64px-s0"])
def test_a_scale_of_0_um_px_or_0_px_is_refused_at_the_door(planned, tmp_path, label):
    """A 0 um/px scale divided by zero when matched against the stores' (an internal error
    from every reader and export); a 0 px tile or stride names no scale a store can have."""
    paths = [
        _store_with(planned, tmp_path, 0, PlanOptions(mpp=1.0, tile=64, min_tissue=0)),
        _store_with(planned, tmp_path, 1, PlanOptions(mpp=2.0, tile=64, min_tissue=0)),
    ]
    said = rf"^scale='{re.escape(label)}': must be a scale's label, .*um/px above 0, sizes of 1"
    with pytest.raises(OptionError, match=said):
        tilestore.open_embeddings(paths, "m", scale=label)
    with pytest.raises(OptionError, match=said):
        cohort_to_h5(paths, "m", tmp_path / "h5", scale=label)
    with pytest.raises(ValueError):
        parse_scale(label)
    run = run_cli("export", "h5", *paths, "-m", "m", "-o", tmp_path / "h5", "--scale", label)
    assert run.returncode == 2 and run.stderr.startswith(f"tilestore: error: --scale {label}: ")
    assert run.stderr.count("\n") == 1 and not (tmp_path / "h5").exists()


def test_pixel_sizes_within_the_tolerance_are_one_scale():
    assert Scale(0.499, 224, 224).matches(Scale(0.5015, 224, 224))
    assert Scale(0.49, 224, 224).matches(Scale(0.51, 224, 224))  # two reads as is of 0.5
    assert Scale(0.51, 224, 224).matches(Scale(0.49, 224, 224))  # either way round
    assert not Scale(0.5, 224, 224).matches(Scale(0.25, 224, 224))
    assert not Scale(0.3, 64, 64).matches(Scale(0.25, 64, 64))
    assert not Scale(None, 224, 224).matches(Scale(0.5, 224, 224))
    assert Scale(None, 224, 224).matches(Scale(None, 224, 224))
    assert not Scale(0.5, 224, 224).matches(Scale(0.5, 224, 112))
    assert Scale(None, 256, 128).label == "level0-256px-s128"


def test_level0_plans_of_slides_at_different_pixel_sizes_are_not_one_scale(
    planned, tmp_path, stores
):
    """level0 names how a plan reads, not a scale: a slide's level-0 pixels are at its own
    pixel size, and two slides' are one scale only where those agree."""
    coarse = tmp_path / "coarse.ome.zarr"
    tilestore.convert(SLIDE, coarse, mpp=1.0, override_mpp=True)  # told it is 1.0 um/px
    fine = _store_with(planned, tmp_path, 0, PlanOptions(mpp="level0", tile=64, min_tissue=0))
    slide = open_slide(coarse)
    plan = tilestore.plan_slide(slide, PlanOptions(mpp="level0", tile=64, min_tissue=0))
    save_plan(slide, plan)
    write_features(coarse, MODEL, np.ones((len(plan), 8), np.float32), plan=plan.name)
    with pytest.raises(MixedResults, match=r"0.499-1mpp-64px: 2 store"):
        tilestore.open_embeddings([fine, coarse], "m")


def test_the_scale_is_the_pixels_read_not_the_um_px_asked(planned, tmp_path):
    """A tolerance of 0.25 reads CMU-1's 0.499 um/px level as is for 0.6: those tiles are at
    0.499, not at 0.6, and are not one scale with tiles read at 0.6."""
    loose = _store_with(
        planned, tmp_path, 0, PlanOptions(mpp=0.6, tile=64, tolerance=0.25, min_tissue=0)
    )
    exact = _store_with(planned, tmp_path, 1, PlanOptions(mpp=0.6, tile=64, min_tissue=0))
    with pytest.raises(MixedResults, match=r"0.499-0.6mpp-64px: 2 store"):
        tilestore.open_embeddings([loose, exact], "m")


def test_the_answer_does_not_depend_on_the_stores_order(planned, tmp_path):
    meta = {"model": MODEL, "precision": "fp32", "mpp": 0.5, "tile_size": 224, "grid": {}}
    old = {"model": MODEL}  # a group from before precision and scale were recorded
    other = {**meta, "precision": "bf16", "mpp": 2.0, "tile_size": 32}
    for order in ([old, meta, other], [meta, old, other], [meta, other, old]):
        with pytest.raises(MixedResults):
            combine([(f"s{i}", recipe(m)) for i, m in enumerate(order)], "m")


def test_combine_keeps_the_order_and_refuses_before_anything(tmp_path):
    meta = {"model": MODEL, "precision": "fp32", "mpp": 0.5, "tile_size": 224, "grid": {}}
    same = [("a", recipe(meta)), ("b", recipe(meta))]
    assert combine(same, "m") == [0, 1]
    other = {**meta, "channels": ["DAPI", "CD8", "PanCK"]}
    with pytest.raises(MixedResults, match=r"channels: RGB \(a\) vs DAPI,CD8,PanCK"):
        combine([("a", recipe(meta)), ("b", recipe(other))], "m")


# timm:<arch> without its weights recorded this: random weights drawn without a seed
UNSEEDED = {**MODEL, "weights": "random", "weights_sha256": None}


def test_features_of_unknown_weights_are_never_put_with_another_stores(planned, tmp_path):
    """Two runs of timm:<arch> without its weights drew other random weights (cosine 0.015
    between their features of the same tiles), and their stores were combined silently (the
    weights' sha256 None in both). Now refused, naming the stores; one store alone opens."""
    options = PlanOptions(mpp=2.0, tile=128, min_tissue=0)
    a, b = (_store_with(planned, tmp_path, i, options, UNSEEDED) for i in (0, 1))
    with pytest.raises(MixedResults) as refused:
        tilestore.open_embeddings([a, b], "m")
    assert str(refused.value) == (
        f"{a}: its 'm' embeddings were made with random weights drawn without a seed (2 of 2 "
        "stores: s0.ome.zarr, s1.ome.zarr), weights no other run has: they cannot be put "
        "with other stores' features; open it alone, or embed again with pretrained weights "
        "or random:<architecture> (seeded)"
    )
    known = _store_with(planned, tmp_path, 2, options)  # with a store of known weights too
    with pytest.raises(MixedResults, match=r"s1\.ome\.zarr: its 'm' embeddings .* \(1 of 2"):
        tilestore.open_embeddings([known, b], "m")
    assert tilestore.open_embeddings([a], "m").sizes["tile"] > 0  # alone: read as it is


def test_seeded_random_weights_meet_only_the_same_draw():
    """random:<name>: the seed and the sha256 of what was drawn are recorded; two draws
    alike are one recipe, another draw (another GPU model lays one seed out otherwise) not."""
    drawn = {**MODEL, "weights": "random", "weights_seed": 0, "weights_sha256": "a" * 64}
    meta = {"model": drawn, "precision": "fp32", "mpp": 0.5, "tile_size": 224, "grid": {}}
    assert recipe(meta).unknown_weights is None
    assert combine([("a", recipe(meta)), ("b", recipe(meta))], "m") == [0, 1]
    other = {**meta, "model": {**drawn, "weights_sha256": "b" * 64}}
    with pytest.raises(MixedResults, match=r"weights_sha256: a{64} \(a\) vs b{64}"):
        combine([("a", recipe(meta)), ("b", recipe(other))], "m")
    unseeded = {**meta, "model": UNSEEDED}
    for order in ([meta, unseeded], [unseeded, meta]):  # whatever the order
        with pytest.raises(MixedResults, match=r"random weights drawn without a seed"):
            combine([(f"s{i}", recipe(m)) for i, m in enumerate(order)], "m")


def test_slide_vectors_of_tiles_at_different_scales_are_refused(embedded_cohort, tmp_path):
    from tilestore.embed.slides import embed_slides

    a, b = (tmp_path / "a.ome.zarr", tmp_path / "b.ome.zarr")
    shutil.copytree(embedded_cohort[0], a)
    shutil.copytree(embedded_cohort[0], b)
    again = Options(batch_size=16, device="cpu", precision="fp32", dtype="float32",
                    overwrite=True, any_scale=True)  # fmt: skip
    embed([b], "efficientnet-lite0", plan=PlanOptions(tile=112), options=again)
    # its 112 px plan's group is made beside the 'classes' one: b keeps only the new one
    shutil.rmtree(b / group_of(b, "efficientnet-lite0", "classes"))
    embed_slides([a, b], "mean", model="efficientnet-lite0", device="cpu")
    with pytest.raises(MixedResults, match=r"more than one scale"):
        open_slide_embeddings([a, b], "efficientnet-lite0", "mean")
    with pytest.warns(TilestoreWarning, match=r"left out 1 store\(s\).*a\.ome\.zarr"):
        kept = open_slide_embeddings([a, b], "efficientnet-lite0", "mean", scale="0.5mpp-112px")
    assert list(kept.store.values) == [str(b)]


def test_tiles_that_are_not_the_models_input_are_refused_unless_asked(store):
    path = store()
    options = Options(batch_size=16, device="cpu", precision="fp32", dtype="float32")
    report = embed([path], "efficientnet-lite0", plan=PlanOptions(tile=32), options=options)
    assert report.failures and "32 px tiles where the model reads 224 px" in str(report.failures)
    assert not (path / "embeddings").exists()
    asked = Options(batch_size=16, device="cpu", precision="fp32", dtype="float32",
                    any_scale=True, max_tiles=16)  # fmt: skip
    report = embed([path], "efficientnet-lite0", plan=PlanOptions(tile=32), options=asked)
    (slide,) = report.slides
    assert slide["reading"]["not_the_models_input"] == "32 px tiles where the model reads 224 px"
    assert slide["reading"]["tile"] == 32 and slide["reading"]["resample"] == 1.0
