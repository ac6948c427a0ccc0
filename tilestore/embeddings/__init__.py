"""Embeddings in stores: the format (`layout`), its writer and its reader, in one place.

>>> ds = tilestore.open_embeddings("stores/*.ome.zarr", "uni")   # read: lazy xarray
>>> embeddings_status("a.ome.zarr").groups  # what is there, how far: read only
>>> writer = EmbeddingWriter(slide, plan, uid, model, batch_size=512, dtype="float16",
...                          settings={...})                      # write: batch by batch

The reader is loaded on first use: it imports dask and xarray (and so pandas), a second of
every `embed` process's start that writing never needs.

May import `tilestore.plan` (the grid), `tilestore.analysis` (the accessor the reader
registers), `tilestore.reading` and `tilestore.format`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tilestore.embeddings.layout import COORDS, GROUP, group_name, model_folder
from tilestore.embeddings.recipe import ScaleLabel
from tilestore.embeddings.write import (
    AlreadyComplete,
    EmbeddingError,
    EmbeddingWriter,
    ResumeState,
    RunIdentity,
    resume_state,
)
from tilestore.errors import MixedResults
from tilestore.faces import lazy_face

__getattr__, __dir__, _read = lazy_face(
    __name__,
    {
        "tilestore.embeddings.groups": (
            "expand_stores",
            "find_group",
            "list_embeddings",
            "list_groups",
            "plan_groups",
        ),
        "tilestore.errors": ("DamagedEmbeddings", "NotEmbedded", "StaleSlideEmbedding"),
        "tilestore.embeddings.read": ("open_embeddings",),
        "tilestore.embeddings.quality": ("plan_slide", "without_blurred"),
        "tilestore.embeddings.status": (
            "AskedEncoder",
            "AskedModel",
            "AskedPlan",
            "STATES",
            "TAKEN_OVER",
            "Finish",
            "GroupStatus",
            "StoreStatus",
            "breaking_runs",
            "embeddings_status",
            "finishing_runs",
            "only_model",
        ),
        "tilestore.embeddings.slides": (
            "TileFeatures",
            "open_slide_embeddings",
            "read_slide_vector",
            "read_tile_features",
            "write_slide_vector",
        ),
    },
)
__all__ = sorted(
    [
        *_read,
        "COORDS",
        "GROUP",
        "MixedResults",
        "ScaleLabel",
        "AlreadyComplete",
        "EmbeddingError",
        "EmbeddingWriter",
        "RunIdentity",
        "ResumeState",
        "group_name",
        "model_folder",
        "resume_state",
    ]
)

if TYPE_CHECKING:
    from tilestore.embeddings.groups import (
        expand_stores,
        find_group,
        list_embeddings,
        list_groups,
        plan_groups,
    )
    from tilestore.embeddings.quality import plan_slide, without_blurred
    from tilestore.embeddings.read import open_embeddings
    from tilestore.embeddings.slides import (
        TileFeatures,
        open_slide_embeddings,
        read_slide_vector,
        read_tile_features,
        write_slide_vector,
    )
    from tilestore.embeddings.status import (
        STATES,
        TAKEN_OVER,
        AskedEncoder,
        AskedModel,
        AskedPlan,
        Finish,
        GroupStatus,
        StoreStatus,
        breaking_runs,
        embeddings_status,
        finishing_runs,
        only_model,
    )
    from tilestore.errors import DamagedEmbeddings, NotEmbedded, StaleSlideEmbedding
