"""Tile plans: a regular grid at a target resolution, kept by tissue and ROI overlap.

Pure numpy/shapely functions, no I/O. A tile is read from one store level as a square
window of `read` level pixels and resampled to `tile` output pixels, so its footprint is
exact to within a pixel of that level; the effective mpp this gives is recorded. Tiles are
in raster order (row, then column), the order in which chunk rows can be streamed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import shapely

from tilestore.errors import PlanError


@dataclass(frozen=True)
class GridSpec:
    """Where a plan's tiles come from: a level, a footprint and a stride in its pixels."""

    level: int
    downsample: tuple[float, float]  # (dy, dx) level-0 pixels per level pixel
    level_shape: tuple[int, int]  # (height, width) of the level
    tile: int  # output tile side, px
    stride: int  # output px between neighbouring tiles
    read: int  # footprint side in level px
    read_stride: int  # stride in level px
    mpp: float | None  # requested um/px (None: level pixels, no pixel size known)
    effective_mpp: float | None  # level mpp * read / tile: what the pixels really are

    @property
    def grid(self) -> tuple[int, int]:
        """(rows, cols) of the full grid: every window that lies wholly inside the level."""
        h, w = self.level_shape
        rows = (h - self.read) // self.read_stride + 1 if h >= self.read else 0
        cols = (w - self.read) // self.read_stride + 1 if w >= self.read else 0
        return rows, cols

    @property
    def footprint0(self) -> tuple[float, float]:
        """(h, w) of a tile's footprint in level-0 pixels."""
        return self.read * self.downsample[0], self.read * self.downsample[1]


def grid_spec(
    level: int,
    downsample: tuple[float, float],
    level_shape: tuple[int, int],
    level_mpp: float | None,
    mpp: float | None,
    tile: int,
    stride: int | None = None,
    tolerance: float = 0.02,
    notes: list[str] | None = None,
) -> GridSpec:
    """Return the grid for `tile`-px tiles at `mpp` read from a level of `level_mpp` um/px.

    Within `tolerance` the level is used as is (no resampling) and the note says so; otherwise
    the footprint is the nearest whole number of level pixels covering tile * mpp um.
    """
    stride = stride or tile
    if tile < 8 or stride < 1:
        raise PlanError(f"tile must be at least 8 px and stride at least 1 (got {tile}, {stride})")
    if mpp is None or level_mpp is None:
        return GridSpec(level, downsample, level_shape, tile, stride, tile, stride, None, level_mpp)
    ratio = mpp / level_mpp
    if abs(ratio - 1) <= tolerance:
        read, read_stride = tile, stride
        if notes is not None and ratio != 1:
            notes.append(
                f"level {level} ({level_mpp:.4g} um/px) used for {mpp:g} um/px without "
                f"resampling ({(ratio - 1) * 100:+.2f}%, within tolerance "
                f"{tolerance * 100:g}%)"
            )
    else:
        read, read_stride = round(tile * ratio), max(1, round(stride * ratio))
        if notes is not None:
            notes.append(
                f"level {level} ({level_mpp:.4g} um/px) read as {read} px windows "
                f"resampled to {tile} px"
            )
    return GridSpec(
        level,
        downsample,
        level_shape,
        tile,
        stride,
        read,
        read_stride,
        mpp,
        level_mpp * read / tile,
    )


