"""Slide quality control: artefact maps (pen, bubbles, folds, dark, bright, blur, stain
outliers) from a low-resolution level, stored as the label image labels/qc.

>>> from tilestore.qc import QCOptions, compute_qc, write_qc
>>> maps = compute_qc(slide, QCOptions(mpp=4))
>>> summary = write_qc(slide, maps)       # labels/qc + the store's "qc" attributes
"""

from __future__ import annotations

from tilestore.qc.detectors import DETECTORS, StainStats
from tilestore.qc.maps import DEFAULT_MPP, QCMaps, QCOptions, compute_qc

__all__ = ["DEFAULT_MPP", "DETECTORS", "QCMaps", "QCOptions", "StainStats", "compute_qc"]
