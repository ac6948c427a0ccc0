"""Embeddings in stores: the format (`layout`), its writer and its reader, in one place.

>>> ds = tilestore.open_embeddings("stores/*.ome.zarr", "uni")   # read: lazy xarray
>>> writer = EmbeddingWriter(slide, plan, uid, model, batch_size=512, dtype="float16",
...                          settings={...})                      # write: batch by batch
"""

from tilestore.embeddings.layout import COORDS, GROUP, group_name
from tilestore.embeddings.read import list_embeddings, open_embeddings
from tilestore.embeddings.write import AlreadyComplete, EmbeddingError, EmbeddingWriter

__all__ = [
    "COORDS",
    "GROUP",
    "AlreadyComplete",
    "EmbeddingError",
    "EmbeddingWriter",
    "group_name",
    "list_embeddings",
    "open_embeddings",
]
