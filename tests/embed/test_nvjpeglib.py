"""Our nvJPEG binding: the frame header it checks every chunk against, and finding the
library (the decodes themselves are GPU tests in test_nvjpeg.py)."""

from __future__ import annotations

import os
import struct

import imagecodecs
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tilestore.embed.nvjpeglib import find_library, jpeg_size


@settings(max_examples=25, deadline=None)
@given(
    height=st.integers(1, 700),
    width=st.integers(1, 700),
    subsampling=st.sampled_from(["444", "422", "420"]),
)
def test_the_frame_header_gives_the_encoded_size(height, width, subsampling):
    image = np.random.default_rng(height * width).integers(0, 255, (height, width, 3), np.uint8)
    data = imagecodecs.jpeg8_encode(image, level=85, subsampling=subsampling)
    assert jpeg_size(data) == (height, width, 3)


def test_grey_and_rgb_coded_streams_give_their_components():
    grey = imagecodecs.jpeg8_encode(np.zeros((40, 30), np.uint8), level=90)
    rgb = imagecodecs.jpeg8_encode(
        np.zeros((20, 50, 3), np.uint8), level=90, colorspace="RGB", outcolorspace="RGB"
    )
    assert jpeg_size(grey) == (40, 30, 1)
    assert jpeg_size(rgb) == (20, 50, 3)


def _segment(marker: int, payload: bytes) -> bytes:
    return bytes([0xFF, marker]) + struct.pack(">H", len(payload) + 2) + payload


def test_frame_marker_bytes_inside_a_table_are_not_taken_for_the_frame():
    # a quantisation table whose values hold FF C0 followed by what would read as 9 x 9 px
    table = _segment(0xDB, bytes([0]) + bytes([0xFF, 0xC0, 0, 17, 8, 0, 9, 0, 9]) + bytes(55))
    frame = _segment(0xC0, bytes([8]) + struct.pack(">HH", 512, 256) + bytes([3]) + bytes(9))
    assert jpeg_size(b"\xff\xd8" + table + frame) == (512, 256, 3)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\xff\xd8" + _segment(0xC2, bytes(15)), "0xC2 .not baseline Huffman"),  # progressive
        (
            b"\xff\xd8" + _segment(0xC1, bytes([12]) + struct.pack(">HH", 8, 8) + bytes(10)),
            "12 bits",
        ),
        (b"\xff\xd8" + _segment(0xDA, bytes(10)), "no JPEG frame header"),
        (b"\xff\xd8garbage", "corrupt JPEG marker structure"),  # the shared marker walk
        (b"\xff\xd8", "no JPEG frame header"),
    ],
)
def test_streams_the_batched_decoder_cannot_take_are_refused(data, message):
    with pytest.raises(ValueError, match=message):
        jpeg_size(data)


def test_the_library_found_is_a_file_or_nothing():
    path = find_library()
    assert path is None or os.path.exists(path) or "/" not in path
