"""The tile grid as properties: exact coverage, no duplicates, round trips, exact fractions."""

from __future__ import annotations

import numpy as np
import pytest
import shapely
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.tilestore.rois import rois
from tilestore.errors import PlanError
from tilestore.plan.grid import _prefix, grid_spec, make_plan, tissue_fractions
from tilestore.plan.tiles import chunk_schedule, joined
from tilestore.reading.resolution import MPP_TOLERANCE

PROPS = settings(max_examples=80, deadline=None)


@st.composite
def specs(draw, side=3000, min_tile=16, min_stride=8):
    level_mpp = draw(st.sampled_from([0.25, 0.2456, 0.5, 0.499, 1.0, 2.0]))
    factor = draw(st.sampled_from([1.0, 2.0, 4.0, 4.0002]))
    h = draw(st.integers(50, side))
    w = draw(st.integers(50, side))
    tile = draw(st.integers(min_tile, 300))
    stride = draw(st.one_of(st.none(), st.integers(min_stride, 400)))
    mpp = draw(st.sampled_from([None, 0.25, 0.5, 0.75, 1.0, 2.0]))
    return grid_spec(1, (factor, factor), (h, w), level_mpp, mpp, tile, stride, tolerance=0.02)


def _plan(spec, **kwargs):
    options = {"min_tissue": 0.5, "min_roi": 0.5, **kwargs}
    return make_plan(spec, name="p", chunk_shape=(256, 240), **options)


@PROPS
@given(specs())
def test_grid_tiles_lie_inside_the_level_and_are_unique(spec):
    plan = _plan(spec)
    rows, cols = spec.grid
    assert len(plan) == rows * cols
    assert len({(r, c) for r, c in zip(plan.row.tolist(), plan.col.tolist(), strict=True)}) == len(
        plan
    )
    assert len(set(zip(plan.x.tolist(), plan.y.tolist(), strict=True))) == len(plan)
    if len(plan):
        assert plan.level_x.min() >= 0 and plan.level_y.min() >= 0
        assert (plan.level_x + spec.read).max() <= spec.level_shape[1]
        assert (plan.level_y + spec.read).max() <= spec.level_shape[0]
        # one more column or row would no longer fit
        assert (cols * spec.read_stride + spec.read) > spec.level_shape[1]
        assert (rows * spec.read_stride + spec.read) > spec.level_shape[0]


@PROPS
@given(specs())
def test_coordinates_round_trip(spec):
    plan = _plan(spec)
    # level-0 <-> level <-> grid: x is the column's window start scaled by the downsample
    np.testing.assert_array_equal(plan.level_x, plan.col * spec.read_stride)
    np.testing.assert_allclose(plan.x, plan.level_x * spec.downsample[1], atol=0.5)
    np.testing.assert_allclose(plan.y, plan.level_y * spec.downsample[0], atol=0.5)
    # and back: level-0 x -> level pixel is the window start (what read_region(level=) floors)
    np.testing.assert_array_equal(
        np.round(plan.x / spec.downsample[1]).astype(np.int64), plan.level_x
    )
    if spec.mpp is not None:  # the footprint really covers tile * mpp micrometres
        level_mpp = spec.effective_mpp * spec.tile / spec.read
        covered_um = spec.read * level_mpp
        assert abs(covered_um - spec.tile * spec.mpp) <= max(
            level_mpp / 2 + 1e-9, 0.02 * spec.tile * spec.mpp
        )


