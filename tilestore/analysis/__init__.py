"""Looking at results: the `ds.tiles` accessor of embeddings (`accessor`: PCA, k-means,
nearest tiles), figures (`plots`) and pictures of a slide with its overlays (`preview`).
Files for other tools: `tilestore.exports`.

May import: `tilestore.reading`, `tilestore.format`.
"""

from __future__ import annotations

from tilestore.faces import lazy_face

__getattr__, __dir__, __all__ = lazy_face(
    __name__,
    {
        "tilestore.analysis.accessor": ("AnalysisError", "TilesAccessor", "register_accessor"),
        "tilestore.analysis.options": (
            "CLUSTERS",
            "MAX_CLUSTERS",
            "PCS",
            "Clusters",
            "Components",
            "OptionalClusters",
            "OptionalComponents",
        ),
        "tilestore.analysis.plots": ("plot_gallery", "plot_hits", "plot_map"),
        "tilestore.analysis.preview": ("render_preview", "save_preview", "thumbnail"),
    },
)
