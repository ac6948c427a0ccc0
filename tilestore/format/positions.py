"""Chunk positions: the CRC-32C each chunk of a level ends with, recorded by where it belongs.

A chunk's CRC-32C (`tilestore.format.integrity`) proves its bytes whole, not that they are
this position's: a shard index with two entries swapped (its own CRC-32C recomputed), or two
chunk files renamed into each other's place, reads whole chunks in the wrong places, and
every check passes. So a store records, for each image and label level whose chunks carry
their CRC-32C, the CRC-32C each chunk ends with, by chunk position: the level's positions,
a uint64 zarr array ``crc32c/<level>`` beside the level, shaped as its chunk grid,
`UNWRITTEN` (2^64 - 1, as a shard index marks an absent chunk) where no chunk was written;
one small file. A read compares each chunk's last 4 bytes with its position's entry
(`Location.expect`, `integrity.tied`): no hashing beyond the chunk's own check. A chunk
absent where one was written, or stored where none was, is damage too. The store's
``integrity`` attribute says ``positions`` where it keeps them (`declared`), so a reader
knows to expect them: positions missing or damaged there are one ChunkError naming them.
Stores made before read and verify as they did; `tilestore reshard` adds them.

Written where chunks are written: the copy path from the CRC-32C it packs with each chunk
(`crcs_of`), the block path and label levels by reading back what zarr wrote (`read_back`:
each shard's index, then each chunk's last 4 bytes, one small read each), `reshard` for a
store made before (the positions its chunks have then: `tilestore verify` first). Levels a
sidecar reads in place are the slide's tiles, not ours: none are recorded; the slide's
fingerprint, checked at every open, ties them (`tilestore.reading.inplace`). zarr readers
(ome-zarr-py, napari) see one more small array beside the levels, which the multiscales
metadata does not name, and ignore it.

An embeddings group ties its arrays the same way (`tilestore.embeddings.tied`): their
records are made empty (`prepare`: a file per shard) and filled as each shard is written
(`shard_entries`, `write_entries`); the group's record lists the arrays it ties
(`group_tied`), and `misplaced` compares a whole array from shard indexes and chunk ends.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import zarr
from zarr.abc.store import ByteRequest, RangeByteRequest, SuffixByteRequest
from zarr.api.asynchronous import open_array as open_async
from zarr.core.array import create_array
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync

from tilestore.errors import ChunkError
from tilestore.format.codecs import zstd_codecs
from tilestore.format.integrity import TRAILER, UNWRITTEN, Location, read_ends
from tilestore.format.record import StoreRecord
from tilestore.format.shards import (
    ABSENT,
    ShardIndex,
    check_ranges,
    chunks_per_shard,
    index_bytes,
    index_checked,
    parse_index,
)
from tilestore.format.store import DAMAGED

GROUP = "crc32c"  # beside each level: crc32c/<level>
FIX = "convert the slide again (a label: compute it again)"
GROUP_RECORD = "positions"  # a group record's key: the arrays it ties (`group_tied`)


def declaration(in_place: bool = False) -> str:
    """What a store's ``integrity`` attribute says (as ``positions``) where it records them;
    `in_place`: a sidecar, whose levels read in place from the slide have none."""
    said = f"{GROUP}/<level> beside each level: the CRC-32C each chunk ends with, by position"
    return said + (", built levels only" if in_place else "")


def declared(record: StoreRecord) -> bool:
    """Whether a store's record says its levels' positions are recorded."""
    return bool(record.integrity.positions)


def is_level(path: str, record: StoreRecord) -> bool:
    """Whether the array at `path` of a store (whose record is `record`) is a level whose
    positions the store records: an image level (not one a sidecar reads in place from its
    slide) or a label level (``labels/<label>/<level>``, as
    `tilestore.reading.labels.write_label` writes them)."""
    images = {lv.path for lv in record.levels}
    in_place = {str(i) for i in record.source.in_place}
    parts = path.split("/")
    label = len(parts) == 3 and parts[0] == "labels" and parts[2].isdigit()
    return label or (path in images and path not in in_place)


def group_tied(attrs: object) -> dict[str, str] | None:
    """The arrays a group's record (its ``tilestore`` attributes) says it ties to their
    positions, each with the dtype it was written with (``positions.arrays``: an embeddings
    group, `tilestore.embeddings.tied`); None where it says none (made before, or another
    kind of group)."""
    declared = attrs.get(GROUP_RECORD) if isinstance(attrs, dict) else None
    if not isinstance(declared, dict) or not isinstance(declared.get("arrays"), dict):
        return None
    return {str(k): str(v) for k, v in declared["arrays"].items()}


def group_positions(
    attrs: dict[str, Any], name: str, array: zarr.Array, where: str, fix: str = FIX
) -> Positions:
    """The positions of `array`, the tied array `name` of a group whose record's ``tilestore``
    attributes are `attrs`: in the record itself where it holds them (``positions.columns``:
    a coordinate column's, written once with the group), else in its file (``crc32c/<name>``
    beside it). A table in the record not the array's chunk grid, or not CRC-32Cs (null where
    none was written), is a ChunkError naming `where`."""
    held = (attrs.get(GROUP_RECORD) or {}).get("columns")
    if not isinstance(held, dict) or name not in held:
        return Positions(array, where, fix)
    found, grid = held[name], grid_of(array)
    values = np.asarray(found if isinstance(found, list) else [], dtype=object)
    ok = (
        isinstance(found, list)
        and values.shape == grid
        and all(v is None or (type(v) is int and 0 <= v < 2**32) for v in values.flat)
    )
    if not ok:
        raise ChunkError(
            f"{where}: its chunk positions (in its group's record) are damaged (not a CRC-32C "
            f"or none for each of its {math.prod(grid)} chunks); {fix}"
        )
    table = [UNWRITTEN if v is None else v for v in values.flat]
    return Positions(array, where, fix, np.array(table, np.uint64).reshape(grid))


def held_in_record(table: np.ndarray) -> list[int | None]:
    """A column's positions (`read_back`'s table, one axis) as its group's record holds them
    (``positions.columns``: `group_positions`): each chunk's CRC-32C, null where none."""
    return [None if v == UNWRITTEN else int(v) for v in np.asarray(table, np.uint64).tolist()]


