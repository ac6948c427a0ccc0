"""JPEG bitstream surgery: headers parse, tables splice, the Adobe marker changes decoding."""

from __future__ import annotations

import dataclasses

import imagecodecs
import numpy as np
import pytest
import tifffile
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from tests.conftest import CMU
from tilestore.format import jpeg


@pytest.fixture(scope="module")
def aperio_tile(slide_path):
    """The first raw (abbreviated) tile of the real SVS, its JPEGTables and tifffile's decode."""
    with tifffile.TiffFile(slide_path(CMU)) as tif:
        page = tif.pages[0]
        tif.filehandle.seek(page.dataoffsets[0])
        raw = tif.filehandle.read(page.databytecounts[0])
        reference = page.asarray()[: page.tilelength, : page.tilewidth]
        return raw, page.jpegtables, reference


def test_aperio_header_says_ycbcr_to_a_standard_decoder(aperio_tile):
    raw, tables, _ = aperio_tile
    head = jpeg.read_header(tables, raw)
    assert (head.height, head.width) == (240, 240)
    assert head.baseline and not head.jfif and head.adobe_transform is None
    assert head.sampling == ((1, 1), (1, 1), (1, 1))
    assert head.color_space == "ycbcr"  # component ids 0,1,2: libjpeg assumes YCbCr


def test_complete_stream_with_adobe_marker_decodes_like_tifffile(aperio_tile):
    raw, tables, reference = aperio_tile
    stream = jpeg.complete_stream(raw, tables, mark_rgb=True)
    assert jpeg.read_header(stream).color_space == "rgb"
    np.testing.assert_array_equal(imagecodecs.jpeg8_decode(stream), reference)
    # Any libjpeg-based decoder honours the marker, not just ours.
    import io

    np.testing.assert_array_equal(np.asarray(Image.open(io.BytesIO(stream))), reference)


def test_without_marker_colours_are_wrong(aperio_tile):
    raw, tables, reference = aperio_tile
    stream = jpeg.complete_stream(raw, tables, mark_rgb=False)
    decoded = imagecodecs.jpeg8_decode(stream)
    assert np.abs(decoded.astype(int) - reference).mean() > 20


def test_read_header_rejects_non_jpeg():
    with pytest.raises(ValueError, match="not a JPEG"):
        jpeg.read_header(b"PNG....")
    with pytest.raises(ValueError, match="no frame header"):
        jpeg.read_header(jpeg.SOI + jpeg.EOI)


@pytest.mark.parametrize(
    ("kwargs", "space", "sampling"),
    [
        ({"subsampling": "420"}, "ycbcr", ((2, 2), (1, 1), (1, 1))),
        ({"subsampling": "444"}, "ycbcr", ((1, 1), (1, 1), (1, 1))),
        ({"colorspace": "RGB", "outcolorspace": "RGB"}, "rgb", ((1, 1), (1, 1), (1, 1))),
    ],
)
def test_header_of_encoded_streams(kwargs, space, sampling):
    image = np.random.default_rng(0).integers(0, 255, (32, 48, 3), dtype=np.uint8)
    head = jpeg.read_header(imagecodecs.jpeg8_encode(image, level=90, **kwargs))
    assert (head.height, head.width, head.color_space, head.sampling) == (32, 48, space, sampling)


@pytest.mark.parametrize("mark_rgb", [True, False])
def test_a_tile_checked_by_its_own_segments_reads_as_the_whole_stream(slide_path, mark_rgb):
    """The copy path parses the part every tile of a level shares once, then each tile from
    where its own segments begin: the header is the whole spliced stream's, tile by tile."""
    from tilestore.sources import open_source

    with open_source(slide_path(CMU)) as source:
        tiles = source.levels[0].jpeg_tiles()
        assert tiles.own_start > 100 and tiles.shared == (False, 0)  # Aperio: Adobe, ours
        jfif, adobe = tiles.shared
        rows, cols = tiles.grid
        for row in range(rows):
            for col in range(cols):
                stream = tiles.read(row, col)
                whole = jpeg.read_header(stream)
                own = jpeg.read_header(stream, start=tiles.own_start, jfif=jfif, adobe=adobe)
                assert own == whole
    tables = b"\xff\xd8\xff\xdb\x00\x43\x00" + bytes(64) + b"\xff\xd9"  # one DQT
    shared = jpeg.complete_stream(jpeg.SOI, tables, mark_rgb=mark_rgb)
    assert jpeg.marker_facts(shared + jpeg.EOI) == (False, 0 if mark_rgb else None)


def _jpeg_with(**pil) -> bytes:
    import io

    from PIL import Image

    pixels = np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)
    if pil.pop("gray", False):
        pixels = pixels[..., 0]
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "JPEG", **pil)
    return buffer.getvalue()


