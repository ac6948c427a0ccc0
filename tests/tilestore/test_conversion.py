"""Conversion: valid OME-Zarr 0.5, exact pixels on the copy and lossless paths, safe failure."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import tifffile
import zarr
from ome_zarr_models.v05 import Image as OmeImage
from PIL import Image

from tests.conftest import CMU, IHC, KIDNEY, NDPI, psnr
from tests.tilestore import tiffs
from tilestore.conversion import levels as levels_module
from tilestore.conversion.converter import convert
from tilestore.errors import SlideError, StoreError, TilestoreError, TilestoreWarning
from tilestore.reading.opening import open_slide


def _level(store, index=0) -> np.ndarray:
    return np.moveaxis(zarr.open_array(store / str(index), mode="r")[:], 0, -1)


def _attrs(store) -> dict:
    return json.loads((store / "zarr.json").read_text())["attributes"]


@pytest.mark.parametrize("name", [CMU, NDPI, KIDNEY, IHC])
def test_real_slides_make_valid_ome_zarr_05(stores, name):
    store = stores(name)
    image = OmeImage.from_zarr(zarr.open_group(store, mode="r"))
    attrs = _attrs(store)
    assert attrs["ome"]["version"] == "0.5"
    assert attrs["tilestore"]["complete"] is True
    for path in image.attributes.ome.get_array_paths():
        meta = json.loads((store / path / "zarr.json").read_text())
        assert meta["dimension_names"] == ["c", "y", "x"]
    assert not list(store.parent.glob(".*partial*"))


def test_svs_copy_path_is_exact_and_keeps_source_bytes(stores, slide_path, cmu_pixels):
    store = stores(CMU)
    levels = _attrs(store)["tilestore"]["levels"]
    assert levels[0]["write"] == "copy" and levels[0]["reencoded"] == 0
    np.testing.assert_array_equal(_level(store), cmu_pixels)
    with tifffile.TiffFile(slide_path(CMU)) as tif:
        page = tif.pages[0]
        tif.filehandle.seek(page.dataoffsets[5])
        raw = tif.filehandle.read(page.databytecounts[5])
    chunk = open_slide(store).chunks(0).fetch_one((0, 5))  # its CRC-32C checked and cut
    assert chunk.endswith(raw[2:])  # the entropy-coded data is the source's, unchanged


def test_copied_chunks_decode_with_other_decoders(stores, cmu_pixels):
    import io

    chunk = open_slide(store := stores(CMU)).chunks(0).fetch_one((2, 3))
    decoded = np.asarray(Image.open(io.BytesIO(chunk)))
    np.testing.assert_array_equal(decoded, cmu_pixels[480:720, 720:960])
    assert store.exists()


def test_svs_gets_built_levels_down_to_1024(stores, cmu_pixels):
    store = stores(CMU)
    levels = _attrs(store)["tilestore"]["levels"]
    assert [lv["shape"] for lv in levels] == [[3, 2967, 2220], [3, 1484, 1110], [3, 742, 555]]
    assert [lv["downsample"] for lv in levels] == [[1, 1], [2, 2], [4, 4]]
    expected = levels_module.downsample2(cmu_pixels)
    # Downsampled pixels carry more detail each, so the same JPEG quality loses a
    # little more than on level 0 (which is copied exactly).
    assert psnr(_level(store, 1), expected) > 38
    # what the store says it lost: level 0 nothing (copied), the built ones their PSNR,
    # measured on every one of their few chunks (35 and 12: under the sample's 64)
    assert [(lv["lossy"], lv["sampled"]) for lv in levels] == [(False, 0), (True, 35), (True, 12)]
    assert levels[1]["psnr"] == pytest.approx(psnr(_level(store, 1), expected), abs=0.01)


def test_the_jpeg_svs_keeps_copying_its_tiles_and_says_what_the_built_levels_lost(
    tmp_path, slide_path
):
    report = convert(slide_path(CMU), tmp_path)
    assert report.codec == "jpeg" and report.codec_reason == (
        "8-bit RGB brightfield stored lossy: TIFF Compression 7 (JPEG)"
    )
    level1 = report.levels[1]
    assert report.summary() == (
        f"codec jpeg q95 ({report.codec_reason}): level 0 copied; LOSSY, level 1 PSNR "
        f"{level1.psnr:.1f} dB (35 chunks sampled)"
    )
    codec = _attrs(report.store)["tilestore"]["codec"]
    assert codec == {"name": "jpeg", "reason": report.codec_reason, "quality": 95, "lossy": True}


def test_a_sidecar_says_its_slide_levels_are_read_in_place_and_its_built_ones_lossy(
    tmp_path, slide_path
):
    report = convert(slide_path(CMU), tmp_path / "cmu.tilestore.zarr", in_place=True)
    assert report.summary() == (
        f"codec jpeg q95 ({report.codec_reason}): level 0 read in place; LOSSY, level 1 PSNR "
        f"{report.levels[1].psnr:.1f} dB (35 chunks sampled)"
    )


@pytest.mark.parametrize("compression", ["zlib", "lzw"])
def test_a_lossless_tiff_stays_lossless(tmp_path, cmu_pixels, compression):
    """Brightfield RGB, once JPEG by default: a slide stored losslessly is stored losslessly,
    its pixels as tifffile decodes them, and the report says so."""
    src = tiffs.tiled(tmp_path / "s.tif", cmu_pixels[:1500, :1300], compression, tile=(240, 240))
    with pytest.warns(TilestoreWarning, match="no pixel size"):
        report = convert(src, tmp_path / "out")
    name = {"zlib": "8 (deflate)", "lzw": "5 (LZW)"}[compression]
    assert report.codec == "zstd"
    assert report.codec_reason == f"stored losslessly, kept lossless: TIFF Compression {name}"
    assert report.summary() == f"codec zstd ({report.codec_reason}): lossless"
    assert [lv.write for lv in report.levels] == ["lossless", "lossless"] and not report.lossy
    np.testing.assert_array_equal(_level(report.store), tifffile.imread(src))
    source = _attrs(report.store)["tilestore"]["source"]
    assert source["lossless"] == {"value": True, "origin": f"TIFF Compression {name}"}


def test_jpeg_asked_for_on_a_lossless_tiff_says_lossy_and_its_psnr(tmp_path, cmu_pixels):
    src = tiffs.tiled(tmp_path / "s.tif", cmu_pixels[:2200, :2200], "zlib", tile=(256, 256))
    with pytest.warns(TilestoreWarning, match="no pixel size"):
        report = convert(src, tmp_path / "out", codec="jpeg", quality=90)
    level0 = report.levels[0]
    assert level0.write == "re-encode" and level0.lossy and level0.sampled == 64  # of 81
    assert level0.psnr == pytest.approx(psnr(_level(report.store), tifffile.imread(src)), abs=0.5)
    assert report.summary() == (
        f"codec jpeg q90 (asked for): LOSSY, level 0 PSNR {level0.psnr:.1f} dB (64 chunks sampled)"
    )
    stored = _attrs(report.store)["tilestore"]
    assert stored["codec"]["lossy"] is True
    assert stored["levels"][0]["psnr"] == level0.psnr and stored["levels"][0]["sampled"] == 64


def test_a_slide_whose_storage_is_not_known_is_kept_lossless(tmp_path, cmu_pixels):
    """JPEG XL in a TIFF may be either, and neither the tag nor the stream's header says."""
    src = tiffs.tiled(tmp_path / "s.tif", cmu_pixels[:700, :900], "jpegxl")
    with pytest.warns(TilestoreWarning, match="no pixel size"):
        report = convert(src, tmp_path / "out")
    assert report.codec == "zstd"
    assert report.codec_reason.startswith(
        "not known to be stored lossy, kept lossless (the safe default): TIFF Compression 50002"
    )
    np.testing.assert_array_equal(_level(report.store), tifffile.imread(src))


