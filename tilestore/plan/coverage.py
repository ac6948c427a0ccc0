"""Exact area of ROI polygons inside tile boxes: how much of each tile an annotation covers.

Pure numpy/shapely. Overlapping polygons are merged first so no area counts twice; the area
inside each box comes from Green's theorem over the polygon edges that cross it (numpy over
(edge, box) pairs found with a spatial hash), so half a million tiles against hundreds of
polygons take seconds, not the minutes of one GEOS intersection per tile.
"""

from __future__ import annotations

import numpy as np
import shapely


def roi_fractions(
    bounds: np.ndarray, rois, classes: list[str], min_roi: float = 0.0
) -> tuple[np.ndarray, np.ndarray]:
    """Return each box's overlap fraction with the ROI union and its majority class index.

    bounds: (n, 4) boxes (xmin, ymin, xmax, ymax), all the same size. Overlapping polygons
    are merged first, so no area is counted twice; areas are exact (`covered_area`). The
    class is worked out only for boxes with at least min_roi overlap.
    """
    area = (bounds[:, 2] - bounds[:, 0]) * (bounds[:, 3] - bounds[:, 1])
    parts = {
        name: disjoint_parts(rois.geometries[rois.classes == name])
        for name in classes
        if (rois.classes == name).any()
    }
    union = disjoint_parts(np.concatenate(list(parts.values())))
    total = np.minimum(covered_area(union, bounds) / area, 1.0)
    best = np.zeros(len(bounds), np.int16)
    named = [c for c in classes if c in parts]
    if len(named) == 1:
        best[total > 0] = classes.index(named[0])
    elif named:
        keep = np.flatnonzero((total >= min_roi) & (total > 0))
        by_class = np.stack([covered_area(parts[name], bounds[keep]) for name in named])
        best[keep] = [classes.index(named[i]) for i in by_class.argmax(axis=0)]
    return total.astype(np.float32), best


def disjoint_parts(geoms: np.ndarray) -> np.ndarray:
    """Return polygons covering the same area without overlaps: only overlapping ones merged."""
    parts = shapely.get_parts(geoms)
    tree = shapely.STRtree(parts)
    left, right = tree.query(parts, predicate="intersects")
    touching = np.unique(np.concatenate([left[left < right], right[left < right]]))
    if not len(touching):
        return parts
    alone = np.setdiff1d(np.arange(len(parts)), touching)
    merged = shapely.get_parts(shapely.union_all(parts[touching]))
    return np.concatenate([parts[alone], merged])


