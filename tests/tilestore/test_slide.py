"""Reading a store: region geometry, chunk-exact reads, dask and xarray views, clear errors."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import xarray as xr
import zarr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import CMU, KIDNEY, psnr
from tests.counting import CountingStore
from tilestore.errors import OptionError, StoreError, TilestoreError
from tilestore.reading.opening import open_slide
from tilestore.reading.slide import resize


@pytest.fixture(scope="module")
def slide(stores):
    return open_slide(stores(CMU))


@pytest.fixture(scope="module")
def levels(slide):
    """Each level fully decoded once, (h, w, c), as the reference for region reads."""
    return [np.moveaxis(slide.array(i)[:], 0, -1) for i in range(len(slide.levels))]


def _expected_region(level_pixels, x0, y0, w, h, background):
    out = np.full((h, w, level_pixels.shape[2]), background, level_pixels.dtype)
    H, W = level_pixels.shape[:2]
    ys, xs = slice(max(y0, 0), min(y0 + h, H)), slice(max(x0, 0), min(x0 + w, W))
    if ys.stop > ys.start and xs.stop > xs.start:
        out[ys.start - y0 : ys.stop - y0, xs.start - x0 : xs.stop - x0] = level_pixels[ys, xs]
    return out


def _expected_chunks(level, x0, y0, w, h, chunk, H, W):
    rows = range(max(y0, 0) // chunk, (min(y0 + h, H) - 1) // chunk + 1)
    cols = range(max(x0, 0) // chunk, (min(x0 + w, W) - 1) // chunk + 1)
    if min(y0 + h, H) <= max(y0, 0) or min(x0 + w, W) <= max(x0, 0):
        return set()
    return {f"{level}/c/0/{r}/{c}" for r in rows for c in cols}


def test_slide_facts(slide):
    assert slide.mpp == (0.499, 0.499)
    assert slide.shape == (3, 2967, 2220)
    assert [lv.downsample for lv in slide.levels] == [(1, 1), (2, 2), (4, 4)]
    assert slide.level_mpp(2) == pytest.approx((1.996, 1.996))
    assert "0.499 µm/px" in repr(slide)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    level=st.integers(0, 2),
    x=st.integers(-300, 2400),
    y=st.integers(-300, 3100),
    w=st.integers(1, 700),
    h=st.integers(1, 700),
)
def test_region_reads_touch_exactly_the_chunks_they_need(stores, levels, level, x, y, w, h):
    store = CountingStore.local(stores(CMU))
    slide = open_slide(store)
    store.log.clear()
    d = int(slide.levels[level].downsample[0])
    region = slide.read_region(x, y, w, h, level=level)
    x0, y0 = (2 * x + d) // (2 * d), (2 * y + d) // (2 * d)  # nearest level pixel, halves up
    np.testing.assert_array_equal(region, _expected_region(levels[level], x0, y0, w, h, 255))
    _, H, W = slide.levels[level].shape
    touched = store.log.chunk_keys(str(level))
    assert len(touched) == len(set(touched))  # no chunk fetched twice
    assert set(touched) == _expected_chunks(level, x0, y0, w, h, 240, H, W)


@pytest.mark.parametrize("cpus", [1, 3, 16])
def test_a_whole_level_read_on_threads_is_zarrs_pixels(slide, levels, monkeypatch, cpus):
    """A read of many chunks decodes them on threads (a tissue mask's level): each chunk
    into its own part of the region, the region equal to zarr's decode of the level."""
    from tilestore.format import chunks

    monkeypatch.setattr(chunks, "usable_cpus", lambda: cpus)
    height, width = levels[0].shape[:2]
    got = slide.read_region(0, 0, width, height, level=0)
    assert np.array_equal(got, levels[0])


def test_a_slide_pickled_carries_its_levels_read_and_opens_the_others_where_asked(stores, levels):
    """A store process sends the slide it opened (its plan's level read) to the run: that
    level travels made, the others as their metadata; every level then reads the pixels it
    did."""
    import pickle

    from zarr.codecs import ShardingCodec

    slide = open_slide(stores(CMU))
    slide.chunks(0).locations([])
    made, setstate = [], ShardingCodec.__setstate__
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ShardingCodec, "__setstate__", lambda c, s: made.append(1) or setstate(c, s))
        travelled = pickle.loads(pickle.dumps(slide))
        assert len(made) == 1 < len(slide.levels)  # the level read, not the others
    for i, lv in enumerate(travelled.levels):
        region = travelled.read_region(0, 0, lv.width, lv.height, level=i)
        np.testing.assert_array_equal(region, levels[i])
    assert travelled.array(1).metadata == slide.array(1).metadata
    # a view (`as_rgb` copies the slide) shares the levels made, not made again
    assert all(copy.copy(slide).array(i) is slide.array(i) for i in range(len(slide.levels)))


