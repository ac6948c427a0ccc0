"""Plans on real slides: stored, reloaded, opened by xarray; ROI reads touch only their chunks."""

from __future__ import annotations

import json
import shutil
import warnings

import numpy as np
import pytest
import xarray as xr

from tests.conftest import CMU, KIDNEY, MONUSEG, NDPI
from tests.counting import CountingStore
from tilestore.conversion.converter import convert
from tilestore.errors import PlanError, TilestoreWarning
from tilestore.plan import (
    PlanOptions,
    list_plans,
    load_plan,
    plan_over_tissue,
    plan_rois,
    resolve_plan,
    save_plan,
)
from tilestore.plan.tiles import iter_tiles
from tilestore.reading.opening import open_slide

# A tumour-region ROI on CMU-1-Small-Region, as QuPath exports it (level-0 px, y down).
CMU_ROI = {
    "type": "FeatureCollection",
    "features": [
        {
            "type": "Feature",
            "properties": {"classification": {"name": "Tumor"}},
            "geometry": {
                "type": "Polygon",
                "coordinates": [
                    [[700, 1300], [1500, 1250], [1650, 1900], [900, 2100], [700, 1300]]
                ],
            },
        },
        {
            "type": "Feature",
            "properties": {"classification": {"name": "Stroma"}},
            "geometry": {
                "type": "Polygon",
                "coordinates": [
                    [[600, 2300], [1200, 2300], [1200, 2700], [600, 2700], [600, 2300]]
                ],
            },
        },
    ],
}


@pytest.fixture
def copy_of(tmp_path, stores):
    def copy(name, **kwargs):
        target = tmp_path / f"{name}.ome.zarr"
        shutil.copytree(stores(name, **kwargs), target)
        return target

    return copy


@pytest.fixture
def cmu_roi(tmp_path):
    path = tmp_path / "cmu-roi.geojson"
    path.write_text(json.dumps(CMU_ROI))
    return path


def test_he_plan_keeps_tissue_tiles(copy_of):
    slide = open_slide(copy_of(CMU))
    plan = plan_over_tissue(slide)
    assert plan.name == "0.5mpp-224px"
    assert (plan.spec.level, plan.spec.read, plan.spec.effective_mpp) == (0, 224, 0.499)
    assert any("tissue mask computed" in n for n in plan.notes)
    rows, cols = plan.spec.grid
    assert (rows, cols) == (13, 9) and 30 < len(plan) < rows * cols
    assert plan.tissue.min() >= 0.5
    # tissue on the kept tiles is really there: they are darker than glass
    means = [tile.mean() for _, tile in iter_tiles(slide, plan)]
    assert max(means) < 225


def test_the_plan_layers_old_name_warns_and_is_plan_over_tissue(copy_of):
    """tilestore.plan.plan_slide (the tutorials' name for the plan layer's planner, before it
    was plan_over_tissue: tilestore.plan_slide is another function) still plans, and says
    what to call instead."""
    import tilestore.plan

    slide = open_slide(copy_of(CMU))
    with pytest.warns(DeprecationWarning, match=r"tilestore\.plan\.plan_over_tissue now"):
        old = tilestore.plan.plan_slide(slide, PlanOptions(mpp=1.0, tile=128))
    new = plan_over_tissue(slide, PlanOptions(mpp=1.0, tile=128))
    assert old.name == new.name == "1mpp-128px" and len(old) == len(new) > 0
    assert (old.row == new.row).all() and (old.col == new.col).all()


def test_saved_plan_round_trips_and_opens_in_xarray(copy_of):
    store = copy_of(CMU)
    slide = open_slide(store)
    plan = plan_over_tissue(slide, PlanOptions(mpp=1.0, tile=128, stride=64))
    uid = save_plan(slide, plan)
    assert list_plans(open_slide(store)) == ["1mpp-128px-s64"]
    again, uid2 = load_plan(open_slide(store))
    assert uid2 == uid and again.spec == plan.spec
    np.testing.assert_array_equal(again.x, plan.x)
    np.testing.assert_array_equal(again.chunk_rows, plan.chunk_rows)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # plain xarray opens it cleanly, as docs/guide shows
        ds = xr.open_zarr(store, group="plans/1mpp-128px-s64", consolidated=False)
    assert set(ds.data_vars) >= {"x", "y", "row", "col", "tissue", "roi", "roi_class"}
    assert ds.sizes["tile"] == len(plan)
    np.testing.assert_array_equal(ds.x.values, plan.x)
    assert save_plan(slide, plan) == uid  # the very same plan: kept as it is, nothing written
    other = plan.subset(np.arange(len(plan)) > 0)  # its name, other tiles
    with pytest.raises(PlanError, match=r"made otherwise .*replace the stored plan"):
        save_plan(slide, other)
    assert load_plan(slide, plan.name)[1] == uid
    assert save_plan(slide, other, overwrite=True) != uid


def test_roi_plan_classes_and_preview_inputs(copy_of, cmu_roi):
    slide = open_slide(copy_of(CMU))
    plan = plan_over_tissue(slide, PlanOptions(roi=cmu_roi, min_tissue=0.0))
    assert plan.classes == ["", "Stroma", "Tumor"]
    names = {plan.classes[i] for i in plan.roi_class}
    assert names == {"Stroma", "Tumor"}
    assert plan.roi.min() >= 0.5
    tumour = plan_over_tissue(slide, PlanOptions(roi=cmu_roi, roi_class="Tumor", min_tissue=0.0))
    assert len(tumour) < len(plan) and set(tumour.roi_class.tolist()) == {1}
    assert tumour.name == "0.5mpp-224px-t0-cmu-roi-Tumor"  # every setting not the default


