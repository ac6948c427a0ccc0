"""Colour measures for QC, in torch so the same code runs on the GPU and the CPU.

A block of 8-bit RGB becomes, on demand: linear RGB, optical density (OD, Beer-Lambert:
-log10 of transmitted light, so stains add), CIELAB (perceptual: ink colours are rules on
hue and chroma there) and haematoxylin / eosin amounts by colour deconvolution with the
Ruifrok-Johnston stain vectors. 8-bit inputs go through 256-entry tables, not pow and log
per pixel.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch
import torch.nn.functional as F

# Ruifrok & Johnston (2001) OD vectors of haematoxylin, eosin and DAB (rows), the matrix
# scikit-image's rgb2hed inverts.
STAIN_OD = np.array(
    [[0.65, 0.70, 0.29], [0.07, 0.99, 0.11], [0.27, 0.57, 0.78]],
    dtype=np.float64,
)
_RGB_TO_XYZ = [
    [0.4124564, 0.3575761, 0.1804375],
    [0.2126729, 0.7151522, 0.0721750],
    [0.0193339, 0.1191920, 0.9503041],
]
_WHITE_D65 = (0.95047, 1.0, 1.08883)
_LAB_EPSILON = 0.008856
LUMA = (0.2126, 0.7152, 0.0722)  # Rec. 709 luminance of linear light
MIN_OD = 1 / 255  # transmitted light of a saturated pixel is clamped to this (OD <= 2.4)


def _tables(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(linear light, optical density) of each 8-bit value."""
    v = np.arange(256) / 255
    linear = np.where(v <= 0.04045, v / 12.92, ((v + 0.055) / 1.055) ** 2.4)
    od = -np.log10(np.maximum(v, MIN_OD))
    as_t = lambda a: torch.tensor(a, dtype=torch.float32, device=device)  # noqa: E731
    return as_t(linear), as_t(od)


@dataclass(frozen=True)
class ColourTables:
    """The colour constants on one device, made once: each made from host data is a copy
    to the device, and on a GPU every such copy waits for all the work queued before it
    (a batch's measures beside a model would wait for the model, every batch)."""

    linear: torch.Tensor  # (256,) linear light of each 8-bit value
    od: torch.Tensor  # (256,) optical density of each 8-bit value
    luma: torch.Tensor  # (3,) linear light's luminance weights

    @classmethod
    def on(cls, device: torch.device | str) -> ColourTables:
        linear, od = _tables(torch.device(device))
        return cls(linear, od, torch.tensor(LUMA, device=linear.device))


def _stain_unmix() -> np.ndarray:
    vectors = STAIN_OD / np.linalg.norm(STAIN_OD, axis=1, keepdims=True)
    return np.linalg.inv(vectors)  # OD (rgb) @ inv -> amounts (h, e, d)


class Pixels:
    """One block's pixels and the measures derived from them, each computed once."""

    def __init__(self, rgb: torch.Tensor, mpp: float) -> None:
        """rgb: (3, H, W) uint8 on the device that computes; mpp: um per pixel."""
        self.rgb8, self.mpp, self.device = rgb, mpp, rgb.device
        self._linear_t, self._od_t = _tables(rgb.device)
        self._smoothed: dict[tuple[str, float], torch.Tensor] = {}

    def px(self, um: float) -> float:
        """A length in micrometres as pixels of this block."""
        return um / self.mpp

    @cached_property
    def _index(self) -> torch.Tensor:
        # int32 indices: index_select with them is twice as fast as indexing with int64
        return self.rgb8.reshape(-1).int()

    def _lookup(self, table: torch.Tensor) -> torch.Tensor:
        return table.index_select(0, self._index).view(self.rgb8.shape)

    @cached_property
    def linear(self) -> torch.Tensor:
        """(3, H, W) linear light in [0, 1]."""
        return self._lookup(self._linear_t)

    @cached_property
    def od(self) -> torch.Tensor:
        """(3, H, W) optical density per channel."""
        return self._lookup(self._od_t)

    @cached_property
    def od_sum(self) -> torch.Tensor:
        """(H, W) total optical density: how much stain (and tissue) light went through."""
        return self.od.sum(0)

    @cached_property
    def gray(self) -> torch.Tensor:
        """(H, W) relative luminance in [0, 1] (linear light, Rec. 709 weights)."""
        r, g, b = self.linear
        return 0.2126 * r + 0.7152 * g + 0.0722 * b

    def smooth(self, measure: str, sigma_um: float) -> torch.Tensor:
        """A measure (`gray`, `od_sum`, `stains`...) blurred over sigma_um; each blur is
        computed once per block, however many detectors ask for it."""
        return self._once(
            (measure, sigma_um), lambda: gaussian(getattr(self, measure), self.px(sigma_um))
        )

    def smooth_lab(self, sigma_um: float) -> torch.Tensor:
        """(3, H, W) CIELAB of the linear light smoothed over sigma_um (so a colour rule
        judges a region, not single nuclei)."""
        return self._once(
            ("lab", sigma_um), lambda: gaussian(self.linear, self.px(sigma_um), then=lab)
        )

    def smooth_chroma(self, sigma_um: float) -> torch.Tensor:
        """(H, W) CIELAB chroma of the linear light smoothed over sigma_um (computed on
        the blur's coarse grid where it has one: chroma of a smooth field is smooth)."""
        chroma = lambda x: _chroma(x)[None]  # noqa: E731 - (1, h, w), a one-channel image
        return self._once(
            ("chroma", sigma_um),
            lambda: gaussian(self.linear, self.px(sigma_um), then=chroma)[0],
        )

    def _once(self, key: tuple[str, float], make) -> torch.Tensor:
        if key not in self._smoothed:
            self._smoothed[key] = make()
        return self._smoothed[key]

    def chroma_where(self, where: torch.Tensor) -> torch.Tensor:
        """(H, W) CIELAB chroma of the unsmoothed pixels where `where` is set, 0 elsewhere
        (a rule that needs it on a few pixels does not convert the whole block)."""
        out = torch.zeros(where.shape, dtype=torch.float32, device=self.device)
        picked = self.linear[:, where]
        if picked.shape[1]:
            out[where] = _chroma(picked[..., None])[:, 0]
        return out

    @cached_property
    def stains(self) -> torch.Tensor:
        """(3, H, W) haematoxylin, eosin and residual (DAB) amounts in OD units."""
        unmix = torch.tensor(_stain_unmix(), dtype=torch.float32, device=self.device)
        return torch.einsum("chw,cs->shw", self.od, unmix)


