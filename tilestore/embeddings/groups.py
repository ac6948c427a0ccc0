"""A store's embeddings groups found and opened for reading: stores named or globbed, a
group opened (absent: KeyError; damaged: one StoreError), the slide's name. What the tile
reader (`read`), the slide-vector reader (`slides`) and the exports share."""

from __future__ import annotations

import glob
import os
from pathlib import Path

import zarr
from zarr.abc.store import Store

from tilestore.embeddings.layout import GROUP
from tilestore.errors import StoreError
from tilestore.format.store import DAMAGED, STORE_SUFFIX, stored

StoreLike = str | os.PathLike | Store


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
