"""How an export's file reaches its place: written under a temporary name beside the target
and renamed when whole, so a failed export never leaves a file that looks whole.

The QuPath GeoJSON and AnnData exports write through `write_whole`; the OME-TIFF, HDF5 and
heatmap PNG writers rename their own partial files the same way.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


def write_whole(path: str | os.PathLike, write: Callable[[Path], object]) -> Path:
    """`write(tmp)` to ``.partial-<name>`` beside `path`, then renamed onto it; the path."""
    path = Path(path)
    tmp = path.with_name(f".partial-{path.name}")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


@dataclass(frozen=True)
class Exported:
    """What an export command wrote, said in lines for its user (one a file, mostly)."""

    lines: tuple[str, ...]
