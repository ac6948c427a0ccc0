"""Pixel sizes: how close a level's resolution must be to the one asked for to be read as it
is, and the level-0 pixel size a user may give (light: plans and the command read these
without opening anything)."""

from __future__ import annotations

from typing import Annotated

from tilestore.options import Opt

MAX_MPP = 100.0  # um/px: coarser than any level a tile or a scan is read at (a 1 mm tile at 10 px)

# The level-0 pixel size a user gives where the file records none (or records it wrong):
# `convert(mpp=)`, `open_in_place(mpp=)`, `embed --scan-mpp`.
ScanMpp = Annotated[
    float | None,
    Opt(
        "Level-0 um/px, overriding (or supplying) the file's value.",
        unit="um/px",
        low=0,
        above=True,
        high=MAX_MPP,
        none="the file's",
    ),
]

# A level whose mpp is within 2% of the one asked for is used as is: scanners calibrate to
# 0.2499 or 0.5015 um/px, and reading the next finer level for that would cost 4x the pixels.
MPP_TOLERANCE = 0.02
