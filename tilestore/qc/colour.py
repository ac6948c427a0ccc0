"""Colour measures for QC, in torch so the same code runs on the GPU and the CPU.

A block of 8-bit RGB becomes, on demand: linear RGB, optical density (OD, Beer-Lambert:
-log10 of transmitted light, so stains add), CIELAB (perceptual: ink colours are rules on
hue and chroma there) and haematoxylin / eosin amounts by colour deconvolution with the
Ruifrok-Johnston stain vectors. 8-bit inputs go through 256-entry tables, not pow and log
per pixel.
"""

from __future__ import annotations

import math
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
MIN_OD = 1 / 255  # transmitted light of a saturated pixel is clamped to this (OD <= 2.4)


def _tables(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(linear light, optical density) of each 8-bit value."""
    v = np.arange(256) / 255
    linear = np.where(v <= 0.04045, v / 12.92, ((v + 0.055) / 1.055) ** 2.4)
    od = -np.log10(np.maximum(v, MIN_OD))
    as_t = lambda a: torch.tensor(a, dtype=torch.float32, device=device)  # noqa: E731
    return as_t(linear), as_t(od)


def _stain_unmix() -> np.ndarray:
    vectors = STAIN_OD / np.linalg.norm(STAIN_OD, axis=1, keepdims=True)
    return np.linalg.inv(vectors)  # OD (rgb) @ inv -> amounts (h, e, d)


class Pixels:
    """One block's pixels and the measures derived from them, each computed once."""

    def __init__(self, rgb: torch.Tensor, mpp: float) -> None:
        """rgb: (3, H, W) uint8 on the device that computes; mpp: um per pixel."""
        self.rgb8, self.mpp, self.device = rgb, mpp, rgb.device
        self._linear_t, self._od_t = _tables(rgb.device)
        self._labs: dict[float, torch.Tensor] = {}

    def px(self, um: float) -> float:
        """A length in micrometres as pixels of this block."""
        return um / self.mpp

    @cached_property
    def index(self) -> torch.Tensor:
        return self.rgb8.long()

    @cached_property
    def linear(self) -> torch.Tensor:
        """(3, H, W) linear light in [0, 1]."""
        return self._linear_t[self.index]

    @cached_property
    def od(self) -> torch.Tensor:
        """(3, H, W) optical density per channel."""
        return self._od_t[self.index]

    @cached_property
    def od_sum(self) -> torch.Tensor:
        """(H, W) total optical density: how much stain (and tissue) light went through."""
        return self.od.sum(0)

    @cached_property
    def gray(self) -> torch.Tensor:
        """(H, W) relative luminance in [0, 1] (linear light, Rec. 709 weights)."""
        r, g, b = self.linear
        return 0.2126 * r + 0.7152 * g + 0.0722 * b

    def smooth_lab(self, sigma_um: float) -> torch.Tensor:
        """(3, H, W) CIELAB of the linear light smoothed over sigma_um (so a colour rule
        judges a region, not single nuclei)."""
        if sigma_um not in self._labs:
            self._labs[sigma_um] = lab(gaussian(self.linear, self.px(sigma_um)))
        return self._labs[sigma_um]

    @cached_property
    def stains(self) -> torch.Tensor:
        """(3, H, W) haematoxylin, eosin and residual (DAB) amounts in OD units."""
        unmix = torch.tensor(_stain_unmix(), dtype=torch.float32, device=self.device)
        return torch.einsum("chw,cs->shw", self.od, unmix)


def lab(linear: torch.Tensor) -> torch.Tensor:
    """(3, H, W) CIELAB (D65) of (3, H, W) linear sRGB light."""
    m = torch.tensor(_RGB_TO_XYZ, dtype=linear.dtype, device=linear.device)
    white = torch.tensor(_WHITE_D65, dtype=linear.dtype, device=linear.device)
    xyz = torch.einsum("ij,jhw->ihw", m, linear) / white[:, None, None]
    f = torch.where(xyz > 0.008856, xyz.clamp_min(1e-12) ** (1 / 3), 7.787 * xyz + 16 / 116)
    return torch.stack(
        [116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])],
    )


def hue_chroma(lab_: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(hue in degrees 0-360, chroma) of a CIELAB image."""
    a, b = lab_[1], lab_[2]
    return torch.rad2deg(torch.atan2(b, a)) % 360, torch.hypot(a, b)


def gaussian(image: torch.Tensor, sigma: float) -> torch.Tensor:
    """Gaussian blur of an (H, W) or (C, H, W) image (3 sigma, edges reflected)."""
    if sigma < 0.3:
        return image
    flat = image.ndim == 2
    out = _separable((image[None] if flat else image)[None], sigma)
    return out[0, 0] if flat else out[0]


def _separable(batch: torch.Tensor, sigma: float) -> torch.Tensor:
    """(1, C, H, W) blurred along x then y with a sampled Gaussian, as sums of shifted
    slices (a few fused passes; CPU conv2d is many times slower for one-channel rows)."""
    if sigma < 0.3:
        return batch
    radius = max(1, math.ceil(3 * sigma))
    taps = [math.exp(-0.5 * (i / sigma) ** 2) for i in range(-radius, radius + 1)]
    total = sum(taps)
    for dim in (-1, -2):
        size = batch.shape[dim]
        pad = [0, 0, 0, 0]
        reach = min(radius, size - 1)
        pad[0 if dim == -1 else 2] = pad[1 if dim == -1 else 3] = reach
        padded = F.pad(batch, pad, mode="reflect") if reach else batch
        if reach < radius:  # narrower than the kernel: replicate the rest
            extra = [0, 0, 0, 0]
            extra[0 if dim == -1 else 2] = extra[1 if dim == -1 else 3] = radius - reach
            padded = F.pad(padded, extra, mode="replicate")
        out = padded.narrow(dim, 0, size) * (taps[0] / total)
        for i in range(1, len(taps)):
            out += padded.narrow(dim, i, size) * (taps[i] / total)
        batch = out
    return batch


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
        size = out.shape[dim]
        shape = list(out.shape)
        shape[dim] = radius
        edge = torch.zeros(shape, dtype=torch.bool, device=mask.device)
        padded = torch.cat([edge, out, edge], dim=dim)
        grown = padded.narrow(dim, 0, size).clone()
        for i in range(1, 2 * radius + 1):
            grown |= padded.narrow(dim, i, size)
        out = grown
    return out


def erode(mask: torch.Tensor, radius: int) -> torch.Tensor:
    return ~dilate(~mask, radius)
