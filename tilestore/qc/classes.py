"""The artefact classes: names, label colours and meanings (plain data, no torch).

The order is the label image's: value k + 1 is the k-th class, and where detectors
overlap the earlier class wins (pen over a blurred region is labelled pen).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Artefact:
    rgba: tuple[int, int, int, int]  # label colour (napari, the report)
    what: str


ARTEFACTS: dict[str, Artefact] = {
    "pen": Artefact((30, 60, 255, 160), "marker ink"),
    "bubble": Artefact((0, 220, 220, 160), "air bubble, coverslip edge"),
    "fold": Artefact((160, 0, 200, 160), "tissue fold"),
    "dark": Artefact((60, 60, 60, 160), "too dark"),
    "bright": Artefact((255, 240, 120, 160), "too bright, washed out"),
    "blur": Artefact((255, 140, 0, 160), "out of focus"),
    "stain": Artefact((255, 0, 90, 160), "stain outlier"),
}
