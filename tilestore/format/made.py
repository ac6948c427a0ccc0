"""Many new arrays made at once in a group just made (an embeddings group: its columns, its
batched arrays and their positions records), in one call of zarr's event loop.

zarr's `create_array`, asked for an array at a store's path, looks for a node there and
writes again the document of every group above it (an embeddings group's array: four or
five), each a file opened on the loop's thread: half of the CPU a small slide's group cost
its store process (bench/RESULTS.md, issue 68). Here each array's metadata is still decided
by zarr's own `create_array` (its checks, codecs and defaults), on a store in memory; then
every document (the metadata's own `to_buffer_dict`), and every array's data, is written to
the store concurrently: the same files, without the lookups. Each round ends whole before
its first error is raised: no write is left running while the caller removes the group.
The caller holds the group (its lock) and has just made it: nothing is at these paths.
"""

from __future__ import annotations

import asyncio
import collections
import json
import threading
from typing import Any

import zarr
from zarr.abc.store import Store
from zarr.core.array import create_array
from zarr.core.buffer import default_buffer_prototype
from zarr.core.common import ZARR_JSON
from zarr.core.group import GroupMetadata
from zarr.core.metadata.v3 import ArrayV3Metadata
from zarr.storage import MemoryStore, StorePath


async def made_new(
    store: Store, arrays: dict[str, dict[str, Any]], groups: tuple[str, ...] = ()
) -> dict[str, zarr.AsyncArray]:
    """Make `arrays` (a path from the store's root: `create_array`'s arguments, `data`
    among them where it has data) in `store`, and the new `groups` they are in (paths,
    without attributes: the groups above that are there already are left as they are);
    return the arrays, opened. The first error once every task has ended (none left
    writing while the caller removes the group)."""
    decided = _all_or_first_error(
        await asyncio.gather(*(_decided(kw) for kw in arrays.values()), return_exceptions=True)
    )
    group = GroupMetadata(zarr_format=3).to_buffer_dict(default_buffer_prototype())
    nodes = {
        **dict.fromkeys(groups, group),
        **{path: documents for path, (*_, documents) in zip(arrays, decided, strict=True)},
    }
    written = (
        store.set(f"{path}/{name}", document)
        for path, node in nodes.items()
        for name, document in node.items()
    )
    _all_or_first_error(await asyncio.gather(*written, return_exceptions=True))
    made = {
        path: zarr.AsyncArray(metadata=meta, store_path=StorePath(store, path), config=config)
        for path, (meta, _, config, _) in zip(arrays, decided, strict=True)
    }
    writes = (
        made[path].setitem(slice(None), data)
        for path, (_, data, _, _) in zip(arrays, decided, strict=True)
        if data is not None
    )
    _all_or_first_error(await asyncio.gather(*writes, return_exceptions=True))
    return made


async def _decided(kwargs: dict[str, Any]) -> tuple[Any, Any, Any, dict[str, Any]]:
    """An array's metadata as zarr's `create_array` decides it (on a store in memory), its
    data (None: none), its runtime config (None: zarr's) and its documents (zarr.json).

    A cohort's groups ask for the same arrays slide after slide: each decision's documents
    are kept (`DECISIONS`, by every argument as its repr says it: shapes, codecs,
    attributes) and the metadata read back from them, as zarr reads an array it opens: each
    array its own (zarr changes an array's attributes in place)."""
    kw = dict(kwargs)
    kw.pop("overwrite", None)  # nothing is there
    data = kw.pop("data", None)
    if data is not None:
        kw["shape"], kw["dtype"] = data.shape, data.dtype
    asked = repr(sorted(kw.items()))
    documents = DECISIONS.get(asked)
    if documents is None:
        metadata = (await create_array(MemoryStore(), **kw)).metadata
        documents = metadata.to_buffer_dict(default_buffer_prototype())
        DECISIONS.put(asked, documents)
    else:
        metadata = ArrayV3Metadata.from_dict(json.loads(documents[ZARR_JSON].to_bytes()))
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


# zarr's decisions' documents by their arguments: `create_array` cost a store process some
# 10 ms of its GIL a small slide's group (bench/RESULTS.md, issue 68); kept in the
# process, bounded
DECISIONS = Kept(512)


def _all_or_first_error(results: list) -> list:
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results
