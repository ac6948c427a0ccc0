"""Whether a source level is stored losslessly, as each reader reads it from its file: TIFF
Compression tags, JPEG 2000 COD markers and WebP chunks of streams made by imagecodecs from
the real slide's pixels, DICOM transfer syntaxes, image files, OpenSlide's properties."""

from __future__ import annotations

import imagecodecs
import numpy as np
import pytest
import tifffile

from tests.conftest import CMU, IHC, NDPI
from tests.tilestore import tiffs, vendors
from tilestore.sources import open_source
from tilestore.sources.storage import j2k_reversible

CAMELYON = "camelyon_lymphnode_jpeg.dcm"
JPG = "stardist_histo.jpg"


@pytest.fixture(scope="module")
def tile(cmu_pixels) -> np.ndarray:
    return np.ascontiguousarray(cmu_pixels[480:736, 720:976])


@pytest.mark.parametrize("codecformat", ["j2k", "jp2"])
@pytest.mark.parametrize(
    ("options", "reversible"),
    [
        ({}, True),
        ({"reversible": True}, True),
        ({"reversible": False}, False),
        ({"level": 40}, False),
    ],
)
def test_the_cod_marker_says_which_wavelet(tile, codecformat, options, reversible):
    """imagecodecs' JPEG 2000: lossless by default (5-3; decoded equal), 9-7 when asked for
    irreversible or a rate; a bare codestream or a JP2 file."""
    stream = imagecodecs.jpeg2k_encode(tile, codecformat=codecformat, **options)
    assert j2k_reversible(stream) is reversible
    assert np.array_equal(imagecodecs.jpeg2k_decode(stream), tile) is reversible


def test_a_rate_cut_reversible_stream_still_says_5_3(tile):
    """What the marker cannot tell: a 5-3 stream cut to a rate is lossy. Taken for lossless,
    it is stored as it decodes (nothing lost twice): the error falls on the safe side."""
    stream = imagecodecs.jpeg2k_encode(tile, level=40, reversible=True)
    assert j2k_reversible(stream) is True
    assert not np.array_equal(imagecodecs.jpeg2k_decode(stream), tile)


def test_streams_that_are_not_jpeg_2000_or_are_cut_say_nothing(tile):
    stream = imagecodecs.jpeg2k_encode(tile, codecformat="j2k")
    cod = stream.find(b"\xff\x52")
    assert j2k_reversible(stream[: cod + 6]) is None  # cut inside its COD marker
    assert j2k_reversible(stream[:cod]) is None  # cut before it
    assert j2k_reversible(imagecodecs.jpeg8_encode(tile)) is None
    assert j2k_reversible(b"") is None


@pytest.mark.parametrize(
    ("compression", "args", "lossless", "said"),
    [
        (None, {}, True, "TIFF Compression 1 (uncompressed)"),
        ("lzw", {}, True, "TIFF Compression 5 (LZW)"),
        ("zlib", {}, True, "TIFF Compression 8 (deflate)"),
        ("zstd", {}, True, "TIFF Compression 50000 (zstd)"),
        ("packbits", {}, True, "TIFF Compression 32773 (PackBits)"),
        ("jpeg", {}, False, "TIFF Compression 7 (JPEG)"),
        ("jpeg2000", {}, True, "reversible 5-3 wavelet (COD marker of the first tile)"),
        ("jpeg2000", {"reversible": False}, False, "irreversible 9-7 wavelet"),
        ("webp", {"lossless": True}, True, "(WEBP): lossless VP8L stream"),
        ("webp", {"level": 80, "lossless": False}, False, "(WEBP): lossy VP8 stream"),
        ("jpegxl", {}, None, "(JPEGXL): may be lossless or lossy, and the tag does not say"),
    ],
)
def test_tiff_levels_say_how_they_are_stored(
    tmp_path, cmu_pixels, compression, args, lossless, said
):
    src = tiffs.tiled(tmp_path / "s.tif", cmu_pixels[:700, :900], compression, compressionargs=args)
    with open_source(src) as source:
        fact = source.levels[0].lossless
    assert fact.value is lossless and said in fact.origin


@pytest.mark.parametrize(
    ("name", "lossless", "said"),
    [
        (CMU, False, "TIFF Compression 7 (JPEG)"),  # Aperio's JPEG tiles
        (NDPI, False, "TIFF Compression 7 (JPEG)"),
        ("kidney-48-5.tif", True, "TIFF Compression 1 (uncompressed)"),
        (IHC, True, "PNG file"),
        (JPG, False, "JPEG file"),
        (CAMELYON, False, "DICOM transfer syntax 1.2.840.10008.1.2.4.50 (JPEG baseline)"),
    ],
)
def test_real_slides_say_how_they_are_stored(slide_path, name, lossless, said):
    with open_source(slide_path(name)) as source:
        assert {level.lossless.value for level in source.levels} == {lossless}
        assert source.levels[0].lossless.origin == said


def test_openslide_formats_say_what_their_properties_or_tiff_tags_say(tmp_path, cmu_pixels):
    vms = vendors.vms(tmp_path / "vms", np.ascontiguousarray(cmu_pixels[:1024, :2048]))
    philips = vendors.philips_tiff(
        tmp_path / "p.tiff", np.ascontiguousarray(cmu_pixels[:1024, :1024])
    )
    with open_source(vms) as source:
        fact = source.levels[0].lossless
        assert fact.value is False
        assert fact.origin == "OpenSlide property hamamatsu.ImageFile = image-0.jpg (JPEG files)"
    with open_source(philips) as source:
        fact = source.levels[0].lossless
        assert fact.value is False
        assert fact.origin == "TIFF Compression 7 (JPEG), of its largest page"


def test_a_jpeg_2000_tiff_whose_first_tile_is_cut_is_not_known(tmp_path, cmu_pixels):
    """The first tile's stream ends before its COD marker: the level says it does not know."""
    src = tiffs.tiled(tmp_path / "j.tif", cmu_pixels[:512, :512], "jpeg2000")
    data = bytearray(src.read_bytes())
    with tifffile.TiffFile(src) as tif:
        offset = tif.pages.first.dataoffsets[0]
    data[offset : offset + 64] = bytes(64)  # its main header gone
    src.write_bytes(bytes(data))
    with open_source(src) as source:
        fact = source.levels[0].lossless
    assert fact.value is None and "no COD marker found" in fact.origin
