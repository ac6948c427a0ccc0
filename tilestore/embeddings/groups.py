"""A store's embeddings groups found and opened for reading: stores named or globbed, a
group opened (absent: KeyError; damaged: one StoreError), the slide's name. What the tile
reader (`read`), the slide-vector reader (`slides`) and the exports share."""

from __future__ import annotations

import glob
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import zarr
from zarr.abc.store import Store

from tilestore.embeddings.layout import GROUP, group_name
from tilestore.errors import StoreError, TilestoreWarning
from tilestore.format.store import DAMAGED, STORE_SUFFIX, stored

StoreLike = str | os.PathLike | Store
T = TypeVar("T")


def list_embeddings(store: StoreLike) -> list[str]:
    """Names of the embeddings groups in a store (complete or not)."""
    root = open_group(store, "")
    with stored(store, GROUP, f"remove {GROUP} and embed the store again"):
        try:
            return sorted(name for name, _ in root[GROUP].groups())
        except KeyError:
            return []


class NotEmbedded(StoreError):
    """A store without this model's finished embeddings (absent or unfinished)."""


def expand_stores(stores) -> list[tuple[StoreLike, bool]]:
    """(store, whether a glob pattern found it) for each store given: a store, a list of
    stores, or glob patterns ("stores/*.ome.zarr"; one that finds nothing is an error)."""
    if isinstance(stores, Store | str | os.PathLike):
        stores = [stores]
    out: list[tuple[StoreLike, bool]] = []
    for s in stores:
        if isinstance(s, str) and glob.has_magic(s):
            found = sorted(glob.glob(s))
            if not found:
                raise StoreError(f"{s}: no store matches this pattern")
            out.extend((f, True) for f in found)
        else:
            out.append((s, False))
    if not out:
        raise StoreError("no stores given")
    return out


def read_each(stores, read: Callable[[StoreLike], T], skip_missing: bool, nothing: str) -> list[T]:
    """read(store) for each store given (`expand_stores`). A store without what is read
    (NotEmbedded) is left out with a warning where skip_missing or a glob pattern found it,
    and raised where it was named; StoreError "<nothing> in <n> store(s)" where none is left."""
    found, skipped = [], []
    given = expand_stores(stores)
    for store, globbed in given:
        try:
            found.append(read(store))
        except NotEmbedded as exc:
            if not (skip_missing or globbed):
                raise
            skipped.append(str(exc))
    for reason in skipped:
        warnings.warn(f"skipped: {reason}", TilestoreWarning, stacklevel=3)
    if not found:
        raise StoreError(f"{nothing} in {len(given)} store(s)")
    return found


def refuse_shared_names(names: list[str]) -> None:
    """A cohort's slides are told apart by name: two stores of one name are refused."""
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise StoreError(f"two stores share the slide name {dup[0]!r}: rename one of them")


def open_finished(store: StoreLike, model: str) -> tuple[zarr.Group, str, dict]:
    """A store's finished embeddings group of `model`: (the group, its path, its tilestore
    attributes). StoreError where the store is absent or the group damaged; NotEmbedded
    where the group is absent or unfinished (how far it got)."""
    if not isinstance(store, Store) and not (Path(store) / "zarr.json").exists():
        raise StoreError(f"{store}: no such store")
    path = group_name(model)
    try:
        group = open_group(store, path)
    except KeyError:
        have = ", ".join(list_embeddings(store)) or "none"
        raise NotEmbedded(
            f"{store}: no {path} (embeddings in this store: {have}); embed the store "
            f"with model={model!r} first"
        ) from None
    with stored(store, path, f"embed the store again with overwrite=True (or remove {path})"):
        meta = group.attrs.get("tilestore", {})
        if not meta.get("complete"):
            done = group["done"][:]
            raise NotEmbedded(
                f"{store}: {path} is unfinished ({int(done.sum())} of {len(done)} batches); "
                "rerun the same `tilestore embed` command to finish it"
            )
    return group, path, meta


def open_group(store: StoreLike, path: str) -> zarr.Group:
    """A group of the store: KeyError where `path` is absent, StoreError where it is damaged."""
    where = store if isinstance(store, Store) else Path(store)
    try:
        return zarr.open_group(where, path=path, mode="r", zarr_format=3, use_consolidated=False)
    except (FileNotFoundError, KeyError, zarr.errors.GroupNotFoundError) as exc:
        if path:
            raise KeyError(path) from exc
        raise StoreError(f"{store}: not a tilestore store ({exc})") from exc
    except DAMAGED as exc:
        what = path or "the store's root"
        raise StoreError(
            f"{store}: {what} is damaged ({type(exc).__name__}: {exc})"
            + (f"; embed the store again with overwrite=True (or remove {path})" if path else "")
        ) from exc


def slide_name(store: StoreLike) -> str:
    if isinstance(store, Store):
        source = (open_group(store, "").attrs.get("tilestore") or {}).get("source", {})
        return Path(source.get("name") or str(store)).stem
    name = Path(store).name
    return name[: -len(STORE_SUFFIX)] if name.endswith(STORE_SUFFIX) else name
