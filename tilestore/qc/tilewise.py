"""Quality of each tile at the resolution the model reads it: focus, tissue, light, ink.

`tile_measures` takes a batch of 8-bit RGB tiles (on the GPU in the embedding pass, beside
the model; on the CPU in tests and in the QC maps' fine pass) and returns one row of
`MEASURES` per tile, by the same colour science and the same rules as the QC maps
(`tilestore.qc.colour`, `tilestore.qc.detectors`), so the two agree where both look:

- ``blur``: the share of the tile's tissue texture in the coarse band. Total optical density
  is split into a fine band (the image less its Gaussian of `fine_um`) and a coarse one (that
  Gaussian less one of `coarse_um`); in focus, nuclei and fibres put much of the energy in
  the fine band, blur moves it to the coarse one. coarse / (fine + coarse) does not depend
  on contrast, so pale tissue is not called blurred. NaN where the tile has too little
  tissue or texture to judge.
- ``tissue_px``: the share of pixels with more total optical density than glass.
- ``brightness``: mean luminance (linear light, 0-1); ``saturation``: mean CIELAB chroma of
  the tissue (NaN without tissue).
- ``ink``: the share of the tile in marker ink colours (`PenParams`' rules);
  ``dark`` / ``bright``: the shares too dark, or too bright with stain left (`LightParams`).

The colour measures are judged on cells of `TileParams.colour_cell_um` (the maps' scale),
blur and tissue on every pixel.

No step waits on the device (no data-dependent branch), so the measures run inside a
compiled model's pass. Everything is in micrometres; `mpp` makes it pixels.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from tilestore.qc.colour import ColourTables, gaussian, hue_chroma, lab
from tilestore.qc.params import LightParams, PenParams

MEASURES = ("blur", "tissue_px", "brightness", "saturation", "ink", "dark", "bright")


@dataclass(frozen=True)
class TileParams:
    """The per-tile measures' scales and floors (thresholds on them: `TileLimits`)."""

    # the bands: below 0.75 um, and 0.75-2 um. Wider (1-4 um, the maps' bands scaled
    # down) let dense nuclei (6-10 um) fill the coarse band: a sharp real 40x tumour crop
    # read as blurred as a 0.75 um blur (bench/RESULTS.md, QC fine blur)
    fine_um: float = 0.75
    coarse_um: float = 2.0
    tissue_od: float = 0.15  # a pixel with more total OD than this is tissue, not glass
    min_tissue: float = 0.1  # blur and saturation judged only from this share of tissue on
    min_texture: float = 1e-4  # ... and this much texture energy (OD^2) in the two bands
    # the colour measures' grid: what the QC maps see (about 4 um/px), cells of a quarter
    # to half the colour rules' smoothing (pen 8 um, light 16 um). Part of the record a run
    # stores: a group measured on other cells is not resumed with these
    colour_cell_um: float = 4.0


@dataclass(frozen=True)
class TileTables:
    """What the measures need on the tiles' device, made once for a run of tiles of one
    `shape` at one `mpp` (each tensor made from host data is a copy to the device, and on
    a GPU every such copy waits for all the work queued before it: a batch's measures
    beside a model would wait for the model, every batch): the colour tables and, on a
    GPU, the blur's two Gaussians as matrices (`gaussian_matrix`, rows then columns)."""

    colour: ColourTables
    shape: tuple[int, int]
    mpp: float
    params: TileParams
    gaussians: tuple[tuple[torch.Tensor, torch.Tensor], ...] | None

    @classmethod
    def on(
        cls,
        device: torch.device | str,
        shape: tuple[int, int],
        mpp: float,
        params: TileParams = TileParams(),
    ) -> TileTables:
        device = torch.device(device)
        gaussians = None
        if device.type == "cuda":
            gaussians = tuple(
                tuple(gaussian_matrix(size, sigma, device, torch.float16) for size in shape)
                for sigma in _band_sigmas(mpp, params)
            )
        return cls(ColourTables.on(device), tuple(shape), mpp, params, gaussians)

    @classmethod
    def fitting(
        cls, tables: TileTables | None, tiles: torch.Tensor, mpp: float, params: TileParams
    ) -> TileTables:
        """`tables` if they were made for these tiles' size, `mpp` and `params`; else new."""
        if (
            tables is not None
            and tuple(tiles.shape[1:3]) == tables.shape
            and (mpp, params) == (tables.mpp, tables.params)
        ):
            return tables
        return cls.on(tiles.device, tiles.shape[1:3], mpp, params)