def test_read_at_a_level_mpp_is_that_level(slide):
    a = slide.read_region(480, 720, 200, 150, mpp=2 * 0.499)
    b = slide.read_region(480, 720, 200, 150, level=1)
    np.testing.assert_array_equal(a, b)


def test_read_between_levels_is_resampled_in_place(slide, levels):
    # 3 x 0.499 um/px: read from level 1 and shrink 1.5x; compare with a 3x box of level 0.
    x, y = 600, 900
    region = slide.read_region(x, y, 200, 200, mpp=3 * 0.499)
    assert region.shape == (200, 200, 3)
    block = levels[0][y : y + 600, x : x + 600].reshape(200, 3, 200, 3, 3).mean(axis=(1, 3))
    assert psnr(region, block) > 28
    shifted = levels[0][y + 12 : y + 612, x + 12 : x + 612].reshape(200, 3, 200, 3, 3).mean((1, 3))
    assert psnr(region, block) > psnr(region, shifted) + 3  # it is in the right place


def test_level_for_mpp_picks_the_coarsest_fine_enough_level(slide):
    assert slide.level_for_mpp(0.25) == 0
    assert slide.level_for_mpp(0.5) == 0  # 0.499 <= 0.5
    assert slide.level_for_mpp(1.0) == 1
    assert slide.level_for_mpp(0.98) == 1  # 0.998 is within 2% of 0.98
    assert slide.level_for_mpp(0.98, tolerance=0.0) == 0
    assert slide.level_for_mpp(100) == 2


def test_read_region_needs_one_of_level_or_mpp(slide):
    with pytest.raises(TypeError):
        slide.read_region(0, 0, 10, 10)
    with pytest.raises(TypeError):
        slide.read_region(0, 0, 10, 10, level=0, mpp=0.5)


# Each answered before (a region at level 0 for mpp=0, the last level for level=-1, a NaN
# corner cast to an integer): a library call out of range is refused naming the argument.
OUT_OF_RANGE = [
    ({"mpp": 0}, r"^mpp=0: must be a number of um/px above 0 and at most 100$"),
    ({"mpp": -0.5}, r"^mpp=-0\.5: must be a number of um/px above 0"),
    ({"mpp": float("nan")}, r"^mpp=nan: must be a number of um/px"),
    ({"level": -1}, r"^level=-1: must be a whole number from 0"),
    ({"level": 3}, r"^level=3: CMU-1-Small-Region\.ome\.zarr has levels 0 to 2$"),
    ({"level": 0.5}, r"^level=0\.5: must be a whole number"),
    ({"level": 0, "x": float("nan")}, r"^x=nan: must be a number of px from "),
    ({"level": 0, "y": float("inf")}, r"^y=inf: must be a number of px from "),
    ({"level": 0, "w": 0}, r"^w=0: must be a whole number of px from 1 to 524,288$"),
    ({"level": 0, "h": -3}, r"^h=-3: must be a whole number of px from 1"),
    ({"level": 0, "w": 10**7}, r"^w=10000000: must be a whole number of px from 1 to 524,288"),
    ({"mpp": 0.5, "tolerance": -0.1}, r"^tolerance=-0\.1: must be a number from 0 to 0\.5$"),
]


