"""Plan defaults are decided once (`resolve_plan`): what each option becomes, for a slide with
and without a recorded pixel size, with and without a model's native mpp and tile."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tilestore.errors import OptionError, PlanError
from tilestore.plan import PlanOptions, ResolvedPlan, resolve_plan

SCANNED = SimpleNamespace(name="scanned", mpp=(0.25, 0.25))
UNKNOWN = SimpleNamespace(name="unknown", mpp=None)


def test_defaults_come_from_one_table():
    plan = resolve_plan(PlanOptions(), SCANNED)
    assert (plan.mpp, plan.tile, plan.stride) == (0.5, 224, 224)
    assert plan.min_tissue == 0.5 and plan.name == "0.5mpp-224px"
    assert resolve_plan(plan, SCANNED) is plan  # resolved once, never again


@pytest.mark.parametrize(
    ("options", "native", "want"),
    [
        (PlanOptions(), (None, 256), (0.5, 256)),  # a model without a native mpp
        (PlanOptions(), (1.0, 256), (1.0, 256)),  # the model's own
        (PlanOptions(mpp=0.25, tile=512), (1.0, 256), (0.25, 512)),  # asked beats native
        (PlanOptions(mpp="level0"), (1.0, 256), (None, 256)),  # level-0 pixels, asked for
    ],
)
def test_a_models_native_mpp_and_tile_fill_what_was_not_asked(options, native, want):
    plan = resolve_plan(options, SCANNED, native_mpp=native[0], native_tile=native[1])
    assert (plan.mpp, plan.tile) == want


def test_stride_and_filter_defaults():
    assert resolve_plan(PlanOptions(tile=100, stride=50), SCANNED).stride == 50
    filtered = resolve_plan(PlanOptions(filter="contrast"), SCANNED)
    assert filtered.min_tissue == 0 and filtered.name.endswith("-contrast")
    with pytest.raises(OptionError, match="filter='sharpness': must be 'contrast'"):
        PlanOptions(filter="sharpness")
    with pytest.raises(OptionError, match="stride=-1: must be a whole number of px from 1"):
        PlanOptions(stride=-1)


@pytest.mark.parametrize("native", [None, 0.5, 1.0])
@pytest.mark.parametrize("mpp", [None, 0.5, 2.0])
def test_a_slide_without_pixel_size_is_refused_at_any_mpp(mpp, native):
    """Never a silent embedding at an unknown magnification: asked for or defaulted (by the
    plan or by a model), any mpp is refused, and the message says both ways out."""
    with pytest.raises(PlanError) as refused:
        resolve_plan(PlanOptions(mpp=mpp), UNKNOWN, native_mpp=native)
    message = str(refused.value)
    assert message.startswith("unknown: pixel size unknown, so its tiles cannot be read at ")
    assert "mpp=<um/px>" in message and "mpp='level0'" in message


def test_level_0_pixels_are_asked_for_explicitly():
    plan = resolve_plan(PlanOptions(mpp="level0"), UNKNOWN, native_mpp=0.5)
    assert isinstance(plan, ResolvedPlan) and plan.mpp is None and plan.name == "level0-224px"


COARSE = SimpleNamespace(name="coarse", mpp=(29.1, 29.1))  # the CAMELYON DICOM's finest level


@pytest.mark.parametrize("native", [None, 0.5])
def test_a_slide_coarser_than_the_plan_is_refused_unless_asked(native):
    """Never a silent upsampling: a plan finer than the slide's finest level (beyond the
    tolerance) names both resolutions; upsample=True reads it so, as asked; a plan at the
    slide's own resolution needs nothing."""
    with pytest.raises(PlanError) as refused:
        resolve_plan(PlanOptions(), COARSE, native_mpp=native)
    assert str(refused.value) == (
        "coarse: its finest level is 29.1 um/px, coarser than the 0.5 um/px asked: each tile "
        "would be 58.2x enlarged from pixels never scanned; plan at mpp=29.1 or coarser, or "
        "pass upsample=True to enlarge them anyway"
    )
    assert resolve_plan(PlanOptions(upsample=True), COARSE).upsample
    assert resolve_plan(PlanOptions(mpp=29.5), COARSE).mpp == 29.5  # within 2%
    assert resolve_plan(PlanOptions(mpp=29.5, tolerance=0.0), COARSE).mpp == 29.5  # coarser
    with pytest.raises(PlanError, match="coarser than the 28 um/px"):
        resolve_plan(PlanOptions(mpp=28), COARSE)  # 4% finer: beyond the tolerance
