"""The exports' options a command shows before anything is loaded: which layout the
per-slide HDF5 files (`tilestore.exports.h5`) are written in, and what the export commands
share (the stores read, the model, the plan, leaving out stores without embeddings)."""

from __future__ import annotations

from pathlib import Path
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

# The files a slide table is written as, its suffix saying which (`slidetable.WRITERS`)
SUFFIXES = (".parquet", ".csv", ".h5ad")

# What an export command reads: one store, or a cohort's (names or quoted globs); and the
# options most exports of embeddings share.
Store = Annotated[Path, Opt("An embedded store.")]
Stores = Annotated[list[str], Opt("Embedded stores, or a quoted glob.")]
Model = Annotated[str, Opt("The model the store was embedded with.", short="m")]
PlanName = Annotated[
    str | None,
    Opt(
        "The plan whose embeddings are read, where a store holds the model's of several.",
        none="each store's only one",
    ),
]
SkipMissing = Annotated[
    bool,
    Opt(
        "Leave out, with a warning, stores without this model's finished embeddings (stores "
        "a quoted glob finds are always left out so)."
    ),
]
Overwrite = Annotated[bool, Opt("Replace existing files.")]
