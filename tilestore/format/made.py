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
from typing import Any

import zarr
from zarr.abc.store import Store
from zarr.core.array import create_array
from zarr.core.buffer import default_buffer_prototype
from zarr.core.group import GroupMetadata
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
    prototype = default_buffer_prototype()
    group = GroupMetadata(zarr_format=3).to_buffer_dict(prototype)
    nodes = {
        **dict.fromkeys(groups, group),
        **{
            path: _documents(meta, prototype)
            for path, (meta, _, _) in zip(arrays, decided, strict=True)
        },
    }
    documents = (
        store.set(f"{path}/{name}", document)
        for path, node in nodes.items()
        for name, document in node.items()
    )
    _all_or_first_error(await asyncio.gather(*documents, return_exceptions=True))
    made = {
        path: zarr.AsyncArray(metadata=meta, store_path=StorePath(store, path), config=config)
        for path, (meta, _, config) in zip(arrays, decided, strict=True)
    }
    writes = (
        made[path].setitem(slice(None), data)
        for path, (_, data, _) in zip(arrays, decided, strict=True)
        if data is not None
    )
    _all_or_first_error(await asyncio.gather(*writes, return_exceptions=True))
    return made


async def _decided(kwargs: dict[str, Any]) -> tuple[Any, Any, Any]:
    """An array's metadata as zarr's `create_array` decides it (on a store in memory), its
    data (None: none) and its runtime config (None: zarr's). A cohort's groups ask for the
    same arrays slide after slide: each decision is kept (`DECISIONS`), by its arguments."""
    kw = dict(kwargs)
    kw.pop("overwrite", None)  # nothing is there
    data = kw.pop("data", None)
    if data is not None:
        kw["shape"], kw["dtype"] = data.shape, data.dtype
    asked = repr(sorted(kw.items()))  # every argument, as its repr says it (shapes, codecs)
    metadata = DECISIONS.get(asked)
    if metadata is None:
        metadata = (await create_array(MemoryStore(), **kw)).metadata
        DECISIONS.put(asked, metadata)
    return metadata, data, kw.get("config")


def _documents(metadata: Any, prototype: Any) -> dict[str, Any]:
    """An array's documents (zarr.json), made once for metadata kept (`DECISIONS`)."""
    key = id(metadata)
    found = DOCUMENTS.get(key)
    if found is None or found[0] is not metadata:
        found = (metadata, metadata.to_buffer_dict(prototype))
        DOCUMENTS.put(key, found)
    return found[1]


class Kept:
    """The last `most` of something made from a key, and each one's documents."""

    def __init__(self, most: int) -> None:
        self.most = most
        self._kept: collections.OrderedDict[Any, Any] = collections.OrderedDict()

    def get(self, key: Any) -> Any:
        found = self._kept.get(key)
        if found is not None:
            self._kept.move_to_end(key)
        return found

    def put(self, key: Any, value: Any) -> None:
        self._kept[key] = value
        if len(self._kept) > self.most:
            self._kept.popitem(last=False)


# zarr's decisions by their arguments (frozen metadata, shared by the arrays made alike):
# `create_array` and the documents it writes cost a store process some 10 ms of its GIL a
# small slide's group (bench/RESULTS.md, issue 68); kept in the process, bounded
DECISIONS = Kept(512)
DOCUMENTS = Kept(512)  # by the metadata's id, the metadata kept with them (ids are reused)


def _all_or_first_error(results: list) -> list:
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results
