"""Tissue masks from a low-resolution level, stored as the OME-Zarr label image labels/tissue.

Methods live in a small registry. `otsu` thresholds the median-blurred saturation for
brightfield (tissue is coloured on white glass) and the smoothed density of bright nuclei
for fluorescence (tissue bright on black; the nuclear channel, or the brightest channel at
each pixel where that finds no credible tissue), then closes gaps, fills holes and drops small
fragments. `auto` picks the polarity from the store's declared modality or, failing that,
from the brightness of the slide's border, and says what it chose. `contrast` is the
per-tile rule of the older GigaPath tutorial scripts, evaluated block by block.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from tilestore import locks
from tilestore.cpus import usable_cpus
from tilestore.errors import OptionError, StoreError
from tilestore.format.omezarr import NUCLEAR
from tilestore.masks.contrast import ContrastRule, passes
from tilestore.masks.options import TISSUE_MPP, TissueMethod, TissueMpp
from tilestore.options import checked
from tilestore.reading.labels import read_label, write_label
from tilestore.reading.slide import Slide, resize

UNKNOWN_MPP_SIDE = 2048  # without a pixel size: mask at most this long (8 um/px nominally)


@dataclass(frozen=True)
class OtsuParams:
    """Cleaning parameters, in micrometres so they mean the same at any mask resolution."""

    median_um: float = 24.0  # brightfield: median blur of saturation (3 px at 8 um/px)
    smooth_um: float = 40.0  # fluorescence: Gaussian sigma turning nuclei into tissue density
    close_um: float = 16.0  # closing radius: joins tissue split by thin gaps
    min_area_um2: float = 20_000.0  # fragments smaller than this are dropped (~140 um square)
    # holes up to this area are filled (gaps between nuclei, pale cytoplasm); larger ones
    # are glass inside the tissue (lumens, vessels, tears) and stay out of the mask, as a
    # fragment of this size would be kept
    max_hole_um2: float = 20_000.0
    min_saturation: float = 0.05  # saturation (0-1) below which a pixel is never tissue
    glass_saturation: float = 0.04  # Otsu's low class is glass only if its median is below this
    min_intensity: float = 0.04  # fluorescence floor (0-1) for slides with no tissue
    # fluorescence: the channel whose nuclei mark tissue, by name or index; None: the one
    # named DAPI or Hoechst (unless it finds no tissue or too little: CREDIBLE_SHARE), else
    # the brightest of all channels at each pixel
    channel: str | int | None = None


@dataclass(frozen=True)
class ContrastParams(ContrastRule):
    """The tutorial rule (`tilestore.masks.contrast`) on blocks of block_um, read at stats_mpp."""

    block_um: float = 112.0  # one 224 px tile at 0.5 um/px
    stats_mpp: float = 2.0  # statistics on pixels of this size (the rule was made at full res)


@dataclass
class TissueMask:
    """A boolean mask over the slide and how it was made."""

    mask: np.ndarray  # bool (h, w)
    downsample: tuple[float, float]  # (dy, dx): level-0 pixels per mask pixel
    mpp: float | None  # um per mask pixel; None if the slide's pixel size is unknown
    method: str
    polarity: str  # "bright background" (brightfield) or "dark background" (fluorescence)
    params: dict[str, Any]
    source_level: int
    notes: list[str] = field(default_factory=list)

    @property
    def fraction(self) -> float:
        """Fraction of the slide area covered by tissue."""
        return float(self.mask.mean()) if self.mask.size else 0.0


@checked
def compute_tissue(
    slide: Slide, method: TissueMethod = "auto", mpp: TissueMpp = TISSUE_MPP, **params: Any
) -> TissueMask:
    """Return the tissue mask of a slide at about `mpp` um/px, read from the coarsest level
    fine enough (level 0 only when the slide is already small)."""
    notes: list[str] = []
    image, level, downsample, mask_mpp = _low_resolution(slide, mpp, notes)
    polarity = _polarity(slide, image, notes)
    name = "otsu" if method == "auto" else method
    if method == "auto":
        notes.append(f"auto: otsu on {'nuclear density' if polarity == 'dark' else 'saturation'}")
    build, param_type = METHODS[name]
    try:
        chosen = param_type(**params)
    except TypeError as exc:
        raise OptionError(f"tissue method {name}: {exc}") from exc
    mask = build(slide, image, polarity, mask_mpp or TISSUE_MPP, chosen, notes)
    if not mask.any():
        notes.append("no tissue found")
    return TissueMask(
        mask,
        downsample,
        mask_mpp,
        name,
        "dark background" if polarity == "dark" else "bright background",
        asdict(chosen),
        level,
        notes,
    )


def levels_read(slide: Slide, method: str, mpp: float = TISSUE_MPP) -> frozenset[int]:
    """The levels `compute_tissue(slide, method, mpp)` reads: the one low-resolution level
    (otsu, auto), every level for contrast (its statistics at stats_mpp)."""
    if method == "contrast":
        return frozenset(range(len(slide.levels)))
    return frozenset({_level_read(slide, mpp)[0]})


def _level_read(slide: Slide, mpp: float) -> tuple[int, int | None]:
    """(the level a mask at about mpp is read from, None); without a pixel size (that level,
    ds): the mask is 1/ds of level 0, ds the smallest power of two that makes it at most
    UNKNOWN_MPP_SIDE long."""
    if slide.mpp is not None:
        return slide.level_for_mpp(mpp), None
    _, h0, w0 = slide.shape
    ds = 1
    while max(h0, w0) / ds > UNKNOWN_MPP_SIDE:
        ds *= 2
    return max((lv.index for lv in slide.levels if lv.downsample[1] <= ds), default=0), ds


def _low_resolution(slide: Slide, mpp: float, notes: list[str]):
    """Return (image at about mpp, level read, level-0 px per mask px, mask mpp or None)."""
    _, h0, w0 = slide.shape
    level, ds = _level_read(slide, mpp)
    if ds is None:
        # never finer than the slide's own pixels: a 28.97 um/px DICOM's 1152x700 image made
        # a 4172x2535 mask at 8 um/px, pixels invented by upsampling
        mask_mpp = max(mpp, *slide.mpp)
        target = (
            max(1, round(h0 * slide.mpp[1] / mask_mpp)),
            max(1, round(w0 * slide.mpp[0] / mask_mpp)),
        )
    else:
        notes.append(
            f"pixel size unknown: mask at 1/{ds} of level 0; sizes in um assume "
            f"{TISSUE_MPP:g} um per mask pixel"
        )
        target = (max(1, round(h0 / ds)), max(1, round(w0 / ds)))
        mask_mpp = None
    lv = slide.levels[level]
    if level == 0 and max(lv.height, lv.width) > 4 * UNKNOWN_MPP_SIDE:
        raise StoreError(
            f"{slide.name}: no pyramid level near {mpp} um/px; convert again so levels are built"
        )
    image = slide.read_region(0, 0, lv.width, lv.height, level=level)
    if image.shape[:2] != target:
        image = resize(image, target[1], target[0])
    notes.append(
        f"read level {level} ({lv.width}x{lv.height} px) for a {target[1]}x{target[0]} mask"
    )
    return image, level, (h0 / target[0], w0 / target[1]), mask_mpp


def _polarity(slide: Slide, image: np.ndarray, notes: list[str]) -> str:
    """Return "dark" (tissue bright on dark: fluorescence) or "bright" (brightfield)."""
    if slide.fluorescence:
        origin = (slide.record.modality or {}).get("origin")
        notes.append(f"fluorescence declared ({origin}): tissue bright on dark")
        return "dark"
    gray = _channel_max(image)
    peak = float(np.iinfo(gray.dtype).max) if gray.dtype.kind in "ui" else 1.0
    rim = max(1, min(gray.shape) // 20)
    border = np.concatenate(
        [gray[:rim].ravel(), gray[-rim:].ravel(), gray[:, :rim].ravel(), gray[:, -rim:].ravel()]
    )
    level = float(np.median(border)) / peak
    polarity = "dark" if level < 0.35 else "bright"
    kind = "dark (fluorescence-like)" if polarity == "dark" else "bright (brightfield)"
    notes.append(f"slide border median {level:.2f} of full scale: {kind} background")
    return polarity


def _otsu(
    slide: Slide, image: np.ndarray, polarity: str, mpp: float, p: OtsuParams, notes: list[str]
) -> np.ndarray:
    peak = np.iinfo(image.dtype).max if image.dtype.kind in "ui" else 1.0
    if polarity == "bright" and image.shape[2] == 3:
        return _clean(_saturation_split(image, peak, mpp, p, notes), mpp, p)
    return _fluorescence(slide, image.astype(np.float32) / peak, mpp, p, notes)


def _saturation_split(image: np.ndarray, peak, mpp: float, p: OtsuParams, notes: list[str]):
    """Brightfield: the pixels whose blurred HSV saturation is above Otsu's threshold. Each
    pixel's brightest and darkest channels are found before they are scaled to 0-1 (the same
    values: scaling is monotonic), so two planes are scaled, not three."""
    signal = np.empty(image.shape[:2], np.float32)

    def saturation(rows: slice) -> None:  # HSV saturation
        high = _channel_max(image[rows]).astype(np.float32) / peak
        low = _channel_min(image[rows]).astype(np.float32) / peak
        signal[rows] = np.where(high > 0, (high - low) / np.maximum(high, 1e-6), 0)

    in_bands(image.shape[0], saturation)
    signal = median_filter(signal, max(1, round(p.median_um / mpp)) | 1)
    threshold = _otsu_threshold(signal, p.min_saturation)
    below = signal[signal <= threshold]
    if below.size and np.median(below) > p.glass_saturation:
        # Otsu's lower class is coloured too: there is no glass, only paler tissue.
        notes.append(
            f"no glass found (Otsu's lower class has median saturation "
            f"{np.median(below):.2f}); threshold {p.min_saturation}"
        )
        threshold = p.min_saturation
    return signal > threshold


# A named nuclear channel too dim to split tissue from glass by itself (Otsu's threshold on its
# density falls under the min_intensity floor) keeps only its brightest patches: on the real
# DAPI scan dimmed 2, 3, 4, 6 and 8 times, 0.80, 0.61, 0.41, 0.12 and 0.035 of the slide
# (0.82 at full strength), while the brightest channel at each pixel keeps 0.87. Under half
# of what that finds, most of the tissue is lost: the mask comes from the brightest channel.
CREDIBLE_SHARE = 0.5


def _fluorescence(
    slide: Slide, pixels: np.ndarray, mpp: float, p: OtsuParams, notes: list[str]
) -> np.ndarray:
    """The mask from the smoothed density of bright nuclei: in the channel asked for (by name
    or index, never overridden), else in the one named for a nuclear stain (DAPI, Hoechst)
    unless it finds no tissue or is too dim to be credible (`CREDIBLE_SHARE`), else in each
    pixel's brightest channel. Each choice but the last is said in the notes."""
    names = list(slide.record.channels)
    if p.channel is not None:
        index = slide.channel_index(p.channel)
        notes.append(f"nuclear signal: channel {_label(names, index)} (asked for)")
        mask, _ = _density_mask(pixels[..., index], mpp, p)
        if not mask.any() and pixels.shape[2] > 1:
            notes.append(_elsewhere(pixels, index, names, mpp, p))
        return mask
    named = [i for i, n in enumerate(names) if n.lower().startswith(NUCLEAR)]
    if not named or pixels.shape[2] == 1:
        return _density_mask(_channel_max(pixels), mpp, p)[0]
    name = _label(names, named[0])
    notes.append(f"nuclear signal: channel {name} (by its name)")
    mask, floored = _density_mask(pixels[..., named[0]], mpp, p)
    if mask.any() and not floored:
        return mask
    brightest, _ = _density_mask(_channel_max(pixels), mpp, p)
    if not brightest.any() or mask.mean() >= CREDIBLE_SHARE * brightest.mean():
        if not mask.any():
            notes.append(f"nuclear channel {name} found no tissue, nor did the brightest channel")
        return mask
    found = (
        f"found {mask.mean():.1%}, too dim to tell tissue from glass (Otsu's threshold on it "
        f"is under min_intensity={p.min_intensity:g})"
        if mask.any()
        else "found no tissue"
    )
    notes.append(
        f"nuclear channel {name} {found}; used the brightest channel at each pixel: "
        f"{brightest.mean():.1%}"
    )
    return brightest


