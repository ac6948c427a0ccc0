"""The detectors' whole-slide steps: what needs more than one block (connectivity, size,
neighbours), on the bool maps, with scipy. Each takes (its map, its parameter record,
um per px, notes, the final maps of the detectors before it) and returns its final map."""

from __future__ import annotations

import math

import numpy as np
from scipy import ndimage


def rings_and_edges(lines: np.ndarray, p, mpp: float, notes: list[str], others) -> np.ndarray:
    """Bubbles: dark lines that close into rings, with what they enclose; coverslip
    edges: lines at least edge_length_um long, with a band on each side."""
    if not lines.any():
        return lines
    filled = ndimage.binary_fill_holes(lines)
    inside = filled & ~lines
    labels, count = ndimage.label(inside)
    sizes = np.bincount(labels.ravel(), minlength=count + 1)
    min_area = math.pi * (p.min_diameter_um / mpp / 2) ** 2
    keep = sizes >= min_area
    keep[0] = False
    rings = keep[labels]
    bubbles = ndimage.binary_dilation(rings, iterations=2) & filled | rings
    parts, _ = ndimage.label(lines)
    edges = np.zeros_like(lines)
    for index, box in enumerate(ndimage.find_objects(parts), start=1):
        extent = max(box[0].stop - box[0].start, box[1].stop - box[1].start) * mpp
        if extent >= p.edge_length_um:
            edges[box] |= parts[box] == index
    if edges.any():
        band = max(1, round(p.edge_band_um / mpp))
        edges = ndimage.binary_dilation(edges, iterations=band)
        notes.append("coverslip edge or long line found")
    if rings.any():
        notes.append(f"{int(keep.sum())} air bubble(s) found")
    return bubbles | edges


def large(mask: np.ndarray, p, mpp: float, notes: list[str], others) -> np.ndarray:
    """The regions of at least p.min_area_um2 (a fold is a long band, not a dense spot)."""
    labels, count = ndimage.label(mask)
    sizes = np.bincount(labels.ravel(), minlength=count + 1) * mpp * mpp
    keep = sizes >= p.min_area_um2
    keep[0] = False
    return keep[labels]


def apart(mask: np.ndarray, p, mpp: float, notes: list[str], others) -> np.ndarray:
    """The map without what lies within p.apart_um of another artefact: the strong edge of
    ink, a dark region or a bubble puts coarse-scale energy beside it that reads as blur."""
    near = np.zeros_like(mask)
    for other in others.values():
        near |= other
    if not near.any():
        return mask
    return mask & ~ndimage.binary_dilation(near, iterations=max(1, round(p.apart_um / mpp)))
