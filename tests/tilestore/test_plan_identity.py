"""A plan is known by what it is, not by its name (issue 69): two plans made with other
settings never share a default name, and a plan of a name stored already is never replaced
implicitly: the very same plan is kept, one made otherwise refused in one line naming how
they differ. Real CMU-1-Small-Region store, its real tissue mask."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import CMU, SLIDES
from tilestore.embed.models import get_model
from tilestore.embed.opening import plan_for
from tilestore.errors import PlanError
from tilestore.masks.tissue import compute_tissue, write_tissue
from tilestore.plan import (
    PlanOptions,
    list_plans,
    load_plan,
    plan_over_tissue,
    plan_recipe,
    save_plan,
)
from tilestore.reading.opening import open_slide

CMU_SLIDE = SLIDES / CMU


def _roi(folder, x0: int) -> str:
    """A rectangle ROI (QuPath GeoJSON) named roi.geojson in `folder`: two folders give two
    files of one name and other content."""
    folder.mkdir(parents=True, exist_ok=True)
    box = [[x0, 300], [x0 + 1400, 300], [x0 + 1400, 2600], [x0, 2600], [x0, 300]]
    feature = {"type": "Feature", "properties": {"classification": {"name": "Tumor"}},
               "geometry": {"type": "Polygon", "coordinates": [box]}}  # fmt: skip
    path = folder / "roi.geojson"
    path.write_text(json.dumps({"type": "FeatureCollection", "features": [feature]}))
    return str(path)


@pytest.fixture(scope="module")
def masked(tmp_path_factory, stores):
    """The CMU store with its tissue mask stored (plans read it, as after `tilestore tissue`)."""
    target = tmp_path_factory.mktemp("masked") / "CMU-1-Small-Region.ome.zarr"
    shutil.copytree(stores(CMU), target)
    slide = open_slide(target)
    write_tissue(slide, compute_tissue(slide, "auto"))
    return target


@pytest.fixture
def fresh(masked, tmp_path):
    """A private copy of the masked store."""
    target = tmp_path / masked.name
    shutil.copytree(masked, target)
    return target


@pytest.fixture(scope="module")
def rois(tmp_path_factory):
    root = tmp_path_factory.mktemp("rois")
    return [_roi(root / "a", 200), _roi(root / "b", 700)]


SETTINGS = {
    "mpp": st.sampled_from([None, 0.5, 1.0]),
    "tile": st.sampled_from([None, 112, 224]),
    "stride": st.sampled_from([None, 112]),
    "min_tissue": st.sampled_from([None, 0.2, 0.9]),
    "roi": st.sampled_from([None, 0, 1]),  # an index into the two ROI files of one name
    "min_roi": st.sampled_from([0.5, 0.8]),
    "roi_class": st.sampled_from([None, "Tumor"]),
    "tolerance": st.sampled_from([0.02, 0.1]),
    "name": st.sampled_from([None, None, None, "mine"]),
}


def _options(drawn: dict, rois: list[str]) -> PlanOptions:
    given_ = {k: v for k, v in drawn.items() if v is not None}
    if "roi" in given_:
        given_["roi"] = rois[given_["roi"]]
    else:
        given_.pop("roi_class", None)
    return PlanOptions(**given_)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(first=st.fixed_dictionaries(SETTINGS), second=st.fixed_dictionaries(SETTINGS))
def test_two_plans_get_two_names_or_the_second_is_refused(masked, tmp_path, rois, first, second):
    store = tmp_path / "s.ome.zarr"
    shutil.rmtree(store, ignore_errors=True)
    shutil.copytree(masked, store)
    slide = open_slide(store)
    try:
        a = plan_over_tissue(slide, _options(first, rois))
        b = plan_over_tissue(slide, _options(second, rois))
    except PlanError:  # no tile kept (a small ROI with min_roi 0.8 at 1 um/px): nothing to store
        return
    uid_a = save_plan(slide, a)
    try:
        uid_b = save_plan(slide, b)
    except PlanError as refused:
        assert a.name == b.name and "made otherwise" in str(refused) and "\n" not in str(refused)
        assert load_plan(slide, a.name)[1] == uid_a  # the first stays, untouched
        return
    if a.name == b.name:  # kept as it was: only the very same plan shares a name
        assert uid_b == uid_a and plan_recipe(a) == plan_recipe(b)
        assert list_plans(slide) == [a.name]
    else:
        assert load_plan(slide, a.name)[1] == uid_a and load_plan(slide, b.name)[1] == uid_b
    if first["name"] is None and second["name"] is None and plan_recipe(a) != plan_recipe(b):
        # default names say every setting but the ROI file's content (compared, and refused)
        assert a.name != b.name or a.params["roi_sha256"] != b.params["roi_sha256"]


def _counts(slide) -> dict[str, int]:
    return {name: len(load_plan(slide, name)[0]) for name in list_plans(slide)}


def test_embed_without_a_plan_keeps_the_users_plans(fresh, rois):
    """Issue 69, 1: `embed` without --plan on a store of two plans replaced the 30-tile
    min-tissue 0.9 plan with 45 default tiles under its name, exit 0."""
    slide = open_slide(fresh)
    save_plan(slide, plan_over_tissue(slide, PlanOptions(mpp=0.5, tile=224, roi=rois[0])))
    strict = plan_over_tissue(slide, PlanOptions(mpp=0.5, tile=224, min_tissue=0.9))
    uid = save_plan(slide, strict)
    before = _counts(slide)
    made, _ = plan_for(slide, get_model("efficientnet-lite0"), None)
    assert made.name == "0.5mpp-224px" and strict.name == "0.5mpp-224px-t0.9"
    assert _counts(slide) == {**before, made.name: len(made)}
    assert len(made) > len(strict) and load_plan(slide, strict.name)[1] == uid
    # `embed --min-tissue 0.9` on a store of one default plan: the same plan, kept as it is
    again, same = plan_for(slide, get_model("efficientnet-lite0"), PlanOptions(min_tissue=0.9))
    assert again.name == strict.name and same == uid


@pytest.mark.parametrize(
    "stored, said",
    [
        (
            PlanOptions(mpp=0.5, tile=224, min_tissue=0.9, name="0.5mpp-224px"),
            "min_tissue=0.9 -> 0.5",
        ),
        (PlanOptions(mpp=0.5, tile=224, stride=112, name="0.5mpp-224px"), "stride=112 -> 224"),
    ],
)
def test_a_plan_of_the_default_name_made_otherwise_is_refused_not_replaced(
    fresh, rois, stored, said
):
    """Stores planned before names said every setting: a plan under the default name made
    with other settings is kept, and a run that makes the default plan (the store holds
    two, so none is its only one) is refused in one line naming the difference."""
    slide = open_slide(fresh)
    save_plan(slide, plan_over_tissue(slide, PlanOptions(mpp=0.5, tile=224, roi=rois[0])))
    uid = save_plan(slide, plan_over_tissue(slide, stored))
    with pytest.raises(PlanError) as refused:
        plan_for(slide, get_model("efficientnet-lite0"), None)
    message = str(refused.value)
    assert message.startswith(
        f"{slide.name}: plan '0.5mpp-224px' is stored already, made otherwise"
    )
    assert said in message and "\n" not in message
    assert load_plan(slide, "0.5mpp-224px")[1] == uid
    # the dry run (writes nothing) says the same
    with pytest.raises(PlanError, match="made otherwise"):
        plan_for(slide, get_model("efficientnet-lite0"), None, save=False)


def test_the_same_settings_over_another_tissue_mask_are_refused(fresh):
    slide = open_slide(fresh)
    first, uid = plan_for(slide, get_model("efficientnet-lite0"), PlanOptions(mpp=0.5))
    tissue = compute_tissue(slide, "auto")
    half = tissue.mask.copy()
    half[:, : half.shape[1] // 2] = False  # the tissue mask replaced: its left half cleared
    write_tissue(slide, dataclasses.replace(tissue, mask=half))
    slide = open_slide(fresh)
    with pytest.raises(PlanError, match=r"the same settings, other tiles: \d+ stored, \d+ now"):
        plan_for(slide, get_model("efficientnet-lite0"), PlanOptions(mpp=0.5))
    assert load_plan(slide, first.name)[1] == uid


def test_a_slide_of_pixels_not_square_is_refused_at_any_mpp(tmp_path):
    """A new user's find (issue 69): an OME-TIFF of 0.5 x 0.25 um/px was planned and embedded
    as "224 px tiles at 0.5 um/px": each tile 112 x 56 um, exit 0."""
    import tifffile

    from tilestore.conversion import convert

    pixels = tifffile.imread(CMU_SLIDE, key=0)[1000:2024, 800:1824]
    source = tmp_path / "aniso.ome.tif"
    sizes = {"axes": "YXS", "PhysicalSizeX": 0.5, "PhysicalSizeY": 0.25}
    tifffile.imwrite(
        source, pixels, tile=(256, 256), photometric="rgb", compression="jpeg", metadata=sizes
    )
    slide = open_slide(convert(source, tmp_path / "out").store)
    assert slide.mpp == pytest.approx((0.5, 0.25))
    with pytest.raises(PlanError, match=r"its pixels are not square \(0\.5 x 0\.25 um/px") as no:
        plan_over_tissue(slide, PlanOptions(mpp=0.5, tile=224, min_tissue=0))
    assert "would cover 112 x 56 um" in str(no.value)
    assert len(plan_over_tissue(slide, PlanOptions(mpp="level0", tile=224, min_tissue=0))) == 16
