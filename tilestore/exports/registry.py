"""Which exports there are: one `Export` of plain facts each (what it reads, what it writes,
the function that writes it, the function that is its command, one line of help), in the
order `tilestore export --help` lists them.

`tilestore export` is generated from here: each subcommand's flags from its command
function's declared options, its help from the line here and the function's docstring. A
new export is a module of its own (its writer and its command function, heavy imports
inside them) and a line here.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from tilestore.exports.options import SUFFIXES

# what an export reads: a store's pixels (its image levels), the tile embeddings of a model,
# a cohort's slide embeddings, or per-tile values (a column, clusters, similarity, scores)
Reads = Literal["a store's pixels", "tile embeddings", "slide embeddings", "per-tile values"]


@dataclass(frozen=True)
class Export:
    """One export: its name (the subcommand `tilestore export <name>`), what it reads, what
    it writes (file suffixes; a folder of files, or the store itself, said in words), its
    module (in `tilestore.exports`), the function there that writes it, the function
    there that is its command (its first parameter what the command line names, the
    stores or the store; its other parameters declared options, `tilestore.options`; it
    returns the lines to print, `Exported`), and one line of help. Both are loaded from
    the module named here; the face of `tilestore.exports` offers the registered ones too
    (a test holds it to the registry)."""

    name: str
    reads: Reads
    writes: tuple[str, ...]
    module: str
    writer: str
    command: str
    help: str

    def load(self) -> Callable[..., Any]:
        """The function that writes this export (its module loaded now, not before)."""
        return getattr(importlib.import_module(self.path), self.writer)

    def load_command(self) -> Callable[..., Any]:
        """The function that is this export's command (its module loaded now: light, its
        heavy imports inside its functions)."""
        return getattr(importlib.import_module(self.path), self.command)

    @property
    def path(self) -> str:
        """Its module's full name."""
        return f"tilestore.exports.{self.module}"

    @property
    def summary(self) -> str:
        """Its help, and what it reads and writes: the line the command's list shows."""
        return f"{self.help} Reads {self.reads}; writes {', '.join(self.writes)}."


EXPORTS = (
    Export(
        "ome-tiff",
        "a store's pixels",
        (".ome.tiff",),
        "ometiff",
        "to_ome_tiff",
        "export_ome_tiff",
        "A tiled, pyramidal OME-TIFF (SubIFDs) for QuPath, OMERO and Bio-Formats.",
    ),
    Export(
        "qupath",
        "tile embeddings",
        (".geojson",),
        "qupath",
        "to_qupath",
        "export_qupath",
        "Tiles as QuPath tile objects: classified by cluster, PCs as measurements.",
    ),
    Export(
        "anndata",
        "tile embeddings",
        (".h5ad",),
        "h5ad",
        "to_anndata",
        "export_anndata",
        "Tiles as an AnnData .h5ad (X = features, obsm['spatial'] = centres) for scanpy/squidpy.",
    ),
    Export(
        "map",
        "tile embeddings",
        (".png",),
        "maps",
        "write_maps",
        "export_map",
        "PNG maps over the slide thumbnail: first three PCs as colour, optionally clusters.",
    ),
    Export(
        "heatmap",
        "per-tile values",
        (".png", ".geojson", "a label image in the store"),
        "heatmap",
        "write_heatmap",
        "export_heatmap",
        "A heatmap of per-tile values for other tools: PNG, QuPath GeoJSON, OME-Zarr label.",
    ),
    Export(
        "h5",
        "tile embeddings",
        ("a folder of <slide>.h5",),
        "h5",
        "cohort_to_h5",
        "export_h5",
        "Tile features as per-slide HDF5 files for TRIDENT, CLAM and other MIL code, or STAMP.",
    ),
    Export(
        "slides",
        "slide embeddings",
        SUFFIXES,
        "slidetable",
        "write_slide_table",
        "export_slides",
        "A cohort's slide embeddings as one table, a row per slide, for classifiers, "
        "survival models and retrieval.",
    ),
)


def get_export(name: str) -> Export:
    """The export called `name` (a KeyError names those there are: a bug, not a user's)."""
    for export in EXPORTS:
        if export.name == name:
            return export
    raise KeyError(f"no export {name!r}; there are {', '.join(e.name for e in EXPORTS)}")
