"""Embeddings tied to their positions, as image levels are (`tilestore.format.positions`).

A chunk's CRC-32C proves its bytes whole, not that they are this position's: two entries of
a features shard's index swapped (its own CRC-32C recomputed), or two shard files renamed
into each other's place, read whole rows of other tiles, and every checksum passes. So a
group records, for each array it writes (features, tokens and quality, ``done``, every
coordinate column), the CRC-32C each chunk ends with, by position: a batched array's in
``crc32c/<array>`` inside the group (found from each array's own path, wherever the group
lives), a file for each of the array's shards, so that a Dask cohort's workers, each writing
its own shards, never write one file; a coordinate column's (written once, with the group)
in the group's record. The record says which arrays it ties, and the dtype each was written
with (``positions``: `declaration`). A group made before the record held its columns' has
them in files as the batched arrays': read there (`positions.group_positions`).

Written as the arrays are: the coordinate columns when the group is made, in its record;
a shard of features (tokens, quality) right after the shard, read back (its index, then 4
bytes a chunk: `positions.record_shard`); the ``done`` flags' positions from the bytes in hand
(a done chunk is the byte 1 and its CRC-32C, `DONE_CRC`; a flag of 0 is no chunk), before the
flags. So at every point a kill can reach, the chunks of every done batch are the ones
recorded (a shard rewritten with done batches rewrites their chunks bit for bit), and a
batch's flag is never 1 where its position says none: what is compared (`check`) of a group
still being written is its done batches' chunks, of a finished group every chunk. Checked
from the shard indexes and 4 bytes a chunk, no chunk read whole: cheap enough for every
reader's door (`groups.check_group`), `status` and the writer's resume. A group made before
declares none: it reads as before and is said to be not tied.
"""

from __future__ import annotations

from typing import Any

import google_crc32c
import numpy as np
import zarr

from tilestore.errors import DamagedEmbeddings
from tilestore.format import positions
from tilestore.format.integrity import UNWRITTEN
from tilestore.format.made import made_new

RECORD = positions.GROUP_RECORD  # the group record's key: what it ties (`declaration`)
BATCHED = ("features", "tokens", "quality")  # written shard by shard, rows of whole batches
DONE = "done"
# A done flag's chunk as zarr writes it (the bytes codec, then crc32c): the byte 1, then
# its CRC-32C; a flag of 0 equals the fill value and is no chunk at all.
DONE_CRC = google_crc32c.value(b"\x01")
SAID = {  # what `positions.misplaced` found, as a message says it
    "missing": "missing where written",
    "stored": "stored where none was written",
    "other": "not those written there (moved, swapped or changed since)",
}


def declaration(arrays: dict[str, zarr.Array], columns: dict[str, np.ndarray]) -> dict[str, Any]:
    """The group record's ``positions``: where they are, each array tied with its dtype as
    written (a zarr.json changed since is found by it, as moved chunks are by position), and
    the coordinate `columns`' positions themselves (`read_back`'s tables): a column is
    written once, with the group, and its table is a number or two (a chunk is 65,536 rows),
    so the record holds it, not a file of its own (two files and two folders a column: a
    third of a small slide's group; bench/RESULTS.md, issue 68)."""
    return {
        "record": f"{positions.GROUP}/<array> in the group: the CRC-32C each chunk ends with, "
        "by position; a coordinate column's in `columns` here",
        "arrays": {name: str(array.dtype) for name, array in sorted(arrays.items())},
        "columns": {name: positions.held_in_record(table) for name, table in columns.items()},
    }


def tied_arrays(meta: dict[str, Any]) -> dict[str, str] | None:
    """The arrays a group's record (its ``tilestore`` attributes) ties, with their dtypes;
    None for a group made before positions (`positions.group_tied`)."""
    return positions.group_tied(meta)


def started(
    group: zarr.Group, arrays: dict[str, zarr.Array], columns: list[str], batched: list[str]
) -> tuple[dict[str, Any], dict[str, zarr.Array]]:
    """Record the positions of a group being made, its `arrays` as just made: its coordinate
    `columns`, written now, read back here, held in the record (`declaration`); for the
    `batched` arrays (features, tokens, quality, done), records of none yet, filled as their
    shards are written (`Recorder`), made at once (`made_new`). Returns the record's
    declaration and the batched arrays' records (for the group's `Recorder`)."""
    tables = {name: positions.read_back(arrays[name], f"{group.path}/{name}") for name in columns}
    made = {name: positions.preparing(arrays[name]) for name in batched}
    folders = tuple({path.rpartition("/")[0] for path, _ in made.values()})  # crc32c/
    opened = made_new(group.store_path.store, dict(made.values()), folders)
    records = {name: opened[made[name][0]] for name in batched}
    return declaration(arrays, tables), records


