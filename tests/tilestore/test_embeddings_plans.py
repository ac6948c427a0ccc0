"""One model's embeddings of several plans in one store (issue 69): a tissue plan's and a
ROI plan's features of the same model live side by side, at embeddings/<model>/<plan>;
readers take plan= and refuse to guess; a store made before (embeddings/<model> itself the
group of its one plan) keeps its group where it is, read and resumed, and another plan's
group is made beside it. Real CMU-1-Small-Region store."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from tilestore.embeddings import (
    embeddings_status,
    open_embeddings,
    plan_groups,
    read_tile_features,
)
from tilestore.embeddings.write import write_features
from tilestore.errors import OptionError
from tilestore.plan import PlanOptions, load_plan, plan_over_tissue, save_plan
from tilestore.reading.opening import open_slide


@pytest.fixture
def two_plans(store):
    """A store with two plans of other tiles: 224 px tiles at 1 um/px, and the same every 112 px."""
    path = store()
    slide = open_slide(path)
    plans = []
    for options in (PlanOptions(mpp=1.0, tile=224), PlanOptions(mpp=1.0, tile=224, stride=112)):
        plan = plan_over_tissue(slide, options)
        save_plan(slide, plan)
        plans.append(plan)
    rng = np.random.default_rng(0)
    features = [rng.standard_normal((len(p), 8)).astype(np.float32) for p in plans]
    return path, plans, features


def test_one_models_embeddings_of_two_plans_live_side_by_side(two_plans):
    path, (a, b), (fa, fb) = two_plans
    assert len(a) != len(b)
    write_features(path, {"name": "m"}, fa, plan=a.name)
    write_features(path, {"name": "m"}, fb, plan=b.name)  # replaced the first before
    assert plan_groups(path, "m") == {
        a.name: f"embeddings/m/{a.name}",
        b.name: f"embeddings/m/{b.name}",
    }
    with pytest.raises(OptionError) as guess:
        open_embeddings(path, "m")
    assert f"'m' embeddings of 2 plans ({a.name}, {b.name}); name one with plan=" in str(
        guess.value
    )
    np.testing.assert_array_equal(open_embeddings(path, "m", plan=a.name).features.values, fa)
    np.testing.assert_array_equal(open_embeddings(path, "m", plan=b.name).features.values, fb)
    np.testing.assert_array_equal(read_tile_features(path, "m", b.name).x, b.x)
    found = {g.plan: g.state for g in embeddings_status(path, "m").groups}
    assert found == {a.name: "complete", b.name: "complete"}
    # the one replaced, the other untouched
    write_features(path, {"name": "m"}, fa * 2, plan=a.name, overwrite=True)
    np.testing.assert_array_equal(open_embeddings(path, "m", plan=a.name).features.values, fa * 2)
    np.testing.assert_array_equal(open_embeddings(path, "m", plan=b.name).features.values, fb)


def _as_made_before(path, model: str, plan: str) -> None:
    """Move a group to the layout of stores made before: embeddings/<model> itself."""
    folder = path / "embeddings" / model
    inner = folder / plan
    (folder / "zarr.json").unlink()
    for item in inner.iterdir():
        shutil.move(str(item), folder / item.name)
    inner.rmdir()


def test_a_store_made_before_keeps_its_group_where_it_is(two_plans):
    path, (a, b), (fa, fb) = two_plans
    write_features(path, {"name": "m"}, fa, plan=a.name)
    _as_made_before(path, "m", a.name)
    assert plan_groups(path, "m") == {a.name: "embeddings/m"}
    np.testing.assert_array_equal(open_embeddings(path, "m").features.values, fa)
    assert [g.state for g in embeddings_status(path, "m", plan=a.name).groups] == ["complete"]
    # its plan again: the group where it is (complete: kept, not made again elsewhere)
    with pytest.raises(Exception, match="already complete"):
        write_features(path, {"name": "m"}, fa, plan=a.name)
    # another plan: made beside it; both read
    write_features(path, {"name": "m"}, fb, plan=b.name)
    assert plan_groups(path, "m") == {a.name: "embeddings/m", b.name: f"embeddings/m/{b.name}"}
    np.testing.assert_array_equal(open_embeddings(path, "m", plan=a.name).features.values, fa)
    np.testing.assert_array_equal(open_embeddings(path, "m", plan=b.name).features.values, fb)
    found = {g.plan: (g.path, g.state) for g in embeddings_status(path).groups}
    assert found == {
        a.name: ("embeddings/m", "complete"),
        b.name: (f"embeddings/m/{b.name}", "complete"),
    }


def test_a_plan_may_not_take_a_groups_own_subgroup_name(store):
    for name in ("slides", "zeroshot"):
        with pytest.raises(OptionError, match=f"name='{name}': a plan's name is a group"):
            PlanOptions(name=name)


def test_every_reader_refuses_a_group_whose_plan_was_stored_again(two_plans, tmp_path):
    """A new user's find (issue 69): status said "other plan" (exit 2) but open_embeddings and
    export h5/anndata/map --plan served the replaced plan's tiles under its name, exit 0."""
    from tilestore.embeddings import NotEmbedded
    from tilestore.exports import cohort_to_h5

    path, (a, _), (fa, _) = two_plans
    write_features(path, {"name": "m"}, fa, plan=a.name)
    slide = open_slide(path)
    save_plan(slide, a.subset(np.arange(len(a)) % 2 == 0), overwrite=True)  # its name, other tiles
    said = f"{path}: embeddings/m/{a.name} was made from an earlier plan {a.name!r}"
    for read in (
        lambda: open_embeddings(path, "m", plan=a.name),
        lambda: open_embeddings(path, "m", plan=a.name, skip_missing=False),
        lambda: read_tile_features(path, "m", a.name),
        lambda: cohort_to_h5([path], "m", tmp_path / "h5", plan=a.name),
    ):
        with pytest.raises(NotEmbedded) as refused:
            read()
        assert str(refused.value).startswith(said) and "stored again since" in str(refused.value)
    assert [g.state for g in embeddings_status(path, "m", plan=a.name).groups] == ["other plan"]
    assert not (tmp_path / "h5").exists() or not list((tmp_path / "h5").iterdir())


