"""Looking at a store in a browser: a local, read-only viewer (`server`: the slides'
own chunks as tiles, `overlays` of tissue, QC, plans and per-tile `values` of embeddings,
a similarity search). The heatmaps it draws, written out for other tools:
`tilestore.exports.heatmap`.

May import: `tilestore.embeddings`, `tilestore.plan`, `tilestore.qc`, `tilestore.masks`,
`tilestore.analysis`, `tilestore.reading`, `tilestore.format`; never `tilestore.conversion`
(a slide file is opened in place by the command, which may convert).
"""

from __future__ import annotations

from tilestore.faces import lazy_face

__getattr__, __dir__, __all__ = lazy_face(
    __name__,
    {
        "tilestore.view.catalog": ("Catalog", "ViewError"),
        "tilestore.view.options": ("HOST", "PORT", "Host", "Port", "TileIndex"),
        "tilestore.view.server": ("bind", "make_app", "serve"),
        "tilestore.view.values": ("read_scores", "tile_values"),
    },
)
