"""The QC maps' fine blur pass: blur too fine to see at the maps' few um/px.

Tissue is read at `FINE_MPP` (the models' 0.5 um/px; a slide scanned coarser, at its finest
level up to `FINE_LIMIT`) in cells of `CELL_UM`, and each cell is judged by the embedding
pass's own per-tile blur against the same limit (`tilestore.qc.tilewise`), so the maps and
the per-tile columns agree. Only cells the maps call tissue are read.

"full" judges every cell. "sparse" (the CPU's default: on 2 cores QC of the 40,000 px
store took 24 s with the full pass, 13 s sparse, 5 s without) first judges the middle cell
of each block of 3 x 3 cells, then every cell of the blocks found and of their neighbours:
blurred regions are mapped cell by cell where they are, at a ninth of the judging
elsewhere. Reading is most of the cost: each window of cells is read as one box or cell by
cell, whichever decodes fewer chunks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import ndimage

from tilestore.reading.resolution import MPP_TOLERANCE
from tilestore.reading.slide import Slide, resize

FINE_MPP = 0.5
FINE_LIMIT = 1.0
# 32 um cells: at 0.5 um/px, clean tissue of CMU-1, CMU-1 enlarged as a 40x scan and a real
# 40x crop none over the limit, blur of 1 um found in every cell (bench/RESULTS.md, QC blur)
CELL_UM = 32.0
SPARSE = 3  # "sparse": one cell in 3 x 3 judged first
WINDOW = 2048  # px a side of slide pixels read at once (a few MB)


@dataclass(frozen=True)
class Cells:
    """The cell grid over the maps: `size` map px a cell, `px` slide px a cell at `mpp`,
    `downsample` level-0 px per map px."""

    size: int
    px: int
    mpp: float
    downsample: tuple[float, float]

    def read(self, slide: Slide, row: int, col: int, rows: int, cols: int) -> np.ndarray:
        """(rows, cols, px, px, 3) pixels of a block of cells from cell (row, col), read as
        one region of the level and each cut at its own corner: the very pixels a read of
        that cell alone gives (cells are `size * downsample` level-0 px apart, not a whole
        number: cut `px` apart, the 20th cell of a window sat 2 px off)."""
        dy, dx = self.downsample
        xs = np.round((col + np.arange(cols)) * self.size * dx).astype(int)
        ys = np.round((row + np.arange(rows)) * self.size * dy).astype(int)
        level, sw, sh = slide.level_window(self.px, self.px, self.mpp)
        lx, ly = slide.level_corner(level, xs, ys)
        box = slide.read_region(xs[0], ys[0], lx[-1] - lx[0] + sw, ly[-1] - ly[0] + sh,
                                level=level)  # fmt: skip
        down = (ly - ly[0])[:, None, None, None] + np.arange(sh)[None, None, :, None]
        across = (lx - lx[0])[None, :, None, None] + np.arange(sw)[None, None, None, :]
        cells = box[down, across]  # (rows, cols, sh, sw, 3)
        if (sw, sh) == (self.px, self.px):
            return cells
        return np.stack([[resize(c, self.px, self.px) for c in line] for line in cells])


def fine_blur(
    slide: Slide,
    map_mpp: float,
    downsample: tuple[float, float],
    tissue_map: np.ndarray,
    device,
    notes: list[str],
    sparse: bool,
) -> np.ndarray | None:
    """The cells whose tissue is blurred, on the maps' grid (bool like `tissue_map`); None
    where the slide is scanned too coarsely to look."""
    from tilestore.qc.tilewise import TileLimits

    finest = slide.level_mpp(0)[0]
    if finest > FINE_LIMIT * (1 + MPP_TOLERANCE):
        notes.append(f"fine blur not judged: the finest level is {finest:.3g} um/px")
        return None
    mpp = max(FINE_MPP, finest)
    size = max(1, round(CELL_UM / map_mpp))
    cells = Cells(size, max(8, round(size * map_mpp / mpp)), mpp, downsample)
    rows, cols = -(-tissue_map.shape[0] // size), -(-tissue_map.shape[1] // size)
    padded = np.zeros((rows * size, cols * size), bool)
    padded[: tissue_map.shape[0], : tissue_map.shape[1]] = tissue_map
    tissue = padded.reshape(rows, size, cols, size).any(axis=(1, 3))  # per cell
    judge = _Judge(slide, cells, device, TileLimits().max_blur)
    if sparse:
        middle = np.zeros_like(tissue)
        middle[SPARSE // 2 :: SPARSE, SPARSE // 2 :: SPARSE] = True
        judge.cells(tissue & middle)
        seen = judge.over.copy()
        block = np.ones((2 * SPARSE + 1, 2 * SPARSE + 1), bool)  # a found cell's blocks
        judge.cells(tissue & ndimage.binary_dilation(seen, block) & ~middle)
    else:
        judge.cells(tissue)
    how = (f"one in {SPARSE} x {SPARSE} first, then every cell around those found"
           if sparse else "every cell")  # fmt: skip
    notes.append(
        f"fine blur: {judge.judged} of {int(tissue.sum())} tissue cells of "
        f"{size * map_mpp:.0f} um judged at {mpp:.3g} um/px ({how}), "
        f"{int(judge.over.sum())} over {judge.limit:g}"
    )
    found = np.kron(judge.over, np.ones((size, size), bool))
    return found[: tissue_map.shape[0], : tissue_map.shape[1]] & tissue_map


def spanned(start, stop, side: float):
    """How many chunks of `side` px a run of pixels [start, stop) touches (arrays too)."""
    # floor division, not floor(a / b): the quotient rounded can land on the next whole
    # number (793 / 1.3 gives 610.0; pixel 793 is in chunk 609)
    return (
        np.floor_divide(np.asarray(stop) - 1, side) - np.floor_divide(np.asarray(start), side) + 1
    )


class _Judge:
    """Cells judged so far: which are over the limit, and how many were judged."""

    def __init__(self, slide: Slide, cells: Cells, device, limit: float) -> None:
        self.slide, self.grid, self.device, self.limit = slide, cells, device, limit
        self.over: np.ndarray | None = None
        self.judged = 0
        # the chunks of the level read, in px at the cells' mpp (what a read decodes)
        level = slide.level_for_mpp(cells.mpp)
        reader = slide.chunks(level)
        scale = slide.level_mpp(level)[0] / cells.mpp
        self.chunk = (max(1.0, reader.chunk_h * scale), max(1.0, reader.chunk_w * scale))

    def _box_decodes(self, r0: int, r1: int, c0: int, c1: int) -> int:
        """Chunks decoded to read the cells [r0, r1) x [c0, c1) at once."""
        px, (ch, cw) = self.grid.px, self.chunk
        return int(spanned(r0 * px, r1 * px, ch) * spanned(c0 * px, c1 * px, cw))

    def _decodes(self, rows: np.ndarray, cols: np.ndarray) -> int:
        """Chunks decoded to read each cell (rows, cols) alone, over all of them."""
        px, (ch, cw) = self.grid.px, self.chunk
        tall = spanned(rows * px, (rows + 1) * px, ch)
        return int((tall * spanned(cols * px, (cols + 1) * px, cw)).sum())

    def cells(self, wanted: np.ndarray) -> None:
        """Judge the cells `wanted` (a bool grid of cells), reading windows of cells."""
        import torch

        from tilestore.qc.tilewise import tile_blur

        if self.over is None:
            self.over = np.zeros(wanted.shape, bool)
        step = max(1, WINDOW // self.grid.px)  # cells a window side
        for r in range(0, wanted.shape[0], step):
            for c in range(0, wanted.shape[1], step):
                part = wanted[r : r + step, c : c + step]
                if not part.any():
                    continue
                rows, cols = np.nonzero(part)
                r0, r1, c0, c1 = rows.min(), rows.max() + 1, cols.min(), cols.max() + 1
                box = self._box_decodes(r + r0, r + r1, c + c0, c + c1)
                if box <= self._decodes(r + rows, c + cols):  # no more chunks decoded at once
                    pixels = self.grid.read(self.slide, r + r0, c + c0, r1 - r0, c1 - c0)
                    batch = np.ascontiguousarray(pixels[rows - r0, cols - c0])
                else:  # scattered, in a box of mostly other chunks: each read alone
                    batch = np.stack([self.grid.read(self.slide, r + i, c + j, 1, 1)[0, 0]
                                      for i, j in zip(rows, cols, strict=True)])  # fmt: skip
                blur = tile_blur(torch.from_numpy(batch).to(self.device), self.grid.mpp)
                blur = blur.cpu().numpy()
                self.judged += int(np.isfinite(blur).sum())
                self.over[r + rows, c + cols] = np.nan_to_num(blur, nan=-np.inf) > self.limit
