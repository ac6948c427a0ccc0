"""The artefact detectors: one small function per artefact, its parameter record in
`tilestore.qc.params`.

Each detector takes a block's `Pixels`, its tissue mask (bool, same grid), its parameters
and the slide's `StainStats`, and returns a bool map of the block. Every length is in
micrometres, so a detector means the same at any QC resolution; thresholds are documented
on the parameter records. `DETECTORS` follows `tilestore.qc.classes` (label order).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from tilestore.qc import whole
from tilestore.qc.classes import ARTEFACTS
from tilestore.qc.colour import (
    Pixels,
    closing,
    dilate,
    gaussian,
    hue_chroma,
    opening,
)
from tilestore.qc.params import (
    BlurParams,
    BubbleParams,
    FoldParams,
    LightParams,
    PenParams,
    StainParams,
    StainStats,
)


def pen(px: Pixels, tissue: torch.Tensor, p: PenParams, stats: StainStats) -> torch.Tensor:
    lab = px.smooth_lab(p.smooth_um)
    hue, chroma = hue_chroma(lab)
    ink = (lab[0] < p.black_max_l) & (chroma < p.black_max_chroma)
    for lo, hi, min_chroma in (p.blue, p.green, p.red):
        ink |= (hue >= lo) & (hue <= hi) & (chroma >= min_chroma)
    return opening(ink, round(px.px(p.min_width_um) / 2))


def blur(px: Pixels, tissue: torch.Tensor, p: BlurParams, stats: StainStats) -> torch.Tensor:
    density = px.od_sum
    g1 = px.smooth("od_sum", p.fine_um)
    g2 = gaussian(g1, (px.px(p.coarse_um) ** 2 - px.px(p.fine_um) ** 2) ** 0.5, exact=True)
    window = px.px(p.window_um)
    # exact blurs: the ratio sits near max_ratio over much normal tissue, and the coarse
    # grid's small error moves which regions cross it
    fine = gaussian((density - g1) ** 2, window, exact=True)
    coarse = gaussian((g1 - g2) ** 2, window, exact=True)
    ratio = fine / (fine + coarse + 1e-12)
    judged = ((fine + coarse) >= p.min_energy) & tissue
    found = opening((ratio < p.max_ratio) & judged, round(px.px(p.min_width_um) / 2))
    # the window lets a sharp neighbour's texture leak in at a blurred region's rim: grow
    # what was found by one window into tissue that is still soft there (hysteresis)
    return found | (dilate(found, round(window)) & (ratio < p.grow_ratio) & tissue)


def fold(px: Pixels, tissue: torch.Tensor, p: FoldParams, stats: StainStats) -> torch.Tensor:
    sigma = px.px(p.smooth_um)
    density = px.smooth("od_sum", p.smooth_um) / max(stats.od_median, 1e-3)
    eosin = px.smooth("stains", p.smooth_um)[1]
    z = (eosin - stats.e_median) / max(stats.e_scale, 1e-3)
    dense = (density > p.factor) & (z > p.min_eosin_z)
    dense = closing(dense, round(px.px(p.close_um) / 2)) & tissue
    found = opening(dense, round(px.px(p.min_width_um) / 2))
    weak = (density > p.grow_factor) & (z > p.grow_eosin_z) & tissue
    return found | (dilate(found, round(sigma)) & weak)


def bubble(px: Pixels, tissue: torch.Tensor, p: BubbleParams, stats: StainStats) -> torch.Tensor:
    """The lines only; `tilestore.qc.whole.rings_and_edges` fills rings and bands edges
    over the whole slide (that needs connectivity beyond a block)."""
    dark = px.gray < p.max_gray
    dark_grey = dark & (px.chroma_where(dark) < p.max_chroma)
    # thin: what an opening of line_um removes (wide dark grey is ink or debris, not a rim)
    lines = dark_grey & ~opening(dark_grey, max(1, round(px.px(p.line_um) / 2)))
    return closing(lines, 1)


def dark(px: Pixels, tissue: torch.Tensor, p: LightParams, stats: StainStats) -> torch.Tensor:
    light = px.smooth("gray", p.smooth_um)
    return opening((light < p.dark) & tissue, round(px.px(p.min_width_um) / 2))


def bright(px: Pixels, tissue: torch.Tensor, p: LightParams, stats: StainStats) -> torch.Tensor:
    light = px.smooth("gray", p.smooth_um)
    pale = (light > p.bright) & (px.smooth_chroma(p.smooth_um) > p.min_chroma) & tissue
    return opening(pale, round(px.px(p.min_width_um) / 2))


def stain(px: Pixels, tissue: torch.Tensor, p: StainParams, stats: StainStats) -> torch.Tensor:
    amounts = px.smooth("stains", p.smooth_um)
    zh = (amounts[0] - stats.h_median) / max(stats.h_scale, 1e-3)
    ze = (amounts[1] - stats.e_median) / max(stats.e_scale, 1e-3)
    odd = (zh.abs() > p.max_z) | (ze.abs() > p.max_z)
    return opening(odd & tissue, round(px.px(p.min_width_um) / 2))


@dataclass(frozen=True)
class Detector:
    """How an artefact class (`tilestore.qc.classes`) is found: its function, its
    parameter record and the context a block needs beyond its edges."""

    find: Callable[..., torch.Tensor]
    params: type
    halo_um: float
    post: Callable[..., np.ndarray] | None = None  # its whole-slide step (tilestore.qc.whole)
    # judged only where the slide records its pixel size: a measure of scale (focus compares
    # texture at 4 and 16 um) at a guessed scale calls sharp tissue blurred
    needs_pixel_size: bool = False


DETECTORS: dict[str, Detector] = {
    "pen": Detector(pen, PenParams, 48),
    "bubble": Detector(bubble, BubbleParams, 24, whole.rings_and_edges),
    "fold": Detector(fold, FoldParams, 96, whole.large),
    "dark": Detector(dark, LightParams, 64),
    "bright": Detector(bright, LightParams, 64),
    "blur": Detector(blur, BlurParams, 96, whole.apart, needs_pixel_size=True),
    "stain": Detector(stain, StainParams, 96),
}
assert list(DETECTORS) == list(ARTEFACTS), "one detector per artefact class, in label order"
