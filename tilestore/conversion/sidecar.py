"""TIFF slides read in place: `open_in_place` makes a slide's sidecar the first time (the only
place one is made), then opens it (`tilestore.reading.open_sidecar`).

A sidecar is an OME-Zarr store, `<slide>.tilestore.zarr` beside the slide or in a folder the
user names (`sidecars`): the store's metadata and the coarse levels conversion adds are
written (`convert(..., in_place=True)`), but the slide's own levels stay in it and are read
from it: JPEG tiles that can be chunks as they are, tile by tile; other levels (NDPI strips,
LZW, 16-bit channels) decoded under each chunk as it is read, exactly. Everything tissue,
plan and embed write goes into the sidecar, so the slide itself is never written.
"""

from __future__ import annotations

import os

from tilestore.conversion.converter import check_mpp, convert
from tilestore.format.store import is_store
from tilestore.masks.options import TissueBesideMethod
from tilestore.options import checked
from tilestore.reading import Slide
from tilestore.reading.inplace import open_sidecar, sidecar_for
from tilestore.reading.resolution import OverrideMpp, ScanMpp


@checked
def open_in_place(
    slide: str | os.PathLike,
    sidecars: str | os.PathLike | None = None,
    *,
    mpp: ScanMpp = None,
    override_mpp: OverrideMpp = False,
    tissue: TissueBesideMethod = None,
) -> Slide:
    """A TIFF slide (SVS, OME-TIFF, generic tiled TIFF, NDPI) read where it is, as a `Slide`:
    its sidecar in `sidecars` (None: beside the slide), made the first time; mpp: its
    level-0 um/px where the file records none, override_mpp: over the one it records, as
    `convert` takes them, for the sidecar made (one made before otherwise is refused, never
    read at it: `check_mpp`);
    tissue: the sidecar made is made with its tissue mask (`convert`'s tissue)."""
    target = sidecar_for(slide, sidecars)
    if not is_store(target):
        convert(slide, target, in_place=True, mpp=mpp, override_mpp=override_mpp, tissue=tissue)
    opened = open_sidecar(slide, store=target)
    check_mpp(opened, mpp, target, override_mpp)
    return opened
