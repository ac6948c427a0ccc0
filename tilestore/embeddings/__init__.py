"""Embeddings in stores: the format (`layout`), its writer and its reader, in one place.

>>> ds = tilestore.open_embeddings("stores/*.ome.zarr", "uni")   # read: lazy xarray
>>> writer = EmbeddingWriter(slide, plan, uid, model, batch_size=512, dtype="float16",
...                          settings={...})                      # write: batch by batch

The reader is loaded on first use: it imports dask and xarray (and so pandas), a second of
every `embed` process's start that writing never needs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from tilestore.embeddings.layout import COORDS, GROUP, group_name
from tilestore.embeddings.write import AlreadyComplete, EmbeddingError, EmbeddingWriter

_READ = ("list_embeddings", "open_embeddings")

__all__ = [
    "COORDS",
    "GROUP",
    "AlreadyComplete",
    "EmbeddingError",
    "EmbeddingWriter",
    "group_name",
    "list_embeddings",
    "open_embeddings",
]


def __getattr__(name: str):
    if name in _READ:
        return getattr(importlib.import_module("tilestore.embeddings.read"), name)
    raise AttributeError(f"module 'tilestore.embeddings' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


if TYPE_CHECKING:
    from tilestore.embeddings.read import list_embeddings, open_embeddings
