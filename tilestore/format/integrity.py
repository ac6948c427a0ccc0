"""Chunk integrity: every chunk ends in its CRC-32C, and a chunk file is read only if it is one.

Stores record a checksum with each chunk at write time: zarr's own ``crc32c`` codec closes
every array's codec chain, so zarr verifies it on its reads and plain zarr readers still open
the store. Our fast readers (`tilestore.format.chunks`, the decoder worker processes) read chunk
files themselves and check them here, with the same layout: the chunk's bytes, then their CRC-32C as
4 little-endian bytes. Conversion writes every chunk of every level (background ones too), so
a chunk file that is missing is damage, not a fill value.

A chunk file is opened without following a symbolic link (a link to another chunk would read
valid pixels in the wrong place) and without blocking (a FIFO would hang the read forever), and
must be a regular file. Standard library and google_crc32c only: each decoder worker imports it.
"""

from __future__ import annotations

import errno
import os
import stat
import struct

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


def read_file(path: str | os.PathLike, where: str, *, required: bool) -> bytes | None:
    """A chunk file's bytes; None where it does not exist and is not `required`.

    Raises ChunkError where a required chunk is missing, or the path is a link, a folder, a
    FIFO or anything but a regular file.
    """
    try:
        fd = os.open(path, _FLAGS)
    except FileNotFoundError:
        if required:
            raise ChunkError(f"{where}: chunk is missing (deleted or never written)") from None
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ChunkError(f"{where}: chunk is a symbolic link, not a file") from None
        raise ChunkError(f"{where}: cannot read chunk: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = "a folder" if stat.S_ISDIR(info.st_mode) else "not a regular file"
            raise ChunkError(f"{where}: chunk is {kind}")
        with os.fdopen(fd, "rb", closefd=False) as fh:
            return fh.read()
    finally:
        os.close(fd)