@pytest.mark.parametrize(("args", "said"), OUT_OF_RANGE, ids=lambda v: str(v))
def test_read_region_refuses_an_argument_out_of_range(slide, args, said):
    region = {"x": 0, "y": 0, "w": 10, "h": 10, **args}
    with pytest.raises(OptionError, match=said):
        slide.read_region(region.pop("x"), region.pop("y"), region.pop("w"), region.pop("h"),
                          **region)  # fmt: skip


def test_read_region_takes_numpy_numbers_and_fractional_corners(slide):
    want = slide.read_region(3, 4, 10, 10, level=1)
    np.testing.assert_array_equal(
        slide.read_region(np.int64(3), np.float32(4.2), np.int64(10), 10, level=np.int64(1)), want
    )


def test_mpp_reads_need_a_known_pixel_size(stores):
    with pytest.raises(TilestoreError, match="pixel size unknown"):
        open_slide(stores(KIDNEY)).read_region(0, 0, 10, 10, mpp=1.0)


def test_to_dask_is_lazy_and_chunk_aligned(slide):
    array = slide.to_dask(0)
    assert array.shape == (3, 2967, 2220)
    assert array.chunks[1][0] == 240 and len(array.chunks[1]) == 13
    np.testing.assert_array_equal(
        array[:, 100:140, 200:260].compute(), slide.array(0)[:, 100:140, 200:260]
    )


def test_to_xarray_coordinates_are_pixel_centres_in_micrometres(slide, levels):
    da = slide.to_xarray(2)
    assert da.dims == ("c", "y", "x")
    assert list(da.c.values) == ["R", "G", "B"]
    assert da.x.attrs["units"] == "micrometer"
    assert float(da.x[0]) == pytest.approx(1.5 * 0.499)
    assert float(da.x[1] - da.x[0]) == pytest.approx(4 * 0.499)
    # selecting by physical position gives the pixel there
    pixel = da.sel(
        x=100 * 4 * 0.499 + 1.5 * 0.499, y=50 * 4 * 0.499 + 1.5 * 0.499, method="nearest"
    )
    np.testing.assert_array_equal(pixel.values, levels[2][50, 100])
    assert isinstance(da.data, type(slide.to_dask(2)))


def test_xarray_without_mpp_uses_pixels(stores):
    da = open_slide(stores(KIDNEY)).to_xarray(1)
    assert da.x.attrs["units"] == "level-0 pixel"
    assert float(da.x[1] - da.x[0]) == 2


def test_a_large_rgb_image_resized_in_bands_on_threads_is_pils_one_call(monkeypatch, cmu_pixels):
    from PIL import Image

    from tilestore.reading import slide as slide_module

    monkeypatch.setattr(slide_module, "THREADED_PX", 1000)  # CMU-1's pixels count as large
    image = np.ascontiguousarray(cmu_pixels)
    height, width = image.shape[:2]
    # down, up, far down, one side kept (one pass only), the 100k mask's 0.2% shrink
    for w, h in ((1111, 1717), (2001, 2999), (64, 48), (width, 999), (777, height),
                 (width - 5, height - 5)):  # fmt: skip
        want = np.asarray(Image.fromarray(image).resize((w, h), Image.Resampling.BILINEAR))
        assert np.array_equal(resize(image, w, h), want), (w, h)
        grey = np.ascontiguousarray(image[..., 1:2])
        one = Image.fromarray(grey[..., 0]).resize((w, h), Image.Resampling.BILINEAR)
        assert np.array_equal(resize(grey, w, h)[..., 0], np.asarray(one)), (w, h)