def tile_measures(
    tiles: torch.Tensor,
    mpp: float,
    params: TileParams = TileParams(),
    tables: TileTables | None = None,
) -> torch.Tensor:
    """(n, len(MEASURES)) float32 measures of (n, h, w, 3) uint8 tiles of `mpp` um/px.
    `tables`: the constants on the tiles' device, made once by a caller that measures
    batch after batch (without, they are made for this call).

    Blur needs every pixel; the colour measures (light, saturation, ink) are rules on
    regions of several micrometres, so they are taken on cells of `colour_cell_um` (linear
    light averaged: 8 x 8 px at 0.5 um/px), the QC maps' resolution (on an H100 the
    measures on every pixel cost as much as a ViT-S forward: bench/RESULTS.md, per-tile
    quality)."""
    tables = TileTables.fitting(tables, tiles, mpp, params)
    colour = tables.colour
    density = _density(tiles, colour)  # (n, h, w) total optical density, half precision
    blur, tissue, tissue_share = _blur(density, mpp, params, tables.gaussians)
    nan = torch.full_like(blur, math.nan)

    pool = colour_pool(min(tiles.shape[1:3]), mpp, params.colour_cell_um)
    # (n, 3, h', w') linear light of each cell, contiguous (the smoothing reads it so)
    linear = _cells(colour.linear[tiles.int()], pool).permute(0, 3, 1, 2).contiguous()
    cover = _cells(tissue, pool)  # each cell's share of tissue
    coarse = mpp * pool
    gray = (linear * colour.luma.view(1, 3, 1, 1)).sum(1)
    pen, light_p = PenParams(), LightParams()
    n, _, h, w = linear.shape
    smooth = gaussian(linear.reshape(n * 3, h, w), pen.smooth_um / coarse).view(n, 3, h, w)
    smooth_lab = lab(smooth)
    hue, chroma = hue_chroma(smooth_lab)
    ink = (smooth_lab[:, 0] < pen.black_max_l) & (chroma < pen.black_max_chroma)
    for lo, hi, min_chroma in (pen.blue, pen.green, pen.red):
        ink |= (hue >= lo) & (hue <= hi) & (chroma >= min_chroma)
    soft = gaussian(gray, light_p.smooth_um / coarse)
    dark = soft < light_p.dark
    bright = (soft > light_p.bright) & (chroma > light_p.min_chroma) & (cover > 0.5)
    weight = cover / cover.sum((1, 2), keepdim=True).clamp_min(1e-6)
    cell_chroma = hue_chroma(lab(linear))[1]
    saturation = torch.where(
        tissue_share >= params.min_tissue, (cell_chroma * weight).sum((1, 2)), nan
    )
    return torch.stack(
        [
            blur,
            tissue_share,
            gray.mean((1, 2)),
            saturation,
            ink.float().mean((1, 2)),
            dark.float().mean((1, 2)),
            bright.float().mean((1, 2)),
        ],
        dim=1,
    ).float()


def tile_blur(
    tiles: torch.Tensor,
    mpp: float,
    params: TileParams = TileParams(),
    tables: TileTables | None = None,
) -> torch.Tensor:
    """(n,) float32 `blur` of (n, h, w, 3) uint8 tiles: the first of `tile_measures`, alone
    (what the QC maps' fine pass judges cells by; the same numbers)."""
    tables = TileTables.fitting(tables, tiles, mpp, params)
    density = _density(tiles, tables.colour)
    return _blur(density, mpp, params, tables.gaussians)[0]


