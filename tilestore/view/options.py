"""The viewer's options a user sets, declared once (`tilestore.options`) for `bind` and the
command's flags. Light: no Starlette."""

from __future__ import annotations

from typing import Annotated, Literal

from tilestore.options import Opt

Port = Annotated[
    int | Literal["auto"],
    Opt("Port to listen on ('auto': any free one).", low=1, high=65_535, metavar="N|auto"),
]
TileIndex = Annotated[
    int | None,
    Opt("A tile, by its number in the slide's plan.", low=0, high=2**40),
]
