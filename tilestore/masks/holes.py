"""Holes of a binary mask, found by one labelling of what is not the mask; its closing by a
disk, as shifted ORs and ANDs.

`scipy.ndimage.binary_fill_holes` finds the outside by dilating in from the border, one
pass per pixel of distance: seconds on a 6,000 px map. A hole is a connected part of the
complement that does not reach the border, so one labelling of the complement finds every
hole at once (the same 4-connectivity, so the same result).
"""

from __future__ import annotations

import numpy as np
from scipy import ndimage


def holes(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return (labels of the complement, which labels are holes: bool per label)."""
    labels, count = ndimage.label(~mask)
    hole = np.ones(count + 1, bool)
    hole[0] = False  # the mask itself
    hole[labels[[0, -1]].ravel()] = False
    hole[labels[:, [0, -1]].ravel()] = False
    return labels, hole


def hole_sizes(labels: np.ndarray, hole: np.ndarray) -> np.ndarray:
    """Pixels in each hole (0 for labels that are not holes), counted inside each hole's
    bounding box: a bincount of the whole map would convert every label to int64 first."""
    sizes = np.zeros(hole.size, np.int64)
    boxes = ndimage.find_objects(labels)
    for index in np.flatnonzero(hole):
        sizes[index] = np.count_nonzero(labels[boxes[index - 1]] == index)
    return sizes


def fill_holes(mask: np.ndarray, max_px: int | None = None) -> np.ndarray:
    """The mask with its holes filled: every hole (equal to `ndimage.binary_fill_holes`), or
    only those of at most `max_px` pixels (larger ones are left open)."""
    if not mask.size:
        return mask
    labels, hole = holes(mask)
    if max_px is not None:
        hole &= hole_sizes(labels, hole) <= max_px
    return mask | hole[labels]


def disk_offsets(radius: int) -> list[tuple[int, int]]:
    """The (dy, dx) of a disk of `radius` (skimage's `morphology.disk`: dy^2 + dx^2 <= r^2)."""
    r = range(-radius, radius + 1)
    return [(dy, dx) for dy in r for dx in r if dy * dy + dx * dx <= radius * radius]


def close_disk(mask: np.ndarray, radius: int) -> np.ndarray:
    """`ndimage.binary_closing(mask, structure=morphology.disk(radius))`, the same pixels:
    a dilation (the OR of the mask shifted by each offset of the disk, nothing coming in from
    beyond the border), then an erosion (the AND of those shifts, beyond the border counting
    as background: scipy's border_value=0). Shifted ORs of a small disk are ~10x faster than
    scipy's per-pixel structure loop (13 offsets at radius 2: 2.5 s on a 6,238 px map)."""
    h, w = mask.shape
    offsets = disk_offsets(radius)
    if any(abs(dy) >= h or abs(dx) >= w for dy, dx in offsets):  # the disk reaches beyond
        return np.zeros_like(mask)  # every pixel's disk leaves the map: all eroded
    grown = _dilate(mask, offsets)
    out = grown.copy()
    for dy, dx in offsets:  # out[y, x] &= grown[y + dy, x + dx], False beyond the border
        out[max(-dy, 0) : h + min(-dy, 0), max(-dx, 0) : w + min(-dx, 0)] &= grown[
            max(dy, 0) : h + min(dy, 0), max(dx, 0) : w + min(dx, 0)
        ]
        if dy:  # the rows whose neighbour lies beyond the border
            out[slice(h - dy, None) if dy > 0 else slice(None, -dy)] = False
        if dx:
            out[:, slice(w - dx, None) if dx > 0 else slice(None, -dx)] = False
    return out


def _dilate(mask: np.ndarray, offsets: list[tuple[int, int]]) -> np.ndarray:
    """The OR of the mask shifted by each offset (each inside the map), nothing from beyond."""
    h, w = mask.shape
    grown = np.zeros_like(mask)
    for dy, dx in offsets:  # grown[y, x] |= mask[y - dy, x - dx]
        grown[max(dy, 0) : h + min(dy, 0), max(dx, 0) : w + min(dx, 0)] |= mask[
            max(-dy, 0) : h + min(-dy, 0), max(-dx, 0) : w + min(-dx, 0)
        ]
    return grown
