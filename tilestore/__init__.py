"""tilestore: whole-slide images as chunked OME-Zarr 0.5 stores, read lazily and chunk-exactly.

>>> import tilestore
>>> tilestore.convert("slide.svs", "stores/")            # once
>>> slide = tilestore.open_slide("stores/slide.ome.zarr")
>>> slide.read_region(1000, 2000, 224, 224, mpp=0.5)      # (224, 224, 3) uint8
>>> plan = tilestore.plan_slide(slide, tilestore.PlanOptions(mpp=0.5, tile=224))
>>> ds = tilestore.open_embeddings("stores/*.ome.zarr", "uni")  # after `tilestore embed`
>>> ds.tiles.pca(3), ds.tiles.kmeans(8), ds.tiles.nearest(0, k=10)

Members load on first use, so importing a light module (``tilestore.errors``) does not
import zarr, dask or xarray.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

# public name -> the module that defines it
_MEMBERS = {
    "ConversionReport": "tilestore.conversion",
    "convert": "tilestore.conversion",
    "open_embeddings": "tilestore.embeddings",
    "AnnotationError": "tilestore.errors",
    "PlanError": "tilestore.errors",
    "SlideError": "tilestore.errors",
    "StoreError": "tilestore.errors",
    "TilestoreError": "tilestore.errors",
    "TilestoreWarning": "tilestore.errors",
    "describe": "tilestore.info",
    "PlanOptions": "tilestore.plans",
    "load_plan": "tilestore.plans",
    "plan_slide": "tilestore.plans",
    "save_plan": "tilestore.plans",
    "Level": "tilestore.slide",
    "Slide": "tilestore.slide",
    "open_slide": "tilestore.slide",
}

__all__ = [
    "AnnotationError",
    "ConversionReport",
    "Level",
    "PlanError",
    "PlanOptions",
    "Slide",
    "SlideError",
    "StoreError",
    "TilestoreError",
    "TilestoreWarning",
    "convert",
    "describe",
    "load_plan",
    "open_embeddings",
    "open_slide",
    "plan_slide",
    "save_plan",
]


def __getattr__(name: str):
    if name in _MEMBERS:
        return getattr(importlib.import_module(_MEMBERS[name]), name)
    raise AttributeError(f"module 'tilestore' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


if TYPE_CHECKING:  # what type checkers and IDEs see
    from tilestore.conversion import ConversionReport, convert
    from tilestore.embeddings import open_embeddings
    from tilestore.errors import (
        AnnotationError,
        PlanError,
        SlideError,
        StoreError,
        TilestoreError,
        TilestoreWarning,
    )
    from tilestore.info import describe
    from tilestore.plans import PlanOptions, load_plan, plan_slide, save_plan
    from tilestore.slide import Level, Slide, open_slide
