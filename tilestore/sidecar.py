"""TIFF slides read in place: a sidecar OME-Zarr whose source levels are the slide's own tiles.

`open_slide("slide.svs")` makes `slide.svs.tilestore.zarr` beside the slide the first time
(`convert(..., in_place=True)`; or at `store=`): the store's metadata and the coarse levels
conversion adds are written, but the slide's own levels stay in it and are read from it
through `TiffTiles`: JPEG tiles that can be chunks as they are, tile by tile
(`tilestore.levels.TileSource`); other levels (NDPI strips, LZW, 16-bit channels) decoded
under each chunk as it is read (`DecodedChunks`), exactly. Everything tissue, plan and
embed write goes into the sidecar, so the slide itself is never written.

The sidecar records the slide's path, size and fingerprint (SHA-256 of its size and of every
in-place level's shape, tile size, tile offsets and byte counts: milliseconds to recompute),
checked at every open: a slide that changed, or another slide under the same name, is
refused, never paired with another slide's tissue, plans or features.
"""

from __future__ import annotations

import os
from pathlib import Path

from zarr.storage import LocalStore

from tilestore.conversion import chunk_source, convert
from tilestore.errors import StoreError
from tilestore.inplace import TiffTiles, fingerprint
from tilestore.sources import Source, open_source
from tilestore.store import is_store, open_store

SUFFIX = ".tilestore.zarr"


def sidecar_for(slide: str | os.PathLike) -> Path:
    """Where a slide's sidecar goes by default: beside it, `<name>.tilestore.zarr`."""
    slide = Path(slide)
    return slide.with_name(slide.name + SUFFIX)


def open_in_place(
    slide: str | os.PathLike, store: str | os.PathLike | None = None
) -> tuple[TiffTiles, Source]:
    """The slide's sidecar as a zarr store whose in-place levels read the slide, and the open
    slide (kept open as long as the store is used); the sidecar is made the first time (at
    `store`, else beside the slide). `tilestore.slide.open_slide` opens it as a `Slide`."""
    slide = Path(slide)
    target = Path(store) if store is not None else sidecar_for(slide)
    if not is_store(target):
        convert(slide, target, in_place=True)
    group, attrs = open_store(target)
    recorded = attrs.get("source", {})
    if "fingerprint" not in recorded:
        raise StoreError(f"{target}: a converted store, not a sidecar of {slide.name}")
    source = open_source(slide)
    try:
        levels = [int(i) for i in recorded.get("in_place", [])]
        if fingerprint(source, levels) != recorded["fingerprint"]:
            raise StoreError(
                f"{slide}: not the slide its sidecar {target} was made from "
                f"({recorded.get('path')}, {recorded.get('size')} bytes): it has changed "
                "since; remove the sidecar to make it again"
            )
        background, decoded = attrs.get("background", 255), frozenset(recorded["decoded"])
        sources = {
            str(i): chunk_source(source, i, group[str(i)], background, decoded) for i in levels
        }
    except BaseException:
        source.close()
        raise
    return TiffTiles(LocalStore(target, read_only=True), sources), source
