"""Slide quality control: artefact maps (pen, bubbles, folds, dark, bright, blur, stain
outliers) from a low-resolution level, stored as the label image labels/qc.

>>> from tilestore.qc import QCOptions, compute_qc, write_qc
>>> maps = compute_qc(slide, QCOptions(mpp=4))
>>> summary = write_qc(slide, maps)       # labels/qc + the store's "qc" attributes

The detectors run in torch (`tilestore.qc.colour`, `.detectors`, `.maps`: the only
modules of tilestore that import it); reading stored QC (`.store`, used by plans) and the
cohort report (`.report`) do not, so planning never pays torch's import.

May import `tilestore.masks`, `tilestore.analysis` (previews), `tilestore.reading` and
`tilestore.format`; `tilestore.plan` reads stored QC from above.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tilestore.faces import lazy_face

__getattr__, __dir__, __all__ = lazy_face(
    __name__,
    {
        "tilestore.qc.classes": ("ARTEFACTS",),
        "tilestore.qc.detectors": ("DETECTORS", "StainStats"),
        "tilestore.qc.maps": ("QCMaps", "compute_qc"),
        "tilestore.qc.options": ("FLAG_FRACTION", "FlagFraction", "QCOptions"),
        "tilestore.qc.store": ("StoredQC", "read_qc", "read_summary", "write_qc"),
        "tilestore.qc.cohort": ("SlideQC", "qc_cohort", "qc_store"),
        "tilestore.qc.report": ("write_report",),
    },
)

if TYPE_CHECKING:
    from tilestore.qc.classes import ARTEFACTS
    from tilestore.qc.cohort import SlideQC, qc_cohort, qc_store
    from tilestore.qc.detectors import DETECTORS, StainStats
    from tilestore.qc.maps import QCMaps, compute_qc
    from tilestore.qc.options import FLAG_FRACTION, FlagFraction, QCOptions
    from tilestore.qc.report import write_report
    from tilestore.qc.store import StoredQC, read_qc, read_summary, write_qc
