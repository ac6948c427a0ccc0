"""Pixel sizes: how close a level's resolution must be to the one asked for to be read as it
is, the level-0 pixel size a user may give, and the one rule for what a store records of it
(light: plans and the command read these without opening anything).

A size the file states is a fact: a size given (`convert(mpp=)`, `open_in_place(mpp=)`,
`embed --scan-mpp`) supplies a missing one, and replaces one the file states only with
`override_mpp`, recorded as such with the file's own (`Mpp.file`). `settle_mpp` decides what
a store is made with; `check_made` whether one made before stands for what is asked now.
"""

from __future__ import annotations

import re
from typing import Annotated

from tilestore.errors import OptionError, StoreError
from tilestore.format.record import MPP_RANGE, OVERRIDE, Mpp
from tilestore.options import Opt

MAX_MPP = MPP_RANGE[1]  # um/px: coarser than any level a tile or a scan is read at

# The level-0 pixel size a user gives where the file records none (with `OverrideMpp`: over
# the one it records): `convert(mpp=)`, `open_in_place(mpp=)`, `embed --scan-mpp`.
ScanMpp = Annotated[
    float | None,
    Opt(
        "Level-0 um/px where the file states none (one it states is replaced only with "
        "--override-mpp).",
        unit="um/px",
        low=MPP_RANGE[0],
        high=MPP_RANGE[1],
        none="the file's",
    ),
]

OverrideMpp = Annotated[
    bool,
    Opt(
        "Replace the pixel size the file states with the one given (recorded in the store "
        "as an override with the file's own; said by info and each slide's line).",
    ),
]

# A level whose mpp is within 2% of the one asked for is used as is: scanners calibrate to
# 0.2499 or 0.5015 um/px, and reading the next finer level for that would cost 4x the pixels.
# The same 2% makes a size given agree with the one the file states (the file's is kept).
MPP_TOLERANCE = 0.02

GIVEN = "user (mpp option)"  # the origin of a size given where the file states none


def settle_mpp(
    stated: Mpp | None, given: float | None, override: bool, where: object
) -> Mpp | None:
    """The level-0 pixel size a store of the slide `where` records: the file's (`stated`);
    a size `given` where the file states none; with `override`, the size given over the
    file's (origin OVERRIDE, the file's own kept in `file`). A size given that disagrees
    with the file's (beyond MPP_TOLERANCE) without `override`, or `override` without a size,
    is one OptionError, before anything is made."""
    if override and given is None:
        raise OptionError(
            f"{where}: override_mpp=True replaces the file's pixel size with mpp=<um/px>: "
            "give the size too"
        )
    if given is None:
        return stated
    if override:
        return Mpp(given, given, OVERRIDE, stated)
    if stated is None:
        return Mpp(given, given, GIVEN)
    if _within(stated, given, MPP_TOLERANCE):
        return stated
    raise OptionError(
        f"{where}: the file states {_size(stated)} ({stated.origin}), not the {given:g} um/px "
        f"given (mpp={given:g}), which supplies a missing pixel size only: leave it out to use "
        "the file's, or add override_mpp=True to replace it (recorded as an override)"
    )


def check_made(recorded: Mpp | None, given: float | None, override: bool, where: object) -> None:
    """Refuse a store made before (`where`, recording `recorded`) that is not what a slide's
    store would be made with now (`settle_mpp`'s `given`, `override`): another size given,
    an override where none is asked or none where one is, a size given that its file's
    disagrees with. It is kept, never remade quietly nor read at another resolution;
    nothing asked (no size, no override) takes a store made without an override as it is."""
    if override and given is None:
        settle_mpp(recorded, given, override, where)  # the OptionError
    overridden = recorded is not None and recorded.overridden
    if given is None:
        if not overridden:
            return
        asked = "the file's own size asked (no override)"
        again = f"or ask the same (mpp={recorded.x:g} with override_mpp=True)"
    elif override:
        if overridden and _within(recorded, given, 1e-6):
            return
        asked = f"the override to {given:g} um/px asked"
        again = "to make it again with that override"
    else:
        if recorded is not None and not overridden and not _given(recorded):
            settle_mpp(recorded, given, False, where)  # the file's: a conflict is refused so
            return
        if recorded is not None and not overridden and _within(recorded, given, 1e-6):
            return
        asked = f"the {given:g} um/px asked"
        again = "to make it again with that pixel size"
    raise StoreError(f"{where}: made before with {_made(recorded)}, not {asked}; remove it {again}")


def _given(mpp: Mpp) -> bool:
    """A size a user gave where the file stated none (stores made before overrides were
    told apart say so too)."""
    return bool(mpp.origin) and mpp.origin.startswith("user")


def _within(mpp: Mpp, given: float, tolerance: float) -> bool:
    return abs(mpp.x / given - 1) <= tolerance and abs(mpp.y / given - 1) <= tolerance


def _size(mpp: Mpp) -> str:
    return f"{mpp.x:g} um/px" if mpp.x == mpp.y else f"{mpp.x:g} x {mpp.y:g} um/px"


def _made(mpp: Mpp | None) -> str:
    if mpp is None:
        return "no pixel size"
    if not mpp.overridden:
        return _size(mpp)
    stated = f"the file's {_size(mpp.file)}" if mpp.file else "the file's none"
    return f"{_size(mpp)} by override of {stated}"


def described(mpp: Mpp | None) -> str:
    """A store's level-0 pixel size in words, an override said as one ("0.25 um/px,
    OVERRIDE of the file's 0.499 um/px (SVS ImageDescription MPP)")."""
    if mpp is None:
        return "unknown"
    if not mpp.overridden:
        return f"{_size(mpp)} ({mpp.origin})" if mpp.origin else _size(mpp)
    if mpp.file is None:
        return f"{_size(mpp)}, OVERRIDE (the file states none)"
    return f"{_size(mpp)}, OVERRIDE of the file's {_size(mpp.file)} ({mpp.file.origin})"


def in_scan_terms(message: str) -> str:
    """A conversion's message in the terms of a command reading the slide files it is given
    (embed, view): convert's and open_in_place's `mpp` is their `scan_mpp`."""
    return re.sub(r"(?<![\w.-])mpp=(?=[<\d])", "scan_mpp=", message)
