"""Whether a source level's pixels are stored losslessly, and where that was read.

Each reader states it as a `Fact` on its levels (`SourceLevel.lossless`): True, False, or None
where the file does not say, each with its origin. The TIFF Compression tag, the DICOM transfer
syntax, a JPEG 2000 codestream's COD marker, a WebP's first chunk, an image file's format and
OpenSlide's properties are read here, in one place. Conversion keeps a lossless source lossless
unless JPEG is asked for (`tilestore.conversion.converter.choose_codec`).

Where a fact could be wrong it errs towards lossless: a JPEG 2000 stream coded with the
reversible 5-3 wavelet but cut to a rate is lossy, and its COD marker says 5-3 all the same.
Taken for lossless, its pixels are stored as they decode (zstd), and nothing is lost twice.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable

import tifffile

from tilestore.sources.base import Fact

# TIFF Compression codes (tifffile.COMPRESSION) whose decoded pixels are the encoded ones
_TIFF_LOSSLESS = {
    1: "uncompressed",
    2: "CCITT RLE",
    3: "CCITT Group 3",
    4: "CCITT Group 4",
    5: "LZW",
    8: "deflate",
    9: "JBIG",
    10: "JBIG",
    99: "lossless JPEG (Leaf)",
    32773: "PackBits",
    32946: "deflate",
    34661: "JBIG",
    34715: "JBIG2",
    34925: "LZMA",
    34926: "zstd",
    34933: "PNG",
    50000: "zstd",
}
# ...and those that quantise
_TIFF_LOSSY = {
    6: "old-style JPEG",
    7: "JPEG",
    22610: "NDPI JPEG XR",
    33004: "lossy JPEG 2000",
    33007: "JPEG",
    34892: "lossy JPEG (DNG)",
}
# JPEG 2000 in TIFF: Aperio's two codes and the standard one; lossless or not is in the stream
TIFF_J2K = frozenset({33003, 33005, 34712})
_TIFF_WEBP = frozenset({34927, 50001})

# DICOM transfer syntaxes of WSI frames
_DICOM_LOSSLESS = {
    "1.2.840.10008.1.2": "uncompressed (implicit VR)",
    "1.2.840.10008.1.2.1": "uncompressed (explicit VR)",
    "1.2.840.10008.1.2.1.99": "deflated",
    "1.2.840.10008.1.2.2": "uncompressed (big endian)",
    "1.2.840.10008.1.2.8.1": "deflated frames",
    "1.2.840.10008.1.2.4.57": "JPEG lossless",
    "1.2.840.10008.1.2.4.70": "JPEG lossless (first-order prediction)",
    "1.2.840.10008.1.2.4.80": "JPEG-LS lossless",
    "1.2.840.10008.1.2.4.90": "JPEG 2000 lossless",
    "1.2.840.10008.1.2.4.110": "JPEG XL lossless",
    "1.2.840.10008.1.2.4.201": "HTJ2K lossless",
    "1.2.840.10008.1.2.4.202": "HTJ2K lossless (RPCL)",
    "1.2.840.10008.1.2.5": "RLE",
}
_DICOM_LOSSY = {
    "1.2.840.10008.1.2.4.50": "JPEG baseline",
    "1.2.840.10008.1.2.4.51": "JPEG extended",
    "1.2.840.10008.1.2.4.81": "JPEG-LS near-lossless",
    "1.2.840.10008.1.2.4.111": "JPEG XL (recompressed JPEG)",
    "1.2.840.10008.1.2.4.112": "JPEG XL",
}
# JPEG 2000 and HTJ2K "lossless or lossy": the stream says which
_DICOM_J2K = frozenset({"1.2.840.10008.1.2.4.91", "1.2.840.10008.1.2.4.203"})

HEAD_BYTES = 65_536  # of a tile or frame, read to find its codestream's main header


def tiff_page_lossless(path: str | os.PathLike, page: tifffile.TiffPage) -> Fact:
    """What a TIFF page's Compression tag says; for JPEG 2000 and WebP, what the stream of
    its first stored tile or strip says."""
    code = int(page.compression)

    def first_block() -> bytes | None:
        blocks = zip(page.dataoffsets, page.databytecounts, strict=True)
        offset, count = next(((o, n) for o, n in blocks if n), (0, 0))
        if not count:
            return None
        with open(path, "rb") as fh:
            fh.seek(offset)
            return fh.read(min(count, HEAD_BYTES))

    return tiff_lossless(code, getattr(page.compression, "name", str(code)), first_block)


def tiff_lossless(code: int, name: str, first_block: Callable[[], bytes | None]) -> Fact:
    """What a TIFF Compression tag (`code`, tifffile's `name` for it) says; for JPEG 2000 and
    WebP, what the stream of the level's first stored tile or strip says (`first_block`)."""
    if code in _TIFF_LOSSLESS:
        return Fact(True, f"TIFF Compression {code} ({_TIFF_LOSSLESS[code]})")
    if code in _TIFF_LOSSY:
        return Fact(False, f"TIFF Compression {code} ({_TIFF_LOSSY[code]})")
    origin = f"TIFF Compression {code} ({name})"
    if code in TIFF_J2K:
        return j2k_fact(first_block(), origin)
    if code in _TIFF_WEBP:
        return _webp_fact(first_block(), origin)
    return Fact(None, f"{origin}: may be lossless or lossy, and the tag does not say")


def dicom_lossless(transfer_syntax: str, first_frame: Callable[[], bytes | None]) -> Fact:
    """What a DICOM level's transfer syntax says; for JPEG 2000 and HTJ2K that may be either,
    what the COD marker of its first frame says (`first_frame`)."""
    origin = f"DICOM transfer syntax {transfer_syntax}"
    if transfer_syntax in _DICOM_LOSSLESS:
        return Fact(True, f"{origin} ({_DICOM_LOSSLESS[transfer_syntax]})")
    if transfer_syntax in _DICOM_LOSSY:
        return Fact(False, f"{origin} ({_DICOM_LOSSY[transfer_syntax]})")
    if transfer_syntax in _DICOM_J2K:
        return j2k_fact(first_frame(), f"{origin} (JPEG 2000, lossless or lossy)")
    return Fact(None, f"{origin}: not one this reader knows")


def j2k_fact(data: bytes | None, origin: str) -> Fact:
    """The fact a JPEG 2000 stream's COD (and COC) markers give: the reversible 5-3 wavelet
    for every component is lossless, the irreversible 9-7 one lossy."""
    reversible = j2k_reversible(data) if data else None
    if reversible is None:
        return Fact(None, f"{origin}: no COD marker found in the first tile's stream")
    if reversible:
        return Fact(True, f"{origin}: reversible 5-3 wavelet (COD marker of the first tile)")
    return Fact(False, f"{origin}: irreversible 9-7 wavelet (COD marker of the first tile)")


def j2k_reversible(data: bytes) -> bool | None:
    """True where a JPEG 2000 codestream (bare, or in a JP2 file) codes every component with
    the reversible 5-3 wavelet, False where any with the irreversible 9-7, None where its main
    header cannot be read (not JPEG 2000, or cut before its COD marker)."""
    stream = _codestream(data)
    if stream is None or stream[:2] != b"\xff\x4f":  # SOC
        return None
    pos, components, transforms = 2, 0, []
    while pos + 4 <= len(stream):
        marker, length = struct.unpack_from(">HH", stream, pos)
        if marker in (0xFF90, 0xFF93) or length < 2:  # SOT, SOD: the main header is over
            break
        payload = stream[pos + 4 : pos + 2 + length]
        if len(payload) < length - 2:
            return None  # cut inside a marker segment
        if marker == 0xFF51 and len(payload) >= 36:  # SIZ: Csiz after 34 bytes of sizes
            components = struct.unpack_from(">H", payload, 34)[0]
        elif marker == 0xFF52 and len(payload) >= 10:  # COD: Scod, SGcod (4), SPcod: NL, xcb,
            transforms.append(payload[9])  # ycb, style, then the wavelet (0: 9-7, 1: 5-3)
        elif marker == 0xFF53:  # COC: Ccoc (1 byte, 2 past 256 components), Scoc, SPcoc
            at = (2 if components > 256 else 1) + 5
            if len(payload) > at:
                transforms.append(payload[at])
        pos += 2 + length
    if not transforms:
        return None
    return all(t == 1 for t in transforms)


def _codestream(data: bytes) -> bytes | None:
    """The JPEG 2000 codestream of `data`: itself, or a JP2 file's jp2c box."""
    if data[:2] == b"\xff\x4f":
        return data
    pos = 0
    while pos + 8 <= len(data):
        size, kind = struct.unpack_from(">I4s", data, pos)
        header = 8
        if size == 1 and pos + 16 <= len(data):  # a 64-bit length follows
            size, header = struct.unpack_from(">Q", data, pos + 8)[0], 16
        if kind == b"jp2c":
            return data[pos + header : pos + size if size else len(data)]
        if size < header:
            return None
        pos += size
    return None


def _webp_fact(data: bytes | None, origin: str) -> Fact:
    """A WebP stream's first image chunk: VP8L is lossless, VP8 lossy."""
    kind = None
    if data and data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        pos = 12
        while pos + 8 <= len(data):
            fourcc, size = struct.unpack_from("<4sI", data, pos)
            if fourcc in (b"VP8L", b"VP8 "):
                kind = fourcc
                break
            pos += 8 + size + (size & 1)
    if kind is None:
        return Fact(None, f"{origin}: its first tile holds no WebP image chunk")
    lossless = kind == b"VP8L"
    return Fact(lossless, f"{origin}: {'lossless VP8L' if lossless else 'lossy VP8'} stream")


def openslide_lossless(properties: object, vendor: str) -> Fact:
    """What OpenSlide's properties say of how a slide's pixels are stored: a MIRAX's image
    format, a Hamamatsu VMS's (or VMU's) image files; unknown for the others (the TIFFs among
    them are asked through their Compression tag instead: `tiff_page_lossless`)."""
    fmt = properties.get("mirax.LAYER_0_LEVEL_0_SECTION.IMAGE_FORMAT")
    if fmt:
        where = f"OpenSlide property mirax.LAYER_0_LEVEL_0_SECTION.IMAGE_FORMAT = {fmt}"
        return Fact(fmt.upper() in ("PNG", "BMP"), where)
    image = properties.get("hamamatsu.ImageFile")
    if image:
        lossy = image.lower().endswith((".jpg", ".jpeg"))
        kind = "JPEG files" if lossy else "raw NGR files"
        return Fact(not lossy, f"OpenSlide property hamamatsu.ImageFile = {image} ({kind})")
    return Fact(None, f"OpenSlide's properties of this {vendor} slide name no compression")
