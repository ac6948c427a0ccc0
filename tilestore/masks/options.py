"""The tissue mask's options a user sets, declared once (`tilestore.options`) for
`compute_tissue`, a plan's `tissue_method` and the command's flags. Light: no scipy."""

from __future__ import annotations

from typing import Annotated, Literal

from tilestore.options import Opt

TISSUE_MPP = 8.0  # um/px of the mask: tissue's outline, not its cells

TissueMethod = Annotated[
    Literal["auto", "otsu", "contrast"],  # auto: detects brightfield or fluorescence
    Opt("auto (detects brightfield/fluorescence), otsu or contrast."),
]
TissueMpp = Annotated[
    float,
    Opt(
        "Mask resolution (read from a low-resolution level).",
        unit="um/px",
        low=0.25,
        high=100,
    ),
]