def is_record(path: str) -> bool:
    """Whether the array at `path` is a level's positions (``.../crc32c/<level>``)."""
    parts = path.split("/")
    return len(parts) >= 2 and parts[-2] == GROUP


def path_of(array_path: str) -> str:
    """Where the positions of the array at `array_path` are: ``crc32c/<name>`` beside it."""
    parent, _, name = array_path.rpartition("/")
    return f"{parent}/{GROUP}/{name}" if parent else f"{GROUP}/{name}"


def grid_of(array: zarr.Array) -> tuple[int, ...]:
    """The chunk grid of an array (chunks along each axis)."""
    return tuple(-(-s // c) for s, c in zip(array.shape, array.chunks, strict=True))


def crcs_of(chunks: Sequence[bytes | tuple[bytes, ...] | None]) -> np.ndarray:
    """The CRC-32C each of `chunks` ends with (as `shards.pack_parts` takes them: bytes, or
    parts whose last holds it; None: `UNWRITTEN`), as uint64."""
    out = np.full(len(chunks), UNWRITTEN, np.uint64)
    for i, chunk in enumerate(chunks):
        if chunk is not None:
            tail = chunk if isinstance(chunk, bytes) else chunk[-1]
            out[i] = int.from_bytes(tail[-TRAILER:], "little")
    return out


def record(array: zarr.Array, table: np.ndarray) -> None:
    """Write `table` (the CRC-32C of each chunk of `array` by position, as `read_back` or
    `crcs_of` give it, shaped as its chunk grid) as the array's positions, replacing any."""
    path, arguments = recording(array, table)
    sync(create_array(array.store_path.store, name=path, **arguments))


def recording(array: zarr.Array, table: np.ndarray) -> tuple[str, dict]:
    """`record`'s array: its path from the store's root and `create_array`'s arguments
    (many arrays' made at once: `tilestore.format.made`)."""
    return path_of(array.path), {
        "data": np.asarray(table, np.uint64).reshape(grid_of(array)),
        "chunks": grid_of(array),  # one file: a level's chunk grid is small
        "fill_value": UNWRITTEN,
        "overwrite": True,
        "attributes": {"tilestore": {"crc32c_of": array.path, "unwritten": UNWRITTEN}},
        **zstd_codecs(),
    }


def read_back(array: zarr.Array, where: str) -> np.ndarray:
    """The CRC-32C each chunk of `array` ends with, by position, as its files hold them now:
    each shard's index (checked), then 4 bytes a chunk (`integrity.read_ends`), or each chunk
    file's last 4. What zarr just wrote (the block path, labels), or a store made before
    (`reshard`). `where` names the array in messages."""
    grid = grid_of(array)
    table = np.full(grid, UNWRITTEN, np.uint64)
    per = chunks_per_shard(array)
    root = getattr(array.store_path.store, "root", None)
    if per is None:
        coords = list(np.ndindex(*grid))
        names = [f"{where} chunk {coord}" for coord in coords]
        keys = [f"{array.path}/{array.metadata.encode_chunk_key(c)}" for c in coords]
        if root is not None:
            ends = read_ends([Location(str(Path(root) / k)) for k in keys], names, required=False)
        else:
            ends = [_get(array, k, SuffixByteRequest(TRAILER)) for k in keys]
        for coord, end, name in zip(coords, ends, names, strict=True):
            if end is not None:
                table[coord] = _trailer(end, name)
        return table
    shards = ShardIndex(array, Path(root) / array.path, where) if root is not None else None
    for shard in np.ndindex(*(-(-g // p) for g, p in zip(grid, per, strict=True))):
        name = f"{where} shard {shard}"
        if shards is not None:
            crcs = _shard_crcs(shards, shard, name)
        else:
            crcs = _stored_shard_crcs(array, shard, math.prod(per), name)
        if crcs is not None:
            block = _block(shard, per, grid)
            table[block] = crcs.reshape(per)[tuple(slice(0, b.stop - b.start) for b in block)]
    return table


def _block(shard: tuple[int, ...], per: Sequence[int], grid: Sequence[int]) -> tuple[slice, ...]:
    """The chunk positions of one shard (its block of the chunk grid, cut at the grid's end)."""
    return tuple(
        slice(s * p, min((s + 1) * p, g)) for s, p, g in zip(shard, per, grid, strict=True)
    )


def preparing(array: zarr.Array, attributes: dict | None = None) -> tuple[str, dict]:
    """An empty positions record of `array` (`UNWRITTEN` throughout), to be filled shard by
    shard (`record_shard`) as the array is written: its path from the store's root and
    `create_array`'s arguments (made with the group's other arrays: `tilestore.format.made`).
    A file for each of the array's shards (one file where it is not sharded), so processes
    writing other shards of one array at once (a Dask cohort's slices) never write one
    file. `attributes`: more of the record's ``tilestore`` attributes."""
    grid = grid_of(array)
    per = chunks_per_shard(array) or grid
    return path_of(array.path), {
        "shape": grid,
        "chunks": tuple(max(1, min(p, g)) for p, g in zip(per, grid, strict=True)),
        "dtype": np.uint64,
        "fill_value": UNWRITTEN,
        "overwrite": True,
        "attributes": {
            "tilestore": {"crc32c_of": array.path, "unwritten": UNWRITTEN, **(attributes or {})}
        },
        **zstd_codecs(),
    }


def opened(array: zarr.Array, where: str, fix: str = FIX) -> zarr.Array:
    """The positions record of `array` opened to be written (`record_shard`); ChunkError
    naming `where` where it is missing or damaged (`fix`: what to do then)."""
    path = path_of(array.path)
    try:
        return zarr.open_array(array.store_path.store, path=path, mode="r+", zarr_format=3)
    except (FileNotFoundError, zarr.errors.NodeNotFoundError):
        raise ChunkError(f"{where}: its chunk positions ({path}) are missing; {fix}") from None
    except (*DAMAGED, OSError) as exc:
        raise ChunkError(
            f"{where}: its chunk positions ({path}) are damaged "
            f"({type(exc).__name__}: {' '.join(str(exc).split())}); {fix}"
        ) from exc


def record_shard(array: zarr.Array, record: zarr.Array, shard: tuple[int, ...], where: str) -> None:
    """Write into `record` (the array's positions, `opened`) the CRC-32C each chunk of one
    shard of `array` ends with as its file holds it now (`shard_entries`)."""
    write_entries([(record, *shard_entries(array, shard, where))])


def shard_entries(
    array: zarr.Array, shard: tuple[int, ...], where: str
) -> tuple[tuple[slice, ...], np.ndarray]:
    """The block of `array`'s positions one shard covers, and the CRC-32C each of its chunks
    ends with as its file holds it now: the shard's index, then 4 bytes a chunk (what
    `read_back` reads, for one shard), read right after the shard is written. The block is a
    file of the record's own (`prepare`): no other shard's entries are read or written."""
    per, grid = chunks_per_shard(array), grid_of(array)
    if per is None:
        raise ValueError(f"{where}: not sharded")  # a caller's mistake, not the store's
    name = f"{where} shard {shard}"
    root = getattr(array.store_path.store, "root", None)
    if root is not None:
        crcs = _shard_crcs(ShardIndex(array, Path(root) / array.path, where), shard, name)
    else:
        crcs = _stored_shard_crcs(array, shard, math.prod(per), name)
    block = _block(shard, per, grid)
    values = np.full(per, UNWRITTEN, np.uint64) if crcs is None else crcs.reshape(per)
    return block, values[tuple(slice(0, b.stop - b.start) for b in block)]


def write_entries(entries: Sequence[tuple[zarr.Array, tuple[slice, ...], np.ndarray]]) -> None:
    """Write each (record, block, values) in one round of concurrent writes (a zarr write
    costs its milliseconds in turn: two a shard, a hundredth of a batch's writing)."""

    async def each() -> None:
        await asyncio.gather(*(r._async_array.setitem(b, v) for r, b, v in entries))

    sync(each())


def misplaced(
    array: zarr.Array,
    recorded: np.ndarray,
    where: str,
    compared: np.ndarray | None = None,
    now: np.ndarray | None = None,
) -> dict[str, list[tuple[int, ...]]]:
    """The chunks of `array` whose last 4 bytes (`read_back`: shard indexes and 4 bytes a
    chunk, no chunk read whole) are not the CRC-32C `recorded` for their position, by what
    is wrong: "missing" (one was written there, none is there now), "stored" (one is there
    where none was written), "other" (another position's, or changed since it was written).
    compared: the positions to compare (a boolean array shaped as the chunk grid; None:
    all); now: `read_back`'s table of the array, where read already. A damaged shard file or
    index is a ChunkError naming it (`where`)."""
    now = read_back(array, where) if now is None else now
    differ = now != np.asarray(recorded, np.uint64)
    if compared is not None:
        differ &= compared
    found: dict[str, list[tuple[int, ...]]] = {"missing": [], "stored": [], "other": []}
    for coord in zip(*np.nonzero(differ), strict=True):
        at = tuple(int(c) for c in coord)
        if now[at] == UNWRITTEN:
            kind = "missing"
        else:
            kind = "stored" if recorded[at] == UNWRITTEN else "other"
        found[kind].append(at)
    return {kind: coords for kind, coords in found.items() if coords}


def _shard_crcs(shards: ShardIndex, shard: tuple[int, ...], where: str) -> np.ndarray | None:
    """The CRC-32C each inner chunk of a local shard ends with (C order, `UNWRITTEN` where
    absent): its index, then 4 bytes of each chunk; None where the shard is not there."""
    index = shards.index(shard)
    if index is None:
        return None
    present = index[:, 0] != ABSENT
    path = str(shards.folder / shards.key(shard))
    located = [Location(path, o, n) for o, n in index[present].tolist()]
    ends = read_ends(located, [where] * len(located), required=True)
    out = np.full(len(index), UNWRITTEN, np.uint64)
    out[present] = [_trailer(end, where) for end in ends]
    return out


def _stored_shard_crcs(
    array: zarr.Array, shard: tuple[int, ...], chunks: int, where: str
) -> np.ndarray | None:
    """`_shard_crcs` of a shard in another zarr store: its index (a suffix read), then each
    chunk's last 4 bytes (a range read each), no chunk read whole."""
    key = f"{array.path}/{array.metadata.encode_chunk_key(shard)}"
    crc = index_checked(array)
    tail = _get(array, key, SuffixByteRequest(index_bytes(chunks, crc)))
    if tail is None:
        return None
    size = sync(array.store_path.store.getsize(key))
    index = parse_index(tail, chunks, where, crc)
    check_ranges(index, where, size - index_bytes(chunks, crc))
    present = index[:, 0] != ABSENT
    out = np.full(len(index), UNWRITTEN, np.uint64)
    ends = []
    for o, n in index[present].tolist():
        if n < TRAILER:
            raise ChunkError(f"{where}: a chunk of {n} bytes, shorter than its CRC-32C")
        end = _get(array, key, RangeByteRequest(o + n - TRAILER, o + n)) or b""
        ends.append(_trailer(end, where))
    out[present] = ends
    return out


def _trailer(data: bytes, where: str) -> int:
    """The CRC-32C a chunk (or its last bytes) ends with; ChunkError if it is too short."""
    if len(data) < TRAILER:
        raise ChunkError(f"{where}: a chunk of {len(data)} bytes, shorter than its CRC-32C")
    return int.from_bytes(data[-TRAILER:], "little")


def _get(array: zarr.Array, key: str, byte_range: ByteRequest | None = None) -> bytes | None:
    found = sync(array.store_path.store.get(key, default_buffer_prototype(), byte_range))
    return None if found is None else found.to_bytes()


def tables(records: Sequence[Positions]) -> list[np.ndarray]:
    """Each record's table (`Positions.table`), read at once: a group's dozen records in one
    round of concurrent reads, not a dozen in turn (each a zarr open and a read)."""

    async def each() -> list[np.ndarray]:
        return list(await asyncio.gather(*(r._read() for r in records if r._table is None)))

    for record, table in zip([r for r in records if r._table is None], sync(each()), strict=True):
        record._table = table
    return [r.table() for r in records]


class Positions:
    """The CRC-32C recorded for each chunk of one array, by position, read on first use (one
    small file); a store that declares positions but lacks them, or whose record is damaged,
    is a ChunkError naming the array (`where`) and the record."""

    def __init__(
        self, array: zarr.Array, where: str, fix: str = FIX, table: np.ndarray | None = None
    ) -> None:
        """table: the positions where they are known already (a group's record holds a
        coordinate column's: `group_positions`)."""
        self.array = array
        self.where = where
        self.fix = fix  # what to do where they are missing or damaged
        self.grid = grid_of(array)
        self._table: np.ndarray | None = table

    def table(self) -> np.ndarray:
        """The recorded CRC-32C of every chunk, shaped as the array's chunk grid."""
        if self._table is None:
            self._table = self._load()
        return self._table

    def expected(self, coords: Sequence[tuple[int, ...]]) -> list[int]:
        """The recorded CRC-32C of each chunk (`UNWRITTEN` where none was written, or the
        coordinates lie beyond the array)."""
        table, out = self.table(), []
        for coord in coords:  # a few chunks a region, a grid row for the engine: plain lookups
            try:
                out.append(table.item(coord) if min(coord) >= 0 else UNWRITTEN)
            except IndexError:
                out.append(UNWRITTEN)
        return out

    def _load(self) -> np.ndarray:
        return sync(self._read())

    async def _read(self) -> np.ndarray:
        path, fix = path_of(self.array.path), self.fix
        try:
            manifest = await open_async(
                store=self.array.store_path.store, path=path, mode="r", zarr_format=3
            )
        except (FileNotFoundError, zarr.errors.NodeNotFoundError):
            raise ChunkError(
                f"{self.where}: its chunk positions ({path}) are missing, though the store "
                f"says it records them; {fix}"
            ) from None
        except (*DAMAGED, OSError) as exc:
            raise self._damaged(path, exc, fix) from exc
        try:
            table = np.asarray(await manifest.getitem(...))
        except (*DAMAGED, OSError) as exc:
            raise self._damaged(path, exc, fix) from exc
        if table.dtype != np.uint64 or table.shape != self.grid:
            what = f"{table.dtype} {table.shape}, not uint64 {self.grid}"
            raise self._damaged(path, ValueError(what), fix)
        return table

    def _damaged(self, path: str, exc: BaseException, fix: str) -> ChunkError:
        return ChunkError(
            f"{self.where}: its chunk positions ({path}) are damaged "
            f"({type(exc).__name__}: {' '.join(str(exc).split())}); {fix}"
        )
