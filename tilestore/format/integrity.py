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

A chunk's CRC-32C proves its bytes whole, not that they are this position's: a `Location` may
carry the CRC-32C recorded for its position (`tilestore.format.positions`), and `read_chunks`
compares the chunk's last 4 bytes with it (`tied`): no hashing beyond the chunk's own check.
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
UNWRITTEN = 2**64 - 1  # recorded for a position where no chunk was written (as a shard index says)
_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)


class Located(NamedTuple):
    """Many chunks' locations packed to cross a pipe (a decode request, a store process's
    reply) cheaply: each file named once, each chunk a row of ints [file, offset, length,
    expect, whole], -1 for None (a file of -1: the chunk has no location)."""

    paths: list[str]
    at: list[list[int]]

    @classmethod
    def of(cls, locations: Sequence[Location | Sequence | None]) -> Located:
        """Packed from `Location`s (or their fields as a list), None where absent."""
        files: dict[str, int] = {}
        at = []
        for location in locations:
            if location is None:
                at.append([-1, 0, -1, -1, 0])
                continue
            here = location if type(location) is Location else Location(*location)
            length, expect = here.length, here.expect
            at.append([
                files.setdefault(here.path, len(files)), here.offset,
                -1 if length is None else length, -1 if expect is None else expect,
                int(here.whole),
            ])  # fmt: skip
        return cls(list(files), at)

    def part(self, start: int, stop: int) -> Located:
        """Chunks [start, stop), naming only their files (a level of one file a chunk has
        as many files as chunks)."""
        at = self.at[start:stop]
        used = sorted({row[0] for row in at if row[0] >= 0})
        if len(used) == len(self.paths):
            return Located(self.paths, at)
        renamed = {old: new for new, old in enumerate(used)}
        return Located(
            [self.paths[old] for old in used], [[renamed.get(r[0], -1), *r[1:]] for r in at]
        )

    def unpacked(self) -> list[Location | None]:
        paths = self.paths
        return [
            None if file < 0 else Location(
                paths[file], offset, None if length < 0 else length,
                None if expect < 0 else expect, bool(whole),
            )
            for file, offset, length, expect, whole in self.at
        ]  # fmt: skip


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


def tied(data: bytes, expect: int, where: str) -> None:
    """Nothing where `data` ends in `expect`, the CRC-32C recorded for its position; else a
    ChunkError naming `where`: the chunk is damaged (its own CRC-32C fails), stored where none
    was written, or another position's (moved, swapped, an index rewritten)."""
    if len(data) >= TRAILER and int.from_bytes(data[-TRAILER:], "little") == expect:
        return
    unseal(data, where)  # damage is named as such: only a whole chunk is someone else's
    if expect == UNWRITTEN:
        raise ChunkError(f"{where}: a chunk is stored where none was written (moved here?)")
    raise ChunkError(
        f"{where}: chunk is not the one written here (its CRC-32C is not the one recorded for "
        "this position: moved, swapped or its shard index rewritten)"
    )


class Location(NamedTuple):
    """Where one chunk's bytes are: a file (one chunk per file: `length` None), or a byte
    range of a shard (`tilestore.format.shards`); `expect`: the CRC-32C recorded for its
    position, checked as it is read (None: the store records none); `whole`: `expect` is
    the CRC-32C of all its bytes (a slide's tile read in place, which ends in none:
    `tilestore.reading.source_chunks.TileSums`), not the one it ends with."""

    path: str
    offset: int = 0
    length: int | None = None
    expect: int | None = None
    whole: bool = False


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
        fd = _open(path, where, what)
    except FileNotFoundError:
        if required:
            raise ChunkError(f"{where}: {what} is missing (deleted or never written)") from None
        return None
    try:
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


def _open(path: str | os.PathLike, where: str, what: str) -> int:
    """A descriptor of the regular file at `path`, not followed if a link and opened without
    blocking; ChunkError naming `where` if it is anything else (FileNotFoundError if absent)."""
    try:
        fd = os.open(path, _FLAGS)
    except FileNotFoundError:
        raise  # absent: the caller says whether that is damage
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ChunkError(f"{where}: {what} is a symbolic link, not a file") from None
        raise ChunkError(f"{where}: cannot read {what}: {exc.strerror}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = "a folder" if stat.S_ISDIR(mode) else "not a regular file"
        raise ChunkError(f"{where}: {what} is {kind}")
    return fd


def read_chunks(
    locations: Sequence[Location | None], names: Sequence[str], *, required: bool
) -> list[bytes | None]:
    """Each chunk's bytes (None where a location is None, or its file is absent and not
    `required`), each tied to its position where its location carries the CRC-32C recorded
    for it (`whole`: checked against all its bytes); chunks lying one after another in one
    shard are read in one call (a grid row of a shard is one range)."""
    out = _read(locations, names, required)
    for at, data, name in zip(locations, out, names, strict=True):
        if data is None or at.expect is None:
            continue
        if not at.whole:
            tied(data, at.expect, name)
        elif google_crc32c.value(data) != at.expect:
            raise ChunkError(f"{name}: its bytes are not the ones recorded (changed since)")
    return out


def _read(
    locations: Sequence[Location | None], names: Sequence[str], required: bool
) -> list[bytes | None]:
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


def read_ends(
    locations: Sequence[Location | None], names: Sequence[str], *, required: bool
) -> list[bytes | None]:
    """The last 4 bytes of each chunk (its CRC-32C; None where a location is None, or its
    file is absent and not `required`), one 4-byte read each, a shard opened once for all
    its chunks, each file checked as `read_file` checks it: what ties a chunk that zarr then
    reads whole to decode, and what `tilestore.format.positions` records of what zarr wrote."""
    out: list[bytes | None] = [None] * len(locations)
    shards: dict[str, int] = {}
    try:
        for i, at in enumerate(locations):
            if at is None:
                continue
            if at.length is not None:  # a byte range of a shard
                if at.path not in shards:
                    shards[at.path] = _open_required(at.path, names[i], "shard")
                start = at.offset + max(0, at.length - TRAILER)
                out[i] = os.pread(shards[at.path], min(TRAILER, at.length), start)
                continue
            try:
                fd = _open(at.path, names[i], "chunk")
            except FileNotFoundError:
                if required:
                    raise ChunkError(
                        f"{names[i]}: chunk is missing (deleted or never written)"
                    ) from None
                continue
            try:
                out[i] = os.pread(fd, TRAILER, max(0, os.fstat(fd).st_size - TRAILER))
            finally:
                os.close(fd)
    finally:
        for fd in shards.values():
            os.close(fd)
    return out


def _open_required(path: str | os.PathLike, where: str, what: str) -> int:
    try:
        return _open(path, where, what)
    except FileNotFoundError:
        raise ChunkError(f"{where}: {what} is missing (deleted or never written)") from None