def _density(tiles: torch.Tensor, colour: ColourTables) -> torch.Tensor:
    """(n, h, w) total optical density of (n, h, w, 3) uint8 tiles in half precision (0.05%
    of the value: far below the measures' floors; what a GPU's matrix products take, and
    half the bytes to write and read back): the three channels' table entries added as
    they are looked up, never stored apart (nor the tiles as int: a compiled pass would
    write 4 bytes a value for its several readers). A compiled pass may keep the fp32 sum
    where it fuses the steps after, so compiled and eager measures can differ by a few
    pixels at the tissue threshold (1e-4 of `tissue_px`, on CMU-1's tiles)."""
    r, g, b = tiles.unbind(-1)
    return (colour.od[r.int()] + colour.od[g.int()] + colour.od[b.int()]).half()


def colour_pool(side: int, mpp: float, cell_um: float) -> int:
    """Pixels a side of a colour cell spans: `cell_um` at `mpp`, at most a quarter of the
    tile (at least 4 x 4 cells)."""
    return max(1, min(round(cell_um / mpp), side // 4))


def _cells(values: torch.Tensor, pool: int) -> torch.Tensor:
    """(n, h // pool, w // pool, ...) means of (n, h, w, ...) values over pool x pool cells
    (avg_pool2d's, the remainder dropped), as one reduction: a compiled pass computes
    `values` inside it instead of writing them out first."""
    n, h, w = values.shape[:3]
    rows, cols = h // pool, w // pool
    cut = values[:, : rows * pool, : cols * pool]
    return cut.reshape(n, rows, pool, cols, pool, *values.shape[3:]).mean((2, 4))


def _band_sigmas(mpp: float, params: TileParams) -> tuple[float, float]:
    """The blur's two Gaussians in pixels: `fine_um`, then what takes that to `coarse_um`
    (Gaussians compose by their variances)."""
    fine_px, coarse_px = params.fine_um / mpp, params.coarse_um / mpp
    return fine_px, math.sqrt(max(coarse_px**2 - fine_px**2, 0.0))


def _blur(density: torch.Tensor, mpp: float, params: TileParams, gaussians=None):
    """(blur (n,), tissue (n, h, w) float, tissue share (n,)) of total optical density
    (half precision: `_density`).

    With `gaussians` (matrices: on a GPU, half precision) each blur is two matrix products,
    on a GPU's tensor cores (fp32 accumulation; the blur column within 1e-3 of fp32's);
    without, two convolutions (a CPU would pay the matrices' 20 times more arithmetic).
    On an H200 the whole measures take 0.45 ms a batch of 512 this way; with cuDNN's
    grouped convolutions the blur alone took 9.7 ms (bench/RESULTS.md, "per-tile quality
    measures' cost")."""
    exact = density.float()
    tissue = (exact > params.tissue_od).float()
    tissue_share = tissue.mean((1, 2))
    if gaussians is None:
        fine_px, rest_px = _band_sigmas(mpp, params)
        g1 = blur_exact(exact, fine_px)
        g2 = blur_exact(g1, rest_px)
    else:
        g1 = blur_matrices(density.to(gaussians[0][0].dtype), *gaussians[0])
        g2 = blur_matrices(g1, *gaussians[1]).float()
        g1 = g1.float()
    # sums over the tissue, then divided by its area: one pass over the pixels
    area = tissue.sum((1, 2)).clamp_min(1.0)
    fine = ((exact - g1) ** 2 * tissue).sum((1, 2)) / area
    coarse = ((g1 - g2) ** 2 * tissue).sum((1, 2)) / area
    judged = (tissue_share >= params.min_tissue) & (fine + coarse >= params.min_texture)
    blur = torch.where(judged, coarse / (fine + coarse).clamp_min(1e-12), math.nan)
    return blur, tissue, tissue_share


def _radius(sigma: float, size: int) -> int:
    """How far a sampled Gaussian of `sigma` px reaches in images `size` px wide: 3 sigma,
    at most size - 1 (so one reflection covers every edge)."""
    return min(max(1, math.ceil(3 * sigma)), size - 1)


def blur_exact(images: torch.Tensor, sigma: float) -> torch.Tensor:
    """(n, h, w) images blurred by a sampled Gaussian of `sigma` px on the full grid (a
    band-pass is a difference of these), edges reflected: two convolutions, whatever the
    width (a kernel launch per tap would cost a GPU more than the blur)."""
    if sigma < 0.3:
        return images
    radius = _radius(sigma, min(images.shape[-2:]))
    taps = torch.arange(-radius, radius + 1, device=images.device, dtype=torch.float32)
    kernel = torch.exp(-0.5 * (taps / sigma) ** 2)
    kernel = (kernel / kernel.sum()).to(images.dtype)
    n = images.shape[0]
    # the tiles as channels of one image, each convolved alone (depthwise; a GPU blurs
    # tiles by `blur_matrices` instead: 9.7 ms here against 0.13, bench/RESULTS.md)
    out = F.pad(images[None], [radius, radius, radius, radius], mode="reflect")
    out = F.conv2d(out, kernel.view(1, 1, 1, -1).expand(n, 1, 1, -1), groups=n)
    return F.conv2d(out, kernel.view(1, 1, -1, 1).expand(n, 1, -1, 1), groups=n)[0]


def gaussian_matrix(
    size: int, sigma: float, device: torch.device | str = "cpu", dtype=torch.float32
) -> torch.Tensor:
    """(size, size) matrix m of `blur_exact`'s Gaussian along one side: out[i] = sum_j
    m[i, j] x[j], edges reflected (the identity below 0.3 px)."""
    if sigma < 0.3:
        return torch.eye(size, device=device, dtype=dtype)
    radius = _radius(sigma, size)
    taps = torch.arange(-radius, radius + 1, dtype=torch.float64)
    weights = torch.exp(-0.5 * (taps / sigma) ** 2)
    weights = (weights / weights.sum()).expand(size, -1)
    i = torch.arange(size)[:, None]
    j = (i + taps.long()[None]).abs()  # reflected at 0 ...
    j = torch.where(j >= size, 2 * (size - 1) - j, j)  # ... and at size - 1
    matrix = torch.zeros(size, size, dtype=torch.float64).scatter_add_(1, j, weights)
    return matrix.to(device=device, dtype=dtype)


def blur_matrices(images: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """(n, h, w) images blurred by `gaussian_matrix`es along their rows (h, h) and columns
    (w, w), in the images' dtype."""
    return torch.matmul(rows, torch.matmul(images, cols.t()))


@dataclass(frozen=True)
class TileLimits:
    """When a tile counts as flagged by its measures (what `summarise` counts, and the
    defaults of the filters that leave flagged tiles out). max_blur: set where, on painted
    real H&E at 0.25 and 0.5 um/px, no more than 2% of clean tissue tiles are over it
    (bench/qc.py tiles; bench/RESULTS.md). The shares: of the tile's pixels."""

    max_blur: float = 0.74
    max_ink: float = 0.05
    max_dark: float = 0.25
    max_bright: float = 0.25

    def flagged(self, values: np.ndarray, measures: list[str]) -> dict[str, np.ndarray]:
        """Per limit, which tiles (rows of `values`, columns `measures`) are over it (NaN:
        not judged, not flagged)."""
        out = {}
        for name in ("blur", "ink", "dark", "bright"):
            if name in measures:
                column = values[:, measures.index(name)]
                out[name] = np.nan_to_num(column, nan=-np.inf) > getattr(self, f"max_{name}")
        return out


def summarise(
    values: np.ndarray, measures: list[str], limits: TileLimits = TileLimits()
) -> dict[str, Any]:
    """A slide's measures in a few numbers: each one's 5th, 50th and 95th percentile over
    the tiles judged, and how many tiles each limit flags."""
    values = np.asarray(values, np.float64)
    spread = {}
    for i, name in enumerate(measures):
        column = values[:, i][np.isfinite(values[:, i])]
        found = np.percentile(column, (5, 50, 95)) if len(column) else None
        spread[name] = (
            {f"p{q}": round(float(v), 4) for q, v in zip((5, 50, 95), found, strict=True)}
            if found is not None
            else None
        )
    flagged = {name: int(mask.sum()) for name, mask in limits.flagged(values, measures).items()}
    return {"tiles": len(values), "spread": spread, "flagged": flagged, "limits": asdict(limits)}
