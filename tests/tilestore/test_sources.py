"""Source readers: formats recognised, metadata read with its origin, bad files refused clearly."""

from __future__ import annotations

import numpy as np
import pytest
import tifffile

from tests.conftest import CMU, IHC, KIDNEY, NDPI
from tests.tilestore import tiffs
from tilestore.errors import SlideError
from tilestore.sources import open_source


@pytest.mark.parametrize(
    ("name", "fmt", "vendor", "mpp", "levels", "associated"),
    [
        (CMU, "svs", "aperio", 0.499, 1, ["label", "macro", "thumbnail"]),
        (NDPI, "ndpi", "hamamatsu", 0.22818, 4, ["macro", "map"]),
        (KIDNEY, "tiff", None, None, 1, []),
        (IHC, "png", None, None, 1, []),
    ],
)
def test_real_slides_are_recognised(slide_path, name, fmt, vendor, mpp, levels, associated):
    with open_source(slide_path(name)) as source:
        assert source.info.format == fmt
        assert source.info.vendor == vendor
        if mpp is None:
            assert source.info.mpp is None
        else:
            assert source.info.mpp.value == pytest.approx((mpp, mpp), rel=1e-4)
        assert len(source.levels) == levels
        assert sorted(source.associated) == associated


def test_svs_facts_name_their_origin(slide_path):
    with open_source(slide_path(CMU)) as source:
        assert source.info.mpp.origin == "SVS ImageDescription MPP"
        assert source.info.objective_power.value == 20.0
        assert source.brightfield_rgb


def test_ndpi_is_fluorescence_from_its_vendor_tag(slide_path):
    with open_source(slide_path(NDPI)) as source:
        assert source.info.modality.value == "fluorescence"
        assert "Fluorescence" in source.info.modality.origin
        assert source.info.objective_power.value == 40.0
        assert [lv.shape for lv in source.levels] == [
            (4864, 3968),
            (2432, 1984),
            (1216, 992),
            (608, 496),
        ]
        assert not source.brightfield_rgb


def test_png_screen_dpi_is_not_taken_as_mpp(slide_path):
    with open_source(slide_path(IHC)) as source:
        assert source.info.mpp is None
        assert any("not a microscope scan resolution" in w for w in source.info.warnings)


def test_aperio_rgb_tiles_are_copyable_and_marked_rgb(slide_path):
    with open_source(slide_path(CMU)) as source:
        tiles = source.levels[0].jpeg_tiles()
        assert tiles.color_space == "rgb"
        assert tiles.tile_shape == (240, 240) and tiles.grid == (13, 10)


@pytest.mark.parametrize(("name", "why"), [(NDPI, "strips"), (KIDNEY, "uncompressed strips")])
def test_non_tiled_sources_say_why_they_cannot_be_copied(slide_path, name, why):
    with open_source(slide_path(name)) as source:
        assert source.levels[0].jpeg_tiles() is None
        assert why in source.levels[0].describe_copy()


def test_band_reads_equal_tifffile(slide_path):
    reference = tifffile.imread(slide_path(NDPI))
    with open_source(slide_path(NDPI)) as source:
        np.testing.assert_array_equal(
            source.levels[0].read(1000, 1256, 7, 3000), reference[1000:1256, 7:3000]
        )


def test_a_qptiff_is_read_by_its_own_reader_not_the_generic_one(tmp_path):
    """Each TIFF reader is chosen by the tifffile flag it declares (`marked_by`)."""
    plane = np.random.default_rng(0).integers(0, 255, (512, 512), dtype=np.uint8)
    path = tiffs.qptiff(
        tmp_path / "v.qptiff", {"DAPI": ("0,0,255", plane), "CD8": ("0,255,0", plane)}
    )
    with open_source(path) as source:
        assert source.info.format == "qptiff"
        assert source.info.mpp.value == (0.5, 0.5)


def test_ome_tiff_pyramid_and_units(tmp_path, cmu_pixels):
    path = tiffs.ome_pyramid(tmp_path / "p.ome.tif", cmu_pixels[:1024, :1536], mpp=0.25)
    with open_source(path) as source:
        assert source.info.format == "ome-tiff"
        assert source.info.mpp.value == (0.25, 0.25)
        assert [lv.shape for lv in source.levels] == [(1024, 1536), (512, 768), (256, 384)]
        assert source.levels[0].jpeg_tiles().color_space == "ycbcr"


