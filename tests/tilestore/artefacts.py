"""Known artefacts painted onto real H&E, for measuring the QC detectors against the truth.

Each artefact is made the way the optics or the glass make it, in level-0 pixels of the
real CMU-1-Small-Region crop (0.499 um/px): blur is a Gaussian of the region; marker ink
multiplies the light by the ink's transmittance (Beer-Lambert: ink adds optical density,
it does not paint over); a fold is a second layer of the same tissue (its optical density
doubled); an air bubble is a thin dark grey ring whose inside is pale and soft; a dark
region is under-exposed light. `truth` is where the artefact was painted.
`bench/qc.py` measures the same cases for the confusion table in docs/guide/qc.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw
from scipy import ndimage

MPP = 0.499
# Marker ink transmittance (RGB, 0-1) as scanned through the glass: blue, green and black
# permanent markers and a red one, from the colours pen marks take in scanned slides.
INKS = {
    "blue": (0.16, 0.27, 0.72),
    "green": (0.20, 0.55, 0.35),
    "black": (0.10, 0.10, 0.11),
    "red": (0.80, 0.16, 0.20),
}


@dataclass(frozen=True)
class Case:
    """One artefact painted on a copy of the slide: its name, detector and parameters."""

    name: str
    detector: str
    image: np.ndarray  # (h, w, 3) uint8
    truth: np.ndarray  # bool (h, w): where the artefact was painted


def _polygon_mask(shape, draw) -> np.ndarray:
    canvas = Image.new("L", (shape[1], shape[0]), 0)
    draw(ImageDraw.Draw(canvas))
    return np.asarray(canvas) > 0


def blurred(image: np.ndarray, sigma_um: float) -> Case:
    truth = np.zeros(image.shape[:2], bool)
    truth[1500:2300, 850:1650] = True  # 400 um square over epidermis and dermis
    soft = ndimage.gaussian_filter(image.astype(np.float32), (sigma_um / MPP,) * 2 + (0,))
    out = np.where(truth[..., None], np.clip(soft + 0.5, 0, 255), image).astype(np.uint8)
    return Case(f"blur sigma {sigma_um:g} um", "blur", out, truth)


def inked(image: np.ndarray, ink: str) -> Case:
    def stroke(d):
        d.line([(150, 700), (900, 1000), (1500, 1050), (2100, 1500)], fill=255, width=360)

    truth = _polygon_mask(image.shape[:2], stroke)
    transmit = np.asarray(INKS[ink], np.float32)
    # soft edges, as a felt tip leaves them
    alpha = ndimage.gaussian_filter(truth.astype(np.float32), 3)[..., None]
    light = image.astype(np.float32) * (1 - alpha + alpha * transmit)
    return Case(f"{ink} pen", "pen", np.clip(light + 0.5, 0, 255).astype(np.uint8), truth)


def folded(image: np.ndarray) -> Case:
    def band(d):
        d.polygon([(500, 2550), (1700, 2000), (1750, 2280), (550, 2830)], fill=255)

    truth = _polygon_mask(image.shape[:2], band)
    t = image.astype(np.float32) / 255
    double = 255 * t * t  # two layers: the light goes through the tissue twice
    out = np.where(truth[..., None], double + 0.5, image).astype(np.uint8)
    return Case("fold", "fold", out, truth)


def bubbled(image: np.ndarray) -> Case:
    h, w = image.shape[:2]
    yy, xx = np.mgrid[:h, :w]
    r = np.hypot(yy - 1900, xx - 1250)
    radius, ring = 420, 18
    truth = r <= radius + ring / 2
    t = image.astype(np.float32)
    inside = ndimage.gaussian_filter(t, (4, 4, 0)) * 0.45 + 255 * 0.55  # pale and soft
    out = np.where((r < radius - ring / 2)[..., None], inside, t)
    edge = np.abs(r - radius) <= ring / 2
    out[edge] = (70, 70, 72)
    return Case("air bubble", "bubble", np.clip(out + 0.5, 0, 255).astype(np.uint8), truth)


def darkened(image: np.ndarray) -> Case:
    truth = np.zeros(image.shape[:2], bool)
    truth[900:1500, 1000:1700] = True
    out = np.where(truth[..., None], image.astype(np.float32) * 0.12 + 0.5, image)
    return Case("under-exposed", "dark", out.astype(np.uint8), truth)


def cases(image: np.ndarray) -> list[Case]:
    """Every case the QC table (docs/guide/qc.md) lists."""
    return [
        *(blurred(image, s) for s in (2, 4, 8)),
        *(inked(image, ink) for ink in INKS),
        folded(image),
        bubbled(image),
        darkened(image),
    ]


def on_grid(truth: np.ndarray, downsample: tuple[float, float], shape) -> np.ndarray:
    """The truth on a coarser grid: a map pixel is in where at least half of it is."""
    h, w = shape
    ys = np.minimum((np.arange(h + 1) * downsample[0]).round().astype(int), truth.shape[0])
    xs = np.minimum((np.arange(w + 1) * downsample[1]).round().astype(int), truth.shape[1])
    table = np.pad(truth.cumsum(0).cumsum(1), ((1, 0), (1, 0)))
    area = np.maximum(np.outer(np.diff(ys), np.diff(xs)), 1)
    inside = table[ys[1:]][:, xs[1:]] - table[ys[:-1]][:, xs[1:]]
    inside = inside - table[ys[1:]][:, xs[:-1]] + table[ys[:-1]][:, xs[:-1]]
    return inside / area >= 0.5
