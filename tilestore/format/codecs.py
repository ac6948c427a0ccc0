"""The zarr v3 ``jpeg`` codec (zarr-extensions spec) and the codec chains tilestore writes.

The codec is registered through the ``zarr.codecs`` entry point, so plain
``zarr.open`` decodes our stores wherever tilestore is installed. Decoding lets
the stream's own markers pick the colour transform, as the spec requires; that is
what makes chunks copied verbatim from a slide decode exactly as the slide does.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import imagecodecs
import numpy as np
from zarr.abc.codec import ArrayBytesCodec
from zarr.codecs import Crc32cCodec, TransposeCodec, ZstdCodec
from zarr.core.common import parse_named_configuration

if TYPE_CHECKING:
    from typing import Self

    from zarr.core.array_spec import ArraySpec
    from zarr.core.buffer import Buffer, NDBuffer

COLOR_SPACES = ("ycbcr", "rgb")
# The J:a:b schemes the spec requires, as per-component sampling factors.
SUBSAMPLING = {
    "4:4:4": ((1, 1), (1, 1), (1, 1)),
    "4:2:2": ((2, 1), (1, 1), (1, 1)),
    "4:4:0": ((1, 2), (1, 1), (1, 1)),
    "4:2:0": ((2, 2), (1, 1), (1, 1)),
}


def _parse_subsampling(value: Any) -> tuple[tuple[int, int], ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        if value not in SUBSAMPLING:
            raise ValueError(f"jpeg codec: unknown subsampling {value!r}")
        return SUBSAMPLING[value]
    factors = tuple((int(h), int(v)) for h, v in value)
    if any(not 1 <= f <= 4 for pair in factors for f in pair):
        raise ValueError(f"jpeg codec: sampling factors must be 1-4, got {value!r}")
    return factors


@dataclass(frozen=True)
class JpegCodec(ArrayBytesCodec):
    """Baseline JPEG for uint8 chunks shaped (H, W), (H, W, 1) or (H, W, 3)."""

    is_fixed_size = False

    quality: int
    encoded_color_space: str | None
    subsampling: tuple[tuple[int, int], ...] | None

    def __init__(
        self,
        *,
        quality: int = 90,
        encoded_color_space: str | None = None,
        subsampling: Any = None,
    ) -> None:
        if not 0 <= int(quality) <= 100:
            raise ValueError(f"jpeg codec: quality must be 0-100, got {quality}")
        if encoded_color_space is not None and encoded_color_space not in COLOR_SPACES:
            raise ValueError(f"jpeg codec: unknown encoded_color_space {encoded_color_space!r}")
        factors = _parse_subsampling(subsampling)
        if encoded_color_space == "ycbcr" and factors is None:
            factors = SUBSAMPLING["4:2:0"]
        if factors is not None and len(factors) == 3:
            if factors[1] != (1, 1) or factors[2] != (1, 1):
                raise ValueError("jpeg codec: chroma sampling factors must be [1, 1]")
            if encoded_color_space == "rgb" and factors[0] != (1, 1):
                raise ValueError("jpeg codec: encoded_color_space 'rgb' cannot be subsampled")
        object.__setattr__(self, "quality", int(quality))
        object.__setattr__(self, "encoded_color_space", encoded_color_space)
        object.__setattr__(self, "subsampling", factors)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        _, config = parse_named_configuration(data, "jpeg", require_configuration=False)
        return cls(**(config or {}))

    def to_dict(self) -> dict[str, Any]:
        config: dict[str, Any] = {"quality": self.quality}
        if self.encoded_color_space is not None:
            config["encoded_color_space"] = self.encoded_color_space
        if self.subsampling is not None:
            config["subsampling"] = [list(f) for f in self.subsampling]
        return {"name": "jpeg", "configuration": config}

    def validate(self, *, shape: Any, dtype: Any, chunk_grid: Any) -> None:
        if np.dtype(dtype.to_native_dtype()) != np.uint8:
            raise ValueError(f"jpeg codec supports uint8 only, not {dtype}")

    def _components(self, shape: tuple[int, ...]) -> int:
        if len(shape) == 2 or (len(shape) == 3 and shape[2] == 1):
            if self.encoded_color_space is not None:
                raise ValueError("jpeg codec: encoded_color_space must not be set for grayscale")
            return 1
        if len(shape) == 3 and shape[2] == 3:
            if self.encoded_color_space is None:
                raise ValueError("jpeg codec: 3-component chunks need encoded_color_space")
            return 3
        raise ValueError(f"jpeg codec: chunk shape {shape} is not (H, W), (H, W, 1) or (H, W, 3)")

    def encode_array(self, image: np.ndarray) -> bytes:
        """Return the JPEG stream for one (H, W[, C]) uint8 image."""
        components = self._components(image.shape)
        image = np.ascontiguousarray(image)
        if components == 1:
            return imagecodecs.jpeg8_encode(image.reshape(image.shape[:2]), level=self.quality)
        if self.encoded_color_space == "rgb":
            # libjpeg writes the Adobe marker (transform 0) for an RGB colour space.
            return imagecodecs.jpeg8_encode(
                image, level=self.quality, colorspace="RGB", outcolorspace="RGB"
            )
        return imagecodecs.jpeg8_encode(image, level=self.quality, subsampling=self.subsampling[0])

    def _decode_sync(self, chunk_bytes: Buffer, chunk_spec: ArraySpec) -> NDBuffer:
        self._components(chunk_spec.shape)
        decoded = imagecodecs.jpeg8_decode(chunk_bytes.as_numpy_array())
        if decoded.size != int(np.prod(chunk_spec.shape)):
            raise ValueError(
                f"jpeg chunk decodes to {decoded.shape}, expected chunk shape {chunk_spec.shape}"
            )
        return chunk_spec.prototype.nd_buffer.from_numpy_array(decoded.reshape(chunk_spec.shape))

    def _encode_sync(self, chunk_array: NDBuffer, chunk_spec: ArraySpec) -> Buffer | None:
        data = self.encode_array(chunk_array.as_numpy_array())
        return chunk_spec.prototype.buffer.from_bytes(data)

    async def _decode_single(self, chunk_bytes: Buffer, chunk_spec: ArraySpec) -> NDBuffer:
        return await asyncio.to_thread(self._decode_sync, chunk_bytes, chunk_spec)

    async def _encode_single(self, chunk_array: NDBuffer, chunk_spec: ArraySpec) -> Buffer | None:
        return await asyncio.to_thread(self._encode_sync, chunk_array, chunk_spec)

    def compute_encoded_size(self, input_byte_length: int, chunk_spec: ArraySpec) -> int:
        raise NotImplementedError


def jpeg_codecs(
    quality: int = 90,
    color_space: str = "ycbcr",
    subsampling: Any = "4:2:0",
    checksums: bool = True,
) -> dict[str, Any]:
    """``create_array`` codec arguments for (c, y, x) uint8 RGB: transpose to (y, x, c), JPEG,
    then each chunk's CRC-32C (`tilestore.format.integrity`)."""
    if color_space == "rgb":
        subsampling = "4:4:4"
    return {
        "filters": [TransposeCodec(order=(1, 2, 0))],
        "serializer": JpegCodec(
            quality=quality, encoded_color_space=color_space, subsampling=subsampling
        ),
        "compressors": [Crc32cCodec()] if checksums else None,
    }


def zstd_codecs(level: int = 5, checksums: bool = True) -> dict[str, Any]:
    """``create_array`` codec arguments for lossless data any zarr v3 reader can decode: zstd,
    then each chunk's CRC-32C."""
    return {"compressors": [ZstdCodec(level=level), *([Crc32cCodec()] if checksums else [])]}


def has_checksums(array) -> bool:
    """True where each chunk of a zarr array ends in its CRC-32C (its last codec is crc32c)."""
    return bool(array.compressors) and isinstance(array.compressors[-1], Crc32cCodec)
