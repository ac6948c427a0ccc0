"""The TRIDENT-layout H5 export's coordinates: each tile's grid cell is coords //
patch_size_level0 (TITAN, Prov-GigaPath), or the export says how many tiles it is not for."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tilestore.embeddings.slides import TileFeatures
from tilestore.errors import TilestoreError
from tilestore.exports.h5 import coords_attributes, magnification


def _tiles(step: float, cols: np.ndarray, rows: np.ndarray, mpp=(0.25, 0.25)) -> TileFeatures:
    return TileFeatures(
        store="s", name="s", model="m", features=np.zeros((len(cols), 2), np.float32),
        x=np.round(cols * step).astype(np.int64), y=np.round(rows * step).astype(np.int64),
        row=rows, col=cols, footprint0=(step, step), stride0=(step, step), mpp=0.5,
        tile_size=512, plan="p", finished="t", recipe={}, model_info={}, slide_mpp=mpp,
        slide_shape=(100_000, 100_000),
    )  # fmt: skip


@settings(max_examples=50, deadline=None)
@given(step=st.integers(64, 4096), n=st.integers(1, 200))
def test_whole_pixel_grids_put_every_tile_in_its_cell(step, n):
    rng = np.random.default_rng(n)
    cols, rows = rng.integers(0, 400, n), rng.integers(0, 400, n)
    attrs, misplaced = coords_attributes(_tiles(float(step), cols, rows))
    assert misplaced == 0 and attrs["patch_size_level0"] == step
    tiles = _tiles(float(step), cols, rows)
    np.testing.assert_array_equal(tiles.x // step, cols)


def test_a_fractional_grid_is_counted_not_hidden():
    cols = np.arange(300)
    attrs, misplaced = coords_attributes(_tiles(1042.7, cols, np.zeros(300, np.int64)))
    assert attrs["patch_size_level0"] == 1043 and misplaced > 0


def test_magnifications_are_the_nominal_ones():
    assert [magnification(m) for m in (0.2456, 0.25, 0.499, 1.0)] == [41, 40, 20, 10]
    attrs, _ = coords_attributes(_tiles(1024.0, np.arange(3), np.arange(3)))
    assert (attrs["level0_magnification"], attrs["target_magnification"]) == (40, 20)


def test_no_pixel_size_no_magnifications():
    tiles = _tiles(256.0, np.arange(2), np.arange(2), mpp=None)
    with pytest.raises(TilestoreError, match="pixel size is unknown"):
        coords_attributes(tiles)
