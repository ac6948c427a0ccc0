"""A finished embeddings group that lies is refused by every reader, once, in one line naming
the store, the array and the cause: shapes that disagree with each other or with the group's
record at open (`check_shapes`), NaN or infinite features when they are read (`check_rows`).
Real stores embedded with efficientnet-lite0 on the CPU, damaged with zarr afterwards."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import zarr

from tests.conftest import group_of
from tests.corpus import DAMAGED_ROWS, damage_embeddings, shape_edited
from tilestore.embeddings import group_name, open_embeddings, read_tile_features
from tilestore.embeddings.groups import check_rows, non_finite_rows
from tilestore.errors import DamagedEmbeddings
from tilestore.exports import to_h5

LITE = "efficientnet-lite0"
GROUP = group_name(LITE, "classes")  # the CMU store's ROI plan, embedded by the fixture
FIX = f"embed the store again with overwrite=True (or remove {GROUP})"


@pytest.fixture
def copied(embedded_cohort, tmp_path):
    """A private copy of the embedded CMU-1-Small-Region store."""
    target = tmp_path / embedded_cohort[0].name
    shutil.copytree(embedded_cohort[0], target)
    return target


def _refused(call, path, said: str) -> str:
    """call() raises DamagedEmbeddings in one line: the store, `said`, the fix."""
    with pytest.raises(DamagedEmbeddings) as caught:
        call()
    message = str(caught.value)
    assert message.startswith(f"{path}: {GROUP}/") and "\n" not in message
    assert said in message and message.endswith(FIX)
    return message


def untied(store) -> None:
    """The group as one made before positions were recorded: its record declares none."""
    group = zarr.open_group(store / group_of(store, LITE), mode="r+")
    attrs = dict(group.attrs["tilestore"])
    del attrs["positions"]
    group.attrs["tilestore"] = attrs


@pytest.mark.parametrize("kind", ["nan", "inf"])
def test_features_made_not_finite_since_are_refused_at_open(copied, tmp_path, kind):
    """NaN or an infinity written into a finished group's features rewrites their chunks:
    not the ones written at their positions, every reader refuses the group at its door,
    naming the rows those chunks hold (no feature read)."""
    said = damage_embeddings(copied, LITE, kind)
    assert said == "features: rows 0-31 are not as written (2 chunk"  # batches of 16
    _refused(lambda: open_embeddings(copied, LITE), copied, said)
    _refused(lambda: read_tile_features(copied, LITE), copied, said)
    _refused(lambda: to_h5(copied, LITE, tmp_path / "h5"), copied, said)
    assert not list((tmp_path / "h5").glob("*")), "an .h5 of damaged features was written"


@pytest.mark.parametrize("kind", ["nan", "inf"])
def test_features_not_finite_in_a_group_made_before_positions_are_refused_when_read(
    copied, tmp_path, kind
):
    untied(copied)
    said = damage_embeddings(copied, LITE, kind)
    ds = open_embeddings(copied, LITE)  # opening reads no features: lazy as before
    _refused(lambda: ds.features.values, copied, said)
    # the rows are numbered in the slide's group, whichever rows a computation reads
    _refused(lambda: ds.features[10:30].values, copied, f"in 1 tile row(s) ({DAMAGED_ROWS[1]})")
    assert ds.features[4:20].values.shape == (16, 1280)  # rows without damage still read
    _refused(lambda: ds.tiles.pca(3).values, copied, said)
    _refused(lambda: read_tile_features(copied, LITE), copied, said)
    _refused(lambda: to_h5(copied, LITE, tmp_path / "h5"), copied, said)
    assert not list((tmp_path / "h5").glob("*")), "an .h5 of damaged features was written"


def _tiles_edited(group, tiles):
    attrs = dict(group.attrs["tilestore"])
    group.attrs["tilestore"] = {**attrs, "tiles": tiles}


@pytest.mark.parametrize(
    ("array", "edit", "said"),
    [
        ("features", lambda g: shape_edited(g / "features", 3), "features has shape (3, 1280)"),
        ("x", lambda g: shape_edited(g / "x", 3), "x has shape (3,) where the group records"),
        ("tissue", lambda g: shape_edited(g / "tissue", 3), "tissue has shape (3,)"),
        ("done", lambda g: shape_edited(g / "done", 1), "done has shape (1,) where the group "),
        ("tiles", None, "features has shape ({n}, 1280) where the group records {m} tiles"),
    ],
)  # fmt: skip
def test_shapes_that_disagree_are_refused_at_open(copied, tmp_path, array, edit, said):
    """Features' zarr.json edited to 3 rows (was: a Dataset refused by xarray, an .h5 of 3
    features and all the coordinates), a coordinate, the done flags, the recorded count."""
    group_path = copied / group_of(copied, LITE)
    n = zarr.open_array(group_path / "features", mode="r").shape[0]
    if edit is None:
        _tiles_edited(zarr.open_group(group_path, mode="r+"), n + 16)
        said = said.format(n=n, m=n + 16)
    else:
        edit(group_path)
    message = _refused(lambda: open_embeddings(copied, LITE), copied, said)
    named = "features" if array == "tiles" else array
    assert message.startswith(f"{copied}: {GROUP}/{named} has shape")
    _refused(lambda: read_tile_features(copied, LITE), copied, said)
    _refused(lambda: to_h5(copied, LITE, tmp_path / "h5"), copied, said)
    assert not (tmp_path / "h5").exists() or not list((tmp_path / "h5").iterdir())


def test_a_damaged_group_is_refused_even_where_missing_ones_are_skipped(copied, tmp_path):
    """skip_missing leaves out what is not there, never what is damaged."""
    said = damage_embeddings(copied, LITE, "rows")
    _refused(lambda: open_embeddings([copied], LITE, skip_missing=True), copied, said)


def test_check_rows_names_the_rows_from_where_the_values_start():
    values = np.ones((40, 8), np.float16)
    assert check_rows(values, "s: g/features", "fix") is values
    values[[3, 11, 12, 13, 14, 15, 16]] = np.float16("inf")
    values[5, 2] = np.nan
    with pytest.raises(DamagedEmbeddings, match=r"in 8 tile row\(s\) \(103, 105, 111, 112, 113, "):
        check_rows(values, "s: g/features", "fix", first=100)
    np.testing.assert_array_equal(non_finite_rows(values), [3, 5, 11, 12, 13, 14, 15, 16])
    # float16 judged on its bits: its largest finite value is finite, its NaNs of any
    # payload and sign are not
    edge = np.array([[65504, -65504, 6e-8, 0]], np.float16)
    assert len(non_finite_rows(edge)) == 0
    payload = np.array([0x7E01, 0xFE00, 0xFC00], np.uint16).view(np.float16).reshape(3, 1)
    np.testing.assert_array_equal(non_finite_rows(payload), [0, 1, 2])
    assert len(non_finite_rows(np.empty((0, 4), np.float16))) == 0


def test_the_arrays_of_an_intact_group_pass(copied):
    """The checks cost no refusal of what a run wrote (both slides' shapes, every row)."""
    meta = json.loads((copied / group_of(copied, LITE) / "zarr.json").read_text())
    ds = open_embeddings(copied, LITE)
    assert ds.sizes["tile"] == meta["attributes"]["tilestore"]["tiles"]
    assert np.isfinite(ds.features.values).all()
    assert read_tile_features(copied, LITE).tiles == ds.sizes["tile"]
