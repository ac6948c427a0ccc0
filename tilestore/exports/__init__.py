"""Stores and their embeddings out to other tools' files, one module per export: `ometiff` (a
store's pixels as pyramidal OME-TIFF), `h5` (tile features as per-slide HDF5 in TRIDENT's and
CLAM's layout or STAMP's), `h5ad` (tiles as AnnData), `slidetable` (slide embeddings as
Parquet, CSV or AnnData), `qupath` (tiles as QuPath GeoJSON), `maps` (PCA and cluster PNGs),
`heatmap` (per-tile values as PNG, GeoJSON or an OME-Zarr label image); `tiles` the
analysis step those of tile embeddings share (clusters, PCs). `registry` lists
them (`EXPORTS`): what each reads and writes, its writer, its command (`export_<name>`: the
inputs and declared options of `tilestore export <name>`), its help.

>>> to_ome_tiff("A.ome.zarr", "A.ome.tiff")
>>> cohort_to_h5("stores/*.ome.zarr", "uni", "h5/", layout="stamp")
>>> write_heatmap(heatmap_values("A.ome.zarr", "uni", "clusters", k=6), png="A.png")

May import: `tilestore.view` (the viewer's per-tile values), `tilestore.embeddings`,
`tilestore.analysis`, `tilestore.reading`, `tilestore.format`; never `tilestore.conversion`
(an OME-TIFF reads a store's pixels, it is not the write path into stores).
"""

from __future__ import annotations

from tilestore.faces import lazy_face

__getattr__, __dir__, __all__ = lazy_face(
    __name__,
    {
        "tilestore.errors": ("ExportError",),
        "tilestore.exports.files": ("Exported",),
        "tilestore.exports.h5": ("H5Export", "cohort_to_h5", "export_h5", "to_h5"),
        "tilestore.exports.h5ad": ("export_anndata", "to_anndata"),
        "tilestore.exports.heatmap": (
            "Heatmap",
            "export_heatmap",
            "heatmap_values",
            "write_geojson",
            "write_heatmap",
            "write_labels",
            "write_png",
        ),
        "tilestore.exports.maps": ("export_map", "write_maps"),
        "tilestore.exports.ometiff": ("TiffExport", "export_ome_tiff", "to_ome_tiff"),
        "tilestore.exports.options": ("LAYOUTS", "SUFFIXES", "H5Layout"),
        "tilestore.exports.qupath": ("export_qupath", "to_qupath"),
        "tilestore.exports.registry": ("EXPORTS", "Export", "get_export"),
        "tilestore.exports.tiles": ("TileAnalysis", "analyse_tiles"),
        "tilestore.exports.slidetable": (
            "export_slides",
            "slide_table",
            "table_format",
            "write_slide_table",
        ),
    },
)
