"""Formats only OpenSlide reads: a Hamamatsu VMS (INI + JPEG files) and a Philips TIFF, written
from the real SVS's pixels (tests/tilestore/vendors.py). Pixels are checked against OpenSlide's
own reads and against Pillow's decoding of the VMS's JPEG files."""

from __future__ import annotations

import numpy as np
import openslide
import pytest
from PIL import Image

from tests.tilestore import vendors
from tilestore.conversion.converter import convert
from tilestore.conversion.info import describe
from tilestore.errors import SlideError
from tilestore.reading.opening import open_slide
from tilestore.sources import OpenSlideSource, open_source
from tilestore.sources.openslide_reader import OpenSlideLevel


@pytest.fixture(scope="module")
def vms(tmp_path_factory, cmu_pixels):
    folder = tmp_path_factory.mktemp("vms")
    return vendors.vms(folder, np.ascontiguousarray(cmu_pixels[:1024, :2048]), mpp=0.5)


def _openslide_level(path, level):
    with openslide.OpenSlide(str(path)) as slide:
        w, h = slide.level_dimensions[level]
        return np.asarray(slide.read_region((0, 0), level, (w, h)))[..., :3]


def test_vms_is_read_through_openslide(vms):
    with open_source(vms) as source:
        assert isinstance(source, OpenSlideSource)
        assert source.info.format == "hamamatsu"
        assert source.info.mpp.value == (0.5, 0.5)
        assert source.levels[0].shape == (1024, 2048)
        assert source.brightfield_rgb
        # the slide is all its files: the INI, both JPEG columns and the map
        assert sorted(p.name for p in source.files) == [
            "image-0.jpg",
            "image-1.jpg",
            "map.jpg",
            "slide.vms",
        ]
        # level 0 is the JPEG files' pixels, whole and in pieces across the column seam
        np.testing.assert_array_equal(
            source.levels[0].read(0, 1024, 0, 2048), vendors.vms_reference(vms)
        )
        np.testing.assert_array_equal(
            source.levels[0].read(100, 300, 1000, 1100),
            vendors.vms_reference(vms)[100:300, 1000:1100],
        )
        for index, level in enumerate(source.levels[1:], 1):
            h, w = level.shape
            np.testing.assert_array_equal(level.read(0, h, 0, w), _openslide_level(vms, index))


def test_vms_converts_bit_exact_with_zstd(vms, tmp_path):
    report = convert(vms, tmp_path, codec="zstd")
    slide = open_slide(report.store)
    np.testing.assert_array_equal(
        np.moveaxis(slide.to_dask(0).compute(), 0, -1), vendors.vms_reference(vms)
    )
    np.testing.assert_array_equal(
        np.moveaxis(slide.to_dask(1).compute(), 0, -1), _openslide_level(vms, 1)
    )
    assert [lvl.reason for lvl in report.levels[:2]] == ["zstd", "zstd"]
    assert slide.mpp == pytest.approx((0.5, 0.5))


def test_info_says_openslide_decodes_each_level(vms):
    facts = describe(vms)
    assert facts["reader"] == "OpenSlideSource"
    assert {lvl["write"] for lvl in facts["levels"]} == {"re-encode"}
    assert {lvl["why_not"] for lvl in facts["levels"]} == {"decoded by OpenSlide"}


def test_vms_missing_jpeg_file_is_one_line(vms, tmp_path):
    copy = tmp_path / "copy"
    copy.mkdir()
    for path in vms.parent.iterdir():
        if path.name != "image-1.jpg":
            (copy / path.name).write_bytes(path.read_bytes())
    with pytest.raises(SlideError, match=r"slide\.vms: OpenSlide cannot open this hamamatsu"):
        open_source(copy / "slide.vms")


def test_vms_damaged_jpeg_fails_conversion_and_leaves_nothing(vms, tmp_path):
    copy = tmp_path / "copy"
    copy.mkdir()
    for path in vms.parent.iterdir():
        data = path.read_bytes()
        if path.name == "image-1.jpg":  # cut in its entropy-coded data
            data = data[: len(data) // 2]
        (copy / path.name).write_bytes(data)
    out = tmp_path / "stores"
    # the levels are written coarse first: the damage is met at the slide's coarsest level
    said = r"slide\.vms \(hamamatsu, through OpenSlide\): level \d: cannot decode rows"
    with pytest.raises(SlideError, match=said):
        convert(copy / "slide.vms", out, codec="zstd")
    assert not list(out.glob("*.ome.zarr"))


def test_philips_tiff_goes_to_openslide(tmp_path, cmu_pixels):
    pixels = np.ascontiguousarray(cmu_pixels[:1024, :1024])
    path = vendors.philips_tiff(tmp_path / "slide.tiff", pixels)
    with open_source(path) as source:
        assert isinstance(source, OpenSlideSource)
        assert source.info.vendor == "philips"
        assert source.info.mpp.value == pytest.approx((0.25, 0.25))
        assert [lvl.shape for lvl in source.levels] == [(1024, 1024), (512, 512)]
        np.testing.assert_array_equal(
            source.levels[0].read(0, 1024, 0, 1024), _openslide_level(path, 0)
        )


class _Transparent:
    """An OpenSlide handle whose region is half unscanned (alpha 0) and a quarter half-covered."""

    def read_region(self, location, level, size):
        (w, h), x = size, location[0] + np.arange(size[0])  # level-0 columns of the region
        rgba = np.zeros((h, w, 4), np.uint8)
        rgba[..., :3] = (200, 100, 50)
        rgba[:, x < 2500, 3] = 255
        rgba[: h // 2, x >= 2500, 3] = 128
        return Image.fromarray(rgba, "RGBA")


@pytest.mark.parametrize("workers", [1, 3])
def test_unscanned_pixels_are_the_background(workers):
    level = OpenSlideLevel(
        shape=(10, 5000),
        channels=3,
        dtype=np.dtype(np.uint8),
        compression="openslide",
        tile_shape=None,
        slide=_Transparent(),
        background=(240, 240, 240),
        workers=workers,
    )
    px = level.read(0, 10, 0, 5000).astype(int)
    assert (px[:, :2500] == (200, 100, 50)).all()
    assert (px[5:, 2500:] == 240).all()
    expected = np.round((np.array([200, 100, 50]) * 128 + 240 * 127) / 255)
    assert (px[:5, 2500:] == expected).all()
