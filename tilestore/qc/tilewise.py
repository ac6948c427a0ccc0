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
  the tissue pixels (NaN without tissue).
- ``ink``: the share of pixels in marker ink colours (`PenParams`' rules);
  ``dark`` / ``bright``: the shares too dark, or too bright with stain left (`LightParams`).

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
COLOUR_POOL = 4  # the colour measures' grid, in pixels of the tile


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


def tile_measures(
    tiles: torch.Tensor,
    mpp: float,
    params: TileParams = TileParams(),
    tables: ColourTables | None = None,
) -> torch.Tensor:
    """(n, len(MEASURES)) float32 measures of (n, h, w, 3) uint8 tiles of `mpp` um/px.
    `tables`: the colour constants on the tiles' device, made once by a caller that
    measures batch after batch (without, they are made for this call).

    Blur needs every pixel; the colour measures (light, saturation, ink) are rules on
    regions of several micrometres, so they are taken on a grid `COLOUR_POOL` times
    coarser (linear light averaged: 2 um cells at 0.5 um/px), at a sixteenth of the work
    (on an H100 the measures on every pixel cost as much as a ViT-S forward:
    bench/RESULTS.md, per-tile quality)."""
    tables = tables if tables is not None else ColourTables.on(tiles.device)
    index = tiles.int()
    density = tables.od[index].sum(-1)  # (n, h, w) total optical density
    blur, tissue, tissue_share = _blur(density, mpp, params)
    nan = torch.full_like(blur, math.nan)

    pool = COLOUR_POOL if min(tiles.shape[1:3]) >= 4 * COLOUR_POOL else 1
    linear = F.avg_pool2d(tables.linear[index].permute(0, 3, 1, 2), pool)  # (n, 3, h', w')
    cover = F.avg_pool2d(tissue[:, None], pool)[:, 0]  # each cell's share of tissue
    coarse = mpp * pool
    gray = (linear * tables.luma.view(1, 3, 1, 1)).sum(1)
    pen, light_p = PenParams(), LightParams()
    n, _, h, w = linear.shape
    smooth = gaussian(linear.reshape(n * 3, h, w), pen.smooth_um / coarse).view(n, 3, h, w)
    smooth_lab = lab(smooth, tables)
    hue, chroma = hue_chroma(smooth_lab)
    ink = (smooth_lab[:, 0] < pen.black_max_l) & (chroma < pen.black_max_chroma)
    for lo, hi, min_chroma in (pen.blue, pen.green, pen.red):
        ink |= (hue >= lo) & (hue <= hi) & (chroma >= min_chroma)
    soft = gaussian(gray, light_p.smooth_um / coarse)
    dark = soft < light_p.dark
    bright = (soft > light_p.bright) & (chroma > light_p.min_chroma) & (cover > 0.5)
    weight = cover / cover.sum((1, 2), keepdim=True).clamp_min(1e-6)
    cell_chroma = hue_chroma(lab(linear, tables))[1]
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


def tile_blur(tiles: torch.Tensor, mpp: float, params: TileParams = TileParams()) -> torch.Tensor:
    """(n,) float32 `blur` of (n, h, w, 3) uint8 tiles: the first of `tile_measures`, alone
    (what the QC maps' fine pass judges cells by; the same numbers)."""
    od = ColourTables.on(tiles.device).od
    return _blur(od[tiles.int()].sum(-1), mpp, params)[0]


def _blur(density: torch.Tensor, mpp: float, params: TileParams):
    """(blur (n,), tissue (n, h, w) float, tissue share (n,)) of total optical density."""
    tissue = (density > params.tissue_od).float()
    tissue_share = tissue.mean((1, 2))
    fine_px, coarse_px = params.fine_um / mpp, params.coarse_um / mpp
    g1 = blur_exact(density, fine_px)
    g2 = blur_exact(g1, math.sqrt(max(coarse_px**2 - fine_px**2, 0.0)))
    weight = tissue / tissue.sum((1, 2), keepdim=True).clamp_min(1.0)
    fine = ((density - g1) ** 2 * weight).sum((1, 2))
    coarse = ((g1 - g2) ** 2 * weight).sum((1, 2))
    judged = (tissue_share >= params.min_tissue) & (fine + coarse >= params.min_texture)
    blur = torch.where(judged, coarse / (fine + coarse).clamp_min(1e-12), math.nan)
    return blur, tissue, tissue_share


def blur_exact(images: torch.Tensor, sigma: float) -> torch.Tensor:
    """(n, h, w) images blurred by a sampled Gaussian of `sigma` px on the full grid (a
    band-pass is a difference of these), edges reflected: two convolutions, whatever the
    width (a kernel launch per tap would cost a GPU more than the blur)."""
    if sigma < 0.3:
        return images
    radius = min(max(1, math.ceil(3 * sigma)), min(images.shape[-2:]) - 1)
    taps = torch.arange(-radius, radius + 1, device=images.device, dtype=torch.float32)
    kernel = torch.exp(-0.5 * (taps / sigma) ** 2)
    kernel = (kernel / kernel.sum()).to(images.dtype)
    n = images.shape[0]
    # the tiles as channels of one image, each convolved alone (depthwise): on an H100
    # twice as fast as a batch of one-channel images (1.6 vs 3.5 ms for 512 tiles)
    out = F.pad(images[None], [radius, radius, radius, radius], mode="reflect")
    out = F.conv2d(out, kernel.view(1, 1, 1, -1).expand(n, 1, 1, -1), groups=n)
    return F.conv2d(out, kernel.view(1, 1, -1, 1).expand(n, 1, -1, 1), groups=n)[0]


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
        spread[name] = (
            {f"p{q}": round(float(np.percentile(column, q)), 4) for q in (5, 50, 95)}
            if len(column)
            else None
        )
    flagged = {name: int(mask.sum()) for name, mask in limits.flagged(values, measures).items()}
    return {"tiles": len(values), "spread": spread, "flagged": flagged, "limits": asdict(limits)}