def test_a_complete_group_of_other_channels_is_never_skipped_as_this_runs(two_plans):
    """A new user's find (issue 69): embed --channels FITC,Cy3,DAPI over a complete
    DAPI,FITC,Cy3 run said "already complete", exit 0: its features are of other pixels."""
    from tilestore.embeddings import AlreadyComplete, EmbeddingWriter, RunIdentity, resume_state
    from tilestore.errors import EmbeddingError

    path, (a, _), (fa, _) = two_plans
    slide = open_slide(path)
    _, uid = load_plan(slide, a.name)

    def writer(channels, **kwargs):
        run = RunIdentity({"name": "m", "output_dim": 8}, 16, "float32", "fp32", False, channels)
        return EmbeddingWriter(slide, a, uid, run, **kwargs)

    made = writer(("DAPI", "FITC", "Cy3"))
    for block in made.todo():
        made.write(int(block), fa[block * 16 : (block + 1) * 16])
    made.finish({})
    with pytest.raises(AlreadyComplete):  # the same channels: complete, skipped
        writer(("DAPI", "FITC", "Cy3"))
    with pytest.raises(EmbeddingError) as refused:
        writer(("FITC", "Cy3", "DAPI"))
    assert (
        "is complete but was made otherwise (channels: ['DAPI', 'FITC', 'Cy3'], this run "
        in str(refused.value)
    )
    held = resume_state(slide, "m", a.name, uid, len(a), {"channels": ["FITC", "Cy3", "DAPI"]})
    assert held.state == "other settings"
    again = writer(("FITC", "Cy3", "DAPI"), overwrite=True)  # asked: embedded again so
    again.abandon()