def test_mpp_and_scales(stores):
    attrs = _attrs(stores(CMU))
    assert attrs["tilestore"]["mpp"] == {
        "x": 0.499,
        "y": 0.499,
        "origin": "SVS ImageDescription MPP",
    }
    datasets = attrs["ome"]["multiscales"][0]["datasets"]
    assert datasets[2]["coordinateTransformations"][0]["scale"] == pytest.approx(
        [1, 4 * 0.499, 4 * 0.499]
    )
    assert datasets[2]["coordinateTransformations"][1]["translation"] == pytest.approx(
        [0, 1.5 * 0.499, 1.5 * 0.499]
    )
    axes = attrs["ome"]["multiscales"][0]["axes"]
    assert [a.get("unit") for a in axes] == [None, "micrometer", "micrometer"]


def test_ndpi_keeps_its_four_levels_losslessly(stores, slide_path):
    store = stores(NDPI)
    attrs = _attrs(store)["tilestore"]
    assert attrs["codec"]["name"] == "zstd" and "fluorescence" in attrs["codec"]["reason"]
    assert attrs["mpp"]["x"] == pytest.approx(0.22818, rel=1e-4)
    with tifffile.TiffFile(slide_path(NDPI)) as tif:
        for index, level in enumerate(tif.series[0].levels):
            np.testing.assert_array_equal(_level(store, index), level.asarray())


