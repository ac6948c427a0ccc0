"""Opening a store as a `Slide`: one made by `tilestore convert`, or a slide's in-place sidecar
(read through the slide it records). Opening never writes and never makes a store."""

from __future__ import annotations

import os
from pathlib import Path

from zarr.abc.store import Store

from tilestore.errors import StoreError
from tilestore.format.store import open_store
from tilestore.reading.inplace import open_sidecar
from tilestore.reading.slide import Slide, slide_of
from tilestore.sources.remote import is_url, shown, url_store


def open_slide(path: str | os.PathLike | Store) -> Slide:
    """Open a store (a path, a URL such as s3://bucket/x.ome.zarr read through zarr's
    FsspecStore, or any zarr v3 store object): converted, or a slide's sidecar. A slide
    file is refused, saying how to convert it or read it in place."""
    if isinstance(path, Store):
        return slide_of(path)
    if is_url(path):  # a store in a bucket: read through zarr's own FsspecStore
        return slide_of(url_store(str(path)), shown(str(path)))
    if Path(path).is_file():
        raise StoreError(
            f"{path}: a slide file, not a store: convert it (tilestore.convert) or read it in "
            "place (tilestore.open_in_place)"
        )
    group, record = open_store(path)
    if record.source.sidecar:  # its source levels are in the slide, not in the store
        return open_sidecar(None, store=path)
    return Slide(group, record, Path(path).name)
