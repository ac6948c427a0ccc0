"""The exports' options a command shows before anything is loaded: which layout the
per-slide HDF5 files (`tilestore.exports.h5`) are written in."""

from __future__ import annotations

from typing import Annotated, Literal, get_args

from tilestore.options import Opt

H5Layout = Annotated[
    Literal["trident", "stamp"],
    Opt(
        "trident (TRIDENT's and CLAM's: features, coords in level-0 px) or stamp (STAMP's: "
        "feats, coords in um)."
    ),
]
LAYOUTS = get_args(get_args(H5Layout)[0])