class Recorder:
    """The positions records of a group's batched arrays, opened once for its writer."""

    def __init__(
        self,
        group: zarr.Group,
        where: str,
        fix: str,
        made: tuple[dict[str, zarr.Array], dict[str, zarr.Array]] | None = None,
    ) -> None:
        """made: the group's arrays and their records as just made (`started`), not opened
        again."""
        self.where = where
        if made is not None:
            arrays, records = made
            self.arrays = {name: arrays[name] for name in (*BATCHED, DONE) if name in arrays}
            self.records = {name: records[name] for name in self.arrays}
            return
        self.arrays = {name: group[name] for name in (*BATCHED, DONE) if name in group}
        self.records = {
            name: positions.opened(array, f"{where}/{name}", fix)
            for name, array in self.arrays.items()
        }

    def shard(self, shard: int, first: int, flags: np.ndarray) -> None:
        """Record one shard as just written (features, tokens, quality: read back) and the
        done flags about to be written for its batches (`flags`, 0 or 1, from batch `first`:
        from the bytes in hand), in one round of writes. Called before the flags are written:
        a flag is never 1 where its position says no chunk."""
        entries = []
        for name in BATCHED:
            if name in self.arrays:
                array = self.arrays[name]
                at = (shard,) + (0,) * (array.ndim - 1)
                found = positions.shard_entries(array, at, f"{self.where}/{name}")
                entries.append((self.records[name], *found))
        values = np.where(np.asarray(flags) == 1, np.uint64(DONE_CRC), np.uint64(UNWRITTEN))
        entries.append((self.records[DONE], (slice(first, first + len(values)),), values))
        positions.write_entries(entries)


def ends(done: zarr.Array, where: str) -> np.ndarray:
    """What a tied group's done chunks end with (`positions.read_back`); its flags are
    ``ends == DONE_CRC`` (the byte 1 as zarr wrote it; 0 is no chunk). zarr reads a sharded
    array of one-byte chunks at about 3 ms a chunk (1.3 s for 100,000 tiles in batches of
    256); these are its shard indexes and 4 bytes a chunk. Each chunk's whole bytes are
    checked (its CRC-32C) as zarr reads them, by the writer that resumes the group."""
    return positions.read_back(done, where)


def check(
    where: str,
    fix: str,
    meta: dict[str, Any],
    arrays: dict[str, zarr.Array],
    flags: np.ndarray,
    done_ends: np.ndarray | None = None,
) -> None:
    """Refuse (DamagedEmbeddings, one line naming `where`, the array and the rows; ChunkError
    for a damaged shard or record) a group whose tied arrays are not as written: another
    dtype, or a chunk not the one recorded at its position. A group marked complete is
    compared whole; one still being written, at its done batches (`flags`, the done array's
    values) and its coordinate columns (`done_ends`: `ends`, where read already). A group
    made before positions: its features (and
    tokens) of a complete group must each have every chunk (a complete group wrote them all,
    never the fill value)."""
    complete = bool(meta.get("complete"))
    declared = tied_arrays(meta)
    if declared is None:
        if complete:
            for name in ("features", "tokens"):
                if name in arrays:
                    _whole(where, fix, name, arrays[name])
        return
    batch = int(meta.get("batch_size") or 1)
    done = np.asarray(flags) == 1
    for name, dtype in declared.items():
        array = arrays.get(name)
        if array is None:
            raise DamagedEmbeddings(f"{where} has no {name} array; {fix}")
        if str(array.dtype) != dtype:
            raise DamagedEmbeddings(
                f"{where}/{name} is {array.dtype} where it was written as {dtype}: its zarr.json "
                f"was changed; it is damaged; {fix}"
            )
    records = [
        positions.group_positions(meta, name, arrays[name], f"{where}/{name}", fix)
        for name in declared
    ]
    for name, recorded in zip(declared, positions.tables(records), strict=True):
        array = arrays[name]
        compared = None
        if not complete and name == DONE:
            compared = done[: positions.grid_of(array)[0]]
        elif not complete and name in BATCHED:
            compared = _of_batches(array, done, batch)
        now = done_ends if name == DONE else None
        wrong = positions.misplaced(array, recorded, f"{where}/{name}", compared, now)
        if wrong:
            raise DamagedEmbeddings(_said(where, name, array, wrong, fix))


def _of_batches(array: zarr.Array, done: np.ndarray, batch: int) -> np.ndarray:
    """Which chunks of a batched array lie in done batches (its chunks along ``tile`` are a
    batch, or a part of one), shaped as its chunk grid."""
    grid = positions.grid_of(array)
    first_rows = np.arange(grid[0]) * array.chunks[0]
    of = np.minimum(first_rows // batch, len(done) - 1)
    along = done[of] if len(done) else np.zeros(grid[0], bool)
    return np.broadcast_to(along.reshape(-1, *([1] * (len(grid) - 1))), grid)


def _whole(where: str, fix: str, name: str, array: zarr.Array) -> None:
    """A complete group made before positions: every chunk of `array` there."""
    now = positions.read_back(array, f"{where}/{name}")
    absent = [tuple(int(c) for c in at) for at in zip(*np.nonzero(now == UNWRITTEN), strict=True)]
    if absent:
        raise DamagedEmbeddings(_said(where, name, array, {"missing": absent}, fix))


def _said(
    where: str, name: str, array: zarr.Array, wrong: dict[str, list[tuple[int, ...]]], fix: str
) -> str:
    """One line: the array, which rows (batches, for done) its wrong chunks hold, and why."""
    chunk, rows = array.chunks[0], array.shape[0]
    coords = sorted({at[0] for found in wrong.values() for at in found})
    runs: list[list[int]] = []  # neighbouring chunks as one range
    for c in coords:
        if runs and runs[-1][1] == c - 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    if name == DONE:
        unit, spans = "batches", [(a, b) for a, b in runs]
    else:
        unit, spans = "rows", [(a * chunk, min((b + 1) * chunk, rows) - 1) for a, b in runs]
    shown = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in spans[:5])
    more = ", ..." if len(spans) > 5 else ""
    why = "; ".join(
        f"{len(found)} chunk{'s' * (len(found) != 1)} {SAID[kind]}" for kind, found in wrong.items()
    )
    return f"{where}/{name}: {unit} {shown}{more} are not as written ({why}): it is damaged; {fix}"
