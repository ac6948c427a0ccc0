"""The JPEG codecs of our stores, and the codec chains tilestore writes.

Stores declare their JPEG chunks with imagecodecs' zarr v3 codec, ``imagecodecs_jpeg``
(`imagecodecs.zarr.Jpeg`, imagecodecs >= 2026.4 on Python >= 3.12; the ``imagecodecs-zarr``
package registers it), so zarr-python with imagecodecs reads them with no code of ours: its
``colorspace_jpeg`` says how the chunks are coded ("RGB" for Aperio's RGB-coded tiles, "YCbCr"
otherwise) and ``colorspace_data`` that they decode to RGB, as tifffile decodes the slide.
Where that imagecodecs cannot install (Python 3.11), `ImagecodecsJpeg` is our implementation
of the same codec; where it can, the name is imagecodecs' own class, and our ``zarr.codecs``
entry point registers that one class (zarr keys its registry by class, so no second
implementation competes). Stores made before declare ``jpeg`` (the zarr-extensions codec),
`JpegCodec`, still read here. Decoding lets the stream's own markers pick the colour transform
where no colour space is declared: each copied chunk is a complete stream with its tables,
and an RGB-coded one carries the Adobe marker that says so (`tilestore.format.jpeg`).
"""

from __future__ import annotations

import asyncio
import base64
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


class _OnThreads(ArrayBytesCodec):
    """A JPEG codec's zarr plumbing: each chunk decoded or encoded (`_decode_sync`,
    `_encode_sync`) on a worker thread, libjpeg releasing the GIL; no fixed encoded size."""

    async def _decode_single(self, chunk_bytes: Buffer, chunk_spec: ArraySpec) -> NDBuffer:
        return await asyncio.to_thread(self._decode_sync, chunk_bytes, chunk_spec)

    async def _encode_single(self, chunk_array: NDBuffer, chunk_spec: ArraySpec) -> Buffer | None:
        return await asyncio.to_thread(self._encode_sync, chunk_array, chunk_spec)

    def compute_encoded_size(self, input_byte_length: int, chunk_spec: ArraySpec) -> int:
        raise NotImplementedError


@dataclass(frozen=True)
class JpegCodec(_OnThreads):
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


# imagecodecs' names of the chroma sampling of a JPEG's first component (the others 1 x 1)
SAMPLING_NAMES = {(1, 1): "444", (2, 1): "422", (1, 2): "440", (2, 2): "420", (4, 1): "411"}
COLOR_SPACE_NAMES = {"rgb": "RGB", "ycbcr": "YCbCr"}


@dataclass(frozen=True)
class _ImagecodecsJpeg(_OnThreads):
    """The ``imagecodecs_jpeg`` zarr v3 codec where imagecodecs does not ship it: the same
    configuration (level, colour spaces, subsampling, JPEGTables, a shared header), the same
    calls to imagecodecs' libjpeg. Only what tilestore writes and reads is needed of it, but
    every field of the configuration is kept, so a store's metadata round-trips unchanged."""

    is_fixed_size = False

    level: int | None = None
    bitspersample: int | None = None
    tables: bytes | None = None
    header: bytes | None = None
    colorspace_data: str | None = None
    colorspace_jpeg: str | None = None
    subsampling: str | tuple[int, int] | None = None
    optimize: bool | None = None
    smoothing: bool | None = None
    lossless: bool | None = None
    predictor: int | None = None
    fancyupsampling: bool | None = None

    def __init__(self, **config: Any) -> None:
        known = {f for f in self.__dataclass_fields__}
        if unknown := set(config) - known:
            raise ValueError(f"imagecodecs_jpeg codec: unknown settings {sorted(unknown)}")
        for name in known:
            value = config.get(name)
            if name in ("tables", "header") and isinstance(value, str):
                value = base64.b64decode(value.encode())
            if isinstance(value, list):
                value = tuple(value)
            object.__setattr__(self, name, value)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        _, config = parse_named_configuration(data, IMAGECODECS_JPEG, require_configuration=False)
        return cls(**(config or {}))

    def to_dict(self) -> dict[str, Any]:
        config: dict[str, Any] = {}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bytes):
                value = base64.b64encode(value).decode()
            config[name] = list(value) if isinstance(value, tuple) else value
        return {"name": IMAGECODECS_JPEG, **({"configuration": config} if config else {})}

    def _decode_sync(self, chunk_bytes: Buffer, chunk_spec: ArraySpec) -> NDBuffer:
        data: Any = chunk_bytes.as_numpy_array()
        if self.header is not None:
            data = b"".join((self.header, bytes(data), b"\xff\xd9"))
        extra = {} if self.fancyupsampling is None else {"fancyupsampling": self.fancyupsampling}
        decoded = imagecodecs.jpeg8_decode(
            data,
            tables=self.tables,
            colorspace=self.colorspace_jpeg,
            outcolorspace=self.colorspace_data,
            **extra,
        )
        return chunk_spec.prototype.nd_buffer.from_numpy_array(decoded.reshape(chunk_spec.shape))

    def _encode_sync(self, chunk_array: NDBuffer, chunk_spec: ArraySpec) -> Buffer | None:
        data = encode_chunk(self, chunk_array.as_numpy_array())
        return chunk_spec.prototype.buffer.from_bytes(data)


