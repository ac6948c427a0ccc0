"""The tile grid: a regular grid at a target resolution, its tiles kept by tissue and ROI.

Pure numpy functions, no I/O: `tilestore.plan.plans` makes and stores a slide's plan with them,
`tilestore.plan.coverage` measures ROI overlap. A tile is read from one store level as a square
window of `read` level pixels and resampled to `tile` output pixels, so its footprint is
exact to within a pixel of that level; the effective mpp this gives is recorded. Tiles are
in raster order (row, then column), the order in which chunk rows can be streamed.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from tilestore.errors import PlanError
from tilestore.plan.coverage import roi_fractions


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
    *,
    tolerance: float,
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
    """The tiles to embed: positions, grid indices, tissue and ROI fractions, the share of
    each QC artefact (where the store has QC), chunks needed."""

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
    qc: dict[str, np.ndarray] = field(default_factory=dict)  # artefact -> float32 share

    def __len__(self) -> int:
        return len(self.row)

    def subset(self, keep: np.ndarray) -> TilePlan:
        """The plan of the tiles `keep` selects (a bool mask or indices), in their order."""
        return replace(
            self,
            row=self.row[keep],
            col=self.col[keep],
            tissue=self.tissue[keep],
            roi=self.roi[keep],
            roi_class=self.roi_class[keep],
            qc={name: share[keep] for name, share in self.qc.items()},
        )

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
    min_tissue: float,
    rois=None,
    min_roi: float,
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
    # a mask's bytes summed as int32 (exact: at most 255 x 2**23), 2.5x faster than
    # float64, and the same float64 sums after the cumsum (integers below 2**53)
    small = values.dtype.kind in "bu" and values.dtype.itemsize == 1 and size < 2**23
    segments = np.add.reduceat(
        values,
        np.concatenate([[0], starts]),
        axis=axis,
        dtype=np.int32 if small else np.float64,
    )
    cumulative = np.cumsum(segments, axis=axis, dtype=np.float64)
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
