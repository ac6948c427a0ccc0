"""The tissue mask's options a user sets, declared once (`tilestore.options`) for
`compute_tissue`, a plan's `tissue_method` and the command's flags. Light: no scipy."""

from __future__ import annotations

from typing import Annotated, Literal

from tilestore.options import Opt

TISSUE_MPP = 8.0  # um/px of the mask: tissue's outline, not its cells

Methods = Literal["auto", "otsu", "contrast"]  # auto: detects brightfield or fluorescence
TissueMethod = Annotated[Methods, Opt("auto (detects brightfield/fluorescence), otsu or contrast.")]
# a store's mask made with its conversion (`convert(tissue=)`): checked at the call like any
# method, since the mask's own refusals are left to the plan (`conversion.beside`)
TissueBesideMethod = Annotated[
    Methods | None,
    Opt("Also make the store's tissue mask with this method.", none="no mask"),
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