IMAGECODECS_JPEG = "imagecodecs_jpeg"
try:  # imagecodecs >= 2026.4 (Python >= 3.12): its own class, the one any reader registers
    from imagecodecs.zarr import Jpeg as ImagecodecsJpeg
except ImportError:
    ImagecodecsJpeg = _ImagecodecsJpeg
JPEG_CODECS = (JpegCodec, _ImagecodecsJpeg, ImagecodecsJpeg)


def is_jpeg(codec: Any) -> bool:
    """Whether a serializer is one of the JPEG codecs stores declare."""
    return isinstance(codec, JPEG_CODECS)


def whole_streams(codec: Any) -> bool:
    """Whether a JPEG codec's chunks are complete streams a decoder reads with no more than
    their declared colour space (no JPEGTables or header kept in the codec's settings)."""
    return isinstance(codec, JpegCodec) or (codec.tables is None and codec.header is None)


def coded_color_space(codec: Any) -> str | None:
    """How a JPEG level's chunks are coded: "rgb", "ycbcr", or None where the streams'
    markers say (grayscale, or no colour space declared)."""
    if isinstance(codec, JpegCodec):
        return codec.encoded_color_space
    named = {v: k for k, v in COLOR_SPACE_NAMES.items()}
    return named.get(codec.colorspace_jpeg) if codec.colorspace_jpeg else None


def chroma_sampling(codec: Any) -> tuple[int, int]:
    """The first component's sampling factors of a JPEG level's chunks ((1, 1): none)."""
    if isinstance(codec, JpegCodec):
        return codec.subsampling[0] if codec.subsampling else (1, 1)
    names = {v: k for k, v in SAMPLING_NAMES.items()}
    value = codec.subsampling
    return names.get(value, (1, 1)) if isinstance(value, str) else tuple(value or (1, 1))


def encode_chunk(codec: Any, image: np.ndarray) -> bytes:
    """One (H, W, C) uint8 chunk coded as `codec` declares (a store's chunk written by us:
    a background tile, a source tile that could not be copied)."""
    if isinstance(codec, JpegCodec):
        return codec.encode_array(image)
    image = np.ascontiguousarray(image)
    if image.ndim == 3 and image.shape[2] == 1:
        image = image[..., 0]
    return imagecodecs.jpeg8_encode(
        image,
        level=codec.level,
        colorspace=codec.colorspace_data,
        outcolorspace=codec.colorspace_jpeg,
        subsampling=codec.subsampling,
        optimize=codec.optimize,
        smoothing=codec.smoothing,
        lossless=codec.lossless,
        predictor=codec.predictor,
    )


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
    factors = _parse_subsampling(subsampling)
    JpegCodec(quality=quality, encoded_color_space=color_space, subsampling=factors)  # checks
    return {
        "filters": [TransposeCodec(order=(1, 2, 0))],
        # our implementation encodes whatever imagecodecs is installed: imagecodecs' own class
        # (2026.10) hands zarr's transposed view of each chunk to its encoder, which refuses a
        # non-contiguous array ("invalid data shape, strides, or dtype": every re-encoded
        # level failed on Python >= 3.12). The metadata is the same: readers open the store
        # with whichever class zarr has registered under the name.
        "serializer": _ImagecodecsJpeg(
            level=quality,
            colorspace_data="RGB",
            colorspace_jpeg=COLOR_SPACE_NAMES[color_space],
            subsampling=SAMPLING_NAMES[tuple(factors[0])],
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