@pytest.mark.parametrize("name", [KIDNEY, IHC])
def test_lossless_files_stay_lossless_and_jpeg_asked_for_keeps_40_db(stores, slide_path, name):
    """An uncompressed TIFF and a PNG (JPEG by default before: lossy, unasked) are stored
    exactly; JPEG asked for re-encodes them above 40 dB."""
    source = slide_path(name)
    reference = (
        np.asarray(Image.open(source).convert("RGB"))
        if name.endswith(".png")
        else tifffile.imread(source)
    )
    store = stores(name)
    assert _attrs(store)["tilestore"]["levels"][0]["write"] == "lossless"
    np.testing.assert_array_equal(_level(store), reference)
    store = stores(name, codec="jpeg")
    assert _attrs(store)["tilestore"]["levels"][0]["write"] == "re-encode"
    assert psnr(_level(store), reference) >= 40


def test_missing_mpp_warns_and_records_null(tmp_path, slide_path):
    with pytest.warns(TilestoreWarning, match=r"kidney-48-5\.tif: no pixel size"):
        store = convert(slide_path(KIDNEY), tmp_path).store
    attrs = _attrs(store)
    assert attrs["tilestore"]["mpp"] is None
    assert "unit" not in attrs["ome"]["multiscales"][0]["axes"][1]


def test_mpp_option_overrides(tmp_path, slide_path):
    store = convert(slide_path(KIDNEY), tmp_path, mpp=0.5).store
    assert _attrs(store)["tilestore"]["mpp"] == {"x": 0.5, "y": 0.5, "origin": "user (mpp option)"}


def test_associated_images_only_when_asked(tmp_path, stores, slide_path):
    assert not (stores(CMU) / "associated").exists()
    store = convert(slide_path(CMU), tmp_path, keep_associated=True).store
    assert _attrs(store)["tilestore"]["associated"] == ["label", "macro", "thumbnail"]
    label = zarr.open_array(store / "associated" / "label", mode="r")
    assert label.shape == (3, 463, 387)


def test_forced_reencode_is_lossy_but_close(tmp_path, slide_path, cmu_pixels):
    report = convert(slide_path(CMU), tmp_path, copy=False)
    assert report.levels[0].write == "re-encode" and report.levels[0].reason == "copy disabled"
    assert report.chunk == 256
    assert psnr(_level(report.store), cmu_pixels) > 40


def test_chunk_option_that_mismatches_tiles_falls_back(tmp_path, slide_path):
    report = convert(slide_path(CMU), tmp_path, chunk=256)
    assert report.levels[0].write == "re-encode"
    assert "differ from chunks" in report.levels[0].reason


def test_ome_pyramid_levels_are_all_copied(tmp_path, cmu_pixels):
    src = tiffs.ome_pyramid(tmp_path / "p.ome.tif", cmu_pixels[:1024, :1536])
    report = convert(src, tmp_path / "out")
    assert report.store.name == "p.ome.zarr"
    assert [lv.write for lv in report.levels] == ["copy", "copy", "copy"]
    assert report.summary() == f"codec jpeg ({report.codec_reason}): copied"  # no q: none encoded
    with tifffile.TiffFile(src) as tif:
        for index, level in enumerate(tif.series[0].levels):
            np.testing.assert_array_equal(_level(report.store, index), level.asarray())
    OmeImage.from_zarr(zarr.open_group(report.store, mode="r"))


