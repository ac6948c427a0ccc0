"""The viewer's options a user sets, declared once (`tilestore.options`) for `bind` and the
command's flags. Light: no Starlette."""

from __future__ import annotations

from typing import Annotated, Literal

from tilestore.options import Opt

PORT = 8000  # the viewer's port where none is asked for
HOST = "127.0.0.1"  # this machine only, where no address is asked for

Host = Annotated[str, Opt("Address to listen on; the default is this machine only.")]
Port = Annotated[
    int | Literal["auto"],
    Opt("Port to listen on ('auto': any free one).", low=1, high=65_535, metavar="N|auto"),
]
TileIndex = Annotated[
    int | None,
    Opt("A tile, by its number in the slide's plan.", low=0, high=2**40),
]