@dataclass
class TilePlan:
    """The tiles to embed: positions, grid indices, tissue and ROI fractions, chunks needed."""

    name: str
    spec: GridSpec
    row: np.ndarray  # int32 grid row
    col: np.ndarray  # int32 grid column
    tissue: np.ndarray  # float32 tissue fraction of the footprint
    roi: np.ndarray  # float32 ROI overlap fraction (1 where no ROI was given)
    roi_class: np.ndarray  # int16 index into classes (0 = none)
    classes: list[str] = field(default_factory=lambda: [""])
    chunk_shape: tuple[int, int] = (256, 256)  # (h, w) of the level's chunks
    params: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.row)

    @property
    def level_y(self) -> np.ndarray:
        """Top row of each footprint, in level pixels."""
        return self.row.astype(np.int64) * self.spec.read_stride

    @property
    def level_x(self) -> np.ndarray:
        """Left column of each footprint, in level pixels."""
        return self.col.astype(np.int64) * self.spec.read_stride

    @property
    def x(self) -> np.ndarray:
        """Left edge of each tile in level-0 pixels (origin top left)."""
        return np.round(self.level_x * self.spec.downsample[1]).astype(np.int64)

    @property
    def y(self) -> np.ndarray:
        """Top edge of each tile in level-0 pixels (y down)."""
        return np.round(self.level_y * self.spec.downsample[0]).astype(np.int64)

    def footprint0(self) -> tuple[float, float]:
        """(h, w) of a tile's footprint in level-0 pixels."""
        return self.spec.footprint0

    @property
    def chunk_rows(self) -> np.ndarray:
        """(n, 2) first and last chunk row each tile needs."""
        ch = self.chunk_shape[0]
        return np.stack([self.level_y // ch, (self.level_y + self.spec.read - 1) // ch], axis=1)

    @property
    def chunk_cols(self) -> np.ndarray:
        """(n, 2) first and last chunk column each tile needs."""
        cw = self.chunk_shape[1]
        return np.stack([self.level_x // cw, (self.level_x + self.spec.read - 1) // cw], axis=1)

    def needed_chunks(self) -> np.ndarray:
        """Unique (chunk row, chunk col) pairs the plan reads, in raster order."""
        return chunks_of(self.chunk_rows, self.chunk_cols)


def chunks_of(rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """Unique (row, col) chunks covered by inclusive (n, 2) row and column ranges, raster order."""
    keys = chunk_keys(rows, cols)
    return np.stack([keys >> 32, keys & 0xFFFFFFFF], axis=1)


def chunk_keys(rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """Sorted unique chunk keys (row << 32 | col) covered by the ranges: 1-D, cheap to set-op."""
    return np.unique(tile_chunk_keys(rows, cols)[1])


def tile_chunk_keys(rows: np.ndarray, cols: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(tile index, chunk key) for every chunk each tile's inclusive ranges cover."""
    if not len(rows):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    span_r = int((rows[:, 1] - rows[:, 0]).max()) + 1
    span_c = int((cols[:, 1] - cols[:, 0]).max()) + 1
    dr, dc = np.meshgrid(np.arange(span_r), np.arange(span_c), indexing="ij")
    r = rows[:, :1] + dr.ravel()[None, :]
    c = cols[:, :1] + dc.ravel()[None, :]
    inside = (r <= rows[:, 1:]) & (c <= cols[:, 1:])
    tile = np.broadcast_to(np.arange(len(rows))[:, None], inside.shape)[inside]
    return tile, (r[inside].astype(np.int64) << 32) | c[inside].astype(np.int64)


def make_plan(
    spec: GridSpec,
    *,
    name: str,
    chunk_shape: tuple[int, int],
    tissue: np.ndarray | None = None,
    tissue_downsample: tuple[float, float] = (1, 1),
    min_tissue: float = 0.5,
    rois=None,
    min_roi: float = 0.5,
    params: dict | None = None,
    notes: list[str] | None = None,
) -> TilePlan:
    """Return the plan: grid windows kept where tissue >= min_tissue and ROI >= min_roi.

    tissue: boolean mask, one pixel = tissue_downsample (dy, dx) level-0 pixels.
    rois: `Annotations` (level-0 pixel polygons with classes) or None.
    """
    rows, cols = spec.grid
    notes = list(notes or [])
    r, c = np.meshgrid(
        np.arange(rows, dtype=np.int32), np.arange(cols, dtype=np.int32), indexing="ij"
    )
    r, c = r.ravel(), c.ravel()
    fh, fw = spec.footprint0
    y0 = r * (spec.read_stride * spec.downsample[0])
    x0 = c * (spec.read_stride * spec.downsample[1])
    classes = [""]
    if rois is not None:  # the ROI bounding box limits the grid before any geometry work
        xmin, ymin, xmax, ymax = rois.bounds()
        near = (x0 < xmax) & (x0 + fw > xmin) & (y0 < ymax) & (y0 + fh > ymin)
        r, c, x0, y0 = r[near], c[near], x0[near], y0[near]
    frac = np.ones(len(r), np.float32)
    if tissue is not None:
        frac = tissue_fractions(tissue, tissue_downsample, y0, x0, fh, fw)
        keep = frac >= min_tissue
        r, c, x0, y0, frac = r[keep], c[keep], x0[keep], y0[keep], frac[keep]
    roi = np.ones(len(r), np.float32)
    roi_class = np.zeros(len(r), np.int16)
    if rois is not None:
        classes = ["", *rois.class_names] if "" not in rois.class_names else rois.class_names
        bounds = np.stack([x0, y0, x0 + fw, y0 + fh], axis=1).astype(np.float64)
        roi, roi_class = roi_fractions(bounds, rois, classes, min_roi)
        keep = roi >= min_roi
        r, c, frac, roi, roi_class = r[keep], c[keep], frac[keep], roi[keep], roi_class[keep]
    return TilePlan(
        name,
        spec,
        r,
        c,
        frac,
        roi,
        roi_class,
        classes,
        tuple(chunk_shape),
        dict(params or {}),
        notes,
    )


def tissue_fractions(
    mask: np.ndarray,
    mask_downsample: tuple[float, float],
    y0: np.ndarray,
    x0: np.ndarray,
    h: float,
    w: float,
) -> np.ndarray:
    """Return the exact fraction of each level-0 box covered by the mask (outside counts 0).

    The mask's integral from the origin to (y, x) is needed only at the boxes' corner
    coordinates: prefix sums at those columns, then at those rows (one pass over the mask
    each, via reduceat), with the fractional edge pixel added in proportion.
    """
    dy, dx = mask_downsample
    ya, yb = y0 / dy, (y0 + h) / dy
    xa, xb = x0 / dx, (x0 + w) / dx
    xs, xi = np.unique(np.concatenate([xa, xb]), return_inverse=True)
    ys, yi = np.unique(np.concatenate([ya, yb]), return_inverse=True)
    columns = _prefix(mask.astype(np.uint8, copy=False), xs, axis=1)  # (H, len(xs))
    table = _prefix(columns, ys, axis=0)  # (len(ys), len(xs)): integral to (y, x)
    n = len(y0)
    ia, ib, ja, jb = yi[:n], yi[n:], xi[:n], xi[n:]
    inside = table[ib, jb] - table[ia, jb] - table[ib, ja] + table[ia, ja]
    return np.clip(inside / ((yb - ya) * (xb - xa)), 0, 1).astype(np.float32)


def _prefix(values: np.ndarray, at: np.ndarray, axis: int) -> np.ndarray:
    """Return sums of `values` along `axis` from 0 to each (fractional) coordinate in `at`."""
    size = values.shape[axis]
    at = np.clip(at, 0, size)
    whole = np.floor(at).astype(np.int64)
    starts = np.unique(whole[(whole > 0) & (whole < size)])
    segments = np.add.reduceat(values, np.concatenate([[0], starts]), axis=axis, dtype=np.float64)
    cumulative = np.cumsum(segments, axis=axis)
    # prefix(k) for each starting break k: the cumulative sum of the segments before it
    zero_shape = list(cumulative.shape)
    zero_shape[axis] = 1
    prefix_at_break = np.concatenate([np.zeros(zero_shape), cumulative], axis=axis)
    slot = np.searchsorted(np.concatenate([[0], starts, [size]]), np.minimum(whole, size))
    result = np.take(prefix_at_break, slot, axis=axis)
    frac = at - whole
    partial = (whole < size) & (frac > 0)
    if partial.any():
        edge = np.take(values, np.minimum(whole, size - 1), axis=axis).astype(np.float64)
        shape = [1, 1]
        shape[axis] = len(at)
        result = result + edge * np.where(partial, frac, 0.0).reshape(shape)
    return result


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
