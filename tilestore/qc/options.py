"""How to QC a slide (`QCOptions`): plain data with its defaults, the one table the command
reads its defaults from (no torch: the detectors are loaded only to compute)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Literal

from tilestore.errors import OptionError
from tilestore.options import Declared, Device, Opt
from tilestore.qc.classes import ARTEFACTS

FineBlur = Literal["auto", "full", "sparse", "off"]
FLAG_FRACTION = 0.05  # a slide is flagged for an artefact over this share of its tissue
FlagFraction = Annotated[
    float,
    Opt("Flag a slide where an artefact covers more of its tissue (a fraction).", low=0, high=1),
]


@dataclass(frozen=True)
class QCOptions(Declared):
    """How to QC a slide, each option declared once here (`tilestore.options`).

    params: per-detector parameter overrides, {"blur": {"max_ratio": 0.2}, ...}.
    block: memory: about 60 bytes per px on the device. threads: a cohort gives each of its
    workers a share. fine_blur: the blur pass at the models' resolution (`tilestore.qc.fine`).
    """

    mpp: Annotated[
        float,
        Opt(
            "Map resolution (2-4 is the range the detectors are tuned for; never level 0).",
            unit="um/px",
            low=0.5,
            high=64,
        ),
    ] = 4.0
    detectors: Annotated[
        tuple[str, ...],
        Opt("Artefacts to look for, comma-separated, in label order.", metavar="A,B,..."),
    ] = tuple(ARTEFACTS)
    params: Annotated[dict, Opt("Per-detector parameter overrides.", cli=False)] = field(
        default_factory=dict
    )
    device: Device = None
    block: Annotated[int, Opt("Block side read at a time.", unit="px", low=256, high=16_384)] = 2048
    threads: Annotated[
        int | None, Opt("torch's CPU threads.", low=1, high=1024, none="every core")
    ] = None
    fine_blur: Annotated[
        FineBlur,
        Opt(
            "The blur pass at 0.5 um/px: full (every 32 um cell), sparse (one in 3 x 3, then "
            "around those found), off; auto: full on a GPU, sparse on the CPU."
        ),
    ] = "auto"

    def __post_init__(self) -> None:
        super().__post_init__()
        unknown = [d for d in self.detectors if d not in ARTEFACTS]
        if unknown or not self.detectors or len(set(self.detectors)) < len(self.detectors):
            raise OptionError(
                f"detectors={','.join(self.detectors)!r}: choose among "
                f"{', '.join(ARTEFACTS)}, each once"
            )