# linear sRGB -> XYZ over the D65 white, row by row: the channels are mixed by these
# constants one multiply-add at a time (a compiled pass fuses that into its neighbours; as
# a matrix product it was a batched GEMV and a permuted pass: 0.27 of the per-tile measures'
# 0.98 ms a batch of 512 on an H200, bench/RESULTS.md)
_LAB_XYZ = tuple(
    tuple(c / white for c in row) for row, white in zip(_RGB_TO_XYZ, _WHITE_D65, strict=True)
)


def lab(linear: torch.Tensor) -> torch.Tensor:
    """(..., 3, H, W) CIELAB (D65) of (..., 3, H, W) linear sRGB light (a block, or a batch
    of tiles: no step waits on the device, and nothing is copied to it, so a compiled
    model's pass can hold it)."""
    r, g, b = linear.unbind(-3)
    f = []
    for m_r, m_g, m_b in _LAB_XYZ:
        xyz = r * m_r + g * m_g + b * m_b
        cube_root = xyz.clamp_min(_LAB_EPSILON).pow(1 / 3)
        # the straight segment near black
        f.append(torch.where(xyz <= _LAB_EPSILON, xyz * 7.787 + 16 / 116, cube_root))
    fx, fy, fz = f
    return torch.stack([fy * 116 - 16, (fx - fy) * 500, (fy - fz) * 200], dim=-3)


def _chroma(linear: torch.Tensor) -> torch.Tensor:
    """(..., H, W) CIELAB chroma of (..., 3, H, W) linear light."""
    return hue_chroma(lab(linear))[1]


