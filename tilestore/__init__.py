"""tilestore: whole-slide images as chunked OME-Zarr 0.5 stores, read lazily and chunk-exactly.

>>> import tilestore
>>> tilestore.convert("slide.svs", "stores/")            # once
>>> slide = tilestore.open_slide("stores/slide.ome.zarr")
>>> slide.read_region(1000, 2000, 224, 224, mpp=0.5)      # (224, 224, 3) uint8
>>> ds = tilestore.open_embeddings("stores/*.ome.zarr", "uni")  # after `tilestore embed`
>>> ds.tiles.pca(3), ds.tiles.kmeans(8), ds.tiles.nearest(0, k=10)
"""

from tilestore import analysis as analysis  # registers the ds.tiles accessor
from tilestore.conversion import ConversionReport, convert
from tilestore.embeddings import open_embeddings
from tilestore.errors import (
    AnnotationError,
    ModelError,
    PlanError,
    SlideError,
    StoreError,
    TilestoreError,
    TilestoreWarning,
)
from tilestore.info import describe
from tilestore.slide import Level, Slide, open_slide

__all__ = [
    "AnnotationError",
    "ConversionReport",
    "Level",
    "ModelError",
    "PlanError",
    "Slide",
    "SlideError",
    "StoreError",
    "TilestoreError",
    "TilestoreWarning",
    "convert",
    "describe",
    "open_embeddings",
    "open_slide",
]