def test_gpu_refusal_names_what_a_gpu_jpeg_decoder_cannot_take():
    import imagecodecs

    from tilestore.format.jpeg import gpu_refusal

    pixels = np.random.default_rng(1).integers(0, 255, (64, 64, 3), dtype=np.uint8)
    assert gpu_refusal(imagecodecs.jpeg8_encode(pixels)) is None  # baseline 4:2:0
    assert gpu_refusal(imagecodecs.jpeg8_encode(pixels, subsampling=(1, 1))) is None  # 4:4:4
    assert gpu_refusal(_jpeg_with(progressive=True)).startswith("progressive JPEG")
    assert gpu_refusal(_jpeg_with(gray=True)).startswith("JPEG of 1 components")
    assert gpu_refusal(imagecodecs.jpeg8_encode(pixels, lossless=True)).startswith("lossless")
    twelve = imagecodecs.jpeg8_encode(pixels.astype(np.uint16) * 16, bitspersample=12)
    assert gpu_refusal(twelve).startswith("12-bit JPEG samples")


# streams of several frames: sizes, chroma sampling, colour (one told RGB by an Adobe marker
# just before its scan), progressive
def _stream(kind: int) -> bytes:
    shape, kwargs = [
        ((240, 240), {"subsampling": "444"}),
        ((240, 240), {"subsampling": "420"}),
        ((240, 232), {"subsampling": "444"}),
        ((240, 240), {"colorspace": "RGB", "outcolorspace": "RGB"}),
        ((240, 240), {"subsampling": "444", "level": 50}),
        ((240, 240), {"progressive": True}),
        ((240, 240), {"subsampling": "444", "late_adobe": True}),
    ][kind % 7]
    image = np.random.default_rng(kind).integers(0, 255, (*shape, 3), dtype=np.uint8)
    if kwargs.pop("progressive", False):
        import io

        buffer = io.BytesIO()  # smooth: PIL's progressive buffer is too small for noise
        smooth = np.add.outer(np.arange(240), np.arange(240)).astype(np.uint8)
        Image.fromarray(smooth).convert("RGB").save(
            buffer, "JPEG", quality=90, subsampling=0, progressive=True
        )
        return buffer.getvalue()
    late = kwargs.pop("late_adobe", False)
    stream = imagecodecs.jpeg8_encode(image, **{"level": 90, **kwargs})
    scan = stream.index(b"\xff\xda")
    return stream[:scan] + jpeg.ADOBE_RGB + stream[scan:] if late else stream


def _answer(frame: jpeg.TileFrame, stream: bytes, own: bool):
    try:
        return frame.fits(stream[2:] if own else stream, own=own)
    except ValueError as exc:
        return f"ValueError: {exc}"


def _damaged(stream: bytes, damage: int) -> bytes:
    """The stream whole, cut inside a segment before its scan, cut where its last segment
    before the scan begins (no scan), or with its scan's bytes changed."""
    spans = list(jpeg._spans(stream, 2))
    scan, last = spans[-1][1] - 4, spans[-2][1] - 4  # where each segment's marker begins
    return [
        stream,
        stream[: scan - 7],
        stream[:last],
        stream[: spans[-1][2]] + bytes(reversed(stream[spans[-1][2] :])),
        b"\x00\x00" + stream[2:],  # no SOI: refused whole, whatever follows
    ][damage]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(st.integers(0, 13), st.integers(0, 4), st.booleans()), min_size=1, max_size=30
    )
)
def test_a_frame_answers_each_stream_as_a_fresh_frame_would(calls):
    """TileFrame.fits remembers headers met: in any order, each stream (whole or damaged)
    gets the answer a frame that never saw another gives, and an error where that one
    errs. (A stream cut before its scan is never remembered: the segments after the cut,
    an Adobe marker, may change another stream's answer.)"""
    frame = jpeg.TileFrame(jpeg.SOI, (240, 240), ((1, 1),) * 3, "ycbcr")
    for kind, damage, own in calls:
        stream = _damaged(_stream(kind), damage)
        fresh = jpeg.TileFrame(jpeg.SOI, (240, 240), ((1, 1),) * 3, "ycbcr")
        assert _answer(frame, stream, own) == _answer(fresh, stream, own)
    assert all(len(seen) <= jpeg.SEEN_HEADERS for seen in frame._seen.values())


def test_a_frame_remembers_a_header_and_at_most_a_few():
    frame = jpeg.TileFrame(jpeg.SOI, (240, 240), ((1, 1),) * 3, "ycbcr")
    assert frame.fits(_stream(0)) and not frame.fits(_stream(1))
    assert len(frame._seen[False]) == 2 and frame.fits(_stream(7))  # kind 0's header again
    assert len(frame._seen[False]) == 2
    images = np.random.default_rng(0).integers(0, 255, (20, 24, 24, 3), dtype=np.uint8)
    for i, image in enumerate(images):  # 20 headers: 20 sizes of tables (quality)
        frame.fits(imagecodecs.jpeg8_encode(image, level=30 + 3 * i))
    assert len(frame._seen[False]) == jpeg.SEEN_HEADERS
    assert frame == jpeg.TileFrame(jpeg.SOI, (240, 240), ((1, 1),) * 3, "ycbcr")  # not compared
    other = dataclasses.replace(frame, shape=(120, 240))  # its own answers, not frame's
    assert not other._seen and not other.fits(_stream(0)) and frame.fits(_stream(0))