def test_roi_restricted_read_touches_exactly_the_planned_chunks(copy_of, cmu_roi):
    store = copy_of(CMU)
    plan = plan_over_tissue(open_slide(store), PlanOptions(roi=cmu_roi, min_tissue=0.0))
    counting = CountingStore.local(store)
    slide = open_slide(counting)
    counting.log.clear()
    tiles = dict(iter_tiles(slide, plan))
    assert sorted(tiles) == list(range(len(plan)))
    expected = {f"0/c/0/{r}/{c}" for r, c in plan.needed_chunks().tolist()}
    read = counting.log.chunk_keys("0")
    assert len(read) == len(set(read))  # each chunk once
    assert set(read) == expected  # exactly the plan's chunks, none outside
    # and once the level's positions, each chunk's CRC-32C by place (a few hundred bytes)
    assert set(counting.log.chunk_keys()) - set(read) == {"crc32c/0/c/0/0/0"}
    assert len(expected) < 0.4 * 130  # the ROI really limits reading (130 chunks in level 0)
    reader = open_slide(store).chunks(0)
    planned_bytes = sum(at.length for at in reader.locations(plan.needed_chunks().tolist()))
    assert counting.log.chunk_bytes() / planned_bytes <= 1.05  # shard indexes included


def test_tiles_equal_read_region(copy_of):
    slide = open_slide(copy_of(CMU))
    plan = plan_over_tissue(slide, PlanOptions(mpp=0.75, tile=96, min_tissue=0.3))
    assert plan.spec.read == 144  # 96 px at 0.75 um/px from 0.499 um/px
    for index, pixels in iter_tiles(slide, plan):
        x, y = int(plan.x[index]), int(plan.y[index])
        np.testing.assert_array_equal(pixels, slide.read_region(x, y, 144, 144, level=0))


def test_tiles_from_a_coarser_zstd_level(copy_of):
    slide = open_slide(copy_of(NDPI))
    plan = plan_over_tissue(slide, PlanOptions(mpp=0.9, tile=128))
    assert plan.spec.level == 2 and plan.spec.read == 128  # 0.9127 um/px within 2%
    for index, pixels in list(iter_tiles(slide, plan))[::7]:
        np.testing.assert_array_equal(
            pixels, slide.read_region(int(plan.x[index]), int(plan.y[index]), 128, 128, level=2)
        )


def test_monuseg_polygons_as_roi(tmp_path, annotation_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TilestoreWarning)
        store = convert(annotation_path(f"{MONUSEG}.tif"), tmp_path, mpp=0.2456).store
    slide = open_slide(store)
    plan = plan_over_tissue(
        slide,
        PlanOptions(
            mpp=0.25, tile=64, min_tissue=0.0, min_roi=0.3, roi=annotation_path(f"{MONUSEG}.xml")
        ),
    )
    assert any("repaired 190 invalid polygons" in n for n in plan.notes)
    assert 0 < len(plan) < 225  # 15x15 grid; only tiles 30% covered by nuclei
    assert plan.roi.min() >= 0.3


def test_roi_mpp_rescales_to_level_0(copy_of, tmp_path, cmu_roi):
    roi = tmp_path / "half.geojson"
    half = json.loads(json.dumps(CMU_ROI))  # the same ROI drawn at 0.998 um/px: half the numbers
    for f in half["features"]:
        f["geometry"]["coordinates"] = [
            [[x / 2, y / 2] for x, y in ring] for ring in f["geometry"]["coordinates"]
        ]
    roi.write_text(json.dumps(half))
    slide = open_slide(copy_of(CMU))
    scaled = plan_over_tissue(slide, PlanOptions(roi=roi, roi_mpp=0.998, min_tissue=0.0))
    reference = plan_over_tissue(slide, PlanOptions(roi=cmu_roi, min_tissue=0.0))
    assert any("scaled by 2" in n for n in scaled.notes)
    np.testing.assert_array_equal(scaled.x, reference.x)
    np.testing.assert_array_equal(scaled.y, reference.y)
    np.testing.assert_allclose(scaled.roi, reference.roi, atol=1e-6)
    # what the preview draws is what the plan kept tiles in: scaled, of the class asked for
    drawn = plan_rois(slide, resolve_plan(PlanOptions(roi=roi, roi_mpp=0.998), slide))
    want = plan_rois(slide, resolve_plan(PlanOptions(roi=cmu_roi), slide))
    assert drawn.union().symmetric_difference(want.union()).area < 1.0
    assert drawn.union().area == pytest.approx(want.union().area, rel=1e-6)
    tumour = resolve_plan(PlanOptions(roi=roi, roi_mpp=0.998, roi_class="Tumor"), slide)
    assert plan_rois(slide, tumour).union().area < 0.8 * want.union().area


def test_unknown_mpp_and_empty_plans_are_clear(copy_of):
    slide = open_slide(copy_of(KIDNEY))
    with pytest.raises(PlanError, match=r"pixel size unknown.*\(mpp='level0'\)"):
        plan_over_tissue(slide)
    with pytest.raises(PlanError, match=r"no tile of the .* grid kept.*tissue covers 0\.\d%"):
        plan_over_tissue(slide, PlanOptions(mpp="level0", tile=224))
    small = plan_over_tissue(slide, PlanOptions(mpp="level0", tile=32, min_tissue=0.5))
    assert small.spec.mpp is None and len(small) > 0


def test_load_plan_errors(copy_of):
    slide = open_slide(copy_of(CMU))
    with pytest.raises(PlanError, match="no plans in the store"):
        load_plan(slide)
    save_plan(slide, plan_over_tissue(slide))
    with pytest.raises(PlanError, match="no plan 'other'"):
        load_plan(slide, "other")