def hue_chroma(lab_: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(hue in degrees 0-360, chroma) of a (..., 3, H, W) CIELAB image."""
    a, b = lab_[..., 1, :, :], lab_[..., 2, :, :]
    return torch.rad2deg(torch.atan2(b, a)) % 360, torch.hypot(a, b)


def gaussian(image: torch.Tensor, sigma: float, then=None, *, exact: bool = False) -> torch.Tensor:
    """Gaussian blur of an (H, W) or (C, H, W) image (3 sigma, edges reflected).

    A wide blur is computed on a grid `decimation(sigma)` times coarser (box average,
    Gaussian of the remaining width, bilinear back up): from 4 px on, the result differs
    from the exact blur by under 1% of the image's range inside the block (0.02% on
    average; tests/tilestore/test_qc.py), at a tenth of the passes over memory. `then`,
    if given, is applied on the coarse grid before it is brought back up (a colour
    conversion of a smooth field need not be computed on every pixel). `exact` keeps the
    full grid: a difference of two blurs (a band-pass) would carry the coarse grid's error
    as signal.
    """
    if sigma < 0.3:
        return then(image) if then else image
    flat = image.ndim == 2
    batch = (image[None] if flat else image)[None]
    factor = 1 if exact else decimation(sigma)
    if factor == 1:
        out = _separable(batch, sigma)
        out = then(out[0])[None] if then else out
    else:
        out = _decimated(batch, sigma, factor, then)
    return out[0, 0] if flat else out[0]


# the share of the width that a box average (per factor: (f^2 - 1) / 12) and a bilinear
# resampling (f^2 / 6) already blur, in squared pixels of the fine grid
def _residual(sigma: float, factor: int) -> float:
    """The Gaussian width left to apply on a grid `factor` times coarser, in its pixels."""
    rest = sigma**2 - (factor * factor - 1) / 12 - factor * factor / 6
    return math.sqrt(max(rest, 0.0)) / factor


# the narrowest blur a coarse grid keeps, in its own pixels: 2x down, 0.85 px (pen's 8 um
# at 4 um/px: its colour rules find the same strokes, bench/qc.py accuracy); 4x and 8x
# down, 2.4 px, where the box and the bilinear steps are coarse enough to show
MIN_COARSE_SIGMA = {8: 2.4, 4: 2.4, 2: 0.85}


def decimation(sigma: float) -> int:
    """How many times coarser a blur of `sigma` px may be computed (1, 2, 4 or 8)."""
    for factor, least in MIN_COARSE_SIGMA.items():
        if _residual(sigma, factor) >= least:
            return factor
    return 1


def _decimated(batch: torch.Tensor, sigma: float, factor: int, then) -> torch.Tensor:
    h, w = batch.shape[-2:]
    pad_h, pad_w = (-h) % factor, (-w) % factor
    if pad_h or pad_w:
        batch = F.pad(batch, [0, pad_w, 0, pad_h], mode="replicate")
    small = _separable(F.avg_pool2d(batch, factor), _residual(sigma, factor))
    if then is not None:
        small = then(small[0])[None]
    up = F.interpolate(small, scale_factor=factor, mode="bilinear", align_corners=False)
    return up[..., :h, :w]


def _separable(batch: torch.Tensor, sigma: float) -> torch.Tensor:
    """(1, C, H, W) blurred along x then y with a sampled Gaussian, as a sum of shifted
    slices, each tap one fused multiply-add in place (CPU conv2d is many times slower for
    one-channel rows)."""
    if sigma < 0.3:
        return batch
    radius = max(1, math.ceil(3 * sigma))
    taps = [math.exp(-0.5 * (i / sigma) ** 2) for i in range(-radius, radius + 1)]
    total = sum(taps)
    for dim in (-1, -2):
        size = batch.shape[dim]
        padded = _pad(batch, dim, radius)
        out = padded.narrow(dim, radius, size) * (taps[radius] / total)
        for i in range(radius):  # the taps either side of the centre
            out.add_(padded.narrow(dim, i, size), alpha=taps[i] / total)
            out.add_(padded.narrow(dim, 2 * radius - i, size), alpha=taps[i] / total)
        batch = out
    return batch


def _pad(batch: torch.Tensor, dim: int, radius: int) -> torch.Tensor:
    """`batch` padded by `radius` on both sides of `dim` (reflected, or replicated where
    the image is narrower than the radius)."""
    pad = [0, 0, 0, 0]
    reach = min(radius, batch.shape[dim] - 1)
    pad[0 if dim == -1 else 2] = pad[1 if dim == -1 else 3] = reach
    padded = F.pad(batch, pad, mode="reflect") if reach else batch
    if reach < radius:
        extra = [0, 0, 0, 0]
        extra[0 if dim == -1 else 2] = extra[1 if dim == -1 else 3] = radius - reach
        padded = F.pad(padded, extra, mode="replicate")
    return padded


def opening(mask: torch.Tensor, radius: int) -> torch.Tensor:
    """Binary opening with a (2r+1)^2 square: removes what is narrower than 2r+1 px."""
    if radius < 1:
        return mask
    return dilate(erode(mask, radius), radius)


def closing(mask: torch.Tensor, radius: int) -> torch.Tensor:
    """Binary closing with a (2r+1)^2 square: joins what is closer than 2r+1 px."""
    if radius < 1:
        return mask
    return erode(dilate(mask, radius), radius)


def dilate(mask: torch.Tensor, radius: int) -> torch.Tensor:
    """Binary dilation by a (2r+1)^2 square: a running OR along rows, then columns."""
    out = mask
    for dim in (-1, -2):
        out = _running_or(out, dim, radius)
    return out


def _running_or(mask: torch.Tensor, dim: int, radius: int) -> torch.Tensor:
    """OR over a window of 2r+1 along `dim`, by doubling spans: log2(2r+1) passes, not
    2r+1 (each step ORs a run with the run `span` further on)."""
    size, width = mask.shape[dim], 2 * radius + 1
    shape = list(mask.shape)
    shape[dim] = radius
    edge = torch.zeros(shape, dtype=torch.bool, device=mask.device)
    run = torch.cat([edge, mask, edge], dim=dim)  # run[i]: OR of padded[i : i + span]
    span = 1
    while span * 2 <= width:
        length = run.shape[dim] - span
        run = run.narrow(dim, 0, length) | run.narrow(dim, span, length)
        span *= 2
    rest = width - span  # < span: the last step overlaps the one before
    if rest:
        length = run.shape[dim] - rest
        run = run.narrow(dim, 0, length) | run.narrow(dim, rest, length)
    return run.narrow(dim, 0, size)


def erode(mask: torch.Tensor, radius: int) -> torch.Tensor:
    return ~dilate(~mask, radius)
