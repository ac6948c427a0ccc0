"""Chunk integrity: every chunk ends in its CRC-32C, and chunk bytes are read only from files.

Stores record a checksum with each chunk at write time: zarr's own ``crc32c`` codec closes
every array's codec chain, so zarr verifies it on its reads and plain zarr readers still open
the store. Our fast readers (`tilestore.format.chunks`, the decoder worker processes) read chunk
files, or a shard's byte ranges (`read_chunks`), themselves and check them here, with the same
layout: the chunk's bytes, then their CRC-32C as 4 little-endian bytes. Conversion writes every
chunk of every level (background ones too), so a chunk that is missing is damage, not a fill
value.

A chunk file is opened without following a symbolic link (a link to another chunk would read
valid pixels in the wrong place) and without blocking (a FIFO would hang the read forever), and
must be a regular file. Standard library and google_crc32c only: each decoder worker imports it.
"""

from __future__ import annotations

import errno
import os
import stat
import struct
from collections.abc import Sequence
from typing import NamedTuple

import google_crc32c

from tilestore.errors import ChunkError

TRAILER = 4  # bytes of CRC-32C after each chunk's data
_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)


def seal(data: bytes) -> bytes:
    """The chunk bytes as a store keeps them: `data` and its CRC-32C."""
    return data + struct.pack("<I", google_crc32c.value(data))


def unseal(data: bytes, where: str) -> bytes:
    """The chunk's data, its CRC-32C checked; ChunkError naming `where` if it fails."""
    if len(data) < TRAILER:
        raise ChunkError(f"{where}: chunk is {len(data)} bytes long (truncated or empty)")
    body = data[:-TRAILER]
    (stored,) = struct.unpack_from("<I", data, len(body))
    if google_crc32c.value(body) != stored:
        raise ChunkError(f"{where}: chunk is corrupt (its CRC-32C does not match its bytes)")
    return body


class Location(NamedTuple):
    """Where one chunk's bytes are: a file (one chunk per file: `length` None), or a byte
    range of a shard (`tilestore.format.shards`)."""

    path: str
    offset: int = 0
    length: int | None = None


def read_file(path: str | os.PathLike, where: str, *, required: bool) -> bytes | None:
    """A chunk file's bytes; None where it does not exist and is not `required`.

    Raises ChunkError where a required chunk is missing, or the path is a link, a folder, a
    FIFO or anything but a regular file.
    """
    return read_range(path, 0, None, where, required=required)


def read_range(
    path: str | os.PathLike,
    offset: int,
    length: int | None,
    where: str,
    *,
    required: bool,
    what: str = "chunk",
) -> bytes | None:
    """`length` bytes of a file from `offset` (None: to its end), checked as `read_file`
    checks; a file shorter than the range is a ChunkError (a truncated shard). `what` the
    file holds, for messages: "chunk" or "shard"."""
    try:
        fd = os.open(path, _FLAGS)
    except FileNotFoundError:
        if required:
            raise ChunkError(f"{where}: {what} is missing (deleted or never written)") from None
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ChunkError(f"{where}: {what} is a symbolic link, not a file") from None
        raise ChunkError(f"{where}: cannot read {what}: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = "a folder" if stat.S_ISDIR(info.st_mode) else "not a regular file"
            raise ChunkError(f"{where}: {what} is {kind}")
        if length is None:
            with os.fdopen(fd, "rb", closefd=False) as fh:
                fh.seek(offset)
                return fh.read()
        data = os.pread(fd, length, offset)
        if len(data) < length:
            raise ChunkError(f"{where}: {what} runs past the end of its file (truncated)")
        return data
    finally:
        os.close(fd)


def read_chunks(
    locations: Sequence[Location | None], names: Sequence[str], *, required: bool
) -> list[bytes | None]:
    """Each chunk's bytes (None where a location is None, or its file is absent and not
    `required`); chunks lying one after another in one shard are read in one call (a grid
    row of a shard is one range)."""
    out: list[bytes | None] = [None] * len(locations)
    i = 0
    while i < len(locations):
        here = locations[i]
        if here is None or here.length is None:
            if here is not None:
                out[i] = read_file(here.path, names[i], required=required)
            i += 1
            continue
        j, end = i + 1, here.offset + here.length
        while j < len(locations):
            nxt = locations[j]
            if nxt is None or nxt.length is None or nxt.path != here.path or nxt.offset != end:
                break
            end += nxt.length
            j += 1
        data = read_range(here.path, here.offset, end - here.offset, names[i], required=True)
        for k in range(i, j):
            start = locations[k].offset - here.offset
            out[k] = data[start : start + locations[k].length]
        i = j
    return out
