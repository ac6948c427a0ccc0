"""Many new arrays made at once in a group just made (an embeddings group: its columns, its
batched arrays and their positions records): the files zarr makes, written as files.

zarr's `create_array`, asked for an array at a store's path, looks for a node there and
writes again the document of every group above it (an embeddings group's array: four or
five), each a file opened on the loop's thread; and its writes of an array's data go
through tasks, batches and a thread each chunk. A small slide's group (some 25 arrays) cost
its store process most of its CPU that way (bench/RESULTS.md, issue 68). Here each array's
metadata is still decided by zarr's own `create_array` (its checks, codecs and defaults), on
a store in memory; every document is the metadata's own `to_buffer_dict`, and every chunk
is encoded by the array's own codecs (their `_encode_sync`, as zarr's pipeline calls them),
in the calling thread: the same files, byte for byte. They are then put (`put`): a local
store's as files written whole one after another (`write_atomic`, as zarr's own local store
writes them), another store's concurrently through zarr's store, each round ended whole
before its first error is raised: no write is left running while the caller removes the
group. An array of a layout not encoded here (a sharded one of more than one dimension) is
written by zarr. The caller holds the group (its lock) and has just made it: nothing is at
these paths.
"""

from __future__ import annotations

import asyncio
import collections
import copy
import threading
from pathlib import Path
from typing import Any

import numpy as np
import zarr
from zarr.abc.store import Store
from zarr.codecs import BytesCodec, Crc32cCodec, ShardingCodec
from zarr.core.array import create_array
from zarr.core.array_spec import ArrayConfig, ArraySpec, parse_array_config
from zarr.core.buffer import default_buffer_prototype
from zarr.core.group import GroupMetadata
from zarr.core.metadata.v3 import ArrayV3Metadata
from zarr.core.sync import sync
from zarr.storage import MemoryStore, StorePath

from tilestore.format.shards import pack, write_atomic


def made_new(
    store: Store, arrays: dict[str, dict[str, Any]], groups: tuple[str, ...] = ()
) -> dict[str, zarr.Array]:
    """Make `arrays` (a path from the store's root: `create_array`'s arguments, `data`
    among them where it has data) in `store`, and the new `groups` they are in (paths,
    without attributes: the groups above that are there already are left as they are);
    return the arrays, opened. The first error once every write has ended (none left
    writing while the caller removes the group)."""
    decided = {path: _decided(kw) for path, kw in arrays.items()}
    group = GroupMetadata(zarr_format=3).to_buffer_dict(default_buffer_prototype())
    files = {f"{path}/{name}": doc.to_bytes() for path in groups for name, doc in group.items()}
    made, left = {}, {}
    for path, (meta, data, config, documents) in decided.items():
        files.update({f"{path}/{name}": doc.to_bytes() for name, doc in documents.items()})
        at = StorePath(store, path)
        made[path] = zarr.AsyncArray(metadata=meta, store_path=at, config=config)
        chunks = None if data is None else encoded(meta, data, parse_array_config(config))
        if chunks is None and data is not None:
            left[path] = data  # a layout not encoded here: zarr writes it
        files.update({f"{path}/{key}": value for key, value in (chunks or {}).items()})
    put(store, files)
    if left:
        sync(_gathered(made[path].setitem(slice(None), data) for path, data in left.items()))
    return {path: zarr.Array(array) for path, array in made.items()}


def put(store: Store, files: dict[str, bytes]) -> None:
    """Write `files` (keys from the store's root) into `store`: a local store's one after
    another in this thread, each whole (`write_atomic`: a temporary name, then renamed, as
    zarr's local store writes); another's concurrently through the store, the first error
    raised once every write has ended."""
    store._check_writable()
    root = getattr(store, "root", None)
    if root is not None:
        for key, value in files.items():
            write_atomic(Path(root) / key, value)
        return
    as_buffer = default_buffer_prototype().buffer.from_bytes
    sync(_gathered(store.set(key, as_buffer(value)) for key, value in files.items()))


async def _gathered(writes) -> None:
    _all_or_first_error(await asyncio.gather(*writes, return_exceptions=True))