def test_jpeg2000_tiles_stay_lossless_if_reversible_else_are_reencoded(tmp_path, cmu_pixels):
    """tifffile's JPEG 2000 is reversible (5-3) by default: stored exactly, where it was
    re-encoded as JPEG before; irreversible (9-7) tiles are lossy already: JPEG, as before."""
    pixels = cmu_pixels[:700, :900]
    reversible = tiffs.tiled(tmp_path / "j2k.tif", pixels, "jpeg2000")
    irreversible = tiffs.tiled(
        tmp_path / "j2k97.tif", pixels, "jpeg2000", compressionargs={"reversible": False}
    )
    with pytest.warns(TilestoreWarning, match="no pixel size"):
        exact = convert(reversible, tmp_path / "out")
        lossy = convert(irreversible, tmp_path / "out")
    assert exact.levels[0].write == "lossless" and "reversible 5-3" in exact.codec_reason
    np.testing.assert_array_equal(_level(exact.store), tifffile.imread(reversible))
    assert lossy.levels[0].write == "re-encode" and "irreversible 9-7" in lossy.codec_reason
    assert "JPEG2000" in lossy.levels[0].reason.upper()
    assert psnr(_level(lossy.store), tifffile.imread(irreversible)) >= 40


def test_uint16_fluorescence_is_lossless_with_channel_names(tmp_path):
    src = tiffs.ome_fluorescence(tmp_path / "f.ome.tif")
    report = convert(src, tmp_path / "out")
    assert report.codec == "zstd"
    np.testing.assert_array_equal(
        zarr.open_array(report.store / "0", mode="r")[:], tifffile.imread(src)
    )
    omero = _attrs(report.store)["ome"]["omero"]
    assert [c["label"] for c in omero["channels"]] == ["DAPI", "FITC", "Cy5"]
    assert omero["channels"][0]["window"]["max"] == 65535


def test_jpeg_for_fluorescence_uses_rgb_color_space(tmp_path, slide_path):
    with pytest.raises(TilestoreError, match="lossy_ok=True"):  # RGB, but declared fluorescence
        convert(slide_path(NDPI), tmp_path, codec="jpeg")
    report = convert(slide_path(NDPI), tmp_path, codec="jpeg", lossy_ok=True)
    meta = json.loads((report.store / "0" / "zarr.json").read_text())
    inner = meta["codecs"][0]["configuration"]["codecs"]  # in each shard
    assert inner[1]["configuration"]["colorspace_jpeg"] == "RGB"


def test_jpeg_codec_refuses_16_bit(tmp_path):
    src = tiffs.ome_fluorescence(tmp_path / "f.ome.tif")
    with pytest.raises(TilestoreError, match="needs 8-bit"):
        convert(src, tmp_path / "out", codec="jpeg")
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


def test_blocks_never_hold_a_whole_level(tmp_path, slide_path, monkeypatch):
    """Re-encoded levels are written a shard at a time: each block read is one shard (at
    most 32 x 32 chunks), never a whole level."""
    seen = []
    original = levels_module.write_blocks

    def spy(array, read, progress, loss=None):
        def recording(y0, y1, x0, x1):
            seen.append((array.shape[1:], array.shards[1:], (y1 - y0, x1 - x0)))
            return read(y0, y1, x0, x1)

        return original(array, recording, progress, loss)

    monkeypatch.setattr("tilestore.conversion.converter.write_blocks", spy)
    convert(slide_path(NDPI), tmp_path, chunk=64)
    assert seen and any(b[0] * b[1] < h * w for (h, w), _, b in seen)  # a level of several
    assert all(block[0] <= shard[0] and block[1] <= shard[1] for _, shard, block in seen)


def test_progress_reports_every_chunk(tmp_path, slide_path):
    calls = []
    convert(slide_path(CMU), tmp_path, progress=lambda n, total: calls.append((n, total)))
    total = calls[0][1]
    assert sum(n for n, _ in calls) == total == 130 + 35 + 12


# -- output safety -------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:.*ignored resolution from PNG dpi")  # 264.6 um/px
def test_existing_store_needs_overwrite(tmp_path, slide_path):
    store = convert(slide_path(IHC), tmp_path, mpp=0.5).store
    before = (store / "zarr.json").read_text()
    with pytest.raises(StoreError, match=r"already exists; pass overwrite=True"):
        convert(slide_path(IHC), tmp_path, mpp=0.25)
    assert (store / "zarr.json").read_text() == before
    convert(slide_path(IHC), tmp_path, mpp=0.25, overwrite=True)
    assert _attrs(store)["tilestore"]["mpp"]["x"] == 0.25
    assert sorted(p.name for p in tmp_path.iterdir()) == ["skimage_ihc.ome.zarr"]


