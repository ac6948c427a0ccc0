"""The detectors' whole-slide steps: what needs more than one block (connectivity, size,
neighbours), on the bool maps, with scipy. Each takes (its map, its parameter record,
um per px, notes, the final maps of the detectors before it) and returns its final map."""

from __future__ import annotations

import math

import numpy as np
from scipy import ndimage

from tilestore.masks.holes import hole_sizes, holes


def rings_and_edges(lines: np.ndarray, p, mpp: float, notes: list[str], others) -> np.ndarray:
    """Bubbles: dark lines that close into rings, with what they enclose; coverslip
    edges: lines at least edge_length_um long, with a band on each side."""
    if not lines.any():
        return lines
    labels, enclosed = holes(lines)
    min_area = math.pi * (p.min_diameter_um / mpp / 2) ** 2
    keep = enclosed & (hole_sizes(labels, enclosed) >= min_area)
    bubbles = np.zeros_like(lines)
    if keep.any():
        rings = keep[labels]
        filled = lines | enclosed[labels]
        bubbles = ndimage.binary_dilation(rings, iterations=2) & filled | rings
        notes.append(f"{int(keep.sum())} air bubble(s) found")
    parts, _ = ndimage.label(lines)
    boxes = ndimage.find_objects(parts)
    extent = np.array([max(b[0].stop - b[0].start, b[1].stop - b[1].start) for b in boxes])
    edges = np.zeros_like(lines)
    for index in np.flatnonzero(extent * mpp >= p.edge_length_um) + 1:
        box = boxes[index - 1]
        edges[box] |= parts[box] == index
    if edges.any():
        band = max(1, round(p.edge_band_um / mpp))
        edges = ndimage.binary_dilation(edges, iterations=band)
        notes.append("coverslip edge or long line found")
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