@PROPS
@given(st.integers(20, 400), st.integers(20, 400), st.integers(8, 64))
def test_tiles_cover_exactly_the_kept_area(h, w, tile):
    spec = grid_spec(0, (1.0, 1.0), (h, w), None, None, tile, tolerance=MPP_TOLERANCE)
    rng = np.random.default_rng(h * 1000 + w)
    mask = rng.random((h // 4 + 1, w // 4 + 1)) > 0.5
    plan = _plan(spec, tissue=mask, tissue_downsample=(4.0, 4.0), min_tissue=0.5)
    canvas = np.zeros((h, w), np.int32)
    for x, y in zip(plan.x.tolist(), plan.y.tolist(), strict=True):
        canvas[y : y + tile, x : x + tile] += 1
    assert canvas.max(initial=0) <= 1  # no pixel in two tiles
    assert canvas.sum() == len(plan) * tile * tile  # every tile wholly inside the slide
    assert all(plan.tissue >= 0.5)


def _overlap_1d(a0, a1, cell):
    """Length of [a0, a1) inside each unit cell [k, k+1) scaled by `cell`."""
    edges = np.arange(len(cell) + 1)
    return np.clip(np.minimum(a1, edges[1:]) - np.maximum(a0, edges[:-1]), 0, None)


@PROPS
@given(
    st.integers(3, 60),
    st.integers(3, 60),
    st.floats(0.5, 8),
    st.floats(0.5, 8),
    st.lists(st.tuples(st.floats(-20, 300), st.floats(-20, 300)), min_size=1, max_size=12),
    st.floats(1, 90),
    st.floats(1, 90),
)
def test_tissue_fraction_is_the_exact_area_fraction(mh, mw, dy, dx, corners, fh, fw):
    rng = np.random.default_rng(mh * 100 + mw)
    mask = rng.random((mh, mw)) > 0.4
    y0 = np.array([c[0] for c in corners])
    x0 = np.array([c[1] for c in corners])
    got = tissue_fractions(mask, (dy, dx), y0, x0, fh, fw)
    for i in range(len(corners)):  # overlap of the box with each mask pixel, in mask units
        oy = _overlap_1d(y0[i] / dy, (y0[i] + fh) / dy, np.zeros(mh))
        ox = _overlap_1d(x0[i] / dx, (x0[i] + fw) / dx, np.zeros(mw))
        want = (oy[:, None] * ox[None, :] * mask).sum() / ((fh / dy) * (fw / dx))
        assert got[i] == pytest.approx(want, abs=1e-6)


@PROPS
@given(
    st.integers(3, 300),
    st.integers(3, 300),
    st.lists(st.floats(-20, 320), min_size=1, max_size=12),
    st.sampled_from(["bool", "ones", "bytes"]),
)
@example(300, 300, [299.5], "bytes")  # a row of bright bytes: beyond 16-bit sums
def test_prefix_sums_of_a_byte_mask_are_its_float_masks_to_the_bit(mh, mw, at, kind):
    """A mask of bytes (bool, 0/1, 0-255) is summed in int32 (the fast path), the same values
    as float64 give, bit for bit, along either axis and at fractional coordinates."""
    rng = np.random.default_rng(mh * 1000 + mw)
    mask = {"bool": rng.random((mh, mw)) > 0.4, "ones": (rng.random((mh, mw)) > 0.4) * 1,
            "bytes": rng.integers(128, 256, (mh, mw))}[kind]  # fmt: skip
    mask = mask.astype(bool if kind == "bool" else np.uint8)
    at = np.asarray(at)
    for axis in (0, 1):
        fast = _prefix(mask, at, axis)
        exact = _prefix(mask.astype(np.float64), at, axis)
        assert fast.dtype == np.float64 and fast.tobytes() == exact.tobytes()


def test_roi_restricts_the_grid_to_its_bounding_box():
    spec = grid_spec(0, (1.0, 1.0), (2000, 2000), 0.5, 0.5, 100, tolerance=MPP_TOLERANCE)
    roi = rois([shapely.box(520, 730, 910, 1080)], ["Tumor"])
    plan = _plan(spec, rois=roi, min_roi=0.5)
    assert plan.classes == ["", "Tumor"] and set(plan.roi_class.tolist()) == {1}
    # exactly the tiles at least half inside the box, computed independently
    xs, ys = np.meshgrid(np.arange(20) * 100, np.arange(20) * 100)
    inside = (
        np.clip(np.minimum(xs + 100, 910) - np.maximum(xs, 520), 0, None)
        * np.clip(np.minimum(ys + 100, 1080) - np.maximum(ys, 730), 0, None)
    ) / 1e4
    assert sorted(zip(plan.x.tolist(), plan.y.tolist(), strict=True)) == sorted(
        zip(xs[inside >= 0.5].tolist(), ys[inside >= 0.5].tolist(), strict=True)
    )


def test_grid_spec_snaps_only_within_tolerance():
    notes = []
    spec = grid_spec(
        0, (1.0, 1.0), (1000, 1000), 0.499, 0.5, 224, tolerance=MPP_TOLERANCE, notes=notes
    )
    assert (spec.read, spec.effective_mpp) == (224, 0.499)
    assert "without resampling" in notes[0] and "+0.20%" in notes[0]
    spec = grid_spec(0, (1.0, 1.0), (1000, 1000), 0.25, 0.5, 224, tolerance=MPP_TOLERANCE)
    assert (spec.read, spec.read_stride, spec.effective_mpp) == (448, 448, 0.5)
    spec = grid_spec(0, (1.0, 1.0), (1000, 1000), 0.2456, 0.5, 224, 112, tolerance=MPP_TOLERANCE)
    assert spec.read == 456 and spec.read_stride == 228
    assert spec.effective_mpp == pytest.approx(0.2456 * 456 / 224)
    with pytest.raises(PlanError):
        grid_spec(0, (1.0, 1.0), (1000, 1000), 0.5, 0.5, 4, tolerance=MPP_TOLERANCE)


def _patchy_plan(spec, seed: int):
    """A plan over random patches of tissue (its rows ragged, chunks shared and not)."""
    rng = np.random.default_rng(seed)
    mask = rng.random((30, 30)) > 0.6
    h0 = spec.level_shape[0] * spec.downsample[0]
    w0 = spec.level_shape[1] * spec.downsample[1]
    return _plan(spec, tissue=mask, tissue_downsample=(h0 / 30, w0 / 30), min_tissue=0.3)


@PROPS
@given(specs(side=1500, min_tile=32, min_stride=16), st.integers(0, 2**31))
def test_schedule_loads_each_needed_chunk_once_before_use(spec, seed):
    plan = _patchy_plan(spec, seed)
    steps = chunk_schedule(plan)
    loaded = [tuple(rc) for s in steps for rc in s.load.tolist()]
    assert len(loaded) == len(set(loaded))
    assert sorted(loaded) == sorted(map(tuple, plan.needed_chunks().tolist()))
    dropped = [tuple(rc) for s in steps for rc in s.drop.tolist()]
    assert sorted(dropped) == sorted(loaded)  # everything is released by the end
    live: set = set()
    seen_tiles = []
    for index, step in enumerate(steps):
        live.update(map(tuple, step.load.tolist()))
        for i in step.tiles:
            r0, r1 = plan.chunk_rows[i]
            c0, c1 = plan.chunk_cols[i]
            assert {(r, c) for r in range(r0, r1 + 1) for c in range(c0, c1 + 1)} <= live
        seen_tiles.extend(step.tiles.tolist())
        live.difference_update(map(tuple, step.drop.tolist()))
        if index + 1 < len(steps):  # dropped as soon as the next grid row starts below them
            top = plan.chunk_rows[steps[index + 1].tiles, 0].min()
            assert all(r >= top for r, _ in live)
    assert seen_tiles == list(range(len(plan)))  # plan order


@PROPS
@given(
    specs(side=1500, min_tile=32, min_stride=16),
    st.integers(0, 2**31),
    st.sampled_from([0, 256 * 240 * 4, 256 * 240 * 30, 10**9]),
)
def test_joined_steps_read_each_chunk_once_and_stay_within_their_band(spec, seed, limit):
    """Steps joined (a small slide's rows cut at once): the same tiles in plan order, each
    chunk loaded once before the step that needs it and dropped once, and a joined step's
    chunks span at most `limit` pixels."""
    plan = _patchy_plan(spec, seed)
    rows = chunk_schedule(plan)
    steps = joined(rows, plan, limit)
    assert [t for s in steps for t in s.tiles.tolist()] == list(range(len(plan)))
    loaded = [tuple(rc) for s in steps for rc in s.load.tolist()]
    assert sorted(loaded) == sorted(map(tuple, plan.needed_chunks().tolist()))
    assert sorted(tuple(rc) for s in steps for rc in s.drop.tolist()) == sorted(loaded)
    live: set = set()
    for step in steps:
        live.update(map(tuple, step.load.tolist()))
        r0, r1 = plan.chunk_rows[step.tiles, 0].min(), plan.chunk_rows[step.tiles, 1].max()
        c0, c1 = plan.chunk_cols[step.tiles, 0].min(), plan.chunk_cols[step.tiles, 1].max()
        for i in step.tiles:
            (a, b), (c, d) = plan.chunk_rows[i], plan.chunk_cols[i]
            assert {(r, k) for r in range(a, b + 1) for k in range(c, d + 1)} <= live
        live.difference_update(map(tuple, step.drop.tolist()))
        if not any(step is row for row in rows):  # rows joined
            assert (r1 - r0 + 1) * (c1 - c0 + 1) * 256 * 240 <= limit
    if limit == 10**9:  # every row in one band
        assert len(steps) == min(1, len(rows))
    if limit == 0:  # nothing joined: the rows as they were
        assert len(steps) == len(rows)