def test_ome_tiff_fluorescence_channels(tmp_path):
    with open_source(tiffs.ome_fluorescence(tmp_path / "f.ome.tif")) as source:
        assert source.info.mpp.value == pytest.approx((0.325, 0.325))
        assert source.info.modality.value == "fluorescence"
        assert [c.name for c in source.info.channels] == ["DAPI", "FITC", "Cy5"]
        level = source.levels[0]
        assert (level.channels, level.dtype) == (3, np.uint16)
        assert level.read(0, 10, 0, 10).shape == (10, 10, 3)


# -- bad input: one clear SlideError naming the file and the cause --------------------------


@pytest.fixture
def small_tiff(tmp_path, cmu_pixels):
    return tiffs.tiled(tmp_path / "ok.tif", cmu_pixels[:512, :512], "jpeg")


def test_zero_bytes(tmp_path):
    path = tmp_path / "empty.svs"
    path.write_bytes(b"")
    with pytest.raises(SlideError, match=r"empty\.svs: file is empty"):
        open_source(path)


def test_not_a_slide(tmp_path):
    path = tmp_path / "notes.svs"
    path.write_text("patient notes, not pixels")
    with pytest.raises(SlideError, match=r"notes\.svs: not a supported slide"):
        open_source(path)


def test_directory(tmp_path):
    with pytest.raises(SlideError, match="is a directory"):
        open_source(tmp_path)


def test_missing_file(tmp_path):
    with pytest.raises(SlideError, match="cannot read"):
        open_source(tmp_path / "nope.svs")


def test_truncated_header(tmp_path, slide_path):
    path = tmp_path / "cut.svs"
    path.write_bytes(slide_path(CMU).read_bytes()[:6])
    with pytest.raises(SlideError, match=r"cut\.svs: not a readable TIFF"):
        open_source(path)


@pytest.mark.parametrize("keep", [1_000_000, 1_500_000])
def test_truncated_svs_is_detected(tmp_path, slide_path, keep):
    # The SVS keeps its IFDs after the pixel data: the cut lands in the IFD chain.
    path = tmp_path / "cut.svs"
    path.write_bytes(slide_path(CMU).read_bytes()[:keep])
    with pytest.raises(SlideError, match=r"cut\.svs: truncated or corrupt"):
        open_source(path)


def test_truncated_pixel_data_is_detected(tmp_path, small_tiff):
    # tifffile writes the IFD first: the cut lands in the tile data.
    data = small_tiff.read_bytes()
    path = tmp_path / "cut.tif"
    path.write_bytes(data[: int(len(data) * 0.7)])
    with pytest.raises(SlideError, match=r"cut\.tif: truncated: image data runs to byte"):
        open_source(path)


def test_unsupported_compression(tmp_path, small_tiff):
    path = tiffs.patch_tag(small_tiff, tmp_path / "odd.tif", "Compression", 12345)
    with pytest.raises(SlideError, match=r"odd\.tif: compression 12345 .*not supported"):
        open_source(path)


def test_absurd_declared_size(tmp_path, small_tiff):
    path = tiffs.patch_tag(small_tiff, tmp_path / "huge.tif", "ImageWidth", 3_000_000)
    with pytest.raises(SlideError, match=r"huge\.tif: page 0 declares an image of 3000000x512 px"):
        open_source(path)


def test_corrupt_png(tmp_path, slide_path):
    path = tmp_path / "broken.png"
    path.write_bytes(slide_path(IHC).read_bytes()[:5000])
    with pytest.raises(SlideError, match=r"broken\.png: cannot decode PNG"):
        open_source(path)


@pytest.mark.parametrize("tile", [(0, 240), (240, 0), (0, 0), (240, 70_000)])
def test_a_level_of_impossible_tiles_is_refused_whoever_read_it(tile):
    """A tile size no slide has, from any reader (ours, wsidicom's, OpenSlide's properties,
    where a tiled TIFF's 0 px tiles once reached a ZeroDivisionError), is one SlideError
    naming the file and the level, and the source is closed."""
    from types import SimpleNamespace

    from tilestore.errors import SlideError
    from tilestore.sources import checked_levels

    closed = []
    level = SimpleNamespace(tile_shape=tile)
    source = SimpleNamespace(
        path="x.tif",
        levels=[SimpleNamespace(tile_shape=None), level],
        close=lambda: closed.append(1),
    )
    with pytest.raises(SlideError) as refused:
        checked_levels(source)
    assert str(refused.value) == (
        f"x.tif: level 1 declares {tile[1]}x{tile[0]} px tiles (plausible: 1-16384 px a "
        "side); the header is corrupt"
    )
    assert closed == [1]
