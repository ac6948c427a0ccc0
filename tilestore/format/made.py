"""Many new arrays made at once in a group just made (an embeddings group: its columns, its
batched arrays and their positions records), in one call of zarr's event loop.

zarr's `create_array`, asked for an array at a store's path, looks for a node there and
writes again the document of every group above it (an embeddings group's array: four or
five), each a file opened on the loop's thread: half of the CPU a small slide's group cost
its store process (bench/RESULTS.md, issue 68). Here each array's metadata is still decided
by zarr's own `create_array` (its checks, codecs and defaults), on a store in memory; then
every document is written to the store, and every array's data, concurrently (zarr's
`create_nodes`): the same files, without the lookups. The caller holds the group (its lock)
and has just made it: nothing is at these paths.
"""

from __future__ import annotations

import asyncio
from typing import Any

import zarr
from zarr.abc.store import Store
from zarr.core.array import create_array
from zarr.core.group import GroupMetadata, create_nodes
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
    metadata = {path: meta for path, (meta, _) in zip(arrays, decided, strict=True)}
    nodes = {**dict.fromkeys(groups, GroupMetadata(zarr_format=3)), **metadata}
    async for _ in create_nodes(store=store, nodes=nodes):
        pass
    made = {
        path: zarr.AsyncArray(metadata=meta, store_path=StorePath(store, path))
        for path, meta in metadata.items()
    }
    writes = (
        made[path].setitem(slice(None), data)
        for path, (_, data) in zip(arrays, decided, strict=True)
        if data is not None
    )
    _all_or_first_error(await asyncio.gather(*writes, return_exceptions=True))
    return made


async def _decided(kwargs: dict[str, Any]) -> tuple[Any, Any]:
    """An array's metadata as zarr's `create_array` decides it (on a store in memory), and
    its data (None: none)."""
    kw = dict(kwargs)
    kw.pop("overwrite", None)  # nothing is there
    data = kw.pop("data", None)
    if data is not None:
        kw["shape"], kw["dtype"] = data.shape, data.dtype
    array = await create_array(MemoryStore(), **kw)
    return array.metadata, data


def _all_or_first_error(results: list) -> list:
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results