def encoded(metadata: ArrayV3Metadata, data: np.ndarray, config: ArrayConfig) -> dict | None:
    """The files zarr writes for a whole new array of `data` (its shape, its dtype), by key
    below the array: its chunks through the array's own codecs (`_encode_sync`). A chunk
    all the fill value is not written, as zarr leaves it (unless the config writes empty
    chunks). For an unsharded array or a 1-D sharded one (a column, a positions record);
    None for another (zarr writes it)."""
    data = np.asarray(data)
    codecs = metadata.codecs
    grid = getattr(metadata.chunk_grid, "chunk_shape", None)
    if grid is None:  # a grid not regular: zarr writes it
        return None
    spec = ArraySpec(  # as zarr makes a chunk's (its metadata's; moved between releases)
        shape=tuple(grid),
        dtype=metadata.dtype,
        fill_value=metadata.fill_value,
        config=config,
        prototype=default_buffer_prototype(),
    )
    sharding = codecs[0] if isinstance(codecs[0], ShardingCodec) else None
    if sharding is not None and (len(codecs) > 1 or data.ndim != 1 or _other_layout(sharding)):
        return None
    inner = sharding.codecs if sharding is not None else codecs
    if not all(hasattr(codec, "_encode_sync") for codec in inner):
        return None
    inner_spec = sharding._get_chunk_spec(spec) if sharding is not None else spec
    fill = metadata.fill_value  # a v3 array's is always set
    files = {}
    for coord in np.ndindex(*(-(-s // g) for s, g in zip(data.shape, grid, strict=True))):
        block = _padded(data, coord, grid, fill)
        if not _stored(block, fill, config):
            continue
        if sharding is None:
            files[metadata.encode_chunk_key(coord)] = _chunk(inner, block, inner_spec)
            continue
        size, edge = sharding.chunk_shape[0], data.shape[0] - coord[0] * grid[0]
        parts = [  # a chunk wholly beyond the array's edge is never written (zarr's too)
            _chunk(inner, part, inner_spec) if i < edge and _stored(part, fill, config) else None
            for i, part in ((i, block[i : i + size]) for i in range(0, len(block), size))
        ]
        if any(part is not None for part in parts):
            files[metadata.encode_chunk_key(coord)] = pack(parts, len(sharding.index_codecs) > 1)
    return files


def _other_layout(sharding: ShardingCodec) -> bool:
    """Whether a shard is laid out otherwise than `pack` lays it out: its index first,
    index codecs other than bytes and a CRC-32C, or shards in shards."""
    index = sharding.index_codecs
    return (
        getattr(sharding.index_location, "value", sharding.index_location) != "end"
        or not isinstance(index[0], BytesCodec)
        or getattr(index[0].endian, "value", index[0].endian) != "little"
        or any(not isinstance(codec, Crc32cCodec) for codec in index[1:])
        or any(isinstance(codec, ShardingCodec) for codec in sharding.codecs)
    )


def _padded(data: np.ndarray, coord: tuple[int, ...], grid: tuple[int, ...], fill) -> np.ndarray:
    """The chunk at `coord` of `data`, beyond its edge the fill value (as zarr pads it)."""
    where = tuple(slice(c * g, (c + 1) * g) for c, g in zip(coord, grid, strict=True))
    part = data[where]
    if part.shape == tuple(grid):
        return part
    block = np.full(grid, fill, data.dtype)
    block[tuple(slice(0, s) for s in part.shape)] = part
    return block


def _stored(block: np.ndarray, fill: Any, config: ArrayConfig) -> bool:
    """Whether zarr writes `block`: not all the fill value (zarr's own test,
    `NDBuffer.all_equal`), or any where the config writes empty chunks."""
    as_buffer = default_buffer_prototype().nd_buffer.from_numpy_array(block)
    return config.write_empty_chunks or not as_buffer.all_equal(fill)


def _chunk(codecs: Any, block: np.ndarray, spec: Any) -> bytes:
    """One chunk's bytes through `codecs` (array to array, array to bytes, bytes to bytes),
    as zarr's pipeline passes it: each codec given the spec the one before resolved."""
    value = default_buffer_prototype().nd_buffer.from_numpy_array(np.ascontiguousarray(block))
    for codec in codecs:
        value = codec._encode_sync(value, spec)
        spec = codec.resolve_metadata(spec)
    return value.to_bytes()


def _decided(kwargs: dict[str, Any]) -> tuple[Any, Any, Any, dict[str, Any]]:
    """An array's metadata as zarr's `create_array` decides it (on a store in memory), its
    data (None: none), its runtime config (None: zarr's) and its documents (zarr.json).

    A cohort's groups ask for the same arrays slide after slide: each decision (its metadata
    and documents) is kept (`DECISIONS`, by every argument as its repr says it: shapes,
    codecs, attributes), and each array made is given its own copy of the metadata, with its
    own attributes (zarr changes an array's attributes in place): a copy costs a CPU some
    4 us where reading the document again cost 90."""
    kw = dict(kwargs)
    kw.pop("overwrite", None)  # nothing is there
    data = kw.pop("data", None)
    if data is not None:
        if "shape" in kw or "dtype" in kw:  # as zarr's create_array refuses them
            raise ValueError("data given with a shape or dtype: give one or the other")
        kw["shape"], kw["dtype"] = data.shape, data.dtype
    asked = repr(sorted(kw.items()))
    kept = DECISIONS.get(asked)
    if kept is None:
        metadata = sync(create_array(MemoryStore(), **kw)).metadata
        kept = metadata, metadata.to_buffer_dict(default_buffer_prototype())
        DECISIONS.put(asked, kept)
    decision, documents = kept
    metadata = copy.copy(decision)  # frozen: its fields are shared but its attributes
    object.__setattr__(metadata, "attributes", copy.deepcopy(decision.attributes))
    return metadata, data, kw.get("config"), documents


class Kept:
    """The last `most` things made, by their keys (safe on threads)."""

    def __init__(self, most: int) -> None:
        self.most = most
        self._kept: collections.OrderedDict[str, Any] = collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> Any:
        with self._lock:
            found = self._kept.get(key)
            if found is not None:
                self._kept.move_to_end(key)
            return found

    def put(self, key: str, value: Any) -> None:
        with self._lock:
            self._kept[key] = value
            self._kept.move_to_end(key)
            if len(self._kept) > self.most:
                self._kept.popitem(last=False)


# zarr's decisions (metadata, documents) by their arguments: `create_array` cost a store
# process some 10 ms of its GIL a small slide's group (bench/RESULTS.md, issue 68); kept in
# the process, bounded
DECISIONS = Kept(512)


def _all_or_first_error(results: list) -> list:
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results