def _density_mask(plane: np.ndarray, mpp: float, p: OtsuParams) -> tuple[np.ndarray, bool]:
    """Return one (h, w) fluorescence plane's cleaned mask (nuclei are bright points; their
    smoothed density marks the tissue) and whether the min_intensity floor, not Otsu's
    threshold, decided it."""
    from scipy import ndimage  # here, as skimage below: planning a stored mask needs neither

    density = ndimage.gaussian_filter(plane, sigma=max(0.5, p.smooth_um / mpp))
    signal = np.log1p(density * 255)
    floor = float(np.log1p(p.min_intensity * 255))
    threshold = _otsu_threshold(signal, floor)
    return _clean(signal > threshold, mpp, p), threshold <= floor


# A channel asked for that finds no tissue: the others are looked at on a mask at most this
# long (block means): 0.25 s a channel where a 3000 x 6000 mask takes 3 s (measured)
GLANCE_SIDE = 1024


def _elsewhere(pixels: np.ndarray, asked: int, names: list[str], mpp: float, p: OtsuParams) -> str:
    """A note for a channel asked for that found no tissue: which other channels do."""
    h, w, c = pixels.shape
    step = -(-max(h, w) // GLANCE_SIDE)
    if step > 1:
        h, w = h // step, w // step
        pixels = pixels[: h * step, : w * step].reshape(h, step, w, step, c).mean(axis=(1, 3))
    found = {
        _label(names, i): _density_mask(pixels[..., i], mpp * step, p)[0].mean()
        for i in range(c)
        if i != asked
    }
    others = ", ".join(f"{n} {share:.1%}" for n, share in found.items() if share > 0)
    said = f"channels that do: {others}" if others else "nor does any other channel"
    return f"channel {_label(names, asked)} finds no tissue; {said}"


def _label(names: list[str], index: int) -> str:
    return names[index] if names else str(index)


def _clean(mask: np.ndarray, mpp: float, p: OtsuParams) -> np.ndarray:
    """Close thin gaps, fill small holes, drop small fragments (sizes in um, from p)."""
    from tilestore.masks.holes import close_disk, fill_holes

    radius = round(p.close_um / mpp)
    if radius >= 1:
        mask = close_disk(mask, radius) | mask
    if p.max_hole_um2 > 0:
        mask = fill_holes(mask, max_px=round(p.max_hole_um2 / (mpp * mpp)))
    return _drop_small(mask, round(p.min_area_um2 / (mpp * mpp)))


OTSU_BINS = 256  # skimage's threshold_otsu default
BAND = 512  # rows a thread computes at a time: small temporaries, every core busy


def in_bands(height: int, work: Callable[[slice], None]) -> None:
    """work(rows) over bands of BAND rows, on threads where there are several (numpy's
    elementwise operations release the GIL: the mask of a 100,000 px slide is 6,238 px a side,
    each of its passes hundreds of milliseconds on one core)."""
    bands = [slice(y, min(y + BAND, height)) for y in range(0, height, BAND)]
    workers = min(len(bands), usable_cpus())
    if workers <= 1:
        for rows in bands:
            work(rows)
        return
    with ThreadPoolExecutor(workers, thread_name_prefix="tilestore-mask") as pool:
        for _ in pool.map(work, bands):  # raises a band's error
            pass


def median_filter(image: np.ndarray, size: int) -> np.ndarray:
    """`ndimage.median_filter(image, size)` (edges reflected); the usual 3 x 3 by a sorting
    network of elementwise minima and maxima, 5x faster than scipy's rank filter here."""
    if size != 3 or image.ndim != 2:
        from scipy import ndimage

        return ndimage.median_filter(image, size=size)
    out = np.empty_like(image)
    height = image.shape[0]

    def band(rows: slice) -> None:  # the band and a row either side, padded as scipy's "reflect"
        above, below = rows.start == 0, rows.stop == height
        inside = image[rows.start - (not above) : rows.stop + (not below)]
        padded = np.pad(inside, ((int(above), int(below)), (1, 1)), mode="symmetric")
        out[rows] = _median3x3(padded)

    in_bands(image.shape[0], band)
    return out


def _median3x3(padded: np.ndarray) -> np.ndarray:
    """The 3 x 3 median of the inside of a padded band: sort each column's three values;
    the median of nine is then the median of (the largest of the three minima, the median
    of the medians, the smallest of the maxima)."""
    lo, mid, hi = _sort3(padded[:-2], padded[1:-1], padded[2:])
    left, centre, right = slice(None, -2), slice(1, -1), slice(2, None)
    most_lo = np.maximum(np.maximum(lo[:, left], lo[:, centre]), lo[:, right])
    least_hi = np.minimum(np.minimum(hi[:, left], hi[:, centre]), hi[:, right])
    return _sort3(most_lo, _sort3(mid[:, left], mid[:, centre], mid[:, right])[1], least_hi)[1]


def _sort3(a: np.ndarray, b: np.ndarray, c: np.ndarray):
    lo, hi = np.minimum(a, b), np.maximum(a, b)
    mid, hi = np.minimum(hi, c), np.maximum(hi, c)
    return np.minimum(lo, mid), np.maximum(lo, mid), hi


# numpy reduces over a trailing axis of 3 element by element: a chain of pairwise
# maxima over the channel planes is 10x faster and gives the same values
def _channel_max(image: np.ndarray) -> np.ndarray:
    return functools.reduce(np.maximum, (image[..., c] for c in range(image.shape[2])))


def _channel_min(image: np.ndarray) -> np.ndarray:
    return functools.reduce(np.minimum, (image[..., c] for c in range(image.shape[2])))


def _otsu_threshold(signal: np.ndarray, floor: float) -> float:
    """skimage's `threshold_otsu(signal)`, its 256-bin histogram counted in bands on threads
    (each value's bin depends on the value and the range alone, so the counts are the same)."""
    low, high = signal.min(), signal.max()  # the signal's own type, as numpy's edges are
    if low == high:
        return max(float(low), floor)
    from skimage import filters

    counts, edges = [], []

    def count(rows: slice) -> None:
        hist, bin_edges = np.histogram(signal[rows], bins=OTSU_BINS, range=(low, high))
        counts.append(hist)
        edges.append(bin_edges)

    in_bands(signal.shape[0], count)
    centers = (edges[0][:-1] + edges[0][1:]) / 2.0  # as skimage's histogram gives them
    return max(float(filters.threshold_otsu(hist=(sum(counts), centers))), floor)


def _drop_small(mask: np.ndarray, min_px: int) -> np.ndarray:
    """Remove connected fragments smaller than min_px pixels."""
    if min_px <= 1 or not mask.any():
        return mask
    from scipy import ndimage

    labels, count = ndimage.label(mask)
    # counted over the mask's pixels alone (label 0, the background, is never kept): a
    # bincount of the whole map converts every label to int64 first, 7x slower
    keep = np.bincount(labels[mask], minlength=count + 1) >= min_px
    keep[0] = False
    return keep[labels]


def _contrast(
    slide: Slide, image: np.ndarray, polarity: str, mpp: float, p: ContrastParams, notes: list[str]
) -> np.ndarray:
    """Evaluate the rule on blocks of block_um, on pixels read at stats_mpp, band by band."""
    if slide.mpp is None:
        raise StoreError(f"{slide.name}: the contrast method needs a known pixel size")
    if polarity == "dark":
        notes.append(
            "contrast: the rule was made for brightfield; on a dark background it "
            "keeps blocks with saturated bright spots"
        )
    _, h0, w0 = slide.shape
    block = max(2, round(p.block_um / p.stats_mpp))  # block side in stats pixels
    step0 = p.block_um / slide.mpp[0]  # block side in level-0 pixels
    rows, cols = int(h0 // step0), int(w0 // step0)
    keep = np.zeros((max(rows, 1), max(cols, 1)), bool)
    for r in range(rows):
        band = slide.read_region(0, round(r * step0), cols * block, block, mpp=p.stats_mpp)
        values = band.reshape(block, cols, block * band.shape[2]).transpose(1, 0, 2)
        keep[r] = passes(values.reshape(cols, -1), p)
    # Paint block decisions onto the mask grid (mask pixel centres -> block index).
    h, w = image.shape[:2]
    cy = (np.arange(h) + 0.5) * (h0 / h)
    cx = (np.arange(w) + 0.5) * (w0 / w)
    by = np.minimum(cy // step0, keep.shape[0] - 1).astype(int)
    bx = np.minimum(cx // step0, keep.shape[1] - 1).astype(int)
    inside = (cy < rows * step0)[:, None] & (cx < cols * step0)[None, :]
    return keep[by][:, bx] & inside


METHODS: dict[str, tuple[Callable[..., np.ndarray], type]] = {
    "otsu": (_otsu, OtsuParams),
    "contrast": (_contrast, ContrastParams),
}


def write_tissue(slide: Slide, tissue: TissueMask) -> None:
    """Store the mask as the OME-Zarr label image labels/tissue, replacing an older one
    (StoreError where a run is embedding the store: its plans were made from that one)."""
    try:
        slide.group["labels/tissue"]
    except KeyError:
        pass
    else:
        locks.refuse_while_written(
            getattr(slide.group.store, "root", None), "replacing its tissue mask"
        )
    write_label(
        slide,
        "tissue",
        tissue.mask.astype(np.uint8),
        tissue.downsample,
        [("background", (0, 0, 0, 0)), ("tissue", (0, 200, 80, 110))],
        {
            "method": tissue.method,
            "polarity": tissue.polarity,
            "params": tissue.params,
            "mpp": tissue.mpp,
            "downsample": list(tissue.downsample),
            "source_level": tissue.source_level,
            "fraction": tissue.fraction,
            "notes": tissue.notes,
        },
        method="tissue mask; coarser levels nearest",
    )


def read_tissue(slide: Slide) -> TissueMask | None:
    """Return the stored tissue mask, or None if the store has none."""
    return read_label(
        slide,
        "tissue",
        lambda mask, meta: TissueMask(
            mask.astype(bool),
            tuple(meta["downsample"]),
            meta["mpp"],
            meta["method"],
            meta["polarity"],
            meta["params"],
            meta["source_level"],
            list(meta["notes"]),
        ),
    )
