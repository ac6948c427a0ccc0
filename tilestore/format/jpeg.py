"""JPEG bitstream surgery for copying source tiles into a store without re-encoding.

TIFF stores each JPEG tile as an abbreviated stream: the quantisation and Huffman
tables live once in the JPEGTables tag. A store chunk must be a complete
interchange stream, so we splice the tables back in. Aperio writes RGB samples
without a colour transform and without the Adobe marker that says so; a standard
decoder would then apply YCbCr->RGB and shift every colour. We add an APP14 Adobe
marker (transform 0) so any decoder reads the samples as they were written.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

SOI = b"\xff\xd8"
EOI = b"\xff\xd9"
# APP14 "Adobe", version 100, flags0 0, flags1 0, transform 0 (no colour transform).
ADOBE_RGB = b"\xff\xee\x00\x0eAdobe\x00\x64\x00\x00\x00\x00\x00"

_SOF_MARKERS = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}
_STANDALONE = {0x01, *range(0xD0, 0xD8)}


@dataclass(frozen=True)
class JpegHeader:
    """What the markers before the scan say about a JPEG stream."""

    height: int
    width: int
    baseline: bool
    components: tuple[tuple[int, int, int], ...]  # (id, horizontal, vertical sampling factor)
    jfif: bool
    adobe_transform: int | None

    @property
    def color_space(self) -> str:
        """The colour space a standard (libjpeg) decoder infers from the stream."""
        if len(self.components) == 1:
            return "grayscale"
        if self.jfif:
            return "ycbcr"
        if self.adobe_transform is not None:
            return "rgb" if self.adobe_transform == 0 else "ycbcr"
        if tuple(c[0] for c in self.components) == (ord("R"), ord("G"), ord("B")):
            return "rgb"
        return "ycbcr"

    @property
    def sampling(self) -> tuple[tuple[int, int], ...]:
        """Per-component (horizontal, vertical) sampling factors, as the jpeg codec spells them."""
        return tuple((h, v) for _, h, v in self.components)


def iter_markers(data: bytes, start: int = 0):
    """Yield (marker, payload) for each segment up to and including the first SOS, from the
    stream's start (its SOI) or from `start`, a segment's first byte after it."""
    if data[:2] != SOI:
        raise ValueError("not a JPEG stream (no SOI marker)")
    yield from segments(data, max(2, start))


BASELINE_FRAMES = (0xC0, 0xC1)  # baseline and extended Huffman: what GPU decoders take
# other frames, by name, as a GPU's JPEG decoder would refuse them
OTHER_FRAMES = {0xC2: "progressive", 0xC3: "lossless", 0xC9: "arithmetic-coded"}


def frame_header(data: bytes) -> tuple[int, int, int, int, int] | None:
    """(frame marker, sample bits, height, width, components) of the stream's frame, found
    by walking its markers (a table may hold the bytes of a frame marker, so a plain search
    could find a false one); None where it has none."""
    for marker, payload in iter_markers(data):
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            return (marker, *struct.unpack_from(">BHHB", payload))
    return None


def gpu_refusal(data: bytes) -> str | None:
    """Why a GPU's batched JPEG decoder (nvJPEG on the JPEG engines of an A100 or H100, or on
    CUDA) cannot take this stream, or None where it can: an 8-bit baseline or extended
    Huffman frame of 3 components, whatever its chroma sampling."""
    frame = frame_header(data)
    if frame is None:
        return "no JPEG frame header"
    marker, bits, _, _, components = frame
    if marker not in BASELINE_FRAMES:
        kind = OTHER_FRAMES.get(marker, f"frame type 0x{marker:02X}")
        return f"{kind} JPEG (the GPU decodes baseline)"
    if bits != 8:
        return f"{bits}-bit JPEG samples (the GPU decodes 8-bit)"
    if components != 3:
        return f"JPEG of {components} components (the GPU decodes colour, 3)"
    return None


def segments(data: bytes | memoryview, pos: int = 0):
    """Yield (marker, payload) for each segment from byte `pos` (a segment's first byte) up
    to and including the first SOS."""
    for marker, begin, end in _spans(data, pos):
        yield marker, data[begin:end]


def _spans(data: bytes | memoryview, pos: int = 0):
    """`segments` as (marker, payload start, payload end) byte positions."""
    n = len(data)
    while pos + 4 <= n:
        if data[pos] != 0xFF:
            raise ValueError(f"corrupt JPEG marker structure at byte {pos}")
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker in _STANDALONE:
            pos += 2
            continue
        if marker == 0xD9:
            return
        (length,) = struct.unpack_from(">H", data, pos + 2)
        if length < 2 or pos + 2 + length > n:
            raise ValueError(f"corrupt JPEG segment at byte {pos}: length {length}")
        yield marker, pos + 4, pos + 2 + length
        if marker == 0xDA:
            return
        pos += 2 + length


def read_header(
    *streams: bytes | memoryview,
    start: int = 0,
    jfif: bool = False,
    adobe: int | None = None,
    own: bool = False,
) -> JpegHeader:
    """Parse the frame header and colour markers from a stream (and optional tables stream).
    start, jfif, adobe: parse each stream from `start` on, what came before it (tables a
    level's tiles share, spliced in front of each) having said these (`marker_facts`).
    own: the streams are a tile's own segments, after its SOI (`JpegTiles.read_own`)."""
    frame = None
    baseline = True
    for data in streams:
        found = segments(data, start) if own else iter_markers(data, start)
        for marker, payload in found:
            if marker in _SOF_MARKERS:
                baseline = marker in (0xC0, 0xC1)
                if len(payload) < 6 or len(payload) < 6 + 3 * payload[5]:
                    raise ValueError("corrupt JPEG frame header (too short)")
                _, height, width, count = struct.unpack_from(">BHHB", payload)
                comps = tuple(
                    (payload[6 + 3 * i], payload[7 + 3 * i] >> 4, payload[7 + 3 * i] & 15)
                    for i in range(count)
                )
                frame = (height, width, comps)
            elif marker == 0xE0 and payload[:5] == b"JFIF\x00":
                jfif = True
            elif marker == 0xEE and payload[:5] == b"Adobe" and len(payload) >= 12:
                adobe = payload[11]
    if frame is None:
        raise ValueError("JPEG stream has no frame header (SOF)")
    return JpegHeader(frame[0], frame[1], baseline, frame[2], jfif, adobe)


def marker_facts(data: bytes) -> tuple[bool, int | None]:
    """What a stream's segments (up to its first SOS, or all of a tables-only stream) say of
    its colours: a JFIF marker, and the Adobe marker's transform (None: none)."""
    jfif, adobe = False, None
    for marker, payload in iter_markers(data):
        if marker == 0xE0 and payload[:5] == b"JFIF\x00":
            jfif = True
        elif marker == 0xEE and payload[:5] == b"Adobe" and len(payload) >= 12:
            adobe = payload[11]
    return jfif, adobe


def as_declared(colorspace: str | None) -> dict[str, str]:
    """`imagecodecs.jpeg8_decode` arguments that decode a chunk coded in `colorspace` ("RGB",
    "YCbCr": as its level declares it) to RGB, as zarr's codec does; {} (the stream's markers
    decide) where nothing is declared."""
    return {"colorspace": colorspace, "outcolorspace": "RGB"} if colorspace else {}


def copy_marking(header: JpegHeader, color_space: str) -> bool | None:
    """Whether a container's JPEG stream can become a chunk as it is, given what its container
    says the samples are (`color_space`: "ycbcr", "rgb" or "grayscale"): None where it cannot
    (not baseline, chroma subsampled vertically or RGB subsampled, a colour transform that
    contradicts the container); else whether it needs the Adobe RGB marker, so that a
    standard decoder does not take RGB-coded samples (Aperio, DICOM RGB) for YCbCr."""
    if not header.baseline:
        return None
    mark_rgb = color_space == "rgb" and header.color_space != "rgb"
    if mark_rgb and header.adobe_transform is not None:
        return None
    sampling = header.sampling
    if color_space == "rgb" and set(sampling) != {(1, 1)}:
        return None
    if color_space == "ycbcr" and (
        header.color_space != "ycbcr" or sampling[1] != (1, 1) or sampling[2] != (1, 1)
    ):
        return None
    return mark_rgb


def complete_stream(tile: bytes, tables: bytes | None, *, mark_rgb: bool) -> bytes:
    """Return a self-contained JPEG: tables spliced in, Adobe RGB marker added if asked."""
    if tile[:2] != SOI:
        raise ValueError("JPEG tile does not start with an SOI marker")
    parts = [SOI]
    if mark_rgb:
        parts.append(ADOBE_RGB)
    if tables:
        body = tables[2:]
        if body.endswith(EOI):
            body = body[:-2]
        parts.append(body)
    parts.append(tile[2:])
    return b"".join(parts)


SEEN_HEADERS = 8  # distinct tile headers a TileFrame remembers its answer for


@dataclass(frozen=True)
class TileFrame:
    """What each tile of a level must be to become its chunk as it is: the level's shared
    prefix (SOI, its tables, the Adobe marker: `JpegTiles.prefix`) spliced in front of the
    tile's own segments, and a frame of the level's tile size, sampling and colour
    (`fits`). A tile that is not is re-encoded from its pixels (`TileSource`), never decoded
    as another frame. Made where a level's tiles are read, and sent as it is (`as_json`) to
    the decoder processes that read the tiles from the slide file by byte range."""

    prefix: bytes
    shape: tuple[int, int]
    sampling: tuple[tuple[int, int], ...]
    color_space: str
    jfif: bool = False  # what the prefix says (`marker_facts`)
    adobe: int | None = None
    # the answers for headers met already, by `own`: (the bytes a parse read, whether they
    # are of this frame). A level's tiles mostly share one header (Aperio: SOF and SOS, the
    # same for each tile), so a tile is checked by comparing its first bytes, not parsed:
    # parsing each in Python held the GIL for 3.4 of a 100,000 px slide's 5.6 s of copy.
    _seen: dict[bool, tuple[tuple[bytes, bool], ...]] = field(
        default_factory=dict, init=False, compare=False, repr=False
    )  # not an argument: a frame made from another (dataclasses.replace) starts its own

    def spliced(self, tile: bytes | None) -> bytes | None:
        """The tile (its whole stream as the file stores it) as its chunk: the prefix, then
        its own segments; None where it is absent, not a JPEG stream, or not of this frame."""
        if tile is None or tile[:2] != SOI:
            return None
        stream = self.prefix + tile[2:]
        try:
            return stream if self.fits(stream) else None
        except ValueError:  # damaged markers: re-encoded, or named, by its reader
            return None

    def fits(self, stream: bytes | memoryview, own: bool = False) -> bool:
        """Whether a spliced stream (or, own, a tile's own segments) is of this frame.

        The answer depends only on the bytes its parse reads: the stream's SOI (spliced) and
        its segments from `start` through the first SOS. A stream whose bytes there equal a
        header met before gets that header's answer; a stream that fails to parse
        (ValueError), or whose parse ends before a scan, is never remembered."""
        start = 0 if own else len(self.prefix)
        if own or stream[:2] == SOI:  # else iter_markers refuses it, below
            for header, answer in self._seen.get(own, ()):
                if stream[start : start + len(header)] == header:
                    return answer
        head = read_header(stream, start=start, jfif=self.jfif, adobe=self.adobe, own=own)
        answer = (
            head.baseline
            and (head.height, head.width) == tuple(self.shape)
            and tuple(map(tuple, head.sampling)) == tuple(map(tuple, self.sampling))
            and head.color_space == self.color_space
        )
        seen = self._seen.get(own, ())
        if len(seen) < SEEN_HEADERS:
            *_, (marker, _, end) = _spans(stream, start if own else max(2, start))
            if marker == 0xDA:  # a parse that ended at its scan
                self._seen[own] = (*seen, (bytes(stream[start:end]), answer))
        return answer

    def as_json(self) -> dict:
        return {
            "prefix": self.prefix.hex(),
            "shape": list(self.shape),
            "sampling": [list(s) for s in self.sampling],
            "color_space": self.color_space,
            "jfif": self.jfif,
            "adobe": self.adobe,
        }

    @classmethod
    def from_json(cls, data: dict) -> TileFrame:
        return cls(
            bytes.fromhex(data["prefix"]),
            tuple(data["shape"]),
            tuple(tuple(s) for s in data["sampling"]),
            data["color_space"],
            data["jfif"],
            data["adobe"],
        )