def test_overwrite_refuses_to_delete_a_non_store(tmp_path, slide_path):
    target = tmp_path / "skimage_ihc.ome.zarr"
    target.mkdir()
    (target / "thesis.docx").write_text("precious")
    # never "pass overwrite=True" (which then failed the same way): move it
    for overwrite in (False, True):
        with pytest.raises(StoreError, match="a folder that is not a tilestore store is in the "
                           "store's place; move it or choose another output"):  # fmt: skip
            convert(slide_path(IHC), tmp_path, mpp=0.5, overwrite=overwrite)
    assert (target / "thesis.docx").read_text() == "precious"


@pytest.mark.filterwarnings("ignore:.*ignored resolution from PNG dpi")  # 264.6 um/px
def test_failed_overwrite_keeps_the_old_store(tmp_path, slide_path, monkeypatch):
    store = convert(slide_path(IHC), tmp_path, mpp=0.5).store

    def broken(*args, **kwargs):
        raise SlideError("simulated decode failure")

    monkeypatch.setattr("tilestore.conversion.converter.write_blocks", broken)
    with pytest.raises(SlideError, match="simulated"):
        convert(slide_path(IHC), tmp_path, mpp=0.25, overwrite=True)
    assert _attrs(store)["tilestore"]["mpp"]["x"] == 0.5
    assert sorted(p.name for p in tmp_path.iterdir()) == ["skimage_ihc.ome.zarr"]


def test_interrupted_conversion_leaves_nothing(tmp_path, slide_path, monkeypatch):
    original = levels_module.write_blocks
    calls = []

    def interrupt_second_level(array, read, progress, loss=None):
        calls.append(array.path)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return original(array, read, progress, loss)

    monkeypatch.setattr("tilestore.conversion.converter.write_blocks", interrupt_second_level)
    with pytest.raises(KeyboardInterrupt):
        convert(slide_path(CMU), tmp_path, copy=False)
    assert list(tmp_path.iterdir()) == []


def test_unwritable_output(tmp_path, slide_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with pytest.raises(StoreError, match="cannot create output directory"):
        convert(slide_path(IHC), blocker / "out")


@pytest.mark.parametrize("bad", ["empty", "text", "truncated"])
def test_bad_input_leaves_no_store(tmp_path, slide_path, bad):
    src = tmp_path / "in" / "bad.svs"
    src.parent.mkdir()
    content = {
        "empty": b"",
        "text": b"hello",
        "truncated": slide_path(CMU).read_bytes()[:1_200_000],
    }[bad]
    src.write_bytes(content)
    with pytest.raises(SlideError, match=r"bad\.svs"):
        convert(src, tmp_path / "out")
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


def test_unknown_codec_and_bad_chunk(tmp_path, slide_path):
    with pytest.raises(
        TilestoreError, match=r"^codec='webp': must be one of 'auto', 'jpeg', 'zstd'$"
    ):
        convert(slide_path(IHC), tmp_path, codec="webp")
    with pytest.raises(TilestoreError, match="multiple of 16"):
        convert(slide_path(IHC), tmp_path, chunk=250)


def test_level_shapes_of_a_large_thin_image(tmp_path):
    # 2x levels stop once the longer side is at most 1024 px, rounding up.
    image = np.full((300, 4100, 3), 200, np.uint8)
    image[:, ::7] = 30
    src = tmp_path / "thin.tif"
    tifffile.imwrite(src, image, photometric="rgb")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TilestoreWarning)
        report = convert(src, tmp_path / "out")
    assert [lv.shape[1:] for lv in report.levels] == [
        (300, 4100),
        (150, 2050),
        (75, 1025),
        (38, 513),
    ]


def test_a_store_made_meanwhile_is_kept_not_replaced(tmp_path):
    """Two conversions of one slide racing (a rerun beside one left running): the one that
    ends second, not asked to overwrite, keeps the first's store and says so; its own
    partial folder is removed."""
    from tilestore.format import leftovers

    target = tmp_path / "a.ome.zarr"
    with (
        pytest.raises(StoreError, match=r"a\.ome\.zarr: made by another process while"),
        leftovers.built_beside(target, "cannot write store", replace=False) as tmp,
    ):
        tmp.mkdir()
        (tmp / "mine").write_text("x")
        target.mkdir()
        (target / "theirs").write_text("y")  # embedded into meanwhile
    assert (target / "theirs").exists() and not (target / "mine").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.ome.zarr"]
    with leftovers.built_beside(target, "cannot write store") as tmp:  # asked to: replaced
        tmp.mkdir()
        (tmp / "mine").write_text("x")
    assert (target / "mine").exists() and not (target / "theirs").exists()
