"""QC in the store: the label image labels/qc and the slide's summary in its attributes.

labels/qc holds one value per map pixel: 0 none, else the first artefact (in detector
order) found there; its class names and colours are OME-Zarr label metadata. The store's
root attribute ``qc`` is the summary a cohort table is made of: tissue area, the share of
tissue each artefact covers, the slide's stain statistics, and flags.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from tilestore.errors import StoreError
from tilestore.qc.classes import ARTEFACTS
from tilestore.qc.options import FLAG_FRACTION
from tilestore.reading.labels import read_label, write_label
from tilestore.reading.slide import Slide

if TYPE_CHECKING:
    from tilestore.qc.maps import QCMaps

NAME = "qc"


@dataclass(frozen=True)
class StoredQC:
    """labels/qc as plans use it: the label image, its grid and class names."""

    label: np.ndarray  # uint8 (h, w)
    downsample: tuple[float, float]
    classes: list[str]  # artefact names; label value = index + 1

    def mask(self, name: str) -> np.ndarray:
        return self.label == self.classes.index(name) + 1


def summarise(slide: Slide, maps: QCMaps, flag_fraction: float = FLAG_FRACTION) -> dict[str, Any]:
    """The slide's QC summary (what `write_qc` stores in the root's ``qc`` attribute)."""
    # the area judged: tissue, and what bubbles hide of it (their pale insides are not
    # tissue to a tissue mask); ink is saturated, so a tissue mask takes it for tissue
    judged = maps.tissue | maps.mask("bubble") if "bubble" in maps.classes else maps.tissue
    tissue = judged & ~maps.mask("pen") if "pen" in maps.classes else judged
    area_px = int(tissue.sum())
    fractions = {
        name: float((maps.mask(name) & judged).sum() / max(int(judged.sum()), 1))
        for name in maps.classes
    }
    flags = [name for name, share in fractions.items() if share > flag_fraction]
    if not area_px:
        flags.append("no tissue")
    px_um2 = (
        maps.downsample[0] * maps.downsample[1] * slide.mpp[0] * slide.mpp[1] if slide.mpp else None
    )
    return {
        "tissue_mm2": area_px * px_um2 / 1e6 if px_um2 else None,
        "tissue_fraction": float(tissue.mean()) if tissue.size else 0.0,
        "fractions": fractions,
        "not_judged": maps.not_judged,  # asked for, but not judged on this slide (notes: why)
        "flags": flags,
        "flag_fraction": flag_fraction,
        "stain": asdict(maps.stats),
        "mpp": maps.mpp,
        "level": maps.level,
        "device": maps.device,
        "seconds": round(maps.seconds, 3),
        "params": maps.params,
        "notes": maps.notes,
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }


def write_qc(slide: Slide, maps: QCMaps, flag_fraction: float = FLAG_FRACTION) -> dict:
    """Store labels/qc and the summary (root attribute ``qc``); return the summary."""
    summary = summarise(slide, maps, flag_fraction)
    classes = [("none", (0, 0, 0, 0))]
    classes += [(name, ARTEFACTS[name].rgba) for name in maps.classes]
    write_label(
        slide,
        NAME,
        maps.label(),
        maps.downsample,
        classes,
        {
            "classes": maps.classes,
            "downsample": list(maps.downsample),
            "what": {name: ARTEFACTS[name].what for name in maps.classes},
            **summary,
        },
        method="QC artefact classes; coarser levels nearest",
    )
    root = slide.writable_group()
    root.attrs["qc"] = summary
    return summary


def read_qc(slide: Slide) -> StoredQC | None:
    """The stored labels/qc, or None if `tilestore qc` has not run on this store."""
    return read_label(
        slide,
        NAME,
        lambda label, facts: StoredQC(label, tuple(facts["downsample"]), list(facts["classes"])),
    )


def read_summary(slide: Slide) -> dict[str, Any] | None:
    """The stored QC summary, or None."""
    summary = slide.group.attrs.asdict().get("qc")
    if summary is not None and not isinstance(summary, dict):
        raise StoreError(f"{slide.name}: the QC summary is damaged; run `tilestore qc` again")
    return summary