def covered_area(parts: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """Return the area of disjoint polygons inside each box (xmin, ymin, xmax, ymax), exactly.

    Green's theorem: area(P & R) = sum over P's edges clipped to R of the integral of x dy,
    plus xmax * (length of R's right side inside P) - xmin * (its left side inside P). Only
    boxes that some edge crosses need it; the rest lie wholly inside or outside P, as their
    centre does. Pure numpy over (edge, box) pairs: GEOS needs ~60 us per box for the
    intersection with a large polygon, this a few microseconds. Boxes are nudged by 1e-6 px
    so that axis-aligned ROI edges never lie exactly on a box side (the area changes by
    about 1e-6 px times the side).
    """
    n = len(bounds)
    out = np.zeros(n)
    if not len(parts) or not n:
        return out
    x0, y0, x1, y1 = (bounds[:, i] + 1e-6 for i in range(4))
    rings = shapely.get_rings(shapely.orient_polygons(parts, exterior_cw=False))
    coords, ring = shapely.get_coordinates(rings, return_index=True)
    same = ring[1:] == ring[:-1]
    a, b = coords[:-1][same], coords[1:][same]  # directed edges, interior on their left
    whole = _multipolygon(parts)
    ei, bi = _edge_box_pairs(a, b, x0, y0, float(x1[0] - x0[0]), float(y1[0] - y0[0]))
    ax, ay, bx, by = a[ei, 0], a[ei, 1], b[ei, 0], b[ei, 1]
    dx, dy = bx - ax, by - ay
    # Liang-Barsky: the part of each edge inside its box, as parameters t0 < t1.
    t0, t1 = np.zeros(len(bi)), np.ones(len(bi))
    for p, q in ((-dx, ax - x0[bi]), (dx, x1[bi] - ax), (-dy, ay - y0[bi]), (dy, y1[bi] - ay)):
        with np.errstate(divide="ignore", invalid="ignore"):
            r = q / p
        t0 = np.where(p < 0, np.maximum(t0, r), t0)
        t1 = np.where(p > 0, np.minimum(t1, r), t1)
        t0 = np.where((p == 0) & (q < 0), 1.0, t0)  # parallel and outside
    inside = t0 < t1
    xs, xe = ax + t0 * dx, ax + t1 * dx
    np.add.at(out, bi[inside], ((xs + xe) / 2 * (t1 - t0) * dy)[inside])
    crossed = np.zeros(n, bool)
    crossed[bi[inside]] = True
    # The vertical sides: length inside P = inside(bottom corner) * height + signed crossings.
    height = y1 - y0
    for side, sign in ((x1, 1.0), (x0, -1.0)):
        c = side[bi]
        straddle = (np.minimum(ax, bx) < c) & (c <= np.maximum(ax, bx))
        with np.errstate(divide="ignore", invalid="ignore"):  # vertical edges never straddle
            yc = ay + (c - ax) * dy / dx
            hit = straddle & (y0[bi] <= yc) & (yc < y1[bi])
        length = np.zeros(n)
        np.add.at(length, bi[hit], np.sign(dx[hit]) * (y1[bi][hit] - yc[hit]))
        corner = shapely.contains_xy(whole, side[crossed], y0[crossed])
        length[crossed] += corner * height[crossed]
        out += sign * side * np.where(crossed, length, 0.0)
    # Boxes no edge crosses: all in or all out, as their centre is.
    free = ~crossed
    centre_in = shapely.contains_xy(whole, (x0[free] + x1[free]) / 2, (y0[free] + y1[free]) / 2)
    out[free] = np.where(centre_in, (height * (x1 - x0))[free], 0.0)
    return out


def _edge_box_pairs(a, b, x0, y0, w: float, h: float) -> tuple[np.ndarray, np.ndarray]:
    """Return (edge, box) index pairs whose bounding boxes overlap; boxes are all w x h.

    A spatial hash with cells the size of a box: each box sits in the cell of its corner and
    reaches only into the next, so an edge can meet only boxes whose cell lies in its own
    cell range widened by one on the low side.
    """
    gx, gy = np.floor(x0 / w).astype(np.int64), np.floor(y0 / h).astype(np.int64)
    ox, oy = gx.min() - 1, gy.min() - 1
    ncol = int(gx.max() - ox) + 2
    order = np.argsort((gy - oy) * ncol + (gx - ox), kind="stable")
    keys = ((gy - oy) * ncol + (gx - ox))[order]
    lo_x, hi_x = np.minimum(a[:, 0], b[:, 0]), np.maximum(a[:, 0], b[:, 0])
    lo_y, hi_y = np.minimum(a[:, 1], b[:, 1]), np.maximum(a[:, 1], b[:, 1])
    cx0 = np.clip(np.floor(lo_x / w).astype(np.int64) - 1 - ox, 0, ncol - 1)
    cx1 = np.clip(np.floor(hi_x / w).astype(np.int64) - ox, 0, ncol - 1)
    nrow = int(gy.max() - oy) + 2
    cy0 = np.clip(np.floor(lo_y / h).astype(np.int64) - 1 - oy, 0, nrow - 1)
    cy1 = np.clip(np.floor(hi_y / h).astype(np.int64) - oy, 0, nrow - 1)
    nx = np.maximum(cx1 - cx0 + 1, 0)
    counts = nx * np.maximum(cy1 - cy0 + 1, 0)
    edge = np.repeat(np.arange(len(a)), counts)
    k = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
    cells = (cy0[edge] + k // nx[edge]) * ncol + cx0[edge] + k % nx[edge]
    start = np.searchsorted(keys, cells, "left")
    many = np.searchsorted(keys, cells, "right") - start
    pair_edge = np.repeat(edge, many)
    j = np.arange(many.sum()) - np.repeat(np.cumsum(many) - many, many)
    pair_box = order[np.repeat(start, many) + j]
    overlap = (
        (lo_x[pair_edge] <= x0[pair_box] + w)
        & (hi_x[pair_edge] >= x0[pair_box])
        & (lo_y[pair_edge] <= y0[pair_box] + h)
        & (hi_y[pair_edge] >= y0[pair_box])
    )
    return pair_edge[overlap], pair_box[overlap]


def _multipolygon(parts: np.ndarray) -> shapely.Geometry:
    geom = shapely.multipolygons(parts)
    shapely.prepare(geom)
    return geom
