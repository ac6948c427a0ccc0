"""`reshard`: a store made before shards (one file per chunk) rewritten into shards, safely.

Every array of one file per chunk becomes the layout a store made today has: image and label
levels in shards of up to `SHARD_CHUNKS` x `SHARD_CHUNKS` chunks, an embeddings group's
``features`` and ``done`` in shards of whole batches (`tilestore.embeddings.layout`), every
other 1-D column one file. Nothing is decoded: each chunk's bytes become an inner chunk as
they are (a copied level's are still the slide's JPEG tiles), each keeps its CRC-32C, and
each shard's index gets its own. Arrays already sharded, and levels a sidecar reads in place
from its slide, are copied as they are. Only the arrays' ``zarr.json`` change: the codecs
become ``sharding_indexed`` around the codecs they had, and JPEG chunks declared with the
older ``jpeg`` codec are declared with imagecodecs' ``imagecodecs_jpeg``, its equal
(`tilestore.format.codecs`), so zarr-python with imagecodecs reads them without tilestore.

The new store is built beside the old one (a hidden partial folder, as `convert` builds)
and renamed into place; the old one is renamed aside first and deleted last, so a kill at
any point leaves the old store or the new one, never neither (`tilestore.format.leftovers`
puts it back). A store an embedding run is writing (its lock is held) is refused.

A store made before positions were recorded (`tilestore.format.positions`) gets them: each
image and label level's chunks' CRC-32C by position, as its chunks are then (`tilestore
verify` first: a chunk already out of place stays so, now recorded there), and the
``integrity`` attribute saying so, written last. A store in shards already gets them in
place: nothing else changes, and until the attribute is written it reads as it did.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import shutil
import time
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated

import numpy as np
import zarr

from tilestore import locks
from tilestore.cpus import usable_cpus
from tilestore.errors import StoreError, TilestoreWarning
from tilestore.format import leftovers, positions
from tilestore.format.codecs import (
    COLOR_SPACE_NAMES,
    IMAGECODECS_JPEG,
    SAMPLING_NAMES,
    has_checksums,
)
from tilestore.format.integrity import read_file, read_range
from tilestore.format.shards import (
    SHARD_CHUNKS,
    batches_per_shard,
    pack_parts,
    shard_shape,
    write_atomic,
)
from tilestore.format.store import (
    damage_as_store_error,
    open_for_writing,
    open_group,
    open_store,
    write_record,
)
from tilestore.options import Opt, Workers, checked

META = "zarr.json"
CRC = "crc32c"
_UNTOUCHED = "nothing was changed; restore it from a copy, or convert the slide again"


@dataclass
class ReshardReport:
    """What `reshard` did to one store."""

    store: Path
    arrays: int = 0  # arrays rewritten into shards
    kept: int = 0  # arrays copied as they were (already sharded, read in place, not chunked)
    files_before: int = 0
    files_after: int = 0
    positions: int = 0  # levels whose chunks' positions were recorded (made before them)
    seconds: float = 0.0


@checked
def reshard(
    store: str | os.PathLike,
    *,
    per_side: Annotated[int, Opt("Chunks per shard side.", low=1, high=256)] = SHARD_CHUNKS,
    workers: Workers = None,
    progress: Callable[[int, int], None] | None = None,
) -> ReshardReport:
    """Rewrite a complete store's arrays of one file per chunk into shards, in place.

    per_side: inner chunks per shard side of image and label levels. A store with nothing
    to reshard is left untouched but for the positions of a store made before them.
    StoreError where the store is not a complete tilestore store, or an embedding run holds
    one of its groups."""
    started = time.perf_counter()
    target = Path(store)
    try:
        _, record = open_store(target)
    except StoreError as exc:  # its record damaged: said as every other document of it
        raise StoreError(f"{exc}; {_UNTOUCHED}") from exc
    locks.refuse_while_written(target, "resharding it")
    for note in leftovers.clear(target):
        warnings.warn(note, TilestoreWarning, stacklevel=2)
    in_place = {str(i) for i in record.source.in_place}
    arrays = _arrays(target)
    todo = {
        path: shard
        for path, meta in arrays.items()
        if (shard := _shard_of(path, meta, arrays, per_side, in_place)) is not None
    }
    report = ReshardReport(target, files_before=_files(target))
    older = {path for path, meta in arrays.items() if path not in todo and _older_jpeg(meta)}
    untied = [p for p in arrays if positions.is_level(p, record) and not positions.declared(record)]
    if not todo and not older:
        report.positions = _record_positions(target, untied)
        report.kept, report.files_after = len(arrays), _files(target)
        report.seconds = time.perf_counter() - started
        return report
    with leftovers.built_beside(target, "cannot reshard") as tmp:
        _copy_tree(target, tmp, skip=set(todo))
        total = sum(_shard_count(arrays[p], s) for p, s in todo.items())
        with ThreadPoolExecutor(workers or usable_cpus()) as pool:
            for path, shard in todo.items():
                written = _reshard_array(target / path, tmp / path, arrays[path], shard, pool)
                if progress:
                    progress(written, total)
        for path in older:  # in shards already: only the codec's name and settings
            doc = {**arrays[path], "codecs": _redeclared(arrays[path]["codecs"])}
            (tmp / path / META).write_text(json.dumps(doc, indent=2))
        report.positions = _record_positions(tmp, untied)
        locks.refuse_while_written(target, "resharding it")  # one begun meanwhile
    report.arrays, report.kept = len(todo) + len(older), len(arrays) - len(todo) - len(older)
    report.files_after = _files(target)
    report.seconds = time.perf_counter() - started
    return report


def _record_positions(root: Path, levels: list[str]) -> int:
    """Record the positions of the store at `root`'s `levels` whose chunks carry their
    CRC-32C, as their chunks are now, then say so in its ``integrity`` attribute; return
    how many were recorded."""
    if not levels:
        return 0
    group = open_for_writing(root)
    tied = [group[path] for path in levels if has_checksums(group[path])]
    for array in tied:
        positions.record(array, positions.read_back(array, f"{root}: {array.path}"))
    if tied:
        _, record = open_group(group.store)
        said = positions.declaration(bool(record.source.in_place))
        write_record(group, record.replace(integrity=replace(record.integrity, positions=said)))
    return len(tied)


def _arrays(root: Path) -> dict[str, dict]:
    """Every array below `root` by path (posix, relative), with its zarr.json, read before
    anything is written: a document that is not JSON, or not an array's metadata as zarr
    reads it, is one StoreError naming it, and the store is left as it was."""
    found = {}
    for meta in sorted(root.rglob(META)):
        rel = meta.parent.relative_to(root).as_posix()
        with damage_as_store_error(root, META if rel == "." else f"{rel}/{META}", _UNTOUCHED):
            # as chunks are read: a link, a folder or a FIFO named zarr.json is refused
            doc = json.loads(read_range(meta, 0, None, f"{root}: {rel}", required=True, what=META))
            if doc.get("node_type") == "array":
                zarr.open_array(meta.parent, mode="r", zarr_format=3)  # zarr's own checks
                found[rel] = doc
    return found


def _shard_of(
    path: str, meta: dict, arrays: dict[str, dict], per_side: int, in_place: set[str]
) -> tuple[int, ...] | None:
    """The shard shape an array of one file per chunk gets (None: kept as it is)."""
    codecs = meta["codecs"]
    if path in in_place or any(c["name"] == "sharding_indexed" for c in codecs):
        return None
    if meta["chunk_grid"]["name"] != "regular":
        return None
    shape, chunks = meta["shape"], meta["chunk_grid"]["configuration"]["chunk_shape"]
    parent, name = path.rpartition("/")[::2]
    features, done = arrays.get(f"{parent}/features"), arrays.get(f"{parent}/done")
    if name in ("features", "done") and features and done and len(features["shape"]) == 2:
        # an embeddings group: shards of whole batches, `done` alike
        batch = features["chunk_grid"]["configuration"]["chunk_shape"][0]
        per = batches_per_shard(batch)
        return (per * batch, *chunks[1:]) if name == "features" else (per * chunks[0],)
    if len(shape) == 1:  # a column: one file
        return (max(1, math.ceil(shape[0] / chunks[0])) * chunks[0],)
    if len(shape) in (2, 3):
        itemsize = np.dtype(meta["data_type"]).itemsize
        chunk_bytes = shape[0] * math.prod(chunks[1:]) * itemsize if len(shape) == 3 else 0
        shard = shard_shape(chunks, shape, per_side, chunk_bytes)
        return shard if tuple(shard) != tuple(chunks) else None
    return None


def _copy_tree(root: Path, tmp: Path, skip: set[str]) -> None:
    """Everything of the store but the arrays to reshard's chunks: groups' and kept arrays'
    files as they are (the root's without the consolidated metadata stores no longer keep)."""
    for folder, dirs, names in os.walk(root):
        rel = Path(folder).relative_to(root).as_posix()
        rel = "" if rel == "." else rel
        if rel in skip:
            dirs[:] = []  # its chunks are packed into shards; its zarr.json is rewritten
            continue
        (tmp / rel).mkdir(parents=True, exist_ok=True)
        for name in names:
            if not leftovers.UNFINISHED_FILE.search(name):  # a killed writer's, never renamed
                shutil.copy2(Path(folder) / name, tmp / rel / name)


def _shard_count(meta: dict, shard: tuple[int, ...]) -> int:
    return math.prod(-(-s // c) for s, c in zip(meta["shape"], shard, strict=True))


def _reshard_array(src: Path, dst: Path, meta: dict, shard: tuple[int, ...], pool) -> int:
    """Pack `src`'s chunk files into shards of `shard` at `dst`, then write its zarr.json
    (last: an array folder with no zarr.json is nothing to a reader); return the shards."""
    chunks = meta["chunk_grid"]["configuration"]["chunk_shape"]
    codecs = meta["codecs"]
    crc = codecs[-1]["name"] == CRC  # its chunks carry their CRC-32C: the index gets one too
    per = [s // c for s, c in zip(shard, chunks, strict=True)]
    grid = [-(-s // c) for s, c in zip(meta["shape"], chunks, strict=True)]
    key = _key_of(meta)
    shards = itertools.product(*(range(-(-g // p)) for g, p in zip(grid, per, strict=True)))

    def one(at: tuple[int, ...]) -> None:
        inner = []
        for offset in itertools.product(*(range(p) for p in per)):
            coords = [a * p + o for a, p, o in zip(at, per, offset, strict=True)]
            if any(c >= g for c, g in zip(coords, grid, strict=True)):
                inner.append(None)  # beyond the array, in its last shards
                continue
            # as our readers read a chunk file: a link (another chunk's pixels), a folder or
            # a FIFO is damage, refused with its name, never packed as this chunk's bytes;
            # absent before (fill value), absent after
            name = f"{src}: chunk {tuple(coords)}"
            inner.append(read_file(src / key(coords), name, required=False))
        if any(data is not None for data in inner):
            write_atomic(dst / key(at), pack_parts(inner, crc))

    written = sum(1 for _ in pool.map(one, shards))
    index = [{"name": "bytes", "configuration": {"endian": "little"}}]
    sharding = {
        "name": "sharding_indexed",
        "configuration": {
            "chunk_shape": chunks,
            "codecs": _redeclared(codecs),
            "index_codecs": index + ([{"name": CRC}] if crc else []),
            "index_location": "end",
        },
    }
    doc = {
        **meta,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": list(shard)}},
        "codecs": [sharding],
    }
    dst.mkdir(parents=True, exist_ok=True)
    (dst / META).write_text(json.dumps(doc, indent=2))
    return written


def _older_jpeg(meta: dict) -> bool:
    return '"name": "jpeg"' in json.dumps(meta["codecs"])


def _redeclared(codecs: list[dict]) -> list[dict]:
    """`codecs` with the older ``jpeg`` codec declared as the ``imagecodecs_jpeg`` it equals
    (the same libjpeg decode of the same complete streams), inside shards too."""
    out = []
    for codec in codecs:
        config = codec.get("configuration") or {}
        if codec["name"] == "jpeg":
            space = config.get("encoded_color_space")
            factors = (config.get("subsampling") or [[1, 1]])[0]
            codec = {
                "name": IMAGECODECS_JPEG,
                "configuration": {
                    "level": config.get("quality", 90),
                    **(
                        {"colorspace_data": "RGB", "colorspace_jpeg": COLOR_SPACE_NAMES[space]}
                        if space
                        else {}
                    ),
                    "subsampling": SAMPLING_NAMES[tuple(factors)],
                },
            }
        elif codec["name"] == "sharding_indexed":
            inner = _redeclared(config["codecs"])
            codec = {**codec, "configuration": {**config, "codecs": inner}}
        out.append(codec)
    return out


def _key_of(meta: dict) -> Callable[[list[int]], str]:
    """Chunk (and shard) coordinates -> the file's path below the array, as its
    chunk_key_encoding names them."""
    encoding = meta.get("chunk_key_encoding", {"name": "default"})
    separator = encoding.get("configuration", {}).get("separator")
    if encoding["name"] == "v2":
        sep = separator or "."
        return lambda coords: sep.join(map(str, coords)) if coords else "0"
    sep = separator or "/"
    return lambda coords: sep.join(["c", *map(str, coords)])


def _files(root: Path) -> int:
    return sum(len(names) for _, _, names in os.walk(root))
