"""The zarr v3 jpeg codec: spec configuration, round trips, registration through entry points."""

from __future__ import annotations

import json

import numpy as np
import pytest
import zarr
import zarr.registry

from tests.conftest import psnr
from tilestore.format.codecs import JpegCodec, jpeg_codecs


def test_registered_with_zarr_by_entry_point():
    assert zarr.registry.get_codec_class("jpeg") is JpegCodec


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (
            {"quality": 80, "encoded_color_space": "ycbcr"},
            {
                "quality": 80,
                "encoded_color_space": "ycbcr",
                "subsampling": [[2, 2], [1, 1], [1, 1]],
            },
        ),
        (
            {
                "quality": 95,
                "encoded_color_space": "ycbcr",
                "subsampling": [[1, 1], [1, 1], [1, 1]],
            },
            {
                "quality": 95,
                "encoded_color_space": "ycbcr",
                "subsampling": [[1, 1], [1, 1], [1, 1]],
            },
        ),
        (
            {"quality": 90, "encoded_color_space": "rgb"},
            {"quality": 90, "encoded_color_space": "rgb"},
        ),
        ({"quality": 70}, {"quality": 70}),
    ],
)
def test_config_round_trip(config, expected):
    codec = JpegCodec.from_dict({"name": "jpeg", "configuration": config})
    assert codec.to_dict() == {"name": "jpeg", "configuration": expected}
    assert JpegCodec.from_dict(codec.to_dict()) == codec


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"quality": 101}, "quality"),
        ({"encoded_color_space": "xyb"}, "encoded_color_space"),
        ({"encoded_color_space": "rgb", "subsampling": "4:2:0"}, "cannot be subsampled"),
        ({"encoded_color_space": "ycbcr", "subsampling": [[2, 2], [2, 1], [1, 1]]}, "chroma"),
        ({"encoded_color_space": "ycbcr", "subsampling": [[5, 1], [1, 1], [1, 1]]}, "1-4"),
    ],
)
def test_invalid_configurations_are_rejected(config, message):
    with pytest.raises(ValueError, match=message):
        JpegCodec(**config)


def _array(tmp_path, shape, chunks, **codecs):
    return zarr.create_array(
        tmp_path / "a.zarr", shape=shape, chunks=chunks, dtype="uint8", **codecs
    )


@pytest.mark.parametrize("space", ["ycbcr", "rgb"])
def test_rgb_chunks_round_trip_through_transpose(tmp_path, cmu_pixels, space):
    data = np.ascontiguousarray(np.moveaxis(cmu_pixels[:600, :520], -1, 0))
    array = _array(tmp_path, data.shape, (3, 256, 256), **jpeg_codecs(95, space, "4:4:4"))
    array[:] = data
    again = zarr.open_array(tmp_path / "a.zarr", mode="r")[:]
    assert again.shape == data.shape
    assert psnr(again, data) > 40
    meta = json.loads((tmp_path / "a.zarr" / "zarr.json").read_text())
    assert [c["name"] for c in meta["codecs"]] == ["transpose", "imagecodecs_jpeg", "crc32c"]
    config = meta["codecs"][1]["configuration"]  # imagecodecs' names for what was written
    assert config == {
        "level": 95,
        "colorspace_data": "RGB",
        "colorspace_jpeg": {"ycbcr": "YCbCr", "rgb": "RGB"}[space],
        "subsampling": "444",
    }


def test_the_serializer_we_write_with_encodes_zarrs_transposed_views(cmu_pixels):
    """zarr hands the serializer each chunk as the transpose filter's view of it (not
    contiguous); imagecodecs' own codec class (2026.10, Python >= 3.12) refused such an
    array, and every re-encoded level failed there. What tilestore writes with encodes it."""
    from zarr.core.array_spec import ArrayConfig, ArraySpec
    from zarr.core.buffer import default_buffer_prototype
    from zarr.core.dtype import UInt8

    chunk = np.ascontiguousarray(np.moveaxis(cmu_pixels[:256, :256], -1, 0))
    view = chunk.transpose(1, 2, 0)
    assert not view.flags.c_contiguous
    serializer = jpeg_codecs(95, "ycbcr", "4:4:4")["serializer"]
    prototype = default_buffer_prototype()
    spec = ArraySpec((256, 256, 3), UInt8(), 0, ArrayConfig.from_dict({}), prototype)
    data = serializer._encode_sync(prototype.nd_buffer.from_numpy_array(view), spec)
    decoded = serializer._decode_sync(data, spec).as_numpy_array()
    assert psnr(decoded, view) > 40


def test_grayscale_chunks_need_no_color_space(tmp_path, cmu_pixels):
    data = np.ascontiguousarray(cmu_pixels[:300, :300, 1])
    array = _array(
        tmp_path, data.shape, (128, 128), serializer=JpegCodec(quality=95), compressors=None
    )
    array[:] = data
    assert psnr(array[:], data) > 40


def test_wrong_channel_count_is_an_error(tmp_path):
    array = _array(
        tmp_path,
        (32, 32, 4),
        (32, 32, 4),
        serializer=JpegCodec(quality=90, encoded_color_space="ycbcr"),
        compressors=None,
    )
    with pytest.raises(ValueError, match="chunk shape"):
        array[:] = np.full((32, 32, 4), 7, np.uint8)


def test_three_channels_without_color_space_is_an_error(tmp_path):
    array = _array(
        tmp_path, (32, 32, 3), (32, 32, 3), serializer=JpegCodec(quality=90), compressors=None
    )
    with pytest.raises(ValueError, match="encoded_color_space"):
        array[:] = np.full((32, 32, 3), 7, np.uint8)


def test_non_uint8_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="uint8"):
        zarr.create_array(
            tmp_path / "b.zarr",
            shape=(8, 8),
            chunks=(8, 8),
            dtype="uint16",
            serializer=JpegCodec(),
            compressors=None,
        )
