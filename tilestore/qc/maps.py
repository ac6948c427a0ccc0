"""A slide's artefact maps: read a low-resolution level block by block, run the detectors.

The slide is read at about `QCOptions.mpp` um/px (4 by default: a 100,000 px slide at 40x
is 6,250 px a side there), never at level 0 unless the slide is that small. Blocks of
`block` px overlap by the context the detectors need; blocks with neither tissue nor
anything darker than glass are skipped. What needs the whole slide at once (whether a
dark line closes into a ring, how long a line is) is done after the blocks, on the bool
maps, with scipy. The slide's own "usual" stain and density (`StainStats`) are measured
first on a coarser read, so every block is judged against the same reference.
"""

from __future__ import annotations

import math
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from tilestore.errors import NotJudged, OptionError, StoreError
from tilestore.masks.tissue import TissueMask, compute_tissue, read_tissue
from tilestore.qc.detectors import DETECTORS, StainStats
from tilestore.qc.fine import fine_blur
from tilestore.qc.options import QCOptions
from tilestore.reading.resolution import MPP_TOLERANCE
from tilestore.reading.slide import Slide

NOMINAL_MPP = 0.5  # a slide without a pixel size is judged as if scanned at 20x (noted)
GLASS_OD = 0.12  # a coarse pixel with more total OD than this is not bare glass


@dataclass
class QCMaps:
    """A slide's artefacts: one bit per detector per pixel, and what was measured."""

    bits: np.ndarray  # uint8 (h, w): bit k set where detector k (in `classes`) fired
    classes: list[str]
    downsample: tuple[float, float]  # level-0 px per map px (dy, dx)
    mpp: float | None  # um per map px; None where the slide's pixel size is unknown
    level: int
    tissue: np.ndarray  # bool (h, w): the tissue mask on the map's grid
    stats: StainStats
    params: dict[str, dict[str, Any]]
    device: str
    seconds: float
    notes: list[str] = field(default_factory=list)
    not_judged: list[str] = field(default_factory=list)  # asked for; why in the notes

    def mask(self, name: str) -> np.ndarray:
        """The bool map of one detector."""
        return (self.bits & (1 << self.classes.index(name))) > 0

    def label(self) -> np.ndarray:
        """uint8 label image: 0 none, else 1 + the index of the first detector that fired."""
        first = np.zeros(256, np.uint8)
        for value in range(1, 256):
            first[value] = (value & -value).bit_length()
        return first[self.bits]


