"""Slide quality control: artefact maps (pen, bubbles, folds, dark, bright, blur, stain
outliers) from a low-resolution level, stored as the label image labels/qc.

>>> from tilestore.qc import QCOptions, compute_qc, write_qc
>>> maps = compute_qc(slide, QCOptions(mpp=4))
>>> summary = write_qc(slide, maps)       # labels/qc + the store's "qc" attributes

The detectors run in torch (`tilestore.qc.colour`, `.detectors`, `.maps`: the only
modules of tilestore that import it); reading stored QC (`.store`, used by plans) and the
cohort report (`.report`) do not, so planning never pays torch's import.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

_MEMBERS = {
    "ARTEFACTS": "tilestore.qc.classes",
    "DETECTORS": "tilestore.qc.detectors",
    "StainStats": "tilestore.qc.detectors",
    "DEFAULT_MPP": "tilestore.qc.maps",
    "QCMaps": "tilestore.qc.maps",
    "QCOptions": "tilestore.qc.maps",
    "compute_qc": "tilestore.qc.maps",
    "FLAG_FRACTION": "tilestore.qc.store",
    "StoredQC": "tilestore.qc.store",
    "read_qc": "tilestore.qc.store",
    "read_summary": "tilestore.qc.store",
    "write_qc": "tilestore.qc.store",
    "SlideQC": "tilestore.qc.cohort",
    "qc_cohort": "tilestore.qc.cohort",
    "qc_store": "tilestore.qc.cohort",
    "write_report": "tilestore.qc.report",
}
__all__ = [
    "ARTEFACTS",
    "DEFAULT_MPP",
    "DETECTORS",
    "FLAG_FRACTION",
    "QCMaps",
    "QCOptions",
    "SlideQC",
    "StainStats",
    "StoredQC",
    "compute_qc",
    "qc_cohort",
    "qc_store",
    "read_qc",
    "read_summary",
    "write_qc",
    "write_report",
]


def __getattr__(name: str):
    if name in _MEMBERS:
        return getattr(importlib.import_module(_MEMBERS[name]), name)
    raise AttributeError(f"module 'tilestore.qc' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


if TYPE_CHECKING:
    from tilestore.qc.classes import ARTEFACTS
    from tilestore.qc.cohort import SlideQC, qc_cohort, qc_store
    from tilestore.qc.detectors import DETECTORS, StainStats
    from tilestore.qc.maps import DEFAULT_MPP, QCMaps, QCOptions, compute_qc
    from tilestore.qc.report import write_report
    from tilestore.qc.store import FLAG_FRACTION, StoredQC, read_qc, read_summary, write_qc
