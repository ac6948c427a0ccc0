"""How to QC a slide (`QCOptions`): plain data with its defaults, the one table the command
reads its defaults from (no torch: the detectors are loaded only to compute)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tilestore.qc.classes import ARTEFACTS


@dataclass(frozen=True)
class QCOptions:
    """How to QC a slide.

    mpp: resolution of the maps, um/px (2-4 is the range the defaults are tuned for).
    detectors: which artefacts to look for (names of `DETECTORS`), in label order.
    params: per-detector parameter overrides, {"blur": {"max_ratio": 0.2}, ...}.
    device: "cuda", "cpu" or None (the GPU where there is one).
    block: block side in px at mpp (memory: about 60 bytes per px on the device).
    threads: torch's CPU threads (None: its default, every core); a cohort gives each of
    its workers a share.
    fine_blur: the blur pass at the models' resolution (`tilestore.qc.fine`): "full" judges
    every 32 um cell of tissue, "sparse" one cell in 3 x 3 first, then every cell around
    those found, "off" none; "auto": full on a GPU, sparse on the CPU.
    """

    mpp: float = 4.0
    detectors: tuple[str, ...] = tuple(ARTEFACTS)
    params: dict[str, dict[str, Any]] = field(default_factory=dict)
    device: str | None = None
    block: int = 2048
    threads: int | None = None
    fine_blur: str = "auto"