def compute_qc(
    slide: Slide, options: QCOptions = QCOptions(), *, tissue: TissueMask | None = None
) -> QCMaps:
    """Return the artefact maps of a slide (the tissue mask is the store's, or computed)."""
    import torch

    start = time.perf_counter()
    if slide.fluorescence:
        raise NotJudged(
            f"{slide.name}: QC detectors are made for brightfield; this slide is fluorescence"
        )
    if not slide.rgb:
        raise NotJudged(
            f"{slide.name}: QC detectors are made for brightfield RGB slides; this store has "
            f"{slide.describe_channels()}"
        )
    params = _params(options)
    notes: list[str] = []
    asked = options.detectors
    options = _judgeable(slide, options, notes)
    if options.threads:
        torch.set_num_threads(options.threads)
    device = torch.device(options.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    tissue = tissue or read_tissue(slide) or compute_tissue(slide)
    grid = _grid(slide, options.mpp, notes)
    stats, busy = _slide_stats(slide, grid, tissue, device)
    notes.append(
        f"read at {grid.mpp:.3g} um/px ({grid.shape[1]}x{grid.shape[0]} px, level {grid.level})"
    )
    halo = math.ceil(max(DETECTORS[n].halo_um for n in options.detectors) / grid.mpp)
    tissue_map = _resample(tissue.mask, tissue.downsample, grid)
    bits = np.zeros(grid.shape, np.uint8)
    blocks = list(_blocks(grid.shape, options.block))
    windows = []  # (the block, the block with its halo), glass left out
    for y0, x0, y1, x1 in blocks:
        ya, xa = max(0, y0 - halo), max(0, x0 - halo)
        yb, xb = min(grid.shape[0], y1 + halo), min(grid.shape[1], x1 + halo)
        if busy(ya, xa, yb, xb) or tissue_map[ya:yb, xa:xb].any():
            windows.append(((y0, x0, y1, x1), (ya, xa, yb, xb)))
    skipped = len(blocks) - len(windows)
    for (y0, x0, y1, x1), (ya, xa, yb, xb), pixels in _read_ahead(slide, grid, windows):
        block = _detect(pixels, tissue_map[ya:yb, xa:xb], grid.mpp, options, params, stats, device)
        bits[y0:y1, x0:x1] = block[y0 - ya : y1 - ya, x0 - xa : x1 - xa]
    if skipped:
        notes.append(f"{skipped} blocks of bare glass skipped")
    sparse = {"auto": device.type != "cuda", "full": False, "sparse": True, "off": None}
    if "blur" in options.detectors and slide.mpp and sparse[options.fine_blur] is not None:
        fine = fine_blur(
            slide, grid.mpp, grid.downsample, tissue_map, device, notes, sparse[options.fine_blur]
        )
        if fine is not None:
            bits |= fine.astype(np.uint8) << options.detectors.index("blur")
    bits = _whole_slide(bits, options.detectors, params, grid.mpp, notes)
    return QCMaps(
        bits,
        list(options.detectors),
        grid.downsample,
        grid.mpp if slide.mpp else None,
        grid.level,
        tissue_map,
        stats,
        params,
        device.type,
        time.perf_counter() - start,
        notes,
        [n for n in asked if n not in options.detectors],
    )


def _judgeable(slide: Slide, options: QCOptions, notes: list[str]) -> QCOptions:
    """The options with the detectors this slide can be judged by (a slide without a pixel
    size is not judged by those that need one: said in the notes, absent from the maps)."""
    if slide.mpp:
        return options
    left = tuple(n for n in options.detectors if not DETECTORS[n].needs_pixel_size)
    dropped = [n for n in options.detectors if n not in left]
    if not left:
        raise StoreError(
            f"{slide.name}: {', '.join(dropped)} need the slide's pixel size, which it does "
            "not record; convert it again with its mpp"
        )
    if dropped:
        notes.append(f"{', '.join(dropped)} not judged: the slide's pixel size is unknown")
    return replace(options, detectors=left)


def _whole_slide(bits, names, params, mpp, notes) -> np.ndarray:
    """Each detector's whole-slide step (`Detector.post`), in label order, each seeing the
    final maps of the detectors before it."""
    done: dict[str, np.ndarray] = {}
    for k, name in enumerate(names):
        found = (bits & (1 << k)) > 0
        post = DETECTORS[name].post
        if post is not None and found.any():
            record = DETECTORS[name].params(**params[name])
            found = post(found, record, mpp, notes, done)
            bits &= ~np.uint8(1 << k)
            bits |= found.astype(np.uint8) << k
        done[name] = found
    return bits


def _params(options: QCOptions) -> dict[str, dict[str, Any]]:
    """Each chosen detector's parameters, defaults overridden; unknown names refused."""
    from dataclasses import asdict

    out = {}
    for name in options.params:
        if name not in options.detectors:
            raise OptionError(f"QC parameters given for {name!r}, which is not being run")
    for name in options.detectors:
        try:
            record = DETECTORS[name].params(**options.params.get(name, {}))
        except TypeError as exc:
            raise OptionError(f"QC detector {name}: {exc}") from exc
        out[name] = asdict(record)
    return out


@dataclass(frozen=True)
class _Grid:
    level: int
    shape: tuple[int, int]  # (h, w) px of the maps
    downsample: tuple[float, float]  # level-0 px per map px
    mpp: float  # um per map px (nominal where the slide has no pixel size)
    exact: bool  # the level is the grid: no resampling

    def read(self, slide: Slide, y0: int, x0: int, y1: int, x1: int) -> np.ndarray:
        """(h, w, 3) uint8 pixels of a window of the grid."""
        if self.exact:
            x, y = round(x0 * self.downsample[1]), round(y0 * self.downsample[0])
            return slide.read_region(x, y, x1 - x0, y1 - y0, level=self.level)
        from tilestore.reading.slide import resize

        lv = slide.levels[self.level]
        fy, fx = self.downsample[0] / lv.downsample[0], self.downsample[1] / lv.downsample[1]
        ly0, lx0 = math.floor(y0 * fy), math.floor(x0 * fx)
        ly1, lx1 = math.ceil(y1 * fy), math.ceil(x1 * fx)
        x, y = round(lx0 * lv.downsample[1]), round(ly0 * lv.downsample[0])
        raw = slide.read_region(x, y, lx1 - lx0, ly1 - ly0, level=self.level)
        return resize(raw, x1 - x0, y1 - y0)


def _grid(slide: Slide, mpp: float, notes: list[str]) -> _Grid:
    _, h0, w0 = slide.shape
    mpp0 = slide.mpp[0] if slide.mpp else NOMINAL_MPP
    if not slide.mpp:
        notes.append(f"pixel size unknown: judged as if {NOMINAL_MPP} um/px (20x)")
    want = mpp / mpp0  # level-0 px per map px
    if want < 1 - MPP_TOLERANCE:
        # the detectors' widths are micrometres: on coarser pixels they see nothing
        raise NotJudged(
            f"{slide.name}: scanned at {mpp0:.3g} um/px, coarser than the {mpp:g} um/px QC "
            "maps are made at; QC needs a slide at least that fine (or a coarser mpp)"
        )
    level = max(lv.index for lv in slide.levels if lv.downsample[1] <= want * (1 + MPP_TOLERANCE))
    lv = slide.levels[level]
    if abs(lv.downsample[1] / want - 1) <= MPP_TOLERANCE:
        return _Grid(level, (lv.height, lv.width), lv.downsample, mpp0 * lv.downsample[1], True)
    if level == 0 and max(h0, w0) / want > 4 * 4096 and max(h0, w0) > 8 * 4096:
        raise StoreError(
            f"{slide.name}: no pyramid level near {mpp} um/px; convert again so levels are built"
        )
    shape = (max(1, round(h0 / want)), max(1, round(w0 / want)))
    downsample = (h0 / shape[0], w0 / shape[1])
    return _Grid(level, shape, downsample, mpp0 * downsample[1], False)


def _read_ahead(slide: Slide, grid: _Grid, windows: list):
    """Yield (block, window, pixels), the next window read on a thread while the caller
    judges this one (decoding overlaps the detectors; one block ahead bounds memory)."""
    with ThreadPoolExecutor(1, thread_name_prefix="qc-read") as reader:
        ahead = None
        for i, (block, window) in enumerate(windows):
            pixels = ahead.result() if ahead else grid.read(slide, *window)
            if i + 1 < len(windows):
                ahead = reader.submit(grid.read, slide, *windows[i + 1][1])
            yield block, window, pixels


def _blocks(shape: tuple[int, int], size: int):
    for y0 in range(0, shape[0], size):
        for x0 in range(0, shape[1], size):
            yield y0, x0, min(y0 + size, shape[0]), min(x0 + size, shape[1])


def _resample(mask: np.ndarray, downsample: tuple[float, float], grid: _Grid) -> np.ndarray:
    """A mask on another grid, nearest: each map pixel takes the mask pixel at its centre."""
    h, w = grid.shape
    iy = ((np.arange(h) + 0.5) * grid.downsample[0] / downsample[0]).astype(np.int64)
    ix = ((np.arange(w) + 0.5) * grid.downsample[1] / downsample[1]).astype(np.int64)
    return mask[np.minimum(iy, mask.shape[0] - 1)][:, np.minimum(ix, mask.shape[1] - 1)]


def _slide_stats(slide: Slide, grid: _Grid, tissue: TissueMask, device):
    """(StainStats of the tissue, busy(y0, x0, y1, x1): whether a window of the grid holds
    anything but glass), from a read 4x coarser than the grid; 2x or at the grid itself
    where the tissue there is too small to measure (a fragment on a mostly empty slide
    would otherwise be judged by the glass around it)."""
    for factor in (4, 2, 1):
        found = _stats_at(slide, grid, tissue, device, factor)
        if found is not None or factor == 1:
            break
    if found is None:  # hardly any tissue even at the grid: the whole slide, as said
        found = _stats_at(slide, grid, tissue, device, 1, fallback=True)
    return found


def _stats_at(slide: Slide, grid: _Grid, tissue: TissueMask, device, factor: int, fallback=False):
    import torch

    from tilestore.qc.colour import Pixels, gaussian

    shape = (max(1, round(grid.shape[0] / factor)), max(1, round(grid.shape[1] / factor)))
    _, h0, w0 = slide.shape
    coarse = replace(
        grid, shape=shape, downsample=(h0 / shape[0], w0 / shape[1]), mpp=grid.mpp * factor
    )
    level = max(
        lv.index
        for lv in slide.levels
        if lv.downsample[1] <= coarse.downsample[1] * (1 + MPP_TOLERANCE)
    )
    lv = slide.levels[level]
    image = slide.read_region(0, 0, lv.width, lv.height, level=level)
    if image.shape[:2] != shape:
        from tilestore.reading.slide import resize

        image = resize(image, shape[1], shape[0])
    px = Pixels(torch.from_numpy(np.ascontiguousarray(image.transpose(2, 0, 1))).to(device), 1.0)
    inside = torch.from_numpy(_resample(tissue.mask, tissue.downsample, coarse)).to(device)
    density = gaussian(px.od_sum, 1.0)
    stains = px.stains
    if inside.sum() < 16:  # hardly any tissue: judge against what is not glass instead
        inside = density > GLASS_OD
    if inside.sum() < 16:
        if not fallback:
            return None  # a finer read may find it
        inside = torch.ones_like(inside)

    def robust(values: torch.Tensor) -> tuple[float, float]:
        v = values[inside].float()
        median = float(v.median())
        return median, 1.4826 * float((v - median).abs().median())

    h, h_scale = robust(stains[0])
    e, e_scale = robust(stains[1])
    stats = StainStats(
        od_median=robust(density)[0],
        h_median=h,
        h_scale=h_scale,
        e_median=e,
        e_scale=e_scale,
        gray_median=robust(px.gray)[0],
    )
    occupied = (density > GLASS_OD).cpu().numpy()
    table = np.pad(occupied.cumsum(0).cumsum(1), ((1, 0), (1, 0)))

    def busy(y0: int, x0: int, y1: int, x1: int) -> bool:
        a, b = y0 // factor, x0 // factor
        c, d = min(-(-y1 // factor), shape[0]), min(-(-x1 // factor), shape[1])
        return bool(table[c, d] - table[a, d] - table[c, b] + table[a, b] > 0)

    return stats, busy


def _detect(pixels, tissue, mpp, options, params, stats, device) -> np.ndarray:
    """The bit map of one block."""
    import torch

    from tilestore.qc.colour import Pixels

    rgb = torch.from_numpy(np.ascontiguousarray(pixels.transpose(2, 0, 1))).to(device)
    px = Pixels(rgb, mpp)
    inside = torch.from_numpy(np.ascontiguousarray(tissue)).to(device)
    bits = torch.zeros(inside.shape, dtype=torch.uint8, device=device)
    for k, name in enumerate(options.detectors):
        detector = DETECTORS[name]
        found = detector.find(px, inside, detector.params(**params[name]), stats)
        bits |= found.to(torch.uint8) << k
    return bits.cpu().numpy()
