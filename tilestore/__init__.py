"""tilestore: whole-slide images as chunked OME-Zarr 0.5 stores, read lazily and chunk-exactly.

>>> import tilestore
>>> tilestore.convert("slide.svs", "stores/")            # once, or read it where it is:
>>> slide = tilestore.open_in_place("slide.svs", sidecars="sidecars/")
>>> slide = tilestore.open_slide("stores/slide.ome.zarr")
>>> slide.read_region(1000, 2000, 224, 224, mpp=0.5)      # (224, 224, 3) uint8
>>> plan = tilestore.plan_slide(slide, tilestore.PlanOptions(mpp=0.5, tile=224))
>>> ds = tilestore.open_embeddings("stores/*.ome.zarr", "uni")  # after `tilestore embed`
>>> ds.tiles.pca(3), ds.tiles.kmeans(8), ds.tiles.nearest(0, k=10)

Members load on first use, so importing a light module (``tilestore.errors``) does not
import zarr, dask or xarray.

The floors, each importing only those below it (tests/test_architecture.py checks them):
``tilestore.cli`` > ``tilestore.embed`` > ``exports`` > ``view`` > ``embeddings`` > ``plan`` >
``qc`` > ``masks`` > ``analysis`` > ``conversion`` > ``reading`` > ``sources`` > ``format``;
ARCHITECTURE.md draws them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tilestore.faces import lazy_face

__getattr__, __dir__, __all__ = lazy_face(
    __name__,
    {
        "tilestore.conversion": (
            "ConversionReport",
            "convert",
            "describe",
            "open_in_place",
            "reshard",
        ),
        "tilestore.embeddings": ("open_embeddings", "plan_slide"),
        "tilestore.errors": (
            "AnnotationError",
            "ChunkError",
            "DeviceError",
            "MixedResults",
            "ModelError",
            "NotEmbedded",
            "OptionError",
            "OutputError",
            "PlanError",
            "ServerError",
            "SlideError",
            "StoreError",
            "TilestoreError",
            "TilestoreWarning",
        ),
        "tilestore.plan": ("PlanOptions", "load_plan", "resolve_plan", "save_plan"),
        "tilestore.reading": ("Level", "Slide", "open_slide"),
    },
)

if TYPE_CHECKING:  # what type checkers and IDEs see
    from tilestore.conversion import ConversionReport, convert, describe, open_in_place
    from tilestore.embeddings import open_embeddings, plan_slide
    from tilestore.errors import (
        AnnotationError,
        ChunkError,
        DeviceError,
        MixedResults,
        ModelError,
        NotEmbedded,
        OptionError,
        OutputError,
        PlanError,
        ServerError,
        SlideError,
        StoreError,
        TilestoreError,
        TilestoreWarning,
    )
    from tilestore.plan import PlanOptions, load_plan, resolve_plan, save_plan
    from tilestore.reading import Level, Slide, open_slide