@settings(max_examples=150, deadline=None)
@given(
    st.integers(1, 40), st.integers(1, 40), st.integers(1, 60), st.integers(1, 60),
    st.integers(1, 9), st.sampled_from([1, 3]), st.integers(0, 2**32 - 1),
)  # fmt: skip
def test_resizing_in_bands_of_any_size_is_pils_one_call(height, width, h, w, band, channels, seed):
    """Bands across, then strips down, of any width: PIL's bytes (each pass reads whole rows
    or whole columns, its weights set by the sizes alone), wherever PIL goes across first;
    and resize gives PIL's bytes for any sizes."""
    from unittest.mock import patch

    from PIL import Image

    from tilestore.reading import slide as slide_module

    image = np.random.default_rng(seed).integers(0, 256, (height, width, channels), np.uint8)
    flat = image[..., 0] if channels == 1 else image
    want = np.asarray(Image.fromarray(flat).resize((w, h), Image.Resampling.BILINEAR))
    with patch.object(slide_module, "BAND_PX", band), patch.object(slide_module, "THREADED_PX", 1):
        got = resize(image, w, h)  # in bands where PIL goes across first, else a channel a thread
        assert got.shape == (h, w, channels)
        assert np.array_equal(got.reshape(want.shape), want)
        if slide_module._across_first(image.shape, w, h):
            got = slide_module._resize_in_bands(image, w, h)
            assert got.shape == (h, w, channels)
            assert np.array_equal(got.reshape(want.shape), want)


def test_sizes_some_pillow_resamples_down_first_are_not_banded():
    """Pillow 13 goes down first where the height shrinks by more than twice the width;
    12.2-12.3 where an image over 100x taller than wide shrinks in height. Those sizes take
    PIL's own call on any Pillow, whichever is installed here."""
    from tilestore.reading.slide import _across_first

    assert _across_first((6250, 6250, 3), 6238, 6238)  # the 100k slide's tissue level
    assert not _across_first((1000, 1000, 3), 990, 900)  # Pillow 13: down shrinks 10x more
    assert not _across_first((21100, 210, 3), 100, 21000)  # Pillow 12.2-12.3: 100x tall
    assert _across_first((21100, 211, 3), 100, 21100)  # no shrink in height: across first


def test_resize_matches_for_uint8_and_uint16():
    image = np.random.default_rng(0).integers(0, 255, (40, 60, 3)).astype(np.uint8)
    small = resize(image, 30, 20)
    assert small.shape == (20, 30, 3) and small.dtype == np.uint8
    wide = resize(image.astype(np.uint16) * 256, 30, 20)
    assert wide.dtype == np.uint16
    assert np.abs(wide.astype(int) // 256 - small).max() <= 1


# -- opening errors -----------------------------------------------------------------------


def test_open_missing(tmp_path):
    with pytest.raises(StoreError, match="no such store"):
        open_slide(tmp_path / "nope.ome.zarr")


def test_a_slide_file_is_refused_with_how_to_read_it(slide_path):
    """open_slide opens stores: a slide is converted, or read in place by asking for it
    (tests/tilestore/test_sidecar.py); nothing is written beside it (the session checks)."""
    with pytest.raises(StoreError, match=r"a slide file, not a store: convert it .*in place"):
        open_slide(slide_path(CMU))


def test_open_incomplete_store(tmp_path, stores):
    import shutil

    copy = tmp_path / "half.ome.zarr"
    shutil.copytree(stores(KIDNEY), copy)
    meta = json.loads((copy / "zarr.json").read_text())
    meta["attributes"]["tilestore"]["complete"] = False
    (copy / "zarr.json").write_text(json.dumps(meta))
    with pytest.raises(StoreError, match="incomplete store"):
        open_slide(copy)


def test_open_foreign_zarr_group(tmp_path):
    zarr.open_group(tmp_path / "other.zarr", mode="w")
    with pytest.raises(StoreError, match="not made by tilestore"):
        open_slide(tmp_path / "other.zarr")


def test_open_with_plain_xarray_free_tools(stores):
    # Any zarr v3 reader with our codec installed reads the pixels: no tilestore API needed.
    group = zarr.open_group(stores(CMU), mode="r")
    assert group["0"][:, :5, :5].shape == (3, 5, 5)
    assert isinstance(xr.DataArray(group["2"][:]), xr.DataArray)


def test_open_store_with_corrupt_metadata(tmp_path):
    bad = tmp_path / "bad.ome.zarr"
    bad.mkdir()
    (bad / "zarr.json").write_text("not json")
    with pytest.raises(StoreError, match=r"bad.ome.zarr: cannot open store"):
        open_slide(bad)
    from tilestore.conversion.info import describe

    with pytest.raises(StoreError, match=r"bad.ome.zarr: cannot open store"):
        describe(bad)
