"""Pixel sizes are facts: a size given supplies a missing one, replaces the one the file
states only as a recorded override, and a store made otherwise is never reused; one
plausible range for a file's size and a size given; magnifications never 0."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from tests.conftest import CMU, KIDNEY
from tilestore.conversion import check_mpp, convert, describe, open_in_place
from tilestore.embeddings.slides import TileFeatures
from tilestore.errors import OptionError, StoreError, TilestoreWarning
from tilestore.exports.h5 import coords_attributes, magnification
from tilestore.format.record import OVERRIDE, Mpp, StoreRecord
from tilestore.options import declarations
from tilestore.reading import open_slide
from tilestore.reading.resolution import GIVEN, check_made
from tilestore.sources.base import checked_mpp

SVS_MPP = Mpp(0.499, 0.499, "SVS ImageDescription MPP")  # what CMU-1-Small-Region states


def test_a_size_given_against_the_files_is_refused_before_anything_is_made(tmp_path, slide_path):
    src = slide_path(CMU)
    with pytest.raises(OptionError) as refused:
        convert(src, tmp_path / "out", mpp=0.25)
    said = str(refused.value)
    assert said.startswith(f"{src}: the file states 0.499 um/px (SVS ImageDescription MPP)")
    assert "not the 0.25 um/px given (mpp=0.25)" in said and "override_mpp=True" in said
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_an_override_is_recorded_with_the_files_own_and_info_says_so(tmp_path, slide_path):
    store = convert(slide_path(CMU), tmp_path, mpp=0.25, override_mpp=True).store
    mpp = open_slide(store).record.mpp
    assert mpp == Mpp(0.25, 0.25, OVERRIDE, SVS_MPP) and mpp.overridden
    assert open_slide(store).mpp == (0.25, 0.25)  # what every reader reads
    assert describe(store)["mpp"] == {
        "x": 0.25,
        "y": 0.25,
        "origin": "override",
        "file": {"x": 0.499, "y": 0.499, "origin": "SVS ImageDescription MPP"},
    }


def test_a_size_that_agrees_is_the_files(tmp_path, slide_path):
    store = convert(slide_path(CMU), tmp_path, mpp=0.5).store  # 0.2% from 0.499
    assert open_slide(store).record.mpp == SVS_MPP


def test_a_size_given_where_the_file_states_none_is_supplied(tmp_path, slide_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error", TilestoreWarning)  # nothing to warn of: a size given
        store = convert(slide_path(KIDNEY), tmp_path, mpp=0.5).store
    assert open_slide(store).record.mpp == Mpp(0.5, 0.5, GIVEN)


def test_an_override_without_a_size_is_refused(tmp_path, slide_path):
    with pytest.raises(OptionError, match=r"override_mpp=True replaces .* give the size too"):
        convert(slide_path(CMU), tmp_path, override_mpp=True)


def test_the_record_keeps_an_override_through_its_attributes():
    record = StoreRecord(levels=(), mpp=Mpp(0.25, 0.25, OVERRIDE, SVS_MPP))
    assert StoreRecord.parse(record.to_attrs(), "s").mpp == record.mpp
    plain = StoreRecord(levels=(), mpp=SVS_MPP).to_attrs()["mpp"]
    assert plain == {"x": 0.499, "y": 0.499, "origin": "SVS ImageDescription MPP"}  # as before


OVERRIDDEN = Mpp(0.2527, 0.2527, OVERRIDE, SVS_MPP)
SUPPLIED = Mpp(0.5, 0.5, GIVEN)


@pytest.mark.parametrize(
    ("recorded", "given", "override", "refused"),
    [
        (SVS_MPP, None, False, None),  # the file's, nothing asked
        (SVS_MPP, 0.5, False, None),  # agrees with the file's
        (SVS_MPP, 0.2527, False, "the file states 0.499 um/px"),  # the cohort reproducer
        (SVS_MPP, 0.2527, True, "made before with 0.499 um/px, not the override to 0.2527"),
        (OVERRIDDEN, None, False, "by override of the file's 0.499 um/px, not the file's own"),
        (OVERRIDDEN, 0.2527, False, "not the 0.2527 um/px asked"),  # an override, none asked
        (OVERRIDDEN, 0.2527, True, None),  # the same override
        (OVERRIDDEN, 0.25, True, "not the override to 0.25 um/px asked"),
        (SUPPLIED, None, False, None),  # a size given where the file had none: kept
        (SUPPLIED, 0.5, False, None),
        (SUPPLIED, 0.499, False, "made before with 0.5 um/px, not the 0.499 um/px asked"),
        (SUPPLIED, 0.5, True, "not the override to 0.5 um/px asked"),
        (None, 0.5, False, "made before with no pixel size"),
    ],
)
def test_a_store_made_before_stands_only_for_what_is_asked(recorded, given, override, refused):
    if refused is None:
        check_made(recorded, given, override, "s.ome.zarr")
    else:
        with pytest.raises((StoreError, OptionError), match=refused):
            check_made(recorded, given, override, "s.ome.zarr")


def test_a_sidecar_follows_the_same_rule(tmp_path, slide_path):
    src, sidecars = slide_path(CMU), tmp_path / "side"
    with pytest.raises(OptionError, match=r"the file states 0\.499 um/px"):
        open_in_place(src, sidecars, mpp=0.2527)
    assert not list(sidecars.glob("*.zarr"))  # nothing left that looks valid
    slide = open_in_place(src, sidecars, mpp=0.2527, override_mpp=True)
    assert slide.record.mpp == OVERRIDDEN
    assert open_in_place(src, sidecars, mpp=0.2527, override_mpp=True).mpp == (0.2527, 0.2527)
    sidecar = sidecars / f"{CMU}.tilestore.zarr"
    with pytest.raises(StoreError, match=f"{sidecar}: made before with 0.2527 um/px by override"):
        open_in_place(src, sidecars)  # no override asked now
    with pytest.raises(StoreError, match=r"not the override to 0\.3 um/px asked"):
        open_in_place(src, sidecars, mpp=0.3, override_mpp=True)
    assert open_slide(sidecar).record.mpp == OVERRIDDEN  # kept


def test_check_mpp_reads_the_stores_record(tmp_path, slide_path):
    slide = open_slide(convert(slide_path(CMU), tmp_path, mpp=0.3, override_mpp=True).store)
    check_mpp(slide, 0.3, "s", override=True)
    with pytest.raises(StoreError, match="by override"):
        check_mpp(slide, None, "s")


def test_one_plausible_range_for_a_size_given_and_a_files_own():
    declared = declarations(convert)["mpp"]
    # written out, not read from MPP_RANGE: the option and a file's own size, both 0.01..100
    assert (declared.opt.low, declared.opt.high, declared.opt.above) == (0.01, 100.0, False)
    for outside in (1e-7, 0.0099, 100.5, 352.8):  # 1e-7 made a 0x0 grid
        with pytest.raises(OptionError, match=r"^mpp=.*: must be a number of um/px from 0.01"):
            declared.check(outside)
        fact, warning = checked_mpp(outside, outside, "a tag")
        assert fact is None and "is not a microscope scan resolution" in warning
    for inside in (0.01, 100.0):
        assert declared.check(inside) == inside
        fact, warning = checked_mpp(inside, inside, "a tag")
        assert fact.value == (inside, inside) and warning is None


def _tiles(slide_mpp: tuple[float, float], mpp: float) -> TileFeatures:
    return TileFeatures(
        store="s", name="s", model="m", features=np.zeros((2, 2), np.float32),
        x=np.array([0, 224]), y=np.array([0, 0]), row=np.array([0, 0]), col=np.array([0, 1]),
        footprint0=(224.0, 224.0), stride0=(224.0, 224.0), mpp=mpp, tile_size=224, plan="p",
        finished="t", recipe={}, model_info={}, slide_mpp=slide_mpp, slide_shape=(700, 1152),
    )  # fmt: skip


def test_a_coarse_dicoms_magnifications_are_not_0(slide_path, stores):
    slide = open_slide(stores("camelyon_lymphnode_jpeg.dcm"))
    assert slide.mpp[0] == pytest.approx(28.97, abs=0.01)  # DICOM PixelSpacing
    attrs, _ = coords_attributes(_tiles(slide.mpp, slide.mpp[0]))
    assert attrs["level0_magnification"] == attrs["target_magnification"] == 0.35  # 10 / 28.97
    assert [magnification(m) for m in (0.2456, 1.0, 4.0, 100.0)] == [41, 10, 2.5, 0.1]
