"""The QC detectors' parameters and the slide's stain statistics: plain records, every
length in micrometres (no torch, no scipy: the embedding pass's per-tile measures read
them too, `tilestore.qc.tilewise`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StainStats:
    """The slide's tissue, measured once at a coarse level: what "usual" means for it."""

    od_median: float  # median total OD of tissue
    h_median: float  # haematoxylin amount (OD units)
    h_scale: float  # robust spread (1.4826 x MAD)
    e_median: float
    e_scale: float
    gray_median: float  # median luminance of tissue


@dataclass(frozen=True)
class PenParams:
    """Marker ink: colour rules on CIELAB smoothed over smooth_um, then an opening of
    min_width_um (strokes are hundreds of micrometres wide; nuclei and red cells are not).

    Hue ranges are degrees on the a*b* plane. Haematoxylin sits near 300-320 (purple) and
    eosin near 315-355 (pink), both below chroma 37 over a region; blue ink near 285-300
    over tissue, green ink 100-220, red ink 8-45 (over dense tissue it darkens to chroma
    24-50, so its floor is 22: its hue, not its chroma, keeps it apart from eosin; a
    haemorrhage wider than min_width_um can read as red ink); black ink is dark and grey.
    """

    smooth_um: float = 8.0
    min_width_um: float = 40.0
    blue: tuple[float, float, float] = (230.0, 305.0, 35.0)  # hue from, hue to, min chroma
    green: tuple[float, float, float] = (100.0, 220.0, 15.0)
    red: tuple[float, float, float] = (8.0, 45.0, 22.0)
    black_max_l: float = 30.0  # L* below this ...
    black_max_chroma: float = 12.0  # ... and chroma below this is black ink


@dataclass(frozen=True)
class BlurParams:
    """Out of focus: the share of a region's texture energy in the finest scale.

    fine = image - G(fine_um); coarse = G(fine_um) - G(coarse_um); both squared and averaged
    over window_um. In focus, nuclei put much of the energy in the finest band; blur moves
    it to the coarse band. The ratio fine / (fine + coarse) does not depend on contrast, so
    pale tissue is not called blurry; regions with almost no texture (min_energy, in OD^2)
    are not judged at all.
    """

    fine_um: float = 4.0
    coarse_um: float = 16.0
    window_um: float = 24.0
    max_ratio: float = 0.3
    grow_ratio: float = 0.45
    min_energy: float = 2e-4
    min_width_um: float = 48.0
    # not judged this close to another artefact: a strong edge reaches the energies over
    # about 3 x sqrt(window^2 + coarse^2) = 87 um (at 60 um, blur ringed black ink)
    apart_um: float = 90.0


@dataclass(frozen=True)
class FoldParams:
    """Folded tissue: two layers, so more of both stains than the slide usually has.

    Total OD smoothed over smooth_um above factor x the slide's tissue median, and eosin
    more than min_eosin_z robust spreads above the slide's median: dense nuclei (much
    haematoxylin, little eosin) are not folds. Gaps up to close_um are closed; regions
    narrower than min_width_um are dropped. A fold over epidermis, which is already as
    dark as a fold, is found only in part (the QC table, docs/guide/qc.md).
    """

    smooth_um: float = 24.0
    factor: float = 1.3
    min_eosin_z: float = 1.2
    grow_factor: float = 1.1  # found regions grow by smooth_um into tissue above these
    grow_eosin_z: float = 0.5
    close_um: float = 24.0
    min_width_um: float = 48.0
    min_area_um2: float = 30_000.0  # e.g. 100 x 300 um; a dense spot is not a fold


@dataclass(frozen=True)
class BubbleParams:
    """Air bubbles and coverslip edges: thin dark grey lines (dark and grey, narrower than
    line_um), closed rings filled (bubbles) or long lines banded (coverslip edges).

    A ring encloses at least min_diameter_um; a line at least edge_length_um long is an
    edge, flagged edge_band_um to each side.
    """

    line_um: float = 24.0
    max_gray: float = 0.2  # luminance (linear, 0-1) of a rim: glass is about 0.8
    max_chroma: float = 14.0
    min_diameter_um: float = 80.0
    edge_length_um: float = 1000.0
    edge_band_um: float = 40.0


@dataclass(frozen=True)
class LightParams:
    """Too dark or too bright tissue: mean luminance over smooth_um below dark or above
    bright (0-1, linear light). Bright counts only where stain is left (chroma above
    min_chroma): faded or washed-out tissue, not the fat and lumens a tissue mask encloses.
    """

    smooth_um: float = 16.0
    dark: float = 0.06
    bright: float = 0.72
    min_chroma: float = 4.0
    min_width_um: float = 40.0


@dataclass(frozen=True)
class StainParams:
    """Stain outliers: haematoxylin or eosin amount (colour deconvolution, smoothed over
    smooth_um) more than max_z robust spreads from the slide's own tissue median, over at
    least min_width_um. The cohort-level comparison is in the report."""

    smooth_um: float = 24.0
    max_z: float = 6.0
    min_width_um: float = 60.0
